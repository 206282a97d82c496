"""`mlcpipe verify DIR`: re-check the SHA-256 of every file of a single artifact (its manifest's
`files`) or of a nightly directory (index.json's `files` for everything outside the artifacts, and
each artifact's own manifest, whose SHA-256 index.json holds). Each problem is one line naming
the file: missing, size or checksum mismatch, or a file no manifest lists."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from ..artifact import MANIFEST, confined, owned_files, owner_kind, sha256_file
from ..config import short_repr
from ..errors import ArtifactError

INDEX = "index.json"


@dataclasses.dataclass
class Verification:
    path: Path
    kind: str  # "artifact" or "nightly"
    files: int  # files checked
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_files(root: Path, expected: dict[str, dict], exclude: tuple[str, ...] = (), skip_under: tuple[str, ...] = (),
                 skip_hidden: bool = False) -> list[str]:
    """Problems of `root` against {relative path: {"sha256", "bytes"}}: missing, changed and
    unlisted files (`exclude`: paths not checked; `skip_under`: folders covered elsewhere;
    `skip_hidden`: dot-names, e.g. a running nightly's temp dirs, are not "unlisted")."""
    root = Path(root)
    problems = []
    for rel, want in sorted(expected.items()):
        try:  # a listed path must stay inside `root` (no '..', absolute paths or escaping symlinks)
            path = confined(root, rel, f"{root}: listed file")
        except ArtifactError as exc:
            problems.append(str(exc))
            continue
        if not isinstance(want, dict):
            problems.append(f"{path}: listed with {short_repr(want)}; expected {{sha256, bytes}}")
            continue
        if not path.is_file():
            problems.append(f"{path}: missing (listed with sha256 {want.get('sha256', '?')[:16]}…)")
            continue
        size = path.stat().st_size
        if "bytes" in want and size != want["bytes"]:
            problems.append(f"{path}: size {size} bytes, manifest says {want['bytes']}")
            continue
        got = sha256_file(path)
        if got != want.get("sha256"):
            problems.append(f"{path}: sha256 {got[:16]}… does not match the manifest's {str(want.get('sha256'))[:16]}…")
    present = _listed(root, exclude, skip_hidden) if root.is_dir() else set()
    for rel in sorted(present - set(expected)):
        if not any(rel.startswith(folder.rstrip("/") + "/") for folder in skip_under):
            problems.append(f"{root / rel}: not listed in the manifest (unexpected file)")
    return problems


def _listed(root: Path, exclude: tuple[str, ...], skip_hidden: bool) -> set[str]:
    """Relative paths of every file (and symlink) under `root`, but `exclude`."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        if skip_hidden:
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            filenames = [f for f in filenames if not f.startswith(".")]
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel not in exclude:
                out.add(rel)
    return out


def _load(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable {what}: {exc}") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: corrupt {what}: expected a JSON object")
    return data


def verify_artifact(artifact: Path) -> list[str]:
    """Problems of one artifact directory against its manifest's `files` map."""
    artifact = Path(artifact)
    manifest_path = artifact / MANIFEST
    if not manifest_path.is_file():
        return [f"{manifest_path}: missing"]
    try:
        manifest = _load(manifest_path, "manifest")
    except ArtifactError as exc:
        return [str(exc)]
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return [f"{manifest_path}: has no 'files' checksums (built before mlcpipe recorded them; rebuild it)"]
    params = artifact / "params"  # weights converted into it after the build: checked against their own tensor cache
    if not any(str(rel).startswith("params/") for rel in files) and owner_kind(params) == "weights":
        return verify_files(artifact, files, exclude=(MANIFEST,), skip_under=("params",)) + verify_weights(params)
    return verify_files(artifact, files, exclude=(MANIFEST,))


def verify_weights(weights: Path) -> list[str]:
    """Problems of an mlcpipe weights directory: each shard's size and digest against its tensor
    cache, and files it does not account for."""
    from ..tensor_cache import read_tensor_cache
    from ..weights import read_shard

    try:
        cache_path, shards = read_tensor_cache(weights)
    except ArtifactError as exc:
        return [str(exc)]
    problems = []
    for shard in shards:
        try:
            read_shard(weights, cache_path, shard)
        except ArtifactError as exc:
            problems.append(str(exc))
    owned = owned_files(weights, "weights") or set()
    problems += [f"{weights / rel}: not listed in {cache_path.name} (unexpected file)" for rel in sorted(_listed(weights, (), False) - owned)]
    return problems


def _artifacts_of(index: dict) -> list[tuple[str, dict]]:
    return [(c["artifact"], c) for c in index.get("cells", []) if c.get("artifact")]


def verify_nightly(root: Path) -> tuple[int, list[str]]:
    """(files checked, problems) of a nightly output directory."""
    root = Path(root)
    index = _load(root / INDEX, "nightly index")
    files = index.get("files")
    if not isinstance(files, dict):
        return 0, [f"{root / INDEX}: has no 'files' checksums"]
    artifacts = _artifacts_of(index)
    problems = verify_files(root, files, exclude=(INDEX,), skip_under=tuple(a for a, _ in artifacts), skip_hidden=True)
    count = len(files)
    for rel, cell in artifacts:
        path = root / rel
        manifest = path / MANIFEST
        want = cell.get("manifest_sha256")
        if not manifest.is_file():
            problems.append(f"{manifest}: missing (cell {cell.get('cell')})")
            continue
        if want and sha256_file(manifest) != want:
            problems.append(f"{manifest}: sha256 does not match index.json (manifest changed after the nightly)")
        found = verify_artifact(path)
        problems.extend(found)
        try:
            count += 1 + len(_load(manifest, "manifest").get("files", {}))
        except ArtifactError:
            pass
    return count, problems


def verify(path: str | Path) -> Verification:
    """Verify a nightly directory (index.json) or a single artifact (manifest.json)."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path}: " + ("not a directory (give the nightly directory or the artifact directory)" if path.exists()
                                           else "no such directory"))
    if (path / INDEX).is_file():
        count, problems = verify_nightly(path)
        return Verification(path, "nightly", count, problems)
    if (path / MANIFEST).is_file():
        manifest = _load(path / MANIFEST, "manifest")
        return Verification(path, "artifact", len(manifest.get("files") or {}), verify_artifact(path))
    if (path / "result.json").is_file() and (path / "artifact" / MANIFEST).is_file():  # one cell of a nightly
        raise ArtifactError(f"{path}: a nightly cell, not a nightly directory ({INDEX}) or an artifact ({MANIFEST}); "
                            f"verify the nightly {path.resolve().parent} or the cell's artifact {path / 'artifact'}")
    raise ArtifactError(f"{path}: neither a nightly directory ({INDEX}) nor an artifact ({MANIFEST})")
