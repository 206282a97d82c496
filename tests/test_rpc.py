"""`mlcpipe run|check|profile --rpc`: the artifact's library uploaded to a TVM RPC server and run
there (loopback llvm server here: the code path a Mac serving Metal takes), `run --save-logits`,
and the one-line errors of bad addresses, dead or refusing servers and metal artifacts."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from mlcpipe.build import build
from mlcpipe.config import MODELS_DIR, load_model_config
from mlcpipe.rpc import RemoteError, parse_address
from mlcpipe.runtime import Engine
from mlcpipe.targets import load_target
from mlcpipe.weights import convert_weights
from mlcpipe.quantization import quantization

from tests.helpers.checkpoints import random_hf_weights, write_hf_checkpoint
from tests.helpers.cli import mlcpipe

SERVER_LIFETIME_S = 900  # an RPC server outlives no test session by more than this
PROMPT = [int(t) for t in np.random.default_rng(11).integers(0, 512, size=40)]  # > prefill_chunk_size 16
PROMPT_ARG = ",".join(map(str, PROMPT))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RPCServer:
    """`python -m tvm.exec.rpc_server` on a free loopback port, in its own process group (its
    per-session children included), killed after SERVER_LIFETIME_S at the latest."""

    def __init__(self, *extra: str):
        self.port = _free_port()
        self.log = open(os.devnull, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["timeout", str(SERVER_LIFETIME_S), sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
             "--port", str(self.port), "--port-end", str(self.port + 1), "--silent", *extra],
            stdout=self.log, stderr=self.log, start_new_session=True, env={**os.environ},
        )  # fmt: skip

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait(self, timeout: float = 90) -> RPCServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rpc_server exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"rpc_server not listening on {self.address} after {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this test started
        self.proc.wait(timeout=30)
        self.log.close()


class FakeTracker:
    """Just enough of `python -m tvm.exec.rpc_tracker` (which needs tornado, not installed here):
    SUMMARY lists `servers` (key -> (host, port)); REQUEST hands out the server of a key."""

    def __init__(self, servers: dict[str, tuple[str, int]]):
        from tvm.rpc import base

        self.base, self.servers = base, servers
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        base = self.base
        with conn:
            try:
                if struct.unpack("<i", base.recvall(conn, 4))[0] != base.RPC_TRACKER_MAGIC:
                    return
                conn.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
                while True:
                    message = base.recvjson(conn)
                    if message[0] == base.TrackerCode.SUMMARY:
                        base.sendjson(conn, [base.TrackerCode.SUCCESS, {
                            "queue_info": {k: {"free": 1, "pending": 0} for k in self.servers},
                            "server_info": [{"key": f"server:{k}", "addr": list(a)} for k, a in self.servers.items()],
                        }])  # fmt: skip
                    elif message[0] == base.TrackerCode.REQUEST and message[1] in self.servers:
                        host, port = self.servers[message[1]]
                        base.sendjson(conn, [base.TrackerCode.SUCCESS, [host, port, ""]])
                    else:
                        base.sendjson(conn, [base.TrackerCode.FAIL])
            except (OSError, struct.error, ValueError):
                return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def tiny16(tmp_path_factory) -> Path:
    """llama-tiny with prefill_chunk_size 16, so that a 40-token prompt takes three prefill calls."""
    raw = yaml.safe_load((MODELS_DIR / "llama-tiny.yaml").read_text())
    raw.update(prefill_chunk_size=16)
    path = tmp_path_factory.mktemp("rpc-model") / "tiny16.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def metal_build(tiny16, tmp_path_factory):
    """The tiny model built for metal in a background process (started first, awaited last)."""
    root = tmp_path_factory.mktemp("rpc-metal")
    with open(root / "build.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mlcpipe.cli", "build", "--model", str(tiny16), "--quant", "q4f32_1",
                                 "--target", "metal", "--output", str(root / "art")],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TVM_NUM_THREADS": "1"})
    yield proc, root / "art", root / "build.log"
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def started_servers(metal_build):
    """A plain RPC server and one started with --key, both on loopback (not yet awaited)."""
    plain, keyed = RPCServer(), RPCServer("--key", "mac-mini")
    try:
        yield plain, keyed
    finally:
        plain.stop()
        keyed.stop()


@pytest.fixture(scope="module")
def llvm_art(tiny16, started_servers, tmp_path_factory):
    """The tiny model for llvm (q4f32_1) with converted random Hugging Face weights."""
    root = tmp_path_factory.mktemp("rpc-llvm")
    cfg = load_model_config(str(tiny16))
    hf = write_hf_checkpoint(root / "hf", cfg, random_hf_weights(cfg, seed=4))
    weights = convert_weights(cfg, quantization("q4f32_1"), hf, root / "w", log=lambda *_: None)
    art = build(cfg, quantization("q4f32_1"), load_target("llvm"), output=root / "art", log=lambda *_: None)
    return art, weights


@pytest.fixture(scope="module")
def servers(started_servers, llvm_art):
    plain, keyed = started_servers
    return plain.wait(), keyed.wait()


def _tokens(result) -> list[int]:
    assert result.returncode == 0, result.stderr
    return [int(t) for t in result.stdout.strip().splitlines()[-1].split(",")]


def _one_error_line(result) -> str:
    """The only line on stderr, an `error:` one, of a command that failed."""
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
    assert result.returncode != 0
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _cli(*args: str, env: dict[str, str] | None = None):
    """The CLI in-process (for commands that never open an RPC session)."""
    from mlcpipe.cli import main

    result = CliRunner().invoke(main, list(args), env=env)
    result.returncode = result.exit_code
    return result


# ---- run / check / profile over RPC --------------------------------------------------------


def test_rpc_run_matches_local_run(llvm_art, servers, tmp_path):
    art, weights = llvm_art
    plain, _ = servers
    common = ("run", "--artifact", str(art), "--weights", str(weights), "--prompt-tokens", PROMPT_ARG, "--max-new-tokens", "8")
    local = _cli(*common, "--save-logits", str(tmp_path / "local.npy"))  # in-process: no RPC session to close
    remote = mlcpipe(*common, "--save-logits", str(tmp_path / "remote.npy"), "--rpc", plain.address)
    assert _tokens(remote) == _tokens(local)
    a, b = np.load(tmp_path / "local.npy"), np.load(tmp_path / "remote.npy")
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape == (8, 512)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    assert [int(t) for t in a.argmax(axis=1)] == _tokens(local)
    assert np.abs(a[0] - a[-1]).max() > 1e-3  # each step's own logits, not one row repeated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.npy", "remote.npy"]  # no temp file left


def test_rpc_run_samples_on_the_remote_device(llvm_art, servers):
    """--temperature/--top-p/--seed over RPC: the sampler functions run on the remote (their
    tuples stay there); the same seed gives the local run's tokens."""
    art, weights = llvm_art
    plain, _ = servers
    common = ("run", "--artifact", str(art), "--weights", str(weights), "--prompt-tokens", PROMPT_ARG, "--max-new-tokens", "8",
              "--temperature", "4", "--top-p", "0.98", "--repetition-penalty", "3", "--seed", "3")
    local = _tokens(_cli(*common))
    remote = _tokens(mlcpipe(*common, "--rpc", plain.address))
    assert remote == local
    greedy = _tokens(_cli(*common[:9]))
    assert local != greedy  # the sampling flags changed the tokens


