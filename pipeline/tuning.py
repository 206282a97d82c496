"""The tuning database: which schedule rule and knobs each kernel gets on a target.

A JSON file (default `artifacts/tuning/<target name>.json`, `$MLCPIPE_TUNING_DB` overrides):
records keyed by the target's JSON, then by kernel signature (schedules.signature; names ignored,
so a record serves every model with that kernel): the rule, its knobs, the timings and the
candidates tried, or "rule": "MetaSchedule" with its trace. `mlcpipe tune` writes it, `mlcpipe
build` reads it. The format: docs/tuning.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .artifact import sha256_file
from .errors import ArtifactError
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
    def __init__(self, path: Path, records: dict[str, dict[str, dict]] | None = None):
        self.path = Path(path)
        self.records = records or {}

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
        return cls(path, records)

    def table(self, target: dict[str, Any]) -> dict[str, dict]:
        """signature -> record for one target (empty when never tuned there)."""
        return self.records.get(target_key(target), {})

    def put(self, target: dict[str, Any], signature: str, record: dict[str, Any]) -> None:
        self.records.setdefault(target_key(target), {})[signature] = record

    def save(self) -> None:
        """Write atomically (temp file + rename): a crash never leaves half a database."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"schema": SCHEMA, "version": VERSION, "records": self.records}, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path)

    def digest(self) -> str | None:
        return sha256_file(self.path) if self.path.exists() else None
