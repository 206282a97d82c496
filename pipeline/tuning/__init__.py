"""The tuning database: which schedule rule and knobs each kernel gets on a target.

A JSON file (default `artifacts/tuning/<target name>.json`, `$MLCPIPE_TUNING_DB` overrides):
records keyed by the target's JSON, then by kernel signature (schedules.signature; names ignored,
so a record serves every model with that kernel): the rule, its knobs, the timings and the
candidates tried, or "rule": "MetaSchedule" with its trace. `mlcpipe tune` writes it, `mlcpipe
build` reads it. The format: docs/tuning.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ..artifact import remove_leftovers, sha256_file, write_file_atomic, write_lock
from ..config import artifacts_root, short_repr, short_text
from ..errors import ArtifactError, ConfigError

SCHEMA, VERSION = "mlcpipe-tuning", 1
TUNE_FORMAT = "mlcpipe-remote-tune/1"  # the index of knob candidates timed elsewhere (tuning/remote.py)


TUNING_DB_ENV = "MLCPIPE_TUNING_DB"


def default_db_path(target_name: str) -> Path:
    override = os.environ.get(TUNING_DB_ENV)
    if override:
        return Path(override)
    return artifacts_root() / "tuning" / f"{target_name}.json"


def check_db_to_read() -> None:
    """A database named by $MLCPIPE_TUNING_DB for a build to read must exist (a typo would build
    untuned without a word); `tune` creates it instead."""
    override = os.environ.get(TUNING_DB_ENV)
    if override and not Path(override).is_file():
        raise ConfigError(f"environment {TUNING_DB_ENV}={override!r}: no such file (unset it, or run `mlcpipe tune` to create it)")


def outputs_differ(got, want, tolerance: float) -> str | None:
    """None when two schedules' outputs agree within `tolerance` relative to the output's scale
    (2% for f16 models), else how far apart they are."""
    import numpy as np

    scale = float(np.abs(want).max()) or 1.0
    if np.allclose(got, want, rtol=tolerance, atol=tolerance * scale):
        return None
    return f"max abs err {float(np.abs(got - want).max()):.3g}"


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
        """The database at `path` (empty when there is none), every record checked: ArtifactError
        in one line naming the file, the record and the field otherwise."""
        path = Path(path)
        if not path.exists():
            return cls(path)
        if not path.is_file():
            raise ArtifactError(f"{path}: not a tuning database (not a file)")
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except json.JSONDecodeError as exc:
            raise ArtifactError(f"{path}: not a tuning database (bad JSON at line {exc.lineno}: {exc.msg})") from None
        except (UnicodeDecodeError, RecursionError, OSError) as exc:
            raise ArtifactError(f"{path}: not a tuning database ({short_text(exc, 120)})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ArtifactError(f"{path}: not a tuning database (schema field must be '{SCHEMA}')")
        if data.get("version") != VERSION:
            raise ArtifactError(f"{path}: tuning database version {short_repr(data.get('version'))} not supported (allowed: {VERSION})")
        records = data.get("records")
        if not isinstance(records, dict):
            raise ArtifactError(f"{path}: field 'records' must be an object")
        for key, table in records.items():
            if not isinstance(table, dict):
                raise ArtifactError(f"{path}: field 'records.{short_text(key)}': got {short_repr(table)}; expected an object "
                                    "{kernel signature: record}")
            for sig, rec in table.items():
                where = f"{path}: record {short_text(sig)} of target {short_text(key)}"
                if not isinstance(rec, dict) or not isinstance(rec.get("rule"), str) or not isinstance(rec.get("knobs"), dict):
                    raise ArtifactError(f"{where} needs 'rule' (string) and 'knobs' (object)")
                if rec["rule"] == "MetaSchedule" and not isinstance(rec.get("trace"), str):
                    raise ArtifactError(f"{where} has rule 'MetaSchedule' but no 'trace' (a JSON string)")
                for knob, value in rec["knobs"].items():
                    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                        raise ArtifactError(f"{where}: knob {short_text(knob)}: got {short_repr(value)}; "
                                            "expected an integer >= 0 (or null: the rule's choice)")
        db = cls(path)
        db.records = records
        return db

    def table(self, target: dict[str, Any]) -> dict[str, dict]:
        """signature -> record for one target (empty when never tuned there); each record's rule
        must be one of the target's rules (or MetaSchedule) and its knobs fields of that rule."""
        table = self.records.get(target_key(target), {})
        if table:
            from mlcpipe.schedules import RULES, rule_by_name

            kind = target.get("kind")
            for sig, rec in table.items():
                if rec["rule"] == "MetaSchedule":
                    continue
                rule = rule_by_name(kind, rec["rule"]) if kind in RULES else None
                where = f"{self.path}: record {short_text(sig)} of target {target_key(target)}"
                if rule is None:
                    names = sorted({type(r).__name__ for r in RULES.get(kind, [])} | {"MetaSchedule"})
                    raise ArtifactError(f"{where}: rule {short_repr(rec['rule'])} unknown; allowed on {kind}: {', '.join(names)}")
                knobs = sorted(f.name for f in dataclasses.fields(rule)) if dataclasses.is_dataclass(rule) else []
                unknown = [k for k in rec["knobs"] if k not in knobs]
                if unknown:
                    raise ArtifactError(f"{where}: knob {short_repr(unknown[0])} is not a knob of {rec['rule']}; allowed: {knobs}")
        return table

    def put(self, target: dict[str, Any], signature: str, record: dict[str, Any]) -> None:
        self.records.setdefault(target_key(target), {})[signature] = record
        self._changed.add((target_key(target), signature))

    def save(self) -> None:
        """Under the file's lock (waiting for another writer): re-read it, apply this process's
        `put`s, write it atomically (artifact.write_file_atomic: a crash never leaves half a database)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        real = Path(os.path.realpath(self.path))  # a linked database: its lock and temp files beside the file itself
        with write_lock(real, wait=True):
            remove_leftovers(real.parent, {real.name})
            merged = TuningDB.load(real).records
            for key, sig in sorted(self._changed):
                merged.setdefault(key, {})[sig] = self.records[key][sig]
            write_file_atomic(real, json.dumps({"schema": SCHEMA, "version": VERSION, "records": merged}, indent=1, sort_keys=True) + "\n")
        self.records, self._changed = merged, set()

    def digest(self) -> str | None:
        return sha256_file(self.path) if self.path.exists() else None


def from_remote_timings(index: dict, timed: dict[str, dict]) -> dict:
    """A tuning database (pipeline/tuning's format) from `index` and the device's results:
    kernel -> {"candidates": [{"function", "us" or None, "error" or None}, ...]}; per kernel the
    fastest candidate whose output matched the defaults' wins."""
    table = {}
    for kernel in index["kernels"]:
        result = timed.get(kernel["kernel"])
        if not result:
            continue
        by_function = {c["function"]: c for c in result["candidates"]}
        tried = [{**c, "us": by_function.get(c["function"], {}).get("us"), "error": by_function.get(c["function"], {}).get("error")}
                 for c in kernel["candidates"]]
        timed_ok = [c for c in tried if c["us"] is not None and c["error"] is None]
        if not timed_ok:
            continue
        best = min(timed_ok, key=lambda c: c["us"])
        default = tried[0]
        table[kernel["signature"]] = {
            "kernel": kernel["kernel"], "rule": best["rule"], "knobs": best["knobs"], "ms": round(best["us"] / 1e3, 5),
            "default_rule": kernel["default_rule"],
            "default_ms": None if default["us"] is None else round(default["us"] / 1e3, 5), "sizes": {},
            "timed_on": result.get("device", ""), "method": result.get("method", ""),
            "candidates": [{"rule": c["rule"], "knobs": c["knobs"], "ms": None if c["us"] is None else round(c["us"] / 1e3, 5),
                            "error": c["error"]} for c in tried],
        }
    return {"schema": SCHEMA, "version": VERSION, "records": {index["target_key"]: table}}
