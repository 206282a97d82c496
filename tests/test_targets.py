"""The llvm target's host CPU: LLVM's own detection (`llvm_get_system_cpu`), checked against the
CPU's /proc/cpuinfo flags, on x86 and aarch64. Fixtures in tests/data/cpuinfo/: the AMD EPYC Zen 4
(`znver4-epyc-genoa`) and Zen 5 (`znver5-epyc-vm`) ones were read off machines of this project
(LLVM said znver4 and znver5); the Sapphire Rapids, Zen 5 (`znver5-epyc-turin`) and Graviton 3
ones carry those CPUs' published flag lists, with the names LLVM's host detection gives them
(sapphirerapids, znver5, neoverse-v1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tvm
from tvm.target import Target, codegen

from mlcpipe.errors import ConfigError
from mlcpipe.targets import HostCPU, detect_host, detect_host_cpu, load_target

CPUINFO = Path(__file__).parent / "data" / "cpuinfo"


def cpuinfo(name: str) -> str:
    return (CPUINFO / f"{name}.txt").read_text()


@pytest.mark.parametrize(("fixture", "llvm", "machine", "features"), [
    ("sapphirerapids-vm", "sapphirerapids", "x86_64", ["amx-bf16", "avx512fp16", "avx512bf16", "avx512vnni"]),
    ("znver5-epyc-turin", "znver5", "x86_64", ["avx512bf16", "avx512vnni", "avxvnni"]),
    ("znver5-epyc-vm", "znver5", "x86_64", ["avx512bf16", "avx512vnni", "avxvnni"]),
    ("znver4-epyc-genoa", "znver4", "x86_64", ["avx512bf16", "avx512vnni"]),
    ("neoverse-v1-graviton3", "neoverse-v1", "aarch64", ["dotprod", "i8mm", "bf16", "fullfp16", "sve"]),
])
def test_llvm_names_the_host_when_the_flags_agree(fixture, llvm, machine, features):
    host = detect_host(cpuinfo(fixture), llvm_cpu=llvm, machine=machine)
    assert host == HostCPU(llvm)
    triple = "aarch64-linux-gnu" if machine == "aarch64" else "x86_64-linux-gnu"
    target = Target({"kind": "llvm", "mtriple": triple, "mcpu": host.mcpu})
    assert all(codegen.target_has_features(f, target) for f in features)
    if llvm == "znver5":  # no AMX: the AMX rule must not take this CPU
        assert not codegen.target_has_features("amx-bf16", target)


def test_a_name_whose_features_the_cpu_lacks_is_not_taken():
    # a VM that hides AMX and AVX512-FP16 from the guest while CPUID's family/model say SPR
    flags = cpuinfo("sapphirerapids-vm").replace(" amx_bf16", "").replace(" amx_tile", "").replace(" avx512_fp16", "")
    assert detect_host(flags, llvm_cpu="sapphirerapids", machine="x86_64") == HostCPU("cooperlake", source="flags")
    # an unknown name, and LLVM answering for a CPU with more than the flags say
    assert detect_host(cpuinfo("znver4-epyc-genoa"), llvm_cpu="no-such-cpu", machine="x86_64").source == "flags"
    assert detect_host(cpuinfo("znver4-epyc-genoa"), llvm_cpu="znver5", machine="x86_64").mcpu != "znver5"  # no avx_vnni


def test_a_name_that_lacks_what_the_flags_have_is_not_taken():
    # a VM reporting family 6 model 167 (LLVM: "rocketlake") on a CPU with AMX and AVX512-FP16
    host = detect_host(cpuinfo("sapphirerapids-vm-model167"), llvm_cpu="rocketlake", machine="x86_64")
    assert host == HostCPU("sapphirerapids", source="flags")
    target = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": host.mcpu})
    assert all(codegen.target_has_features(f, target) for f in ("amx-bf16", "amx-int8", "avx512fp16"))
    # a name with every feature of the flags' pick is kept (Zen 4's over cooperlake)
    assert detect_host(cpuinfo("znver4-epyc-genoa"), llvm_cpu="znver4", machine="x86_64") == HostCPU("znver4")


def test_aarch64_without_a_name_gets_its_features():
    host = detect_host(cpuinfo("neoverse-v1-graviton3"), llvm_cpu="generic", machine="aarch64")
    assert host.mcpu == "generic" and set(host.mattr) == {"+fullfp16", "+dotprod", "+i8mm", "+bf16", "+sve"}
    target = Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": list(host.mattr)})
    assert codegen.target_has_features("dotprod", target) and codegen.target_has_features("i8mm", target)


def test_flag_fallback_without_llvm_answer():
    # another machine's flags: whatever this host is (Zen 3, Sapphire Rapids, aarch64), LLVM's answer for it is not taken
    assert detect_host_cpu("flags\t: fpu avx2 fma f16c avx512f avx512bw avx512vl avx512_fp16 amx_bf16\n") == "sapphirerapids"
    assert detect_host("flags\t: fpu avx2 fma f16c avx512f avx512bw avx512vl avx512_fp16 amx_bf16\n").source == "flags"
    assert detect_host("Features\t: fp asimd asimddp i8mm\n") == HostCPU("generic", ("+dotprod", "+i8mm"), "flags")
    assert detect_host("flags\t: fpu avx2 fma f16c\n", llvm_cpu="", machine="x86_64").mcpu == "haswell"
    assert detect_host("flags\t: fpu sse2\n", llvm_cpu="", machine="x86_64").mcpu == "x86-64"


def test_this_machine_uses_llvms_name():
    llvm = codegen.llvm_get_system_cpu()
    host = detect_host()
    target = load_target("llvm")
    assert target.target["mcpu"] == host.mcpu
    if host.source == "llvm":
        assert host.mcpu == llvm
    assert load_target("llvm", {"mcpu": "skylake-avx512"}).target["mcpu"] == "skylake-avx512"  # --mcpu still overrides
    assert tvm.target.Target(target.target).kind.name == "llvm"


def test_host_cpu_override_forces_another_cpu_class(monkeypatch):
    """MLCPIPE_HOST_CPU=haswell: `auto` builds (and the suite) take the AVX2-only class's code paths."""
    monkeypatch.setenv("MLCPIPE_HOST_CPU", "haswell")
    assert detect_host() == HostCPU("haswell", source="env") and load_target("llvm").target["mcpu"] == "haswell"
    assert detect_host("flags\t: fpu sse2\n", llvm_cpu="", machine="x86_64").mcpu == "x86-64"  # given flags: not this host
    for bad in ("native", "zen9"):
        monkeypatch.setenv("MLCPIPE_HOST_CPU", bad)
        with pytest.raises(ConfigError, match=rf"^environment MLCPIPE_HOST_CPU='{bad}': not a CPU LLVM knows for "):
            load_target("llvm")


