"""CUDA and Metal artifacts of the tiny Llama (q4f16_1), built for real on a machine without a GPU.

CUDA: lib.so holds ONE fatbin with SASS for sm_80 and sm_90 (not CUDA source), kernels.cu has the
fused dequantize kernels, ptxas reports their registers. Metal: lib.dylib is an ad-hoc-signed
arm64 Mach-O dylib linked by lld that exports what TVM's loader looks up, lib.tar keeps the
objects, kernels.metal is the MSL embedded in the library.

Each target is built in its own subprocess (scheduling one IRModule for two targets in one
process breaks the second); both start when this module starts and run while the quick tests do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mlcpipe.backends import cuda, metal
from mlcpipe.backends.binfmt import MachO
from mlcpipe.targets import load_target

from tests.helpers import REPO

ARCHS = ["sm_80", "sm_90"]

_BUILD = """
import sys
from pathlib import Path
from mlcpipe.build import build
from mlcpipe.config import load_model_config
from mlcpipe.targets import load_target
from mlcpipe.quantization import quantization
build(load_model_config("llama-tiny"), quantization("q4f16_1"), load_target(sys.argv[1]), output=Path(sys.argv[2]),
      log=lambda *_: None)
"""

SMALL_CUDA = r"""
extern "C" __global__ void __launch_bounds__(256) scale_kernel(float* __restrict__ out,
                                                               const float* __restrict__ in) {
  __shared__ float tile[1024];
  int i = threadIdx.x;
  for (int k = 0; k < 4; ++k) tile[i + 256 * k] = in[blockIdx.x * 1024 + i + 256 * k];
  __syncthreads();
  out[blockIdx.x * 256 + i] = tile[1023 - i] * 2.0f + tile[i];
}
"""


@pytest.fixture(scope="module", autouse=True)
def builds(tmp_path_factory):
    """Start the cuda and metal builds in parallel subprocesses; tests wait on what they need."""
    root = tmp_path_factory.mktemp("gpu-artifacts")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env["TVM_NUM_THREADS"] = "1"  # two builds share the two cores
    started = {}
    for target in ("cuda", "metal"):
        log = root / f"{target}.log"
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BUILD, target, str(root / target)],
                cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
            )  # fmt: skip
        started[target] = (proc, root / target, log)
    yield started
    for proc, _, _ in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def artifact(builds, target: str) -> Path:
    proc, out, log = builds[target]
    rc = proc.wait(timeout=900)
    assert rc == 0, f"{target} build failed (exit {rc}):\n{log.read_text()[-4000:]}"
    return out


# ------------------------------------------------------------------------------------------
# quick checks (run while the builds are going)


@pytest.mark.nvcc
def test_compile_context_installs_fatbin_callback_and_restores_it():
    import tvm  # noqa: F401  (registers TVM's own tvm_callback_cuda_compile)
    import tvm_ffi

    spec = load_target("cuda")
    before = tvm_ffi.get_global_func(cuda.CALLBACK, allow_missing=True)
    with cuda.compile_context(spec):
        fatbin = bytes(tvm_ffi.get_global_func(cuda.CALLBACK)(SMALL_CUDA))  # TVM calls it with (source)
    assert struct.unpack_from("<I", fatbin)[0] == cuda.FATBIN_MAGIC
    assert cuda.fatbin_archs(fatbin) == ARCHS
    after = tvm_ffi.get_global_func(cuda.CALLBACK, allow_missing=True)
    assert (before is None and after is None) or after.same_as(before)

    # with no callback registered beforehand, the context leaves none behind (also on error)
    if before is not None:
        tvm_ffi.remove_global_func(cuda.CALLBACK)
    try:
        with pytest.raises(KeyError):
            with cuda.compile_context(spec):
                assert tvm_ffi.get_global_func(cuda.CALLBACK, allow_missing=True) is not None
                raise KeyError("boom")
        assert tvm_ffi.get_global_func(cuda.CALLBACK, allow_missing=True) is None
    finally:
        if before is not None:
            tvm_ffi.register_global_func(cuda.CALLBACK, before, override=True)


@pytest.mark.nvcc
def test_ptxas_report_reads_registers_and_shared_memory():
    cuda.PTXAS_CACHE.clear()
    report = cuda.ptxas_report(SMALL_CUDA, ARCHS)  # one cubin per arch with -Xptxas -v
    assert set(report) == {"scale_kernel"}
    for arch in ARCHS:
        stats = report["scale_kernel"][arch]
        assert stats["smem"] == 4096
        assert 0 < stats["registers"] <= 255
        assert stats["spill_stores"] == 0 and stats["spill_loads"] == 0

    # a fatbin build records the same ptxas figures, and ptxas_report then reuses them
    cuda.PTXAS_CACHE.clear()
    cuda.compile_fatbin(SMALL_CUDA, ARCHS)
    assert {key[1] for key in cuda.PTXAS_CACHE} == set(ARCHS)
    assert cuda.ptxas_report(SMALL_CUDA, ARCHS) == report


def test_ptxas_log_parsing_spills():
    log = """ptxas info    : Compiling entry function 'k_kernel' for 'sm_90'
