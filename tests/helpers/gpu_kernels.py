"""The model's kernels after the fuse-tir phase (the schedule rules' input), its decode GEMVs, and
a kernel run on llvm: shared by the GPU schedule rules' tests."""

from __future__ import annotations

import re

import numpy as np
import tvm

from mlcpipe.build import export_model
from mlcpipe.config import load_model_config
from mlcpipe.passes import run_pipeline
from mlcpipe.targets import load_target
from mlcpipe.quantization import quantization

DECODE_GEMV = re.compile(r"(fused_)?(dequantize\d*_)?NT_matmul\d*(_\w+)?")


def copy_func(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    return tvm.ir.load_json(tvm.ir.save_json(func))


def fused_kernels(model: str, quant: str, target_name: str = "webgpu") -> dict[str, tvm.tirx.PrimFunc]:
    """{name: PrimFunc} of `model` after the fuse-tir phase (the input of the schedule phase)."""
    target = load_target(target_name).tvm_target()
    mod, _ = export_model(load_model_config(model), quantization(quant), target)
    mod = run_pipeline(mod, target, until="fuse-tir")
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def is_static(func: tvm.tirx.PrimFunc) -> bool:
    return all(isinstance(d, tvm.tirx.IntImm) for p in func.params for d in (getattr(p, "shape", None) or []))


def decode_gemvs(funcs: dict[str, tvm.tirx.PrimFunc]) -> dict[str, tvm.tirx.PrimFunc]:
    return {n: f for n, f in funcs.items() if DECODE_GEMV.fullmatch(n) and is_static(f)}


def run_llvm(func: tvm.tirx.PrimFunc, args: list[np.ndarray]) -> list[np.ndarray]:
    lib = tvm.compile(tvm.IRModule({"main": copy_func(func).with_attr("global_symbol", "main")}), target=load_target("llvm").tvm_target())
    tensors = [tvm.runtime.tensor(a, tvm.cpu()) for a in args]
    lib["main"](*tensors)
    return [t.numpy() for t in tensors]
