"""The shared micro-kernel pieces (schedules/llvm/microkernels.py): where the per-task accumulators
live, and the GEMVs' default prefetch distance. Compile-only (znver4 / Sapphire Rapids targets):
holds on any x86 host."""

from __future__ import annotations

import re

import pytest
import tvm

from mlcpipe.config import load_model_config
from mlcpipe.tuning.knobs import compile_kernel, unscheduled_kernels
from mlcpipe.schedules.analysis import match_nt_matmul as match
from mlcpipe.schedules.llvm.gemm_bf16 import PrefillGEMMBF16
from mlcpipe.schedules.llvm.gemm_f32 import PrefillGEMMF32
from mlcpipe.schedules.llvm.gemm_q4_vnni import PrefillGEMMQ4VNNI
from mlcpipe.schedules.llvm.gemv_float import DecodeGEMVFloat
from mlcpipe.schedules.llvm.gemv_q4_vnni import DecodeGEMVQ4VNNI
from mlcpipe.schedules.llvm.microkernels import LANES, PREFETCH_AHEAD, STACK_BYTES, default_prefetch, tile_rows
from mlcpipe.quantization import quantization

ZEN4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
SMALL = 4096  # bytes: accumulator-sized (a GEMM task's weight block is larger)


def _workspace_in_parallel(func, target) -> list[tuple[str, int]]:
    """(buffer, bytes) of each runtime-workspace allocation of a constant size inside a parallel
    loop, read from the host TIR right after LowerTVMBuiltin (the pass that picks stack or
    workspace). A size that depends on the token count (F32's converted slices with the
    accumulators carried between slices) is no register tile's and is left out."""
    lowered = []

    @tvm.instrument.pass_instrument
    class Grab:
        def run_after_pass(self, mod, info):
            if info.name == "tirx.LowerTVMBuiltin":
                lowered.append(mod.script())

    with tvm.transform.PassContext(instruments=[Grab()]):
        compile_kernel(func, target)
    found, parallel_at = [], []
    for line in "\n".join(lowered).splitlines():
        indent = len(line) - len(line.lstrip())
        parallel_at = [i for i in parallel_at if i < indent]
        if "T.parallel(" in line:
            parallel_at.append(indent)
        alloc = re.search(r"(\w+) = T\.decl_buffer\(.*TVMBackendAllocWorkspace\(\d+, \w+, T\.uint64\((\d+)\),", line)
        if alloc and parallel_at:
            found.append((alloc.group(1), int(alloc.group(2))))
    return found


@pytest.fixture(scope="module")
def full_size():
    config = load_model_config("llama-3.2-1b")
    return {q: unscheduled_kernels(config, quantization(q), ZEN4) for q in ("q4f16_1", "q0f16", "q4f32_1")}


def _kernel(kernels, decode: bool, n: int, k: int):
    for name, func in kernels.items():
        info = match(func) if "NT_matmul" in name else None
        if info is not None and info.n == n and info.k == k and ("seq_len" not in func.script()) == decode:
            return func
    raise AssertionError(f"no {'decode' if decode else 'prefill'} matmul {n}x{k}")


@pytest.mark.parametrize(
    "rule, quant, decode",
    [(DecodeGEMVQ4VNNI(), "q4f16_1", True), (DecodeGEMVFloat(), "q0f16", True), (PrefillGEMMQ4VNNI(), "q4f16_1", False),
     (PrefillGEMMBF16(), "q0f16", False), (PrefillGEMMF32(), "q4f32_1", False)],
    ids=lambda v: type(v).__name__ if not isinstance(v, (str, bool)) else str(v),
)
def test_per_task_accumulators_are_stack_arrays_not_runtime_workspace(rule, quant, decode, full_size):
    """TVM 0.27 turns a per-task "local" buffer into two runtime calls per task
    (TVMBackendAllocWorkspace / FreeWorkspace), which were ~40% of the q4 decode GEMV's time with one
    row per task. The rules' accumulators are "global" buffers under STACK_BYTES: inside the parallel loop, no
    accumulator-sized buffer comes from the workspace (a GEMM task's weight block may)."""
    func = _kernel(full_size[quant], decode, 3072, 2048)
    sch = rule.apply(func, ZEN4, False)
    assert sch is not None
    small = [(name, size) for name, size in _workspace_in_parallel(sch.mod["main"], ZEN4) if size <= SMALL]
    assert small == []


