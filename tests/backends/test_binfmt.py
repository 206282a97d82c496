"""pipeline/backends/binfmt.py on real files: an ELF shared object from gcc, TVM's packed module
blob inside a CUDA lib.so and from a WebGPU build, and the Mach-O objects and dylib of the Metal
path (TVM's arm64 host code linked by ld64.lld), each cross-checked with nm where it is installed."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess

import pytest
import tvm
from tvm.script import tirx as T

from mlcpipe.backends import binfmt, cuda, metal
from mlcpipe.backends.binfmt import Elf, MachO, ModuleBlob
from mlcpipe.targets import load_target


def _blob(modules: list[tuple[bytes, bytes | None]]) -> bytes:
    """A packed module blob: the first module imports every other one."""
    n = len(modules)
    indptr = [0] + [n - 1] * n  # module 0's children are 1..n-1; the others have none
    tree = struct.pack(f"<{n + 2}Q", n + 1, *indptr) + struct.pack(f"<{n}Q", n - 1, *range(1, n))
    return ModuleBlob(tree, modules).to_bytes()


def _nm(path, *flags) -> str | None:
    nm = shutil.which("nm")
    if nm is None:
        return None
    return subprocess.run([nm, *flags, str(path)], capture_output=True, text=True, check=True).stdout


# ---- ELF: a shared object gcc builds ------------------------------------------------------------


@pytest.fixture(scope="module")
def gcc_library(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    tmp = tmp_path_factory.mktemp("elf")
    blob = _blob([(b"_lib", None), (b"cuda", b"\x05\0\0\0\0\0\0\0fatbin" + b"payload" * 3)])
    longer = "volatile int y = x; " + " ".join(f"y = y * 3 + {k};" for k in range(50)) + " return y;"
    src = tmp / "lib.c"
    src.write_text(
        "const unsigned char blob_bin[] = {" + ",".join(str(b) for b in blob) + "};\n"
        "int short_func(int x) { return x + 1; }\n"
        f"int long_func(int x) {{ {longer} }}\n"
    )
    lib = tmp / "lib.so"
    subprocess.run(["gcc", "-O0", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib, blob


def test_elf_sections_symbols_and_functions(gcc_library):
    lib, _ = gcc_library
    data = lib.read_bytes()
    elf = Elf(data)
    names = {s.name for s in elf.sections}
    assert {".text", ".dynsym", ".symtab", ".rodata"} <= names
    functions = {f.name: f for f in elf.functions()}
    assert {"short_func", "long_func"} <= set(functions)
    listing = _nm(lib, "-S", "--defined-only")
    if listing is not None:  # nm's addresses and sizes agree
        for name in ("short_func", "long_func"):
            addr, size = re.search(rf"^([0-9a-f]+) ([0-9a-f]+) T {name}$", listing, re.M).groups()
            assert (functions[name].value, functions[name].size) == (int(addr, 16), int(size, 16))
    code = elf.function_code()
    assert len(code["long_func"]) == functions["long_func"].size > len(code["short_func"]) > 0
    at = elf.file_offset(functions["long_func"].value)
    assert data[at : at + functions["long_func"].size] == code["long_func"]
    assert elf.function_at(at + 3) == "long_func" and elf.vaddr(at + 3) == functions["long_func"].value + 3
    assert elf.function_at(elf.file_offset(functions["short_func"].value)) == "short_func"


def test_elf_symbol_data_is_the_embedded_blob(gcc_library):
    lib, blob = gcc_library
    assert binfmt.library_blob(lib, "blob_bin") == blob
    packed = ModuleBlob.parse(blob)
    assert packed.modules == [(b"_lib", None), (b"cuda", b"\x05\0\0\0\0\0\0\0fatbin" + b"payload" * 3)]
    assert packed.to_bytes() == blob
    with pytest.raises(ValueError, match="no __tvm_ffi__library_bin symbol"):
        binfmt.library_blob(lib)
    with pytest.raises(KeyError):
        Elf(lib.read_bytes()).symbol_offset("nothing_here")


def test_readers_refuse_other_formats(tmp_path):
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF file"):
        Elf(b"\xcf\xfa\xed\xfe" + bytes(60))
    with pytest.raises(ValueError, match="not a little-endian 64-bit Mach-O file"):
        MachO(b"\x7fELF" + bytes(60))
    assert binfmt.is_elf(b"\x7fELF\x02") and not binfmt.is_macho(b"\x7fELF\x02")
    blob = _blob([(b"_lib", None), (b"metal", b"x")])
    with pytest.raises(ValueError, match="size mismatch"):
        ModuleBlob.parse(blob + b"\0")
    with pytest.raises(ValueError, match="truncated"):
        ModuleBlob.parse(struct.pack("<Q", len(blob) - 9) + blob[8:-1])
    not_elf = tmp_path / "x.so"
    not_elf.write_bytes(b"MZ" + bytes(100))
    with pytest.raises(ValueError, match="x.so: not a 64-bit little-endian ELF file"):
        binfmt.library_blob(not_elf)


# ---- TVM's module blob: CUDA (inside lib.so) and WebGPU -----------------------------------------


@T.prim_func(s_tir=True)
def _double_cuda(a: T.Buffer((256,), "float32"), c: T.Buffer((256,), "float32")):
    for bx in T.thread_binding(4, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("double"):
                c[bx * 64 + tx] = a[bx * 64 + tx] * T.float32(2)


@T.prim_func(s_tir=True)
def _double_webgpu(a: T.Buffer((256,), "float32"), c: T.Buffer((256,), "float32")):
    for bx in T.thread_binding(4, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("double"):
                c[bx * 64 + tx] = a[bx * 64 + tx] * T.float32(2)


@T.prim_func(s_tir=True)
def _double_metal(a: T.Buffer((256,), "float32"), c: T.Buffer((256,), "float32")):
    for bx in T.thread_binding(4, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("double"):
                c[bx * 64 + tx] = a[bx * 64 + tx] * T.float32(2)


def _compile(func, target_name: str):
    target = load_target(target_name).tvm_target()
    with target:
        return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)


def test_cuda_library_blob(tmp_path):
    """Without a CUDA driver TVM packs the CUDA source ("cuda" format) into lib.so's blob."""
    lib = tmp_path / "lib.so"
    _compile(_double_cuda, "cuda").export_library(str(lib))
    blob = binfmt.library_blob(lib)
    packed = ModuleBlob.parse(blob)
    assert packed.to_bytes() == blob
    kinds = [k for k, _ in packed.modules]
    assert b"cuda" in kinds
    assert cuda.embedded_cuda_formats(lib) == ["cuda"]
    assert cuda.rewrite_cuda_modules(blob, lambda *_: None) == blob  # nothing replaced: the same bytes
    rewritten = ModuleBlob.parse(cuda.rewrite_cuda_modules(blob, lambda _i, _fmt, _code: ("fatbin", b"\x50\xed\x55\xba")))
    [payload] = rewritten.payloads(b"cuda")
    assert payload.startswith(binfmt.pack_bytes(b"fatbin")) and payload.endswith(binfmt.pack_bytes(b"\x50\xed\x55\xba"))
    symbols = _nm(lib, "-D", "--defined-only")
    if symbols is not None:
        assert binfmt.LIBRARY_BIN in symbols
    assert any(s.name == binfmt.LIBRARY_BIN for s in Elf(lib.read_bytes()).symbols())


