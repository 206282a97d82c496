"""Connect to a TVM RPC server (`python -m tvm.exec.rpc_server`) directly or through a tracker.

Every failure is a `RemoteError` (a ValueError: the CLI prints one `error:` line, exit 2): an
address that is not HOST:PORT, nothing listening (connection refused), no answer (timeout), a
server or tracker that refuses the key, a remote without the artifact's device, a server process
that stops mid-session (`stops_reported`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tvm

TIMEOUT_S = 30.0  # TCP connect, RPC handshake, tracker request ($MLCPIPE_RPC_TIMEOUT overrides)
_HINTS = {"RPC server": "is `python -m tvm.exec.rpc_server` running there?",
          "RPC tracker": "is `python -m tvm.exec.rpc_tracker` running there?"}


class RemoteError(ValueError):
    """A user-facing error about the remote machine or the connection to it."""


def parse_address(text: str, option: str = "--rpc") -> tuple[str, int]:
    """'HOST:PORT' (or '[v6addr]:PORT') -> (host, port)."""
    value = (text or "").strip()
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise RemoteError(f"{option} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9090 or mac.local:9090")
    return host, int(port)


def _probe(host: str, port: int, what: str, timeout: float) -> None:
    """Open and close one TCP connection, so that a dead address fails fast with its reason."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.gaierror as exc:
        raise RemoteError(f"{what} {host}:{port}: cannot resolve host '{host}' ({exc.strerror or exc})") from None
    except (socket.timeout, TimeoutError):
        raise RemoteError(f"{what} {host}:{port}: no answer within {timeout:g} s (host down, wrong address or a firewall?)") from None
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:
            raise RemoteError(f"{what} {host}:{port}: connection refused; {_HINTS[what]}") from None
        raise RemoteError(f"{what} {host}:{port}: {exc.strerror or exc}") from None


def _with_timeout(fn: Callable[[], Any], timeout: float, on_timeout: str) -> Any:
    """Run `fn` in a daemon thread; its result, its exception, or RemoteError(on_timeout).
    (TVM's C++ handshake blocks without a timeout of its own.)"""
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="mlcpipe-rpc-connect")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise RemoteError(on_timeout)
    if "error" in box:
        raise box["error"]
    return box["value"]


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    # TVM errors end with the message; the lines before it are a traceback
    return lines[-1] if lines else type(exc).__name__


def _tracker_keys(host: str, port: int, timeout: float) -> list[str]:
    """Keys of the servers registered with the tracker (its SUMMARY request)."""
    from tvm.rpc import base

    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                raise RemoteError(f"--rpc-tracker {host}:{port}: not a TVM RPC tracker (wrong handshake)")
            base.sendjson(sock, [base.TrackerCode.SUMMARY])
            reply = base.recvjson(sock)
    except RemoteError:
        raise
    except (OSError, struct.error, json.JSONDecodeError) as exc:
        raise RemoteError(f"--rpc-tracker {host}:{port}: not a TVM RPC tracker ({_first_line(exc)})") from None
    if not isinstance(reply, list) or not reply or reply[0] != base.TrackerCode.SUCCESS:
        raise RemoteError(f"--rpc-tracker {host}:{port}: the tracker refused the summary request ({reply!r})")
    servers = reply[1].get("server_info", []) if isinstance(reply[1], dict) else []
    return sorted({str(s.get("key", "")).split(":", 1)[-1] for s in servers if str(s.get("key", "")).startswith("server:")})


def _default_timeout() -> float:
    text = os.environ.get("MLCPIPE_RPC_TIMEOUT", "")
    try:
        return float(text) if text else TIMEOUT_S
    except ValueError:
        raise RemoteError(f"$MLCPIPE_RPC_TIMEOUT {text!r}: expected seconds, e.g. 30") from None


