"""Output directories: ownership (mlcpipe replaces only what it wrote), per-writer locks, atomic
replacement (one renameat2 exchange), leftovers of killed runs, checksums, manifest reading.

Every writer (build, convert-weights, nightly cells and cache entries) goes through
`atomic_directory`: it takes `.<name>.lock` beside the directory, removes what killed writers left
(`.<name>.tmp-<pid>-*` / `.<name>.old-<pid>-*` of dead pids), checks ownership (`check_writable`),
builds into a temp dir and swaps it in with one RENAME_EXCHANGE. Where the kernel or file system
has no renameat2 it falls back to two renames; a kill between them leaves `.<name>.old-<pid>-*`,
which the next writer renames back when `<name>` is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from .backends import KINDS as TARGET_KINDS
from .config import short_repr, short_text
from .errors import ArtifactError, raise_if_signalled

MANIFEST = "manifest.json"
RUNTIME_CONFIG = "mlc-chat-config.json"
# the tokenizer files MLC-LLM's model directories carry (copied from the checkpoint)
TOKENIZER_FILES = (
    "tokenizer.model", "tokenizer.json", "vocab.json", "merges.txt", "added_tokens.json", "tokenizer_config.json",
)
TENSOR_CACHE = "tensor-cache.json"
ARTIFACT_FORMAT = "mlcpipe-artifact/1"
WEIGHTS_WRITER = "mlcpipe"  # tensor-cache.json metaData["writer"] of convert-weights
NIGHTLY_MARKER = ".mlcpipe-nightly"  # in a nightly --out directory
CACHE_MARKER = ".mlcpipe-cache"  # in a nightly cell cache
BUNDLE_INDEX = "bundle.json"  # in an `mlcpipe bundle` folder
KINDS = {"artifact": "an mlcpipe artifact", "weights": "an mlcpipe weights directory",
         "nightly": "an mlcpipe nightly directory", "cache": "an mlcpipe nightly cache", "bundle": "an mlcpipe bundle"}
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<tag>tmp|old|work)-(?P<pid>\d+)-[0-9a-f]{8}$")


# ---- ownership ------------------------------------------------------------------------------------

def _json(path: Path) -> dict:
    """A JSON object file's content; {} when absent, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def owner_kind(path: Path) -> str | None:
    """Which mlcpipe writer's marker `path` holds: "artifact", "weights", "nightly", "cache",
    "bundle" or None."""
    path = Path(path)
    if not path.is_dir():
        return None
    if str(_json(path / MANIFEST).get("format", "")).startswith("mlcpipe-artifact"):
        return "artifact"
    meta = _json(path / TENSOR_CACHE).get("metadata")
    if isinstance(meta, dict) and (meta.get("writer") == WEIGHTS_WRITER or {"model", "quantization", "source"} <= set(meta)):
        return "weights"  # (weights converted before the writer key: mlcpipe's own metaData keys)
    if (path / NIGHTLY_MARKER).is_file() or str(_json(path / "index.json").get("format", "")).startswith("mlcpipe-nightly") \
            or any(_json(d / "result.json").get("cell") == d.name for d in path.iterdir() if d.is_dir()):
        return "nightly"
    if (path / CACHE_MARKER).is_file() or ((path / ".lock").is_file() and all(
            re.fullmatch(r"[0-9a-f]{64}", d.name) and d.is_dir() for d in path.iterdir() if not d.name.startswith("."))):
        return "cache"  # (caches made before the marker: a .lock and entries named by their SHA-256)
    if str(_json(path / BUNDLE_INDEX).get("format", "")).startswith("mlcpipe-bundle"):
        return "bundle"
    return None


def owned_files(path: Path, kind: str) -> set[str] | None:
    """Relative paths of the files mlcpipe wrote in `path` (None: every file, the marker cannot say)."""
    if kind == "artifact":
        files = _json(path / MANIFEST).get("files")
        if not isinstance(files, dict) or not files:
            return None
        params = path / "params"  # weights converted into it after the build (convert-weights --output <artifact>/params)
        extra = owned_files(params, "weights") if owner_kind(params) == "weights" else set()
        return {MANIFEST, *files, *(f"params/{f}" for f in extra)}
    if kind == "weights":
        records = _json(path / TENSOR_CACHE).get("records")
        shards = {r.get("dataPath") for r in records if isinstance(r, dict)} if isinstance(records, list) else set()
        return {TENSOR_CACHE, RUNTIME_CONFIG, *TOKENIZER_FILES, *(s for s in shards if isinstance(s, str))}
    if kind == "bundle":
        files = _json(path / BUNDLE_INDEX).get("files")
        return {BUNDLE_INDEX, *files} if isinstance(files, dict) and files else None
    return None


