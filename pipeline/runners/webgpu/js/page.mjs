// The browser side of mlcpipe's WebGPU runner (browser_runner.mjs drives it with puppeteer):
// the node runner's ops on the page's own WebGPU (navigator.gpu). The page fetches the artifact's
// lib.wasm and its weights (tensor-cache.json + shards) over HTTP from the runner's server;
// tensors come and go as base64 strings. Every op resolves to a reply object ({ok: true, ...} or
// {ok: false, error}), never throws.
import { ModelSession, openDevice, sessionOps } from "./session.mjs";

const tvmjs = globalThis.tvmjs; // TVM's web runtime: a UMD bundle loaded as a classic script (page.html)

const ADAPTERS = {
  swiftshader: { compatibility: false }, // Chromium started with --use-webgpu-adapter=swiftshader
  gpu: { compatibility: false, powerPreference: "high-performance" },
  auto: { compatibility: false }, // whatever Chromium gives
};
const SOFTWARE = /swiftshader|llvmpipe|lavapipe|software/i;

function b64(bytes) {
  const u8 = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (u8.toBase64) return u8.toBase64();
  let text = "";
  for (let i = 0; i < u8.length; i += 0x8000) text += String.fromCharCode.apply(null, u8.subarray(i, i + 0x8000));
  return btoa(text);
}

function unb64(text) {
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text);
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; ++i) out[i] = bin.charCodeAt(i);
  return out;
}

async function fetchOk(url) {
  const res = await fetch(url, { cache: "no-store" });
  if (!res.ok) throw new Error(`GET ${url}: HTTP ${res.status}`);
  return res;
}

/** The tensor cache's parameters `names`, fetched from `base` (tensor-cache.json + its shards). */
async function fetchTensorCache(base, names) {
  const index = await (await fetchOk(`${base}/tensor-cache.json`)).json();
  const found = new Map();
  for (const shard of index.records) {
    const data = new Uint8Array(await (await fetchOk(`${base}/${encodeURIComponent(shard.dataPath)}`)).arrayBuffer());
    for (const rec of shard.records) {
      if (rec.format && rec.format !== "raw") throw new Error(`${rec.name}: tensor format ${rec.format} (only raw)`);
      if (rec.byteOffset + rec.nbytes > data.byteLength) throw new Error(`${rec.name}: past the end of ${shard.dataPath}`);
      found.set(rec.name, { ...rec, bytes: data.subarray(rec.byteOffset, rec.byteOffset + rec.nbytes) });
    }
  }
  return names.map((n) => {
    if (!found.has(n)) throw new Error(`parameter ${n} missing from ${base}/tensor-cache.json`);
    return found.get(n);
  });
}

let session = null;
let gpu = null;
let lost = null; // why the device was lost, once it was

const ops = {
  async open(req) {
    const spec = ADAPTERS[req.adapter];
    if (!spec) throw new Error(`unknown adapter ${req.adapter} (in the browser: swiftshader, gpu or auto)`);
    if (!navigator.gpu) {
      throw new Error(`navigator.gpu is missing in the page (${isSecureContext ? "" : "not a secure context; "}` +
        "WebGPU is off in this Chromium: it needs --enable-unsafe-webgpu)");
    }
    const wasm = new Uint8Array(await (await fetchOk(req.wasm)).arrayBuffer());
    const openGpu = async () => {
      try {
        gpu = await openDevice(navigator.gpu, spec);
      } catch (err) {
        if (/no WebGPU adapter/.test(String(err && err.message))) {
          throw new Error(`no WebGPU adapter in the page: navigator.gpu.requestAdapter() gave none (adapter ${req.adapter})`);
        }
        throw err;
      }
      const name = gpu.info.description || gpu.info.architecture || gpu.info.device || gpu.info.vendor;
      if (req.adapter === "gpu" && (gpu.info.fallback || SOFTWARE.test(`${name} ${gpu.info.architecture}`))) {
        throw new Error(`no GPU adapter: Chromium offers only ${name} (a software adapter)`);
      }
      if (req.needs_f16 && !gpu.info.features.includes("shader-f16")) {
        throw new Error(`adapter ${req.adapter} (${name}) lacks shader-f16, which this f16 artifact needs (q4f32_1 and q0f32 run without it)`);
      }
      const info = gpu.info;
      console.log(`[GPU] ${info.vendor} ${info.architecture} (${info.description || info.device || "?"}), ` +
        `${info.features.join("/") || "no optional features"}, maxBufferSize ${info.limits.maxBufferSize}`);
      gpu.device.lost.then((info) => {
        lost = `the WebGPU device was lost (${info.reason}): ${info.message}`;
        console.error(lost);
      });
      return gpu;
    };
    session = await ModelSession.create(tvmjs, wasm, openGpu, { logger: (m) => console.log(m) });
    let weightsMs = 0;
    if (req.weights) {
      const t0 = performance.now();
      session.setParams(await fetchTensorCache(req.weights, req.params));
      await session.dev.sync();
      weightsMs = performance.now() - t0;
    }
    return { ok: true, adapter: { ...gpu.info, browser: navigator.userAgent }, load_ms: session.loadMs, weights_ms: weightsMs };
  },
  ...sessionOps(() => ({ session, gpu }), { b64, unb64 }),
};

/** Run one op of the runner's protocol; a device loss ends the op (and every later one). */
async function call(op, req) {
  try {
    if (!ops[op]) throw new Error(`unknown op ${op}`);
    if (op !== "open" && !session) throw new Error("no session: send open first");
    if (lost) throw new Error(lost);
    let onLost;
    const gone = new Promise((_, reject) => { onLost = reject; });
    gpu?.device.lost.then(() => onLost(new Error(lost || "the WebGPU device was lost")));
    return await Promise.race([ops[op](req), gone]);
  } catch (err) {
    return { ok: false, error: String(err && err.message ? err.message : err) };
  }
}

if (!tvmjs) {
  window.mlcpipeError = "TVM's web runtime (/tvmjs.js) did not define the global tvmjs";
} else {
  window.mlcpipe = { call };
}
