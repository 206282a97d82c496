"""The tuning database: which schedule rule and knobs each kernel gets on a target.

A JSON file (default `artifacts/tuning/<target name>.json`, `$MLCPIPE_TUNING_DB` overrides):

    {"schema": "mlcpipe-tuning", "version": 1,
     "records": {"<target key>": {"<kernel signature>": {
         "kernel": "fused_dequantize2_NT_matmul2_cast2", "rule": "DecodeGEMVQ4",
         "knobs": {"lanes": 16, "rows": 4}, "ms": 0.61, "default_ms": 0.74,
         "sizes": {"seq_len": 1}, "candidates": [{"knobs": {...}, "ms": ...}, ...]}}}}

`mlcpipe tune --tuner metaschedule` writes records with "rule": "MetaSchedule", empty knobs and
"trace": the best schedule's MetaSchedule trace as TVM JSON (schedules/trace_replay.py).

The target key is the target's JSON (kind, mcpu/arch, ...), so one file can hold several CPUs;
the kernel signature (schedules.signature) ignores names, so a record serves every model that
has the same kernel. `mlcpipe tune` writes it (pipeline/tune.py); `mlcpipe build` reads it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .artifact import ArtifactError, remove_leftovers, sha256_file, temp_sibling, write_lock
from .config import REPO_ROOT

SCHEMA, VERSION = "mlcpipe-tuning", 1


def default_db_path(target_name: str) -> Path:
    override = os.environ.get("MLCPIPE_TUNING_DB")
    if override:
        return Path(override)
    root = Path(os.environ.get("MLCPIPE_ARTIFACTS", REPO_ROOT / "artifacts"))
    return root / "tuning" / f"{target_name}.json"


def target_key(target: dict[str, Any]) -> str:
    """The parts of a target dict that change generated code, as canonical JSON."""
    keep = {k: v for k, v in target.items() if k in ("kind", "mcpu", "mtriple", "arch", "mattr", "tag")}
    return json.dumps(keep, sort_keys=True, separators=(",", ":"))


class TuningDB:
    """Records in memory; `put` marks what this process changed, `save` merges those into the
    file as it is then (under its lock), so concurrent tuners on one file keep each other's records."""

    def __init__(self, path: Path, records: dict[str, dict[str, dict]] | None = None):
        self.path = Path(path)
        self.records = records or {}
        self._changed = {(key, sig) for key, table in self.records.items() for sig in table}

    @classmethod
    def load(cls, path: Path) -> "TuningDB":
        path = Path(path)
        if not path.exists():
            return cls(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ArtifactError(f"{path}: not a tuning database (bad JSON at line {exc.lineno}: {exc.msg})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ArtifactError(f"{path}: not a tuning database (schema field must be '{SCHEMA}')")
        if data.get("version") != VERSION:
            raise ArtifactError(f"{path}: tuning database version {data.get('version')!r} not supported (allowed: {VERSION})")
        records = data.get("records")
        if not isinstance(records, dict):
            raise ArtifactError(f"{path}: field 'records' must be an object")
        for key, table in records.items():
            for sig, rec in table.items():
                if not isinstance(rec, dict) or not isinstance(rec.get("rule"), str) or not isinstance(rec.get("knobs"), dict):
                    raise ArtifactError(f"{path}: record {sig} of target {key} needs 'rule' (string) and 'knobs' (object)")
                if rec["rule"] == "MetaSchedule" and not isinstance(rec.get("trace"), str):
                    raise ArtifactError(f"{path}: record {sig} of target {key} has rule 'MetaSchedule' but no 'trace' (a JSON string)")
        db = cls(path)
        db.records = records
        return db

    def table(self, target: dict[str, Any]) -> dict[str, dict]:
        """signature -> record for one target (empty when never tuned there)."""
        return self.records.get(target_key(target), {})

    def put(self, target: dict[str, Any], signature: str, record: dict[str, Any]) -> None:
        self.records.setdefault(target_key(target), {})[signature] = record
        self._changed.add((target_key(target), signature))

    def save(self) -> None:
        """Under the file's lock (waiting for another writer): re-read it, apply this process's
        `put`s, write a temp file and rename it over (a crash never leaves half a database)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with write_lock(self.path, wait=True):
            remove_leftovers(self.path.parent, {self.path.name})
            merged = TuningDB.load(self.path).records
            for key, sig in sorted(self._changed):
                merged.setdefault(key, {})[sig] = self.records[key][sig]
            tmp = temp_sibling(self.path)
            try:
                tmp.write_text(json.dumps({"schema": SCHEMA, "version": VERSION, "records": merged}, indent=1, sort_keys=True) + "\n")
                os.replace(tmp, self.path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        self.records, self._changed = merged, set()

    def digest(self) -> str | None:
        return sha256_file(self.path) if self.path.exists() else None