@pytest.mark.parametrize("preset, edit, message", [
    ("metal", ('macos_min_version: "13.0"', 'macos_min_version: "abc"'),
     r"metal\.yaml: field 'macos_min_version': got 'abc'; expected a macOS version string"),  # was: a ValueError at the link
    ("metal", ("mcpu: apple-m2", "mcpu: bogus"),  # was: TVM's warning, and generic arm64 code
     r"metal\.yaml: field 'host\.mcpu': got 'bogus'; not a CPU LLVM knows for arm64-apple-macos \(llc -mtriple=arm64-apple-macos"),
    ("metal", ("max_threads_per_block: 1024", "max_threads_per_block: -4"), r"metal\.yaml: field 'max_threads_per_block': got -4; expected an integer >= 1"),
    ("cuda", ("thread_warp_size: 32", "thread_warp_size: 7"), r"cuda\.yaml: field 'thread_warp_size': got 7; expected a power of two"),
    ("llvm", ("peak_gbps: 25", "peak_gbps: -5"), r"llvm\.yaml: field 'peak_gbps': got -5; expected a number of GB/s > 0"),
])
def test_an_edited_preset_is_one_line_naming_its_field(preset, edit, message, tmp_path, monkeypatch):
    """Each of these was taken (TVM takes any integer limit) or failed late, without the field."""
    import shutil

    from mlcpipe import targets

    folder = Path(shutil.copytree(targets.TARGETS_DIR, tmp_path / "targets"))
    text = (folder / f"{preset}.yaml").read_text()
    assert edit[0] in text
    (folder / f"{preset}.yaml").write_text(text.replace(edit[0], edit[1]))
    monkeypatch.setattr(targets, "TARGETS_DIR", folder)
    with pytest.raises(ConfigError, match=message):
        load_target(preset)
    (folder / f"{preset}.yaml").write_text(text)
    assert load_target(preset).kind == preset


def test_portable_cpu_and_the_cuda_host():
    """`mcpu: portable` is the architecture's baseline; the cuda preset's host code uses it (was
    `auto`: a cuda artifact built on an AVX-512 machine carried AVX-512 host code to the GPU
    machine's CPU). Every manifest records the flags its CPU code needs."""
    import platform

    from mlcpipe.targets import PORTABLE_MCPU, required_cpu_flags

    baseline = PORTABLE_MCPU[platform.machine()]
    assert load_target("llvm", {"mcpu": "portable"}).target["mcpu"] == baseline
    cuda = load_target("cuda", {"arch": "sm_90"}).target
    assert cuda["host"] == {"kind": "llvm", "mcpu": baseline}
    flags = {"x86_64": ["avx2", "f16c", "fma"], "aarch64": ["asimd"]}[platform.machine()]
    assert required_cpu_flags(cuda) == required_cpu_flags({"kind": "llvm", "mcpu": baseline}) == flags
    assert required_cpu_flags(load_target("metal").target)[0] == "asimd"  # arm64 host code (no /proc/cpuinfo on macOS: not checked)
    assert required_cpu_flags(load_target("webgpu").target) is None  # wasm host code
