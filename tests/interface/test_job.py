"""The bundle job's logits comparison and the GPU benchmark's kernel-time table (no GPU needed)."""

import numpy as np

from benchmarks import llm_gpu
from mlcpipe.interface.job import compare_logits

VOCAB = 128256  # the 1B's vocabulary: the max-abs tail is over this many values


def _logits(steps: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, size=(steps, VOCAB)).astype(np.float32)


def test_f16_rounding_noise_passes_on_rel_l2_although_its_max_is_past_the_tolerance():
    want = _logits(3, 0)
    # f16-sized noise: about 0.5% of each logit's scale, heavy-tailed like accumulated rounding
    noise = np.random.default_rng(1).standard_t(3, size=want.shape) * 0.005 * 3
    got = (want + noise).astype(np.float32)
    tokens = want.argmax(axis=1)
    result = compare_logits(got, want, tokens, 2e-2)
    assert result["max_rel"] > 2e-2, result["max_rel"]  # the old criterion would have failed it
    assert result["rel_l2"] < 2e-2 and result["ok"], result


def test_wrong_logits_fail():
    want = _logits(3, 0)
    tokens = want.argmax(axis=1)
    assert not compare_logits(_logits(3, 2), want, tokens, 2e-2)["ok"]  # another model's logits
    scaled = want * 1.05  # a 5% error everywhere (a wrong norm, say)
    result = compare_logits(scaled, want, tokens, 2e-2)
    assert not result["ok"] and abs(result["rel_l2"] - 0.05) < 1e-3
    broken = want.copy()
    broken[1, 7] = np.nan
    assert compare_logits(broken, want, tokens, 2e-2)["rel_l2"] == float("inf")


def test_a_decided_token_that_differs_fails():
    want = np.zeros((1, 16), dtype=np.float32)
    want[0, 3] = 10.0
    got = want.copy()
    got[0, 3], got[0, 5] = 9.9, 10.1  # rel L2 is small, but the greedy token moved off a clear winner
    result = compare_logits(got, want, np.asarray([3]), 2e-2)
    assert result["tokens_decided"] == 1 and result["tokens_agree"] == 0 and not result["ok"]


def test_kernel_time_tables_render_and_say_their_errors():
    results = {"a-cuda": {"bench": {"kernels": {
        "decode": {"steps": 4, "wall_us_per_step": 1000.0, "kernel_us_per_step": 600.0, "launches_per_step": 3.0,
                   "kernels": {"gemv": {"calls_per_step": 2.0, "us_per_step": 450.0},
                               "rms_norm": {"calls_per_step": 1.0, "us_per_step": 150.0}}},
        "prefill 1024": {"error": "RuntimeError: CUPTI unavailable"}}}}}
    text = llm_gpu.render_kernels(results)
    assert "wall 1000.0 µs, kernels 600.0 µs (60% of wall), 3.0 launches" in text
    assert "| gemv | 2.0 | 450.0 | 75.0 |" in text and "| rms_norm | 1.0 | 150.0 | 25.0 |" in text
    assert "a-cuda: prefill 1024\n\nnot measured: RuntimeError: CUPTI unavailable" in text
    assert llm_gpu.render_kernels({"b": {"bench": {}}}) == ""


def test_rel_l2():
    from mlcpipe.interface.job import rel_l2

    assert rel_l2(np.asarray([3.0, 4.0]), np.asarray([3.0, 4.0])) == 0.0
    assert abs(rel_l2(np.asarray([3.0, 4.0]) * 1.1, np.asarray([3.0, 4.0])) - 0.1) < 1e-12
    assert rel_l2(np.asarray([np.nan, 4.0]), np.asarray([3.0, 4.0])) == float("inf")