def _files(path: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        rel = Path(dirpath).relative_to(path)
        out += [(rel / f).as_posix() for f in sorted(filenames)]
        out += [(rel / d).as_posix() + "/" for d in dirnames if not os.listdir(Path(dirpath) / d)]
    return out


def refusal(path: Path, why: str, role: str = "") -> ArtifactError:
    return ArtifactError(f"refusing to write {path}{role}: {why}; choose an empty or new directory")


def check_writable(path: Path, kind: str, role: str = "") -> None:
    """`path` may be (re)written by the `kind` writer: it does not exist, is an empty directory,
    or holds that writer's marker and no file mlcpipe did not create. Else one-line ArtifactError
    (`role`: how the user named it, e.g. " (--cache)")."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        what = "a symbolic link" if path.is_symlink() else "a file"
        raise refusal(path, f"it is {what}, not a directory mlcpipe created", role)
    files = _files(path)
    if not files:
        return
    found = owner_kind(path)
    if found is None:
        raise refusal(path, f"it holds files mlcpipe did not create (e.g. {files[0]})", role)
    if found != kind:
        raise refusal(path, f"it is {KINDS[found]}, not {KINDS[kind]}", role)
    owned = owned_files(path, kind)
    if owned is not None:
        foreign = [f for f in files if f not in owned]
        if foreign:
            raise refusal(path, f"it holds files mlcpipe did not create (e.g. {foreign[0]})", role)


def check_not_inside(output: Path, source: Path, output_flag: str = "--output", source_flag: str = "--source") -> None:
    """Refuse an output that is, contains or lies inside an input directory (a write there would
    replace or delete the input)."""
    out, src = Path(output).resolve(), Path(source).resolve()
    if out == src:
        raise ArtifactError(f"refusing to write {output}: {output_flag} is the {source_flag} directory {source}; choose an empty or new directory")
    if src in out.parents:
        raise ArtifactError(f"refusing to write {output}: {output_flag} lies inside the {source_flag} directory {source}; choose a directory outside it")
    if out in src.parents:
        raise ArtifactError(f"refusing to write {output}: {output_flag} contains the {source_flag} directory {source}; choose a directory outside it")


# ---- locks ----------------------------------------------------------------------------------------

def lock_path(path: Path) -> Path:
    return Path(path).parent / f".{Path(path).name}.lock"


def _flock(fd: int, wait: bool, tries: int = 10) -> None:
    """Exclusive flock; without `wait`, a few quick tries (a cleaner's probe holds it for an
    instant, `_lock_held`) before BlockingIOError."""
    import fcntl
    import time

    if wait:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == tries - 1:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def write_lock(path: Path, wait: bool = False, role: str = "") -> Iterator[None]:
    """Hold `.<name>.lock` beside `path` (flock; the OS drops it when the process dies). Taken:
    wait for it (`wait`), or one-line ArtifactError naming the holder's pid. The lock file is
    removed on release (re-checked by inode on acquire, so a removed file is never trusted)."""
    lock = lock_path(path)
    while True:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a parent that is a file, no permission, a read-only file system
            blocker = next((a for a in Path(path).parents if os.path.lexists(a) and not a.is_dir()), None)
            why = f"{blocker} is not a directory" if blocker else f"{exc.strerror}: {exc.filename}"
            raise ArtifactError(f"cannot write {path}{role}: {why}") from None
        try:
            _flock(fd, wait)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ArtifactError(f"refusing to write {path}{role}: it is being written by another mlcpipe (pid {holder}); "
                                "wait for it to finish or choose another directory") from None
        try:
            same = (os.fstat(fd).st_ino, os.fstat(fd).st_dev) == (os.stat(lock).st_ino, os.stat(lock).st_dev)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed it as we waited: lock the new file
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


# ---- leftovers and atomic replacement -------------------------------------------------------------

def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def temp_sibling(final: Path, tag: str = "tmp") -> Path:
    """A new name `.<name>.<tag>-<pid>-<8 hex>` beside `final` (not created)."""
    final = Path(final)
    return final.parent / f".{final.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}"


def make_temp_dir(final: Path, tag: str = "tmp") -> Path:
    while True:
        path = temp_sibling(final, tag)
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _lock_held(path: Path) -> bool:
    """Whether some process holds `path`'s write lock now (the lock file is never created here)."""
    import fcntl

    try:
        fd = os.open(lock_path(path), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def remove_leftovers(directory: Path, names: set[str] | list[str] | None = None) -> list[Path]:
    """Remove the `.<name>.{tmp,old,work}-<pid>-<hex>` entries of `directory` whose pid is dead
    (of `names` only, whose locks the caller holds; else only where `<name>`'s lock is free, so a
    writer in another pid namespace keeps its temp dir): leftovers of killed writers. Nothing else
    is touched. A lost `<name>` whose `.old-` copy survived (a kill in the two-rename fallback) is
    restored."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in sorted(directory.iterdir()):
        m = _LEFTOVER.match(path.name)
        if not m or (names is not None and m["name"] not in names) or _alive(int(m["pid"])):
            continue
        if names is None and _lock_held(directory / m["name"]):
            continue
        final = directory / m["name"]
        if m["tag"] == "old" and not os.path.lexists(final):
            os.rename(path, final)
            continue
        _remove(path)
        removed.append(path)
    return removed


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def replace_directory(tmp: Path, final: Path) -> None:
    """Make `tmp` be `final` in one step: a rename when `final` is absent, else one exchange
    (`final` is the new dir at every instant; the old one, now at `tmp`'s name, is deleted after).
    Fallback without renameat2: final -> .old-, tmp -> final (see remove_leftovers)."""
    if not os.path.lexists(final):
        os.rename(tmp, final)
        return
    if _rename_exchange(tmp, final):
        _remove(tmp)
        return
    old = temp_sibling(final, "old")
    os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(old, final)
        raise
    _remove(old)


def normalize_output(path: Path) -> Path:
    """Absolute, and a symlink to a directory resolved (its target is what gets written)."""
    path = Path(os.path.abspath(path))
    return path.resolve() if path.is_symlink() and path.resolve().is_dir() else path


@contextlib.contextmanager
def atomic_directory(final: Path, kind: str | None = None, wait: bool = False, role: str = "") -> Iterator[Path]:
    """Yield a temp dir beside `final`; on success it replaces `final` (one exchange), on error it
    vanishes. Holds `final`'s write lock throughout (`wait`: wait for another writer, else a
    one-line error); with `kind`, `final` must pass `check_writable` (before and again at the swap).
    A symlink `final` to a directory writes that directory."""
    final = normalize_output(final)
    if not final.name:
        raise refusal(final, "it is a file system root", role)
    with write_lock(final, wait=wait, role=role):
        remove_leftovers(final.parent, {final.name})
        if kind is not None:
            check_writable(final, kind, role)
        tmp = make_temp_dir(final)
        try:
            yield tmp
            raise_if_signalled()
            if kind is not None:
                check_writable(final, kind, role)  # nothing foreign appeared while we built
            tmp.chmod(0o755)
            replace_directory(tmp, final)
        except BaseException:
            _remove(tmp)
            raise


def check_output_file(path: str | Path, flag: str, example: str) -> Path:
    """A file a command will write, refused before any work (ValueError, one line) when it is a
    directory or its directory does not exist."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a directory; give a file name such as {path / example}")
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: directory {parent} does not exist")
    return path


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_file_atomic(path: str | Path, data: str | bytes) -> Path:
    """`data` into a temp file beside `path`, then renamed over it: a full disk or a kill leaves
    the earlier file whole; a replaced file keeps its permissions. A symlink is followed (the file
    it names is replaced); a device or a pipe (/dev/stdout) is written in place, since a rename
    would replace the node itself. OSError becomes ArtifactError in one line naming the file."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    if _is_stream(path):
        try:
            with open(path, "wb") as f:
                f.write(payload)
        except OSError as exc:
            raise ArtifactError(f"{path}: could not write it: {_reason(exc)}") from None
        return path
    try:
        final, mode = Path(os.path.realpath(path)), os.stat(path).st_mode & 0o777
    except OSError:
        final, mode = path, 0o644
    tmp = temp_sibling(final)
    try:
        with open(tmp, "xb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        raise_if_signalled()
        os.replace(tmp, final)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ArtifactError(f"{path}: could not write it: {_reason(exc)} (nothing was changed)") from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def check_distinct_paths(inputs: dict[str, Path | None], outputs: dict[str, Path | None],
                         input_dirs: dict[str, Path | None] | None = None) -> None:
    """Refuse (ValueError, one line) before any work an output that is one of the inputs, lies
    inside one of the `input_dirs` (an artifact, a weights directory), or shares its path with
    another output; each output's directory must be writable."""
    def same(a: Path, b: Path) -> bool:
        try:
            return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
        except OSError:
            return False

    given = [(flag, Path(p)) for flag, p in outputs.items() if p is not None]
    for flag, out in given:
        for dir_flag, folder in (input_dirs or {}).items():
            if folder is None or not Path(folder).is_dir():
                continue
            try:
                inside = out.resolve().is_relative_to(Path(folder).resolve())
            except OSError:
                inside = False
            if inside:
                raise ValueError(f"{flag} {out}: is inside the input {dir_flag} {folder}; write the output elsewhere")
    for i, (flag, out) in enumerate(given):
        for in_flag, src in inputs.items():
            if src is not None and same(out, Path(src)):
                raise ValueError(f"{flag} {out}: is the input {in_flag} {src}; write the output elsewhere")
        for other_flag, other in given[:i]:
            if same(out, other):
                raise ValueError(f"{flag} {out}: is also {other_flag}'s output; give each output its own file")
        if _is_stream(out):
            continue  # written in place (write_file_atomic): its directory is not touched
        parent = Path(os.path.realpath(out)).parent if out.exists() else (out.parent if str(out.parent) else Path("."))
        if parent.is_dir() and not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {out}: directory {parent} is not writable")


def _is_stream(path: Path) -> bool:
    """An existing path that is not a regular file or a directory (a device, a pipe: /dev/stdout)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


MAX_JSON_BYTES = 256 << 20  # a manifest, tensor cache or profile is far smaller; refuse to parse more


def read_json(path: Path, what: str) -> Any:
    """A JSON file (at most MAX_JSON_BYTES, UTF-8), or ArtifactError in one line naming it."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ArtifactError(f"{path}: {size} bytes; a {what} may have at most {MAX_JSON_BYTES} bytes")
        text = path.read_bytes().decode("utf-8")
        return json.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable {what}: {_reason(exc)}") from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: corrupt {what}: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise ArtifactError(f"{path}: corrupt {what}: nested too deeply") from None


def _reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.start})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return short_text(exc, 120)


