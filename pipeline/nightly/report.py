"""The nightly's published summary: index.json (every cell's record plus the SHA-256 of every file
outside the artifacts), SUMMARY.md, and with a previous nightly a regression table per cell
(per-kernel time change with the profiler's Mann-Whitney U verdicts, artifact size change,
new/removed kernels) in SUMMARY.md, index.json and `regressions/<cell>.md` (the full A/B report)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from ..artifact import file_digests, read_manifest, sha256_file, write_file_atomic, write_json
from ..profiler.compare import compare, drift_pct, gfm_table, kernel_rows
from ..profiler.schema import load_profile
from .matrix import Matrix
from .verify import INDEX, verify_artifact

FORMAT = "mlcpipe-nightly/1"
SUMMARY = "SUMMARY.md"
RESULT = "result.json"
FLAGGED = ("regression", "improvement", "new", "removed")


def load_records(out: Path, matrix: Matrix) -> list[dict]:
    """Every matrix cell's record from `<out>/<cell>/result.json` (merging per-cell CI jobs); a
    cell with no result is "missing", one whose artifact no longer verifies is "failed"."""
    records = []
    for cell in matrix.cells:
        path = Path(out) / cell.id / RESULT
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            records.append({"cell": cell.id, "model": cell.model, "quantization": cell.quant, "target": cell.target.name,
                            "status": "missing", "error": f"no {cell.id}/{RESULT}: the cell was not run (or its job failed)"})
            continue
        if record.get("status") == "passed":
            problems = verify_artifact(Path(out) / record["artifact"])
            if problems:
                record = {**record, "status": "failed", "error": f"artifact does not verify: {problems[0]}"}
        records.append(record)
    return records


# ---- regressions ------------------------------------------------------------------------------

def _kernel_names(artifact: Path) -> set[str] | None:
    try:
        return {k["name"] for k in read_manifest(artifact).get("kernels", [])}
    except ValueError:  # the previous nightly's artifact is gone or corrupt: no kernel diff
        return None


def _pct(new, old) -> float | None:
    return None if not old or new is None else round(100.0 * (new - old) / old, 2)


def cell_regression(cur_dir: Path, prev_dir: Path, cur: dict, prev: dict) -> dict[str, Any]:
    """Size change, new/removed kernels and per-kernel time change of one cell against the previous nightly."""
    out: dict[str, Any] = {"cell": cur["cell"]}
    sizes = {}
    for what in ("library", "kernel_source", "total"):
        a, b = (prev.get("sizes") or {}).get(what), (cur.get("sizes") or {}).get(what)
        if a is not None or b is not None:
            sizes[what] = {"previous": a, "current": b, "change_pct": _pct(b, a)}
    out["sizes"] = sizes
    kernels_a = _kernel_names(prev_dir / prev["artifact"])
    kernels_b = _kernel_names(cur_dir / cur["artifact"])
    known = kernels_a is not None and kernels_b is not None
    out["new_kernels"] = sorted(kernels_b - kernels_a) if known else None
    out["removed_kernels"] = sorted(kernels_a - kernels_b) if known else None
    out["kernel_times"] = None
    pa, pb = prev_dir / cur["cell"] / "profile.json", cur_dir / cur["cell"] / "profile.json"
    if pa.is_file() and pb.is_file():
        a, b = load_profile(pa), load_profile(pb)
        if _machine(a) != _machine(b):  # another CPU or GPU (CI runners vary): its timings are no regression
            out["kernel_times"] = {"not_compared": f"the previous profile ran on {_machine(a)}, this one on {_machine(b)}"}
            (cur_dir / "regressions" / f"{cur['cell']}.md").unlink(missing_ok=True)  # a report-only rerun's stale A/B
            return out
        rows = kernel_rows(a, b)
        out["kernel_times"] = {
            "drift_pct": round(drift_pct(rows), 2),
            "verdicts": {v: sum(1 for r in rows if r["verdict"] == v) for v in ("regression", "improvement", "noise", "unchanged", "new", "removed")},
            "rows": [{k: r[k] for k in ("kernel", "phase", "role", "calls_a", "calls_b", "avg_a", "avg_b", "change_pct", "p", "verdict")}
                     for r in rows],
        }
        report = cur_dir / "regressions" / f"{cur['cell']}.md"
        report.parent.mkdir(exist_ok=True)
        write_file_atomic(report, compare(a, b, name_a=f"previous ({prev_dir.name})", name_b=f"current ({cur_dir.name})") + "\n")
        out["report"] = f"regressions/{cur['cell']}.md"
    return out


def _machine(profile: dict) -> str:
    """Where a profile ran: the device (CPU or GPU name, threads) and the compiled target."""
    target = profile.get("target") or {}
    return f"{profile.get('device')} ({', '.join(f'{k} {v}' for k, v in sorted(target.items()) if isinstance(v, str))})"


def regressions(cur_dir: Path, prev_dir: Path, records: list[dict]) -> dict[str, Any]:
    prev_index = json.loads((Path(prev_dir) / INDEX).read_text())
    previous = {r["cell"]: r for r in prev_index.get("cells", [])}
    cells = []
    for rec in records:
        old = previous.get(rec["cell"])
        # every cell with an artifact in both: one that failed a check (e.g. reproducibility) still
        # has sizes, kernels and maybe a profile to compare
        if not rec.get("artifact") or not old or not old.get("artifact"):
            continue
        cells.append(cell_regression(Path(cur_dir), Path(prev_dir), rec, old))
    return {"previous": str(prev_dir), "new_cells": sorted({r["cell"] for r in records} - set(previous)),
            "removed_cells": sorted(set(previous) - {r["cell"] for r in records}), "cells": cells}


# ---- markdown -----------------------------------------------------------------------------------

def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _size(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return str(n)


def _change(value) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _cell_row(r: dict) -> list[str]:
    conf = r.get("conformance") or {}
    prof = (r.get("profile") or {}).get("headline") or {}
    repro = r.get("reproducibility")
    sizes = r.get("sizes") or {}
    status = r["status"] + (" (cached)" if r.get("cached") else "")
    return [
        r["cell"], status, _fmt(r.get("build_seconds")), _size(sizes.get("library")), _size(sizes.get("total")),
        _fmt(r.get("kernels")), conf.get("status", "-"),
        _fmt(prof.get("prefill_tok_s")), _fmt(prof.get("decode_ms_per_token_p50"), 2), _fmt(prof.get("decode_tok_s")),
        "-" if repro is None else ("identical" if repro["identical"] else "DIFFERS: " + ", ".join(sorted(repro["differs"]))),
    ]


def summary_markdown(index: dict) -> str:
    s = index["summary"]
    lines = [f"# Nightly {Path(index['out']).name}: {s['passed']}/{s['cells']} cells passed", ""]
    lines.append(f"Matrix `{index['matrix']['file']}`; {s['cached']} cells reused from the cache; "
                 f"{s['failed']} failed; {s['missing']} missing" + (f"; {s['interrupted']} interrupted (Ctrl-C; they keep "
                 "their previous result)" if s.get("interrupted") else "") + f". Generated {index['created']}.")
    lines.append("")
    headers = ["Cell", "Status", "Build s", "Library", "Artifact", "Kernels", "Conformance",
               "Prefill tok/s", "Decode ms/tok", "Decode tok/s", "Reproducible"]
    lines.append(gfm_table(headers, [_cell_row(r) for r in index["cells"]], ["l", "l"] + ["r"] * 4 + ["l"] + ["r"] * 3 + ["l"]))
    failed = [r for r in index["cells"] if r["status"] != "passed"]
    if failed:
        lines += ["", "## Failures", ""]
        for r in failed:
            lines.append(f"### {r['cell']}: {r['status']}")
            lines.append("")
            lines.append(f"{r.get('error')}" + (f" (log: `{r['log']}`)" if r.get("log") else ""))
            if r.get("log_tail"):
                lines += ["", "```", *r["log_tail"], "```"]
            lines.append("")
    notes = [r for r in index["cells"] if r.get("reproducibility") and not r["reproducibility"]["identical"]]
    if notes:
        lines += ["", "## Not reproducible", ""]
        for r in notes:
            for path, why in sorted(r["reproducibility"]["differs"].items()):
                lines.append(f"- `{r['cell']}/artifact/{path}`: {why}")
    if index.get("regressions"):
        lines += ["", regressions_markdown(index["regressions"])]
    return "\n".join(lines).rstrip() + "\n"


def regressions_markdown(reg: dict) -> str:
    lines = [f"## Regressions against `{reg['previous']}`", ""]
    if reg["new_cells"] or reg["removed_cells"]:
        lines.append(f"New cells: {reg['new_cells'] or '-'}; removed cells: {reg['removed_cells'] or '-'}.")
        lines.append("")
    body = []
    for c in reg["cells"]:
        kt = c.get("kernel_times") or {}
        if kt.get("not_compared"):
            kt = {}
        verdicts = kt.get("verdicts") or {}
        size = c["sizes"].get("library") or {}
        total = c["sizes"].get("total") or {}
        body.append([c["cell"], _change(size.get("change_pct")), _change(total.get("change_pct")),
                     ", ".join(c["new_kernels"] or []) or "-", ", ".join(c["removed_kernels"] or []) or "-",
                     str(verdicts.get("regression", 0)) if kt else "-", str(verdicts.get("improvement", 0)) if kt else "-",
                     _change(kt.get("drift_pct")) if kt else "-"])
    if not body:
        return "\n".join(lines + ["No cell passed in both nightlies."])
    lines.append(gfm_table(["Cell", "Library size", "Artifact size", "New kernels", "Removed kernels", "Kernel regressions",
                            "Kernel improvements", "Common drift"], body, ["l", "r", "r", "l", "l", "r", "r", "r"]))
    flagged = [(c["cell"], r) for c in reg["cells"] for r in ((c.get("kernel_times") or {}).get("rows") or []) if r["verdict"] in FLAGGED]
    lines += ["", "### Per-kernel time changes (Mann-Whitney U, Bonferroni; verdicts as `mlcpipe profile compare`)", ""]
    if flagged:
        rows = [[cell, r["kernel"], r["phase"], _fmt(r["avg_a"], 4), _fmt(r["avg_b"], 4), _change(r["change_pct"]),
                 "-" if r["p"] is None else f"{r['p']:.2g}", r["verdict"]] for cell, r in flagged]
        lines.append(gfm_table(["Cell", "Kernel", "Phase", "Prev avg ms", "Avg ms", "Change", "p", "Verdict"], rows,
                               ["l", "l", "l", "r", "r", "r", "r", "l"]))
    else:
        lines.append("No kernel changed beyond run-to-run noise.")
    other = [(c["cell"], c["kernel_times"]["not_compared"]) for c in reg["cells"] if (c.get("kernel_times") or {}).get("not_compared")]
    if other:
        lines += ["", "Kernel times not compared (another machine): " + "; ".join(f"`{cell}`: {why}" for cell, why in other) + "."]
    reports = [c["report"] for c in reg["cells"] if c.get("report")]
    if reports:
        lines += ["", "Full A/B reports: " + ", ".join(f"`{p}`" for p in reports) + "."]
    return "\n".join(lines)


# ---- index ----------------------------------------------------------------------------------------

def write_reports(out: Path, matrix: Matrix, records: list[dict], previous: Path | None = None) -> dict:
    """Write regressions/, SUMMARY.md and index.json (last, with the checksums) into `out`."""
    out = Path(out)
    summary = {
        "cells": len(records),
        "passed": sum(r["status"] == "passed" for r in records),
        "failed": sum(r["status"] == "failed" for r in records),
        "missing": sum(r["status"] == "missing" for r in records),
        "interrupted": sum(r["status"] == "interrupted" for r in records),
        "cached": sum(bool(r.get("cached")) for r in records),
    }
    index = {
        "format": FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "out": str(out),
        "matrix": {"file": str(matrix.path), "sha256": sha256_file(matrix.path)},
        "summary": summary,
        "cells": records,
        "regressions": regressions(out, previous, records) if previous else None,
    }
    write_file_atomic(out / SUMMARY, summary_markdown(index))
    artifacts = tuple(r["artifact"] for r in records if r.get("artifact"))
    index["files"] = file_digests(out, exclude=(INDEX,), skip_dirs=artifacts, skip_hidden=True)
    tmp = out / f".{INDEX}.tmp"
    write_json(tmp, index)
    tmp.replace(out / INDEX)
    return index


def check_previous(previous: Path, out: Path) -> None:
    """--previous is another nightly's directory, not --out (whose cells the regression table
    read after this run replaced them: the run compared with itself, never a regression)."""
    from ..errors import ArtifactError

    if not (Path(previous) / INDEX).is_file():
        raise ArtifactError(f"--previous {str(previous)!r}: not a nightly directory ({INDEX} missing)")
    if Path(previous).resolve() == Path(out).resolve():
        raise ArtifactError(f"--previous {str(previous)!r}: is --out itself (the regression table would compare the run "
                            "with itself); give the last nightly's own directory (e.g. artifacts/nightly/<yesterday>)")

