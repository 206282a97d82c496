"""The layout of schedules/, as TVM dlight keeps its rules: a rule module imports only the base
(schedules.base), the analysis (schedules.analysis, and the IR utilities tir_rewrite / signature)
and its family's shared micro-kernels, never another rule; our rules derive from the base's rule
classes; and importing the rules installs nothing: the llvm exp lowering is the build's doing."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

SCHEDULES = REPO / "schedules"
SHARED = {"schedules.base", "schedules.analysis", "schedules.tir_rewrite", "schedules.signature"}
MICROKERNELS = {"llvm": {"schedules.llvm.microkernels"}, "gpu": set()}


def _imported_modules(path: Path) -> set[str]:
    """Every module of `schedules` that `path` imports (relative imports resolved)."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:  # absolute: its import name (mlcpipe.schedules.x) as the folder's (schedules.x)
                module = (node.module or "").replace("mlcpipe.schedules", "schedules", 1)
            names = [f"{module}.{alias.name}" for alias in node.names]
            # `from . import x` / `from .. import x` import modules x
            found |= {n for n in names if (REPO / Path(*n.split("."))).with_suffix(".py").is_file()} or {module}
        elif isinstance(node, ast.Import):
            found |= {alias.name.replace("mlcpipe.schedules", "schedules", 1) for alias in node.names}
    return {m for m in found if m == "schedules" or m.startswith("schedules.")}


def test_rule_modules_import_only_base_analysis_and_microkernels():
    offending = {}
    for family, kernels in MICROKERNELS.items():
        for path in sorted((SCHEDULES / family).glob("*.py")):
            if path.name == "__init__.py":  # the family's registry imports every rule
                continue
            allowed = SHARED | kernels
            bad = sorted(_imported_modules(path) - allowed)
            if bad:
                offending[f"{family}/{path.name}"] = bad
    assert not offending, f"rule modules importing other rules (allowed: {sorted(SHARED)} + micro-kernels): {offending}"


def test_shared_modules_import_no_rule():
    for path in [SCHEDULES / "base.py", SCHEDULES / "analysis.py", SCHEDULES / "llvm" / "microkernels.py"]:
        assert _imported_modules(path) <= SHARED, path


def test_our_rules_derive_from_the_base_rule_classes():
    from mlcpipe.schedules import RULES
    from mlcpipe.schedules.base import CPUScheduleRule, GPUScheduleRule

    ours = [r for rules in RULES.values() for r in rules if type(r).__module__.startswith("mlcpipe.schedules.")]
    assert {type(r).__name__ for r in ours} >= {"GEMVDequant", "SamplerGPU", "MatmulNT", "RowNorm", "DecodeGEMVQ4"}
    for rule in ours:
        family = type(rule).__module__.split(".")[2]
        assert isinstance(rule, {"llvm": CPUScheduleRule, "gpu": GPUScheduleRule}[family]), type(rule).__name__


_EXP_PROBE = '''
import tvm
from tvm.script import tirx as T


@T.prim_func(private=True)
def exp_kernel(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    for i in range(4):
        for j in T.vectorized(16):
            b[i * 16 + j] = T.exp(a[i * 16 + j])


def libm_exp() -> bool:
    """Whether llvm lowers exp to TVM's default (the llvm.exp intrinsic: libm calls per lane)."""
    lib = tvm.compile(tvm.IRModule({"main": exp_kernel.with_attr("global_symbol", "main")}), target=tvm.target.Target({"kind": "llvm"}))
    return "llvm.exp" in lib.mod.inspect_source("ll")
'''


def _run(code: str, tmp_path: Path) -> None:
    """`code` after _EXP_PROBE in a fresh process (TVMScript needs its source in a file)."""
    script = tmp_path / "probe.py"
    script.write_text(_EXP_PROBE + code)
    result = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]


def test_importing_the_rules_installs_no_lowering(tmp_path):
    _run('''
import mlcpipe.schedules, mlcpipe.schedules.llvm, mlcpipe.schedules.llvm.fast_exp, mlcpipe.schedules.gpu, mlcpipe.build, mlcpipe.tuning.knobs
assert libm_exp(), "importing the schedules installed the fast exp"
from mlcpipe.schedules.llvm import fast_exp
fast_exp.install()
fast_exp.install()  # idempotent
assert not libm_exp()
''', tmp_path)


def test_the_build_installs_the_fast_exp(tmp_path):
    _run(f'''
from mlcpipe.build import build
from mlcpipe.config import load_model_config
from mlcpipe.targets import load_target
from mlcpipe.quantization import quantization

assert libm_exp()
build(load_model_config("llama-tiny"), quantization("q0f32"), load_target("llvm"), output={str(tmp_path / "art")!r}, log=lambda *_: None)
assert not libm_exp(), "the build did not install the fast exp"
''', tmp_path)