def connect(rpc: str | None = None, tracker: str | None = None, key: str = "", timeout: float | None = None) -> tvm.rpc.RPCSession:
    """A session with the RPC server at `rpc` (HOST:PORT), or one the tracker at `tracker` hands out
    for `key`."""
    timeout = _default_timeout() if timeout is None else timeout
    if (rpc is None) == (tracker is None):
        raise RemoteError("give exactly one of --rpc HOST:PORT or --rpc-tracker HOST:PORT")
    key = key or ""
    if rpc is not None:
        host, port = parse_address(rpc, "--rpc")
        _probe(host, port, "RPC server", timeout)
        try:
            return _with_timeout(lambda: tvm.rpc.connect(host, port, key=key), timeout,
                                 f"RPC server {host}:{port}: accepted the connection but did not complete the handshake within {timeout:g} s")
        except RemoteError:
            raise
        except Exception as exc:  # noqa: BLE001 - TVM raises InternalError/RuntimeError here
            message = _first_line(exc)
            if "cannot find server that matches key" in message:
                raise RemoteError(f"RPC server {host}:{port} refused key {key!r}: pass the key it was started with "
                                  "(`rpc_server --key K` -> --rpc-key K)") from None
            raise RemoteError(f"RPC server {host}:{port}: {message}") from None
    if not key:
        raise RemoteError("--rpc-tracker needs --rpc-key KEY (the key the device's rpc_server registered with)")
    host, port = parse_address(tracker, "--rpc-tracker")
    _probe(host, port, "RPC tracker", timeout)
    keys = _tracker_keys(host, port, timeout)
    if key not in keys:
        raise RemoteError(f"RPC tracker {host}:{port} has no server with key {key!r} (registered: {', '.join(keys) or 'none'})")

    def request():
        return tvm.rpc.connect_tracker(host, port).request(key, max_retry=1)

    try:
        return _with_timeout(request, timeout, f"RPC tracker {host}:{port}: no free server with key {key!r} within {timeout:g} s (all busy?)")
    except RemoteError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise RemoteError(f"RPC tracker {host}:{port}, key {key!r}: {_first_line(exc)}") from None


def describe(session) -> str:
    """'RPC server HOST:PORT' / 'RPC tracker HOST:PORT (key K)' for sessions from open_session."""
    return getattr(session, "_mlcpipe_address", "the RPC server")


# what TVM's client says once the server's process is gone: the call it was in, then every later one
_STOPPED = ("code=kShutdown", "SockChannel::Send Error", "SockChannel::Recv Error")


class RemoteStopped(RemoteError):
    """The remote's server process went away in the middle of the session (it crashed or was killed)."""


@contextlib.contextmanager
def stops_reported(session, during: str, note: str = "") -> Iterator[None]:
    """Inside: TVM's errors of a remote whose server process went away mid-call (a traceback
    ending in 'code=kShutdown', then broken pipes) become one RemoteStopped naming the server and
    what ran; `note`: what may have stopped it."""
    try:
        yield
    except RemoteError:
        raise
    except Exception as exc:
        if not any(mark in str(exc) for mark in _STOPPED):
            raise
        raise RemoteStopped(f"{describe(session)}: its process stopped while {during} (it crashed or was killed; "
                            f"the server's log says which){note}") from None


def remote_device(session: tvm.rpc.RPCSession, target_kind: str, where: str = "the RPC server"):
    """The remote device an artifact of `target_kind` runs on; RemoteError if the remote lacks it."""
    from .backends import KINDS
    from .device import device, kinds_with

    kind_device = device(target_kind) if target_kind in KINDS else None
    method = kind_device.RPC_DEVICE if kind_device is not None else None  # the RPCSession method giving the device
    if method is None:
        raise RemoteError(f"artifact target '{target_kind}' cannot run over TVM RPC (supported: {', '.join(sorted(kinds_with('RPC_DEVICE')))})")
    device = getattr(session, method)(0)
    try:
        present = bool(device.exist)
    except Exception as exc:  # noqa: BLE001 - a runtime built without that device API
        raise RemoteError(f"{where} has no {target_kind} device ({_first_line(exc)})") from None
    if not present:
        raise RemoteError(f"{where} has no {target_kind} device; this is a {target_kind} artifact{kind_device.RPC_DEVICE_HINT}")
    return device


def open_session(rpc: str | None, tracker: str | None, key: str | None) -> tvm.rpc.RPCSession | None:
    """connect() for the CLI options, or None when neither --rpc nor --rpc-tracker is given."""
    if rpc is None and tracker is None:
        if key:
            raise RemoteError("--rpc-key needs --rpc HOST:PORT or --rpc-tracker HOST:PORT")
        return None
    session = connect(rpc, tracker, key or "")
    session._mlcpipe_address = f"RPC server {rpc}" if rpc else f"RPC tracker {tracker} (key {key})"
    return session


def upload_library(session: tvm.rpc.RPCSession, path, where: str = "the RPC server") -> tvm.runtime.Module:
    """Upload a library file and load it on the remote."""
    from pathlib import Path

    path = Path(path)
    try:
        session.upload(str(path))
    except Exception as exc:  # noqa: BLE001
        raise RemoteError(f"uploading {path.name} to {where} failed: {_first_line(exc)}") from None
    try:
        return session.load_module(path.name)
    except Exception as exc:  # noqa: BLE001 - e.g. a library for another OS / CPU
        raise RemoteError(f"{where} could not load {path.name}: {_first_line(exc)}") from None
