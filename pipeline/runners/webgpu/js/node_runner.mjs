// mlcpipe's WebGPU runner for node: Dawn (npm `webgpu`) + TVM's web runtime
// (npm `@mlc-ai/web-runtime`) running an artifact's lib.wasm. Python drives it with one JSON
// request per line on stdin and reads one JSON reply per line on stdout (bytes as base64);
// everything else the runtime prints goes to stderr.
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";

import { pathToFileURL } from "node:url";

import { ModelSession, openDevice, sessionOps } from "./session.mjs";

// The npm packages (`npm ci` in the checkout): $MLCPIPE_NODE_MODULES, set by pipeline/runners/webgpu/dawn.py.
const modules = process.env.MLCPIPE_NODE_MODULES;
const load = (file) => import(pathToFileURL(path.join(modules, file)).href);
const dawn = await load("webgpu/index.js");
const tvmjs = await load("@mlc-ai/web-runtime/lib/index.js");

const reply = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
console.log = (...args) => console.error(...args);
console.info = console.log;

Object.assign(globalThis, dawn.globals);

const ADAPTERS = {
  gles: { dawn: ["backend=opengles"], compatibility: true },
  swiftshader: { dawn: ["backend=vulkan"], compatibility: false },
  gpu: { dawn: ["backend=vulkan"], compatibility: false, powerPreference: "high-performance" },
};

const b64 = (bytes) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
const unb64 = (text) => new Uint8Array(Buffer.from(text, "base64"));

function readTensorCache(dir, names) {
  const index = JSON.parse(fs.readFileSync(path.join(dir, "tensor-cache.json"), "utf8"));
  const found = new Map();
  for (const shard of index.records) {
    const data = fs.readFileSync(path.join(dir, shard.dataPath));
    for (const rec of shard.records) {
      if (rec.format && rec.format !== "raw") throw new Error(`${rec.name}: tensor format ${rec.format} (only raw)`);
      found.set(rec.name, { ...rec, bytes: new Uint8Array(data.buffer, data.byteOffset + rec.byteOffset, rec.nbytes) });
    }
  }
  return names.map((n) => {
    if (!found.has(n)) throw new Error(`parameter ${n} missing from ${dir}/tensor-cache.json`);
    return found.get(n);
  });
}

let session = null;
let gpu = null;

const ops = {
  async open(req) {
    const spec = ADAPTERS[req.adapter];
    if (!spec) throw new Error(`unknown adapter ${req.adapter}`);
    const openGpu = async () => {
      gpu = await openDevice(dawn.create(spec.dawn), spec);
      const name = gpu.info.description || gpu.info.device || gpu.info.vendor;
      if (req.adapter === "gpu" && (gpu.info.fallback || /swiftshader|llvmpipe|lavapipe/i.test(name))) {
        throw new Error(`no GPU adapter: Dawn's Vulkan backend offers only ${name} (a software adapter)`);
      }
      if (req.needs_f16 && !gpu.info.features.includes("shader-f16")) {
        throw new Error(`adapter ${req.adapter} (${name}) lacks shader-f16, which this f16 artifact needs (q4f32_1 and q0f32 run without it)`);
      }
      return gpu;
    };
    session = await ModelSession.create(tvmjs, fs.readFileSync(req.wasm), openGpu, { logger: (m) => console.error(m) });
    let weightsMs = 0;
    if (req.weights) {
      const t0 = performance.now();
      session.setParams(readTensorCache(req.weights, req.params));
      await session.dev.sync();
      weightsMs = performance.now() - t0;
    }
    return { ok: true, adapter: gpu.info, load_ms: session.loadMs, weights_ms: weightsMs };
  },
  ...sessionOps(() => ({ session, gpu }), { b64, unb64 }),
};

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  const req = JSON.parse(line);
  if (req.op === "close") break;
  try {
    if (!ops[req.op]) throw new Error(`unknown op ${req.op}`);
    if (req.op !== "open" && !session) throw new Error("no session: send open first");
    reply(await ops[req.op](req));
  } catch (err) {
    reply({ ok: false, error: String(err && err.message ? err.message : err) });
  }
}
process.exit(0);