def test_webgpu_module_blob():
    executable = _compile(_double_webgpu, "webgpu")
    blob = tvm.get_global_func("runtime.ModulePackImportsToTensor")(executable.mod).numpy().tobytes()
    packed = ModuleBlob.parse(blob)
    assert packed.to_bytes() == blob
    [payload] = packed.payloads(b"webgpu")
    reader = binfmt.BlobReader(payload)
    n_functions = reader.u64()
    assert n_functions == 1 and reader.str() == "main_kernel"


# ---- Mach-O: the Metal path's objects and dylib -------------------------------------------------


@pytest.fixture(scope="module")
def metal_files(tmp_path_factory):
    try:
        metal.find_ld64()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    tmp = tmp_path_factory.mktemp("macho")
    _compile(_double_metal, "metal").export_library(str(tmp / "lib.tar"))
    objects = metal.extract_objects(tmp / "lib.tar", tmp)
    metal.link_dylib(objects, tmp / "lib.dylib")
    return objects, tmp / "lib.dylib"


def test_macho_objects_and_dylib(metal_files):
    objects, dylib = metal_files
    assert [o.rsplit("/", 1)[-1] for o in objects] == ["lib0.o", "devc.o"]
    for obj in objects:
        head = MachO(open(obj, "rb").read()).header
        assert (head["magic"], head["cputype"], head["filetype"]) == (binfmt.MH_MAGIC_64, binfmt.CPU_TYPE_ARM64, binfmt.MH_OBJECT)
    data = dylib.read_bytes()
    macho = MachO(data)
    assert macho.header["filetype"] == binfmt.MH_DYLIB and macho.header["ncmds"] == len(macho.commands)
    cmds = [cmd for cmd, _, _ in macho.commands]
    assert {binfmt.LC_SYMTAB, binfmt.LC_UUID, binfmt.LC_CODE_SIGNATURE, binfmt.LC_BUILD_VERSION} <= set(cmds)
    start, end = macho.uuid_span()
    assert end - start == 16 and data[start:end] != bytes(16)
    dataoff, datasize = macho.code_signature()
    assert struct.unpack_from(">I", data, dataoff)[0] == 0xFADE0CC0 and dataoff + datasize <= len(data)  # embedded signature
    symbols = macho.defined_symbols()
    assert {binfmt.LIBRARY_BIN, "__tvm_ffi__library_ctx", "__tvm_ffi_main"} <= set(symbols)
    assert metal.exported_symbols(dylib) == symbols  # llvm-nm where installed, else this reader
    assert set(metal.CONTEXT_SYMBOLS) <= set(symbols)  # C names: Mach-O's extra leading underscore removed


def test_uuid_fix_is_a_function_of_the_rest_of_the_file(metal_files, tmp_path):
    from mlcpipe.backends.reproducible import fix_macho_uuid

    _, dylib = metal_files
    copy = tmp_path / "lib.dylib"
    data = bytearray(dylib.read_bytes())
    start, end = MachO(data).uuid_span()
    uuid = bytes(data[start:end])
    data[start:end] = bytes(range(16))
    copy.write_bytes(bytes(data))
    assert fix_macho_uuid(copy) == uuid.hex()
    assert copy.read_bytes() == dylib.read_bytes()