# Manifest fields `run`, `check` and `profile` read: field -> (check, what is allowed).
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MANIFEST_FIELDS = {
    "model": (lambda v: isinstance(v, str) and bool(v), "a model name"),
    "quantization": (lambda v: isinstance(v, str) and bool(v), "a quantization name"),
    "target": (lambda v: isinstance(v, dict) and v.get("kind") in TARGET_KINDS,
               f"a TVM target object whose kind is {', '.join(TARGET_KINDS[:-1])} or {TARGET_KINDS[-1]}"),
    "library": (lambda v: isinstance(v, str) and bool(v), "the library's file name"),
    "parameters": (lambda v: isinstance(v, list) and all(
        isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("dtype"), str)
        and isinstance(p.get("shape"), list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in p["shape"])
        for p in v), "a list of {name, shape, dtype}"),
    "kernels": (lambda v: isinstance(v, list) and all(isinstance(k, dict) and isinstance(k.get("name"), str) for k in v),
                "a list of {name, ...}"),
    "files": (lambda v: isinstance(v, dict) and all(
        isinstance(f, dict) and isinstance(f.get("sha256"), str) and _HEX64.fullmatch(f["sha256"])
        and isinstance(f.get("bytes"), int) and f["bytes"] >= 0 for f in v.values()),
        "an object {relative path: {sha256, bytes}}"),
}
RUN_FIELDS = tuple(_MANIFEST_FIELDS)


