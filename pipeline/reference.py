"""The reference an artifact ships for `mlcpipe check`: every kernel's reference compiled for a
portable llvm CPU into `reference/kernels.so`, and `reference/kernels.json` with each kernel's
signature (what the run side builds seeded inputs from), its reference's kind, or why `check`
skips it. The run side loads both with TVM's runtime alone (pipeline/conformance.py).

A kernel's reference is its unscheduled PrimFunc (plain loops, TVM's own `exp`), except a GPU
paged-attention kernel's, which is TVM's CPU kernel of the same signature and contract.
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import tvm

from .kernel_info import is_thread_bound, signature_of
from .passes.kv_cache_fixes import DEFAULT_WINDOW, prefill_paged_cpu
from .targets import PORTABLE_MCPU

DIRECTORY = "reference"
LIBRARY = f"{DIRECTORY}/kernels.so"
KERNELS = f"{DIRECTORY}/kernels.json"
FORMAT = "mlcpipe-reference/1"
# llvm CPU of the reference kernels per host architecture (targets.PORTABLE_MCPU): AVX2 + FMA +
# F16C on x86-64 (every x86 machine this project meets, GPU hosts included), the baseline on aarch64

# Kernels the KV cache carries but mlcpipe's runtime never calls: tree attention (speculative
# decoding) and page copies (sequence forking / compaction).
NOT_RANDOMIZABLE = re.compile(r"^(batch_tree_attn|tree_attn|copy_single_page|compact_kv_copy|tir_kv_cache_debug)")
UNUSED = "tree attention / page copies: unused by the mlcpipe runtime"
GPU_ONLY = "no llvm reference for this GPU-only kernel"


def portable_target() -> dict:
    machine = platform.machine()
    if machine not in PORTABLE_MCPU:
        raise ValueError(f"no portable reference CPU for host architecture {machine!r}; allowed: {', '.join(PORTABLE_MCPU)}")
    return {"kind": "llvm", "mcpu": PORTABLE_MCPU[machine]}


def attention_counterparts(model_config: dict, dtype: str) -> dict[str, tvm.tirx.PrimFunc]:
    """GPU paged-attention kernel name -> TVM's CPU kernel with the same signature and contract
    (the one the llvm build runs, checked end to end against the NumPy Llama)."""
    from tvm.relax.frontend.nn.llm import kv_cache as kc

    h_kv, h_q, d = model_config["num_key_value_heads"], model_config["num_attention_heads"], model_config["head_dim"]
    rope = model_config.get("rope_scaling") or {}
    window, page = model_config.get("sliding_window") or DEFAULT_WINDOW, model_config.get("page_size", 16)
    return {
        "batch_prefill_paged_kv": prefill_paged_cpu(h_kv, h_q, d, dtype, page, False, window),
        "batch_decode_paged_kv": kc._attention_decode_cpu(h_kv, h_q, d, dtype, False, rope),
        "batch_prefill_ragged_kv": kc._attention_prefill_ragged_cpu(h_kv, h_q, d, d, dtype, rope),
        "tir_attention_merge_state": kc._merge_state_inplace_cpu(dtype),
        "batch_prefill_paged_kv_sliding_window": prefill_paged_cpu(h_kv, h_q, d, dtype, page, True, window),
        "batch_decode_paged_kv_sliding_window": kc._attention_decode_cpu(h_kv, h_q, d, dtype, True, rope),
    }


def build_reference(unscheduled: tvm.IRModule, names: list[str], model_config: dict, dtype: str, host_cpu: bool,
                    out_dir: Path) -> list[str]:
    """Write reference/kernels.so and reference/kernels.json for kernels `names` of an artifact
    whose fused kernels before scheduling are `unscheduled` (`host_cpu`: the artifact runs on
    the CPU, so its attention kernels are TVM's CPU ones already). Returns the files written,
    relative to the artifact."""
    from mlcpipe.schedules.llvm import fast_exp

    counterparts = {} if host_cpu else attention_counterparts(model_config, dtype)
    kernels, functions = {}, {}
    for name in sorted(names):
        entry = {"signature": signature_of(unscheduled[name]), "reference": None, "skip": ""}
        func = counterparts.get(name, unscheduled[name])
        if NOT_RANDOMIZABLE.match(name):
            entry["skip"] = UNUSED
        elif is_thread_bound(func):
            entry["skip"] = GPU_ONLY
        else:
            entry["reference"] = "tvm-cpu" if name in counterparts else "unscheduled"
            functions[name] = func.with_attr("global_symbol", name)
        kernels[name] = entry
    target = portable_target()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with fast_exp.suspended():  # TVM's own exp: the reference does not share our approximation
        library = tvm.compile(tvm.IRModule(functions), target=tvm.target.Target(target))
    library.export_library(str(out_dir / Path(LIBRARY).name))
    (out_dir / Path(KERNELS).name).write_text(json.dumps({"format": FORMAT, "target": target, "kernels": kernels}) + "\n")
    return [LIBRARY, KERNELS]
