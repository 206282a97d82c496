"""Content-addressed cell cache.

A cell's key is the SHA-256 of everything its build depends on (model config, quantization,
resolved target, the source under pipeline/ and schedules/, the target's tuning database, tvm /
tvm-ffi / mlcpipe versions). `<key>/artifact/` holds the artifact, `<key>/checks-<checks key>/`
its check results; both are written as a temp dir + one exchange (leftovers of killed runs removed by the next) and trusted only when every file
matches its SHA-256. Details: docs/nightly.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..artifact import CACHE_MARKER, read_manifest, remove_leftovers, sha256_file
from ..build import package_versions
from ..config import REPO_ROOT, ModelConfig
from ..targets import TargetSpec
from .verify import verify_artifact, verify_files

CODE_DIRS = ("pipeline", "schedules")


def _versions() -> dict[str, str]:
    """The package versions a build records (without the tvm module's own version string,
    which the distribution versions already pin)."""
    return {k: v for k, v in package_versions().items() if k != "tvm"}


def code_digest(root: Path = REPO_ROOT) -> str:
    """SHA-256 over (path, content) of every file under pipeline/ and schedules/ (no bytecode)."""
    digest = hashlib.sha256()
    for top in CODE_DIRS:
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = Path(dirpath) / name
                digest.update(path.relative_to(root).as_posix().encode() + b"\0")
                digest.update(sha256_file(path).encode() + b"\n")
    return digest.hexdigest()


def tuning_db(target_name: str) -> Path:
    """The tuning database a build for `target_name` reads (hashed only if it exists)."""
    from ..tuning import default_db_path

    return default_db_path(target_name)


def cache_inputs(config: ModelConfig, quant: str, target: TargetSpec, code: str | None = None) -> dict[str, Any]:
    """Everything a cell's build depends on (what the key hashes; kept in the manifest)."""
    db = tuning_db(target.name)
    return {
        "model_config": {"file": Path(config.source).name, "sha256": sha256_file(Path(config.source))},
        "quantization": quant,
        "target": {"preset": target.name, "target": target.target, "options": target.options},
        "code_sha256": code or code_digest(),
        "tuning_db": {"file": str(db), "sha256": sha256_file(db)} if db.is_file() else None,
        "versions": _versions(),
    }


def digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def checks_key(key: str, checks: dict[str, Any]) -> str:
    """Key of a cell's check results: its artifact key plus the check settings."""
    return digest({"artifact": key, "checks": {k: v for k, v in checks.items() if k != "reproducibility"}})[:16]


def artifact_entry(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / key / "artifact"


def checks_entry(cache_dir: Path, key: str, ckey: str) -> Path:
    return Path(cache_dir) / key / f"checks-{ckey}"


def lookup_artifact(cache_dir: Path, key: str) -> Path | None:
    """The cached artifact for `key` if it is complete and intact, else None."""
    path = artifact_entry(cache_dir, key)
    if not (path / "manifest.json").is_file():
        return None
    try:
        if read_manifest(path).get("cache_key") != key:
            return None
    except ValueError:
        return None
    return None if verify_artifact(path) else path


CHECKS_INDEX = "checks.json"  # in a checks entry: results + SHA-256 of each result file


def lookup_checks(cache_dir: Path, key: str, ckey: str) -> Path | None:
    """The cached check results for (`key`, `ckey`) if complete and intact, else None."""
    path = checks_entry(cache_dir, key, ckey)
    index = path / CHECKS_INDEX
    if not index.is_file():
        return None
    try:
        data = json.loads(index.read_text())
    except json.JSONDecodeError:
        return None
    if data.get("checks_key") != ckey or verify_files(path, data.get("files", {}), exclude=(CHECKS_INDEX,)):
        return None
    return path


class CacheLock:
    """Held (shared) by every nightly run using a cache for as long as it runs; the OS drops it when
    the process dies, even by SIGKILL. On entry the cache gets its marker (`.mlcpipe-cache`) and
    the temp dirs of killed runs (dead pids in their names) are removed, at the top and in entries."""

    def __init__(self, cache_dir: Path) -> None:
        self.path = Path(cache_dir) / ".lock"
        self._file = None

    def __enter__(self) -> "CacheLock":
        import fcntl

        root = self.path.parent
        root.mkdir(parents=True, exist_ok=True)
        if not (root / CACHE_MARKER).is_file():
            (root / CACHE_MARKER).write_text("mlcpipe nightly cell cache\n")
        self._file = open(self.path, "a")  # noqa: SIM115 - held until __exit__
        fcntl.flock(self._file, fcntl.LOCK_SH)
        remove_stale_temp_dirs(root)
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def remove_stale_temp_dirs(root: Path) -> None:
    """Remove what killed runs left in the cache (`artifact.remove_leftovers`: only
    `.<name>.{tmp,old,work}-<pid>-<hex>` of dead pids), at the top and inside each entry."""
    root = Path(root)
    for directory in [root, *(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))]:
        remove_leftovers(directory)