def read_manifest(artifact: Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The artifact's manifest (a JSON object) with the `required` fields present and well-formed
    (RUN_FIELDS: what `run`, `check` and `profile` read); ArtifactError in one line otherwise."""
    path = Path(artifact) / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{artifact}: not an mlcpipe artifact ({MANIFEST} missing); run `mlcpipe build` first")
    data = read_json(path, "manifest")
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: corrupt manifest: expected a JSON object, got {type(data).__name__}")
    if "format" in data and data["format"] != ARTIFACT_FORMAT:  # was: another format's artifact read as this one's
        raise ArtifactError(f"{path}: field 'format': got {short_repr(data['format'])}; this mlcpipe reads {ARTIFACT_FORMAT} "
                            "(rebuild the artifact with it)")
    for field in required:
        if field not in data:
            raise ArtifactError(f"{path}: field '{field}' is missing (not a manifest of `mlcpipe build`; rebuild the artifact)")
        ok, allowed = _MANIFEST_FIELDS[field]
        if not ok(data[field]):
            raise ArtifactError(f"{path}: field '{field}': got {short_repr(data[field])}; expected {allowed}")
    return data


def confined(root: Path, rel: Any, where: str) -> Path:
    """`root / rel` for a path read from a file (`where` names the entry): refused unless `rel`
    is a relative path that stays inside `root`, symlinks resolved."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise ArtifactError(f"{where}: got {short_repr(rel)}; expected a file name relative to {root}")
    pure = PurePosixPath(rel)
    root = Path(root)
    if pure.is_absolute() or Path(rel).is_absolute() or ".." in pure.parts:
        raise ArtifactError(f"{where}: got {short_repr(rel)}; a path must stay inside {root} (no absolute paths, no '..')")
    path = root / rel
    real_root = root.resolve()
    real = path.resolve()
    if real != real_root and real_root not in real.parents:
        raise ArtifactError(f"{where}: got {short_repr(rel)}; it resolves to {real}, outside {real_root} (symlink)")
    return path


def _digest_error(path: Path, got: str, want: str, recorded: str, algo: str = "sha256") -> ArtifactError:
    return ArtifactError(f"{path}: {algo} {got[:16]}... does not match {want[:16]}... recorded in {recorded}: "
                         "the file is corrupt or was replaced; rebuild / re-convert it")


def verify_bytes(path: Path, data: bytes, want: str, recorded: str, algo: str = "sha256") -> None:
    """`data` (the file's content, already read) against its recorded digest."""
    got = hashlib.new(algo, data).hexdigest()
    if got != want:
        raise _digest_error(path, got, want, recorded, algo)


def verify_file(path: Path, want: str, nbytes: int | None, recorded: str) -> Path:
    """`path` against its recorded SHA-256 (and size) before it is loaded; ArtifactError in one
    line naming the file, both digests' prefixes and where the expected one is recorded."""
    if not path.is_file():
        raise ArtifactError(f"{path}: missing (listed in {recorded})")
    size = path.stat().st_size
    if nbytes is not None and size != nbytes:
        raise ArtifactError(f"{path}: {size} bytes, {recorded} records {nbytes}: the file is corrupt or was replaced; "
                            "rebuild / re-convert it")
    got = sha256_file(path)
    if got != want:
        raise _digest_error(path, got, want, recorded)
    return path


def verified(artifact: Path, manifest: dict[str, Any], rel: Any, field: str) -> Path:
    """An artifact file named by the manifest (`field` says where), confined to the artifact and
    checked against the SHA-256 its manifest's `files` records."""
    artifact = Path(artifact)
    where = f"{artifact / MANIFEST}: field '{field}'"
    path = confined(artifact, rel, where)
    record = manifest.get("files", {}).get(rel)
    if record is None:
        raise ArtifactError(f"{where}: {short_repr(rel)} has no SHA-256 in field 'files'; rebuild the artifact")
    if not path.is_file():
        raise ArtifactError(f"{artifact}: {'library ' if field == 'library' else ''}{rel} missing; rebuild the artifact")
    return verify_file(path, record["sha256"], record["bytes"], f"{artifact / MANIFEST}")


def verified_library(artifact: Path, manifest: dict[str, Any]) -> Path:
    """The artifact's library, verified before it is loaded or uploaded: its digest (`verified`),
    then its bytes against the manifest (library.check_library_file: container and machine of the
    target, the functions, `_metadata`'s quantization and parameters)."""
    from .library import check_library_file

    path = verified(artifact, manifest, manifest["library"], "library")
    check_library_file(path, manifest)
    return path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_digests(root: Path, exclude: tuple[str, ...] = (MANIFEST,), skip_dirs: tuple[str, ...] = (),
                 skip_hidden: bool = False) -> dict[str, dict[str, Any]]:
    """{relative path: {"sha256", "bytes"}} of every regular file under `root`, sorted by path
    (`exclude`: relative paths left out, e.g. the manifest that holds this map; `skip_dirs`:
    relative folders left out; `skip_hidden`: leave out names starting with a dot)."""
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if (rel_dir / d).as_posix() not in skip_dirs
                             and not (skip_hidden and d.startswith(".")))
        filenames = [f for f in filenames if not (skip_hidden and f.startswith("."))]
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel in exclude or path.is_symlink() or not path.is_file():
                continue
            out[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return dict(sorted(out.items()))


def model_config_of(artifact: str | Path):
    """The model config an artifact was built from (its runtime config keeps all of it)."""
    from .config import parse_model_config

    path = Path(artifact) / RUNTIME_CONFIG
    if not path.is_file():
        raise ArtifactError(f"{artifact}: {RUNTIME_CONFIG} missing; rebuild the artifact")
    return parse_model_config(json.loads(path.read_text())["model_config"], str(path))