def test_every_allowed_gemm_tile_fits_two_stack_arrays():
    """The f32 / BF16 GEMM tiles (up to 24 accumulators, up to 4 token vectors: the knob spaces)
    split by rows into two arrays, each under STACK_BYTES: what keeps them off the runtime workspace."""
    for block_n in range(1, 25):
        for token_vecs in range(1, min(4, 24 // block_n) + 1):
            assert tile_rows(block_n) * token_vecs * LANES * 4 < STACK_BYTES, (block_n, token_vecs)
            assert 2 * tile_rows(block_n) >= block_n


def test_the_check_sees_a_workspace_accumulator():
    """The check above can fail: a per-task "local" buffer is a workspace allocation in a parallel loop."""
    from tvm.script import tirx as T

    @T.prim_func
    def per_task(a: T.Buffer((64, 16), "float32"), b: T.Buffer((64,), "float32")):
        for task in T.parallel(64):
            acc = T.alloc_buffer((16,), "float32", scope="local")
            for i in range(16):
                acc[i] = a[task, i] * 2.0
            b[task] = acc[3]

    assert _workspace_in_parallel(per_task, ZEN4) == [("acc", 64)]


def test_default_prefetch_runs_a_fixed_number_of_bytes_ahead(full_size):
    """Unset `prefetch`: ~8 KiB of weights ahead: 8 q4 rows of K = 2048 (as before), 2 f16 rows
    (8 rows = 32 KiB was slower for q0f16), at least one row; the rule's kernel uses it."""
    q4 = match(_kernel(full_size["q4f16_1"], True, 16384, 2048))
    f16 = match(_kernel(full_size["q0f16"], True, 16384, 2048))
    f16_down = match(_kernel(full_size["q0f16"], True, 2048, 8192))
    assert (default_prefetch(q4), default_prefetch(f16), default_prefetch(f16_down)) == (8, 2, 1)
    assert PREFETCH_AHEAD == 8 * 1024
    text = DecodeGEMVFloat().apply(_kernel(full_size["q0f16"], True, 16384, 2048), ZEN4, False).mod["main"].script()
    assert re.findall(r"T\.min\(task \+ r \+ (\d+), 16383\)", text) == ["2"]


@pytest.mark.parametrize(
    "rule, quant",
    [(PrefillGEMMQ4VNNI, "q4f16_1"), (PrefillGEMMBF16, "q0f16"), (PrefillGEMMBF16, "q4f16_1"), (PrefillGEMMF32, "q4f32_1"),
     (PrefillGEMMF32, "q0f16")],
    ids=lambda v: v.__name__ if isinstance(v, type) else v,
)
def test_gemm_prefetches_the_next_tasks_rows_only_when_asked(rule, quant, full_size):
    """`prefetch` (default 1; PrefillGEMMF32: q4 weights, or up to 16 tokens): the next task's weight rows (F32:
    the next k slice's) are software-prefetched into L2 (`prefetcht1`) inside the first token
    block's K loop only (LLVM unswitches the `mb == 0` test: one loop copy with the prefetch, one
    without); `prefetch=0` emits none of those (the BF16 rule's few-token branch has the GEMV's own
    prefetch either way)."""
    func = _kernel(full_size[quant], False, 3072, 2048)
    asm = {p: compile_kernel(rule(prefetch=p).apply(func, ZEN4, False).mod["main"], ZEN4).mod.inspect_source("s") for p in (0, 1)}
    count = {p: len(re.findall(r"prefetcht[012]\s", text)) for p, text in asm.items()}
    assert count[1] > count[0]
    if not (rule is PrefillGEMMBF16 and quant == "q0f16"):
        assert count[0] == 0
    assert rule(prefetch=2).apply(func, ZEN4, False) is None
    default = compile_kernel(rule().apply(func, ZEN4, False).mod["main"], ZEN4).mod.inspect_source("s")
    by_default = len(re.findall(r"prefetcht[012]\s", default))
    if rule is PrefillGEMMF32 and quant == "q0f16":  # f16 rows: only the one-vector branch (up to 16 tokens) prefetches
        assert 0 < by_default < count[1]
    else:
        assert by_default == count[1]
    assert 0 in rule().knob_space(func, ZEN4)["prefetch"]


def test_prefetch_next_task_spans_the_next_rows():
    """The helper's addresses, read from the TIR it emits: over `steps` steps they cover the next
    task's span 64 B apart (each line at least once), and clamp past the buffer's end."""
    from tvm.script import tirx as T

    from mlcpipe.schedules.llvm.microkernels import prefetch_next_task

    def offsets(span, steps, elem_bytes, task, n_elems):
        @T.prim_func(private=True, check_well_formed=False)
        def body(w: T.handle):
            buf = T.match_buffer(w, (n_elems,), "uint32" if elem_bytes == 4 else "float16")
            for step in range(steps):
                prefetch_next_task(buf, (task + 1) * span, span, step, steps, elem_bytes)

        found = []
        for line in body.script().splitlines():
            m = re.search(r"buf\[(.*)\]", line)
            if m:
                found.append(m.group(1))
        assert found, body.script()
        values = set()
        for step in range(steps):
            for expr in found:
                values.add(eval(expr.replace("T.min", "min"), {"step": step, "min": min}))  # noqa: S307 (TIR index text)
        return values

    # f16 rows: 8 rows x 2048 over 1024 pair steps: 32 B a step, every 64 B line of the next task
    got = offsets(8 * 2048, 1024, 2, 0, 64 * 2048)
    lines = {v * 2 // 64 for v in got}
    assert lines == set(range(8 * 2048 * 2 // 64, 2 * 8 * 2048 * 2 // 64))
    # q4 words: 32 rows x 256 words over 512 steps: 64 B a step
    got = offsets(32 * 256, 512, 4, 3, 8 * 32 * 256)
    assert {v * 4 // 64 for v in got} == set(range(4 * 32 * 256 * 4 // 64, 5 * 32 * 256 * 4 // 64))
    # 128 B a step: two prefetches per step; the last task's next rows clamp to the buffer's end
    got = offsets(64 * 256, 512, 4, 7, 8 * 64 * 256)
    assert got == {8 * 64 * 256 - 1}