def test_rpc_run_through_a_tracker(llvm_art, servers, tmp_path):
    art, weights = llvm_art
    plain, _ = servers
    tracker = FakeTracker({"mac": ("127.0.0.1", plain.port)})
    try:
        via = mlcpipe("run", "--artifact", str(art), "--weights", str(weights), "--prompt-tokens", PROMPT_ARG, "--max-new-tokens", "3",
                      "--rpc-tracker", f"127.0.0.1:{tracker.port}", "--rpc-key", "mac")
        unknown = _cli("run", "--artifact", str(art), "--weights", str(weights), "--prompt-tokens", "1,2",
                       "--rpc-tracker", f"127.0.0.1:{tracker.port}", "--rpc-key", "iphone")
    finally:
        tracker.close()
    assert _tokens(via) == Engine(art, weights).generate(PROMPT, 3)
    assert _one_error_line(unknown) == f"error: RPC tracker 127.0.0.1:{tracker.port} has no server with key 'iphone' (registered: mac)"


def test_rpc_check_passes_every_kernel(llvm_art, servers):
    art, _ = llvm_art
    plain, _ = servers
    result = mlcpipe("check", "--artifact", str(art), "--rpc", plain.address, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["executed"] and report["summary"].startswith(f"llvm on RPC server {plain.address}: executed")
    statuses = {r["status"] for r in report["results"]}
    assert statuses <= {"pass", "skip"}
    ran = {r["kernel"] for r in report["results"] if r["status"] == "pass"}
    assert {"rms_norm", "take_dequantize", "tir_kv_cache_transpose_append", "batch_decode_paged_kv_cpu"} <= ran
    assert sum(r["status"] == "pass" for r in report["results"]) >= 40


def test_rpc_profile(llvm_art, servers, tmp_path):
    art, weights = llvm_art
    plain, _ = servers
    out = tmp_path / "profile.json"
    result = mlcpipe("profile", "--artifact", str(art), "--weights", str(weights), "--rpc", plain.address, "--prompt-len", "20",
                     "--gen-len", "3", "--runs", "1", "--warmup", "0", "--format", "json", "-o", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["method"]["kind"] == "rpc" and data["method"]["rpc_round_trip_ms"] > 0
    assert data["metrics"]["prefill_ms"] > 0 and data["metrics"]["decode_ms_per_token"]["p50"] > 0
    assert data["metrics"]["ttft_ms"] > data["metrics"]["prefill_ms"]  # from the request: new sequence, prefill, token
    kernels = {s["kernel"] for s in data["samples"]}
    assert {"rms_norm", "take_dequantize", "tir_kv_cache_transpose_append", "batch_prefill_paged_kv_cpu", "batch_decode_paged_kv_cpu"} <= kernels
    assert all(s["ms"] > 0 for s in data["samples"])
    assert {s["mode"] for s in data["steps"]} == {"low-overhead", "per-kernel"}


# ---- errors: one line, non-zero exit -----------------------------------------------------


@pytest.mark.parametrize("address", ["mac.local", "mac.local:", ":9090", "mac.local:99999", "mac local:9090", "mac.local:90a"])
def test_malformed_address(address):
    with pytest.raises(RemoteError, match="expected HOST:PORT"):
        parse_address(address)
    result = _cli("run", "--artifact", "nowhere", "--prompt-tokens", "1", "--rpc", address)
    assert _one_error_line(result).startswith(f"error: --rpc {address!r}: expected HOST:PORT")


def test_parse_address_accepts_hosts_and_ipv6():
    assert parse_address("mac.local:9090") == ("mac.local", 9090)
    assert parse_address("[::1]:9090") == ("::1", 9090)


def test_server_down_wrong_key_and_silent_server(llvm_art, servers):
    art, weights = llvm_art
    _, keyed = servers
    run = ("run", "--artifact", str(art), "--weights", str(weights), "--prompt-tokens", "1,2")
    port = _free_port()
    down = _cli(*run, "--rpc", f"127.0.0.1:{port}")
    assert _one_error_line(down) == (f"error: RPC server 127.0.0.1:{port}: connection refused; "
                                     "is `python -m tvm.exec.rpc_server` running there?")
    check_down = _cli("check", "--artifact", str(art), "--rpc", f"127.0.0.1:{port}")
    assert "connection refused" in _one_error_line(check_down)
    tracker_down = _cli(*run, "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", "mac")
    assert _one_error_line(tracker_down) == (f"error: RPC tracker 127.0.0.1:{port}: connection refused; "
                                             "is `python -m tvm.exec.rpc_tracker` running there?")

    wrong = _cli(*run, "--rpc", keyed.address, "--rpc-key", "laptop")
    assert _one_error_line(wrong).startswith(f"error: RPC server {keyed.address} refused key 'laptop'")
    no_key = _cli(*run, "--rpc", keyed.address)
    assert "refused key ''" in _one_error_line(no_key)

    with socket.socket() as silent:  # accepts TCP connections, never answers the RPC handshake
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        result = _cli(*run, "--rpc", address, env={"MLCPIPE_RPC_TIMEOUT": "2"})
    assert _one_error_line(result) == f"error: RPC server {address}: accepted the connection but did not complete the handshake within 2 s"


def test_option_combinations_and_save_logits_path(llvm_art, tmp_path):
    art, weights = llvm_art
    run = ("run", "--artifact", str(art), "--weights", str(weights), "--prompt-tokens", "1,2")
    assert "--rpc-key needs --rpc" in _one_error_line(_cli(*run, "--rpc-key", "mac"))
    assert "--rpc-tracker needs --rpc-key" in _one_error_line(_cli(*run, "--rpc-tracker", "127.0.0.1:9190"))
    both = _cli(*run, "--rpc", "127.0.0.1:9090", "--rpc-tracker", "127.0.0.1:9190", "--rpc-key", "k")
    assert "exactly one of --rpc" in _one_error_line(both)
    missing = tmp_path / "no-such-dir" / "logits.npy"
    assert _one_error_line(_cli(*run, "--save-logits", str(missing))) == (
        f"error: --save-logits {missing}: directory {missing.parent} does not exist")
    assert "is a directory" in _one_error_line(_cli(*run, "--save-logits", str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def test_metal_artifact_needs_a_mac(metal_build, servers):
    proc, art, log = metal_build
    assert proc.wait(timeout=600) == 0, log.read_text()[-2000:]
    assert json.loads((art / "manifest.json").read_text())["library"] == "lib.dylib"
    plain, _ = servers
    hint = "error: metal artifacts run on a Mac: serve `python -m tvm.exec.rpc_server` there and pass --rpc HOST:PORT"
    run = ("run", "--artifact", str(art), "--weights", "synthetic", "--prompt-tokens", "1,2,3")
    assert _one_error_line(_cli(*run)) == hint
    assert _one_error_line(_cli("profile", "--artifact", str(art))) == hint
    no_metal = (f"error: RPC server {plain.address} has no metal device; this is a metal artifact "
                "(serve from a Mac whose TVM is built with USE_METAL)")
    assert _one_error_line(mlcpipe(*run, "--rpc", plain.address)) == no_metal
    assert _one_error_line(mlcpipe("check", "--artifact", str(art), "--rpc", plain.address)) == no_metal


# ---- a remote whose process stops mid-session, a remote's CPU ------------------------------


def _edited(art: Path, dest: Path, manifest_changes: dict | None = None, illegal_at: str | None = None) -> Path:
    """A copy of the artifact with manifest fields changed, and/or with the kernel `illegal_at`
    starting on an illegal instruction (ud2; udf on aarch64), its record re-written: the process
    running that kernel dies of SIGILL, as on code for a CPU it lacks."""
    import hashlib
    import platform
    import shutil

    from mlcpipe.backends.binfmt import Elf

    copy = Path(shutil.copytree(art, dest))
    manifest = json.loads((copy / "manifest.json").read_text())
    if illegal_at is not None:
        library = copy / manifest["library"]
        data = bytearray(library.read_bytes())
        at = Elf(bytes(data)).symbol_offset(f"__tvm_ffi_{illegal_at}")
        code = {"x86_64": b"\x0f\x0b", "aarch64": b"\0\0\0\0"}[platform.machine()]
        data[at : at + len(code)] = code
        library.write_bytes(data)
        manifest["files"][manifest["library"]] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (copy / "manifest.json").write_text(json.dumps({**manifest, **(manifest_changes or {})}))
    return copy


def _stopped_line(server: RPCServer, during: str, artifact: Path) -> str:
    manifest = json.loads((artifact / "manifest.json").read_text())
    return (f"error: RPC server {server.address}: its process stopped while {during} (it crashed or was killed; the server's "
            f"log says which); this artifact's code, built for CPU {manifest['target']['mcpu']!r}, stops on an illegal "
            f"instruction on a CPU without one of {', '.join(manifest['cpu_flags'])} (/proc/cpuinfo flags): if the remote "
            "lacks one, rebuild with --mcpu of its CPU (or portable)")


def _last_line_only_error(result) -> str:
    """The last stderr line, the only error one (check's progress lines, [k/n] kernel, come first)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and [ln for ln in lines if "error" in ln.lower() or "Traceback" in ln] == lines[-1:], result.stderr
    return lines[-1]


def test_a_remote_that_stops_mid_session_is_one_line(llvm_art, tmp_path):
    """Was: code the remote's CPU cannot run (e.g. --mcpu sapphirerapids served by a Zen 4) stopped
    its server process on an illegal instruction, and run printed TVM's traceback ending in
    'code=kShutdown', check a FAIL row for that kernel and every one after it. Now: one line naming
    the server, the artifact or kernel, and the CPU features its code needs. (TVM's server itself
    exits once a session's process has crashed: one server per command.)"""
    art, weights = llvm_art
    broken = _edited(art, tmp_path / "broken", illegal_at="rms_norm")
    started = {command: RPCServer() for command in ("run", "check")}
    try:
        run_server, check_server = started["run"].wait(), started["check"].wait()
        run = mlcpipe("run", "--artifact", str(broken), "--weights", str(weights), "--prompt-tokens", PROMPT_ARG,
                      "--rpc", run_server.address)
        check = mlcpipe("check", "--artifact", str(broken), "--rpc", check_server.address)
    finally:
        for server in started.values():
            server.stop()
    assert _last_line_only_error(run) == _stopped_line(run_server, f"running {broken}", broken)
    assert _last_line_only_error(check) == _stopped_line(check_server, "running kernel rms_norm", broken)
    progress = check.stderr.strip().splitlines()[:-1]
    assert progress[0].startswith("[1/") and progress[-1].endswith("] rms_norm")  # the kernels before it ran, none after


def test_rpc_profile_of_an_llvm_artifact_this_cpu_cannot_run(llvm_art, servers, tmp_path, monkeypatch):
    """An llvm artifact built for the remote's CPU (--mcpu), which this one lacks a feature of:
    `profile --rpc` recorded its call sequence by running it here (refused: 'this CPU lacks'); now
    on an llvm build of the same model for this CPU (built into the cache from the artifact's
    own model config, which the cache's child build could not load before). Its remote stopping
    mid-profile: one line, as for run."""
    art, weights = llvm_art
    plain, _ = servers
    absent = {"cpu_flags": [*json.loads((art / "manifest.json").read_text())["cpu_flags"], "mlcpipe_test_absent"]}
    elsewhere = _edited(art, tmp_path / "for-the-remote", absent)
    monkeypatch.setenv("MLCPIPE_ARTIFACTS", str(tmp_path / "artifacts"))
    run = ("run", "--artifact", str(elsewhere), "--weights", str(weights), "--prompt-tokens", "1,2")
    assert "whose code needs mlcpipe_test_absent: this CPU lacks them" in _one_error_line(_cli(*run))
    out = tmp_path / "profile.json"
    profile = ("profile", "--weights", str(weights), "--prompt-len", "20", "--gen-len", "2", "--runs", "1", "--warmup", "0")
    result = mlcpipe(*profile, "--artifact", str(elsewhere), "--rpc", plain.address, "--format", "json", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "[mlcpipe] building llama-tiny q4f32_1 llvm into" in result.stdout + result.stderr
    twins = list((tmp_path / "artifacts" / "cache").glob("*/artifact/manifest.json"))
    assert len(twins) == 1 and json.loads(twins[0].read_text())["config_hash"] == json.loads((art / "manifest.json").read_text())["config_hash"]
    data = json.loads(out.read_text())
    assert data["method"]["kind"] == "rpc" and data["metrics"]["decode_ms_per_token"]["p50"] > 0
    assert {"rms_norm", "batch_decode_paged_kv_cpu"} <= {s["kernel"] for s in data["samples"]}

    broken = _edited(art, tmp_path / "broken", absent, illegal_at="rms_norm")
    server = RPCServer()
    try:
        stopped = mlcpipe(*profile, "--artifact", str(broken), "--rpc", server.wait().address)
    finally:
        server.stop()
    assert "[mlcpipe] reusing" in stopped.stdout + stopped.stderr  # the twin built above
    assert _last_line_only_error(stopped) == _stopped_line(server, f"running {broken}", broken)