ptxas info    : Function properties for k_kernel
    96 bytes stack frame, 44 bytes spill stores, 52 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8192 bytes smem, 400 bytes cmem[0]
"""
    assert cuda.parse_ptxas_log(log) == {
        "k_kernel": {"sm_90": {"registers": 255, "spill_stores": 44, "spill_loads": 52, "smem": 8192}}
    }


@pytest.mark.nvcc
def test_nvcc_errors_are_short_and_clear():
    with pytest.raises(RuntimeError) as info:
        cuda.compile_fatbin('extern "C" __global__ void k() { undeclared_thing = 1; }', ["sm_80"])
    message = str(info.value)
    assert message.startswith("nvcc failed")
    assert "undeclared_thing" in message and "error" in message
    assert len(message.splitlines()) <= 8


def test_missing_lld_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError) as info:
        metal.find_ld64()
    message = str(info.value)
    assert "\n" not in message
    assert "lld" in message and "scripts/setup-debian.sh" in message


# ------------------------------------------------------------------------------------------
# the real artifacts


@pytest.mark.nvcc
def test_cuda_artifact_is_a_multi_arch_fatbin(builds):
    out = artifact(builds, "cuda")
    lib = out / cuda.LIBRARY
    assert lib.is_file()
    head = lib.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and struct.unpack_from("<H", head, 18)[0] == 62  # EM_X86_64

    # one fatbin with both archs, and the embedded CUDA module holds it (not source)
    assert set(ARCHS) <= set(cuda.verify_fatbin(lib))
    assert cuda.embedded_cuda_formats(lib) == ["fatbin"]

    source = (out / cuda.SOURCE_FILE).read_text()
    dequant = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w*fused_dequantize\w*)\(', source)
    assert dequant, "no fused_dequantize kernel in kernels.cu"

    report = cuda.ptxas_report(source, ARCHS)
    for kernel in dequant:
        for arch in ARCHS:
            stats = report[kernel][arch]
            assert 0 < stats["registers"] <= 255, (kernel, arch, stats)
            # the dequantize schedules keep their accumulators in registers: a spill is a regression
            assert stats["spill_stores"] == 0 and stats["spill_loads"] == 0, (kernel, arch, stats)

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["library"] == "lib.so" and manifest["kernel_source"] == "kernels.cu"


def test_metal_artifact_is_an_arm64_dylib_tvm_can_load(builds):
    out = artifact(builds, "metal")
    dylib = out / metal.LIBRARY
    data = dylib.read_bytes()
    magic, cputype, _, filetype = struct.unpack_from("<IiiI", data, 0)
    assert magic == 0xFEEDFACF  # MH_MAGIC_64
    assert cputype == 0x0100000C  # CPU_TYPE_ARM64
    assert filetype == 6  # MH_DYLIB
    cmds = [cmd for cmd, _, _ in MachO(data).commands]
    assert 0x1D in cmds  # LC_CODE_SIGNATURE: arm64 macOS refuses unsigned code
    assert 0x32 in cmds  # LC_BUILD_VERSION (platform macos)

    msl = (out / metal.SOURCE_FILE).read_text()
    assert "kernel void" in msl
    names = re.findall(r"kernel void (\w*fused_dequantize\w*)\(", msl)
    assert names, "no fused_dequantize kernel in kernels.metal"
    assert names[0].encode() in data  # the MSL travels inside the dylib (compiled at load)

    with tarfile.open(out / metal.TARBALL) as tar:
        members = {Path(m.name).name: tar.extractfile(m).read(32) for m in tar.getmembers() if m.isfile()}
    assert {"lib0.o", "devc.o"} <= set(members)
    for head in members.values():
        assert struct.unpack_from("<IiiI", head, 0) == (0xFEEDFACF, 0x0100000C, 0, 1)  # MH_OBJECT

    symbols = metal.exported_symbols(dylib)
    assert symbols == metal.exported_symbols(dylib, use_tools=False)  # llvm-nm == own parser
    assert {"__tvm_ffi__library_bin", "__tvm_ffi__library_ctx"} <= set(symbols)
    assert set(metal.CONTEXT_SYMBOLS) <= set(symbols)
    assert any(s.startswith("__tvm_ffi_fused_dequantize") for s in symbols)
    assert set(metal.required_symbols(out / metal.TARBALL)) <= set(symbols)

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["library"] == "lib.dylib" and manifest["kernel_source"] == "kernels.metal"


@pytest.mark.nvcc
def test_check_says_cuda_did_not_execute_and_reports_ptxas(builds):
    from mlcpipe.conformance import check_artifact

    report = check_artifact(artifact(builds, "cuda"))
    assert not report.executed and report.ok
    assert "NOT EXECUTED" in report.summary
    lib = [r for r in report.results if r.kernel == "<lib.so>"][0]
    assert lib.status == "static" and "sm_80" in lib.note and "sm_90" in lib.note
    fused = [r for r in report.results if r.kernel.startswith("fused_dequantize") and r.status == "compiled"]
    assert fused and all("regs" in r.note and "sm_90" in r.note for r in fused)


def test_check_says_metal_did_not_execute_and_checks_exports(builds):
    from mlcpipe.conformance import check_artifact

    report = check_artifact(artifact(builds, "metal"))
    assert not report.executed and report.ok and "NOT EXECUTED" in report.summary
    assert [r for r in report.results if r.kernel == "<lib.dylib>"][0].status == "static"
    assert any(r.kernel.startswith("fused_dequantize") and r.note == "MSL kernel present" for r in report.results)


def test_metal_kernel_library_for_remote_profiling(builds, tmp_path):
    """`profile --rpc` uploads the scheduled kernels as a dylib of their own, named apart from lib.dylib."""
    from mlcpipe.profiler.remote import kernel_library

    out = artifact(builds, "metal")
    manifest = json.loads((out / "manifest.json").read_text())
    library = kernel_library(out, manifest, tmp_path / "kernels")
    assert library.name == "mlcpipe-kernels.dylib" and library.is_file()
    assert metal.macho_header(library)["filetype"] == 6  # MH_DYLIB
    assert b"@rpath/mlcpipe-kernels.dylib" in library.read_bytes()  # its install name
    assert any(s.startswith("__tvm_ffi_fused_dequantize") for s in metal.exported_symbols(library))


def _with_kernel_renamed(out: Path, tmp_path: Path, source_file: str, pattern: str) -> tuple[Path, dict, str]:
    """A copy of the artifact whose kernel source no longer has the first kernel `pattern` finds."""
    copy = tmp_path / out.name
    shutil.copytree(out, copy)
    source = (copy / source_file).read_text()
    name = re.search(pattern, source).group(1)
    (copy / source_file).write_text(source.replace(f" {name}_kernel(", " renamed_away("))
    return copy, json.loads((copy / "manifest.json").read_text()), name


@pytest.mark.nvcc
def test_cuda_device_kernel_missing_from_ptxas_fails(builds, tmp_path):
    copy, manifest, name = _with_kernel_renamed(artifact(builds, "cuda"), tmp_path, cuda.SOURCE_FILE,
                                                r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(fused_dequantize\w*)_kernel\(')
    roles = {k["name"]: k["role"] for k in manifest["kernels"]}
    rows = {row[0]: row for row in cuda.static_checks(copy, manifest, [name], roles)}
    assert rows[name][2:] == ("FAIL", "device kernel missing from the ptxas report of kernels.cu")


def test_metal_device_kernel_missing_from_msl_fails(builds, tmp_path):
    # fused_dequantize2_NT_matmul2_cast2_kernel stays: a longer name does not stand in for it
    copy, manifest, name = _with_kernel_renamed(artifact(builds, "metal"), tmp_path, metal.SOURCE_FILE,
                                                r"kernel void (fused_dequantize2_NT_matmul2)_kernel\(")
    roles = {k["name"]: k["role"] for k in manifest["kernels"]}
    rows = {row[0]: row for row in metal.static_checks(copy, manifest, [name], roles)}
    assert rows[name][2:] == ("FAIL", "device kernel missing from kernels.metal")
