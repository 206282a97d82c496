"""Where an artifact runs, from the device options of `run`, `check` and `profile`: TVM's runtime
here or over RPC (--rpc / --rpc-tracker / --rpc-key), or a WebGPU runtime (--adapter / --browser)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..errors import OptionError


def run_options(rpc: str | None, rpc_tracker: str | None, rpc_key: str | None, adapter: str | None, browser: bool,
                prefill_chunk: int | None = None):
    """device.RunOptions for the options (connects to the RPC server or tracker when given)."""
    from ..device import RunOptions

    if (rpc or rpc_tracker) and (adapter or browser):
        raise OptionError("--rpc/--rpc-tracker run TVM's runtime elsewhere; --adapter/--browser choose a WebGPU runtime here: give one kind")
    remote = None
    if rpc or rpc_tracker or rpc_key:  # TVM's RPC client: only where a remote is asked for
        from ..rpc import open_session

        remote = open_session(rpc, rpc_tracker, rpc_key)
    return RunOptions(remote=remote, adapter=adapter, browser=browser, prefill_chunk=prefill_chunk)


def device_of(artifact: Path):
    """The run-side module of the artifact's target kind (its manifest checked first)."""
    from ..artifact import RUN_FIELDS, read_manifest
    from ..device import device

    return device(read_manifest(artifact, RUN_FIELDS)["target"]["kind"])


def remote_stops(options, artifact: Path):
    """Around a run over RPC: the remote's process stopping mid-session (a crash, e.g. code for a CPU
    it lacks) is one line naming the server and the artifact's CPU needs (rpc.stops_reported)."""
    if options.remote is None:
        return contextlib.nullcontext()
    from ..artifact import RUN_FIELDS, read_manifest
    from ..device import cpu_note
    from ..rpc import stops_reported

    return stops_reported(options.remote, f"running {artifact}", cpu_note(read_manifest(artifact, RUN_FIELDS)))