def _bench_record(quant: str, variant: str = "") -> dict:
    gemv = [{"kernel": f"fused_dequantize{i}_NT_matmul{i}_cast{i}_add", "role": role, "bytes": 18_912_000, "us": 14.002,
             "gbps": 1350.6, "pct_of_peak": 40.3, "pct_of_copy": 31.4, "method": "CUDA graph, 12 rotated copies"}
            for i, role in enumerate(("qkv", "o_proj", "gate_up", "down", "lm_head"))]
    kernels = {f"fused_dequantize{i}_NT_matmul{i}_cast{i}_add_kernel": {"calls_per_step": 16.0, "us_per_step": 100.0 - i}
               for i in range(20)}
    region = {"steps": 16, "wall_us_per_step": 1245.3, "kernel_us_per_step": 1100.0, "launches_per_step": 170.0, "kernels": kernels}
    return {"model": "llama-3.2-1b", "quantization": quant, "kind": "cuda", "variant": variant,
            "run": {"ok": True, "rel_l2": 0.022, "max_rel": 0.021, "tolerance": 0.02, "tokens_agree": 1, "tokens_decided": 1,
                    "rel_l2_vs_truth": 0.02, "llvm_rel_l2_vs_truth": 0.022, "allowed_vs_truth": 0.044},
            "bench": {"ok": True, "decode_ms": 1.2453, "decode_tok_s": 803.0, "greedy_step_ms": 1.4854,
                      "prefill_ms": {"128": 7.138, "1024": 77.401}, "gemv": gemv,
                      "kernels": {"decode": region, "prefill 1024": region}}}


def test_stdout_tables_fit_the_device_tools_output_tail():
    """The job prints the benchmark tables (top 5 kernels per table) and the summary last: for the
    default bundle they fit the 12,000 characters the device tool returns of the output."""
    from mlcpipe.interface.job import bench_tables, summary_table

    results = {f"llama-3.2-1b-{q}-cuda{v and '-' + v}": _bench_record(q, v)
               for q, v in (("q4f16_1", ""), ("q4f16_1", "cuda-graph"), ("q4f32_1", ""), ("q0f16", ""))}
    printed = bench_tables(results, top=5) + "\n" + summary_table(results)
    assert "### Where the GPU time goes" in printed and "| mlcpipe q4f16_1 (cuda-graph) (llama-3.2-1b) |" in printed
    assert len(printed) < 11_000, len(printed)


def test_the_peak_is_the_gpus_own_by_its_name(monkeypatch):
    """The bundle's cuda preset assumes an H100 (3350 GB/s); the lent machine may be an H200 (4800):
    the % of peak columns use the datasheet figure of the GPU the job finds, the preset's only for
    an unknown GPU or a CPU artifact."""
    from mlcpipe.device import cuda, peak_gbps, tvm_runtime
    from mlcpipe.device.cuda import datasheet_gbps
    from mlcpipe.interface.job import Job

    assert datasheet_gbps("NVIDIA H200") == 4800.0 and datasheet_gbps("NVIDIA H200 NVL") == 4800.0
    assert datasheet_gbps("NVIDIA H100 80GB HBM3") == 3350.0 and datasheet_gbps("NVIDIA H100 PCIe") == 2000.0
    assert datasheet_gbps("NVIDIA H100 NVL") == 3900.0 and datasheet_gbps("NVIDIA GH200 480GB") == 4000.0
    assert datasheet_gbps("NVIDIA A100-SXM4-80GB") == 2039.0 and datasheet_gbps("NVIDIA A100-PCIE-40GB") == 1555.0
    assert datasheet_gbps("NVIDIA GeForce RTX 4090") is None
    job = Job.__new__(Job)  # the method alone: no bundle needed
    assert job.peak_gbps({"kind": "cuda", "peak_gbps": 3350.0}) == 3350.0  # this machine: no GPU, the preset's figure
    assert job.peak_gbps({"kind": "llvm", "peak_gbps": 25.0}) == 25.0
    for name, want in (("NVIDIA H200", 4800.0), ("NVIDIA GeForce RTX 4090", 3350.0)):  # the lent H200; an unknown GPU
        monkeypatch.setattr(cuda, "runs_here", lambda: True)
        monkeypatch.setattr(cuda, "cuda_device", lambda: "gpu0")
        monkeypatch.setattr(tvm_runtime, "device_name", lambda dev, name=name: name if dev == "gpu0" else "?")
        assert job.peak_gbps({"kind": "cuda", "peak_gbps": 3350.0}) == want
        assert peak_gbps("cuda", "cuda") == want and peak_gbps("cuda", "cuda", here=False) == 3350.0  # profile / nightly


def test_gemv_table_has_the_copy_column():
    text = llm_gpu.render({"a": _bench_record("q4f16_1")})
    header = next(line for line in text.splitlines() if line.startswith("| artifact | kernel |"))
    assert "| % of peak | % of copy |" in header
    assert "| 1350.6 | 40.3 | 31.4 | CUDA graph" in text
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:  # no CUDA here: no ceiling measured, the column says "-"
        assert llm_gpu.copy_gbps() is None
    else:
        assert llm_gpu.copy_gbps() > 100.0
