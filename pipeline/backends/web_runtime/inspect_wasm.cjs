// mlcpipe: load an artifact's lib.wasm in node (no GPU, no tvmjs) and report what TVM's web
// runtime inside it deserialised: the VM executable (as text) and the WebGPU module's function
// table and shaders. Usage: node inspect_wasm.cjs lib.wasm [kernel ...]  -> JSON on stdout.
//
// It drives the wasm through the TVM FFI C API the same way tvmjs does: _initialize (static
// registrations), "ffi.SystemLib" (loads the packed module tree: VM executable, host library,
// "webgpu" module), then module functions. A stub "wasm.WebGPUCreateShader" is registered because
// the WebGPU module asks for it when it is created.
"use strict";
const fs = require("fs");
const { WASI } = require("wasi");

const [wasmPath, ...kernels] = process.argv.slice(2);
const wasmModule = new WebAssembly.Module(fs.readFileSync(wasmPath));
const wasi = new WASI({ version: "preview1", args: [], env: {}, returnOnExit: true });
const jsFunctions = new Map(); // resource handle -> JS function
let exp = null;

function view() {
  return new DataView(exp.memory.buffer);
}
function bytes() {
  return new Uint8Array(exp.memory.buffer);
}
function alloc(n) {
  const ptr = exp.TVMWasmAllocSpace(n);
  bytes().fill(0, ptr, ptr + n);
  return ptr;
}
function cString(s) {
  const data = Buffer.from(s, "utf8");
  const ptr = alloc(data.length + 1);
  bytes().set(data, ptr);
  return { ptr, size: data.length };
}
function byteArray(s) {
  const str = cString(s);
  const ptr = alloc(8); // TVMFFIByteArray on wasm32: {const char* data; size_t size}
  view().setUint32(ptr, str.ptr, true);
  view().setUint32(ptr + 4, str.size, true);
  return ptr;
}
function readCString(ptr) {
  const mem = bytes();
  let end = ptr;
  while (mem[end] !== 0) end++;
  return Buffer.from(mem.subarray(ptr, end)).toString("utf8");
}
function check(rc, what) {
  if (rc !== 0) throw new Error(`${what} failed: ${readCString(exp.TVMFFIWasmGetLastError())}`);
}

// TVMFFIAny (16 bytes): int32 type_index, uint32 padding / small_str_len, 8-byte value
const kNone = 0, kInt = 1, kBool = 2, kRawStr = 8, kSmallStr = 11, kStr = 65;
function readAny(ptr) {
  const dv = view();
  const type = dv.getInt32(ptr, true);
  if (type === kNone) return null;
  if (type === kInt) return Number(dv.getBigInt64(ptr + 8, true));
  if (type === kBool) return dv.getBigInt64(ptr + 8, true) !== 0n;
  if (type === kSmallStr) {
    const len = dv.getUint32(ptr + 4, true);
    return Buffer.from(bytes().subarray(ptr + 8, ptr + 8 + len)).toString("utf8");
  }
  if (type === kStr) {
    const obj = dv.getUint32(ptr + 8, true); // StringObj: 24-byte object header, then {data, size}
    const data = dv.getUint32(obj + 24, true);
    const size = dv.getUint32(obj + 28, true);
    return Buffer.from(bytes().subarray(data, data + size)).toString("utf8");
  }
  return { type, handle: dv.getUint32(ptr + 8, true) };
}
function writeAny(ptr, value) {
  const dv = view();
  if (typeof value === "string") {
    dv.setInt32(ptr, kRawStr, true);
    dv.setUint32(ptr + 8, cString(value).ptr, true);
  } else if (typeof value === "boolean") {
    dv.setInt32(ptr, kBool, true);
    dv.setBigInt64(ptr + 8, value ? 1n : 0n, true);
  } else if (typeof value === "number") {
    dv.setInt32(ptr, kInt, true);
    dv.setBigInt64(ptr + 8, BigInt(value), true);
  } else {
    dv.setInt32(ptr, value.type, true); // an object we got back before
    dv.setUint32(ptr + 8, value.handle, true);
  }
}
function call(func, ...args) {
  const argv = alloc(16 * Math.max(args.length, 1));
  args.forEach((a, i) => writeAny(argv + 16 * i, a));
  const ret = alloc(16);
  check(exp.TVMFFIFunctionCall(func, argv, args.length, ret), "TVMFFIFunctionCall");
  return readAny(ret);
}
function getGlobal(name) {
  const out = alloc(4);
  check(exp.TVMFFIFunctionGetGlobal(byteArray(name), out), `get ${name}`);
  const handle = view().getUint32(out, true);
  if (handle === 0) throw new Error(`global function ${name} not found in the wasm`);
  return handle;
}
function setGlobal(name, fn) {
  const id = jsFunctions.size + 1;
  jsFunctions.set(id, fn);
  const out = alloc(4);
  check(exp.TVMFFIWasmFunctionCreate(id, out), "TVMFFIWasmFunctionCreate");
  check(exp.TVMFFIFunctionSetGlobal(byteArray(name), view().getUint32(out, true), 1), `set ${name}`);
}

const env = {
  TVMFFIWasmSafeCall: (self, args, numArgs, result) => {
    const fn = jsFunctions.get(self);
    const values = [];
    for (let i = 0; i < numArgs; i++) values.push(readAny(args + 16 * i));
    fn(...values);
    view().setInt32(result, kNone, true);
    return 0;
  },
  TVMFFIWasmFunctionDeleter: (self) => jsFunctions.delete(self),
  emscripten_notify_memory_growth: () => {},
};
const instance = new WebAssembly.Instance(wasmModule, { env, wasi_snapshot_preview1: wasi.wasiImport });
exp = instance.exports;
wasi.initialize(instance);

setGlobal("wasm.WebGPUCreateShader", () => {
  throw new Error("no WebGPU device in this inspection");
});
const moduleGetFunction = getGlobal("ffi.ModuleGetFunction");
const systemLib = call(getGlobal("ffi.SystemLib"));
const kind = call(getGlobal("ffi.ModuleGetKind"), systemLib);
const asText = call(call(moduleGetFunction, systemLib, "as_text", false).handle);
const fmap = JSON.parse(call(call(moduleGetFunction, systemLib, "webgpu.get_fmap", true).handle));
const getShader = call(moduleGetFunction, systemLib, "webgpu.get_shader", true).handle;
const shaders = {};
for (const name of kernels) shaders[name] = call(getShader, name);
process.stdout.write(JSON.stringify({ kind, as_text: asText, fmap, shaders }));
