// mlcpipe's WebGPU runner in headless Chromium: the same JSON-lines protocol as node_runner.mjs
// (one request per line on stdin, one reply per line on stdout, bytes as base64), each request
// forwarded to a page (page.html + page.mjs + session.mjs + TVM's web runtime) that runs the
// artifact's lib.wasm on the page's own WebGPU. The page and the files it needs (the artifact's
// lib.wasm, the weights' tensor-cache.json and shards) are served from 127.0.0.1 on an ephemeral
// port: only those files, looked up by exact path. Chromium is the system's (MLCPIPE_CHROMIUM,
// default /usr/bin/chromium), driven by puppeteer-core, in a fresh temporary profile; it is
// closed on `close`, on stdin EOF and when this process exits. The page's console goes to stderr
// as `[browser:log|warning|error] ...`. One more op, `webllm` (pipeline/runners/webgpu/webllm.py), opens
// webllm.html instead: WebLLM's own engine (npm @mlc-ai/web-llm) loads a lib.wasm and a model
// directory served here and completes one prompt.
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

// The npm packages (`npm ci` in the checkout): $MLCPIPE_NODE_MODULES, set by pipeline/runners/webgpu/dawn.py.
const MODULES = process.env.MLCPIPE_NODE_MODULES;
const { default: puppeteer } = await import(pathToFileURL(path.join(MODULES, "puppeteer-core", "lib", "puppeteer", "puppeteer-core.js")).href);

const HERE = path.dirname(fileURLToPath(import.meta.url));
const RUNTIME_JS = path.join(MODULES, "@mlc-ai", "web-runtime", "lib", "index.js"); // UMD
const WEBLLM_JS = path.join(MODULES, "@mlc-ai", "web-llm", "lib", "index.js"); // ES module, self-contained
const CHROMIUM = process.env.MLCPIPE_CHROMIUM || "/usr/bin/chromium";
const LAUNCH_MS = 60_000;
const OP_MS = 1000 * Number(process.env.MLCPIPE_BROWSER_TIMEOUT_S || 600); // one request to the page

const reply = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const log = (line) => process.stderr.write(line.replace(/\n+$/, "") + "\n");
console.log = (...args) => console.error(...args);
console.info = console.log;

/** One line for the user: puppeteer's errors carry Chromium's output and call logs. */
const oneLine = (err) => String(err && err.message ? err.message : err).split("\n").map((s) => s.trim()).filter(Boolean).join(" | ").slice(0, 600);

// ---- the local HTTP server: a fixed map of URL path -> file -------------------------------------

const TYPES = { ".html": "text/html", ".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm", ".json": "application/json" };
const files = new Map([
  ["/", path.join(HERE, "page.html")],
  ["/page.mjs", path.join(HERE, "page.mjs")],
  ["/session.mjs", path.join(HERE, "session.mjs")],
  ["/tvmjs.js", RUNTIME_JS],
  ["/webllm.html", path.join(HERE, "webllm.html")],
  ["/webllm.mjs", path.join(HERE, "webllm.mjs")],
  ["/web-llm.js", WEBLLM_JS],
]);

const server = http.createServer((req, res) => {
  const deny = (status) => { res.writeHead(status, { "content-type": "text/plain" }); res.end(`${status}\n`); };
  if (req.headers.host !== `127.0.0.1:${server.address().port}`) return deny(403); // no other origin (DNS rebinding)
  if (req.method !== "GET" && req.method !== "HEAD") return deny(405);
  let pathname;
  try {
    pathname = decodeURIComponent(new URL(req.url, "http://127.0.0.1").pathname);
  } catch {
    return deny(400);
  }
  const file = files.get(pathname);
  if (!file) return deny(404);
  fs.stat(file, (err, st) => {
    if (err || !st.isFile()) return deny(404);
    res.writeHead(200, {
      "content-type": TYPES[path.extname(file)] || "application/octet-stream",
      "content-length": st.size, "cache-control": "no-store",
    });
    if (req.method === "HEAD") return res.end();
    fs.createReadStream(file).on("error", () => res.destroy()).pipe(res);
  });
});

/** Serve the artifact's library and the weights' files; the URLs the page fetches them from. */
function serveArtifact(wasm, weights) {
  for (const key of [...files.keys()]) if (key === "/lib.wasm" || key.startsWith("/weights/")) files.delete(key);
  if (!fs.statSync(wasm, { throwIfNoEntry: false })?.isFile()) throw new Error(`${wasm}: no such file`);
  files.set("/lib.wasm", path.resolve(wasm));
  if (!weights) return { wasm: "/lib.wasm", weights: null };
  const dir = path.resolve(weights);
  const index = path.join(dir, "tensor-cache.json");
  const shards = JSON.parse(fs.readFileSync(index, "utf8")).records.map((r) => r.dataPath);
  files.set("/weights/tensor-cache.json", index);
  for (const name of shards) {
    const file = path.resolve(dir, name);
    if (path.dirname(file) !== dir) throw new Error(`${index}: shard ${JSON.stringify(name)} is not a file of ${dir}`);
    files.set(`/weights/${name}`, file);
  }
  return { wasm: "/lib.wasm", weights: "/weights" };
}

/** Serve a webgpu library and an MLC model directory (its top-level files) for WebLLM under a fresh
 *  prefix (WebLLM caches by URL: a second model must not meet the first one's files). */
let webllmServed = 0;
function serveWebLLM(wasm, modelDir) {
  for (const key of [...files.keys()]) if (key.startsWith("/webllm/")) files.delete(key);
  if (!fs.statSync(wasm, { throwIfNoEntry: false })?.isFile()) throw new Error(`${wasm}: no such file`);
  const dir = path.resolve(modelDir);
  if (!fs.statSync(dir, { throwIfNoEntry: false })?.isDirectory()) throw new Error(`${modelDir}: no such directory`);
  const prefix = `/webllm/${++webllmServed}`;
  files.set(`${prefix}/lib.wasm`, path.resolve(wasm));
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    if (entry.isFile()) files.set(`${prefix}/model/resolve/main/${entry.name}`, path.join(dir, entry.name));
  }
  return { model_lib: `${prefix}/lib.wasm`, model: `${prefix}/model/resolve/main/` };
}

// ---- the browser --------------------------------------------------------------------------------

const CHROMIUM_ARGS = {
  // Chromium's own SwiftShader (Dawn's Vulkan backend on it, like --adapter swiftshader in node)
  swiftshader: ["--use-webgpu-adapter=swiftshader"],
  // a GPU through Dawn's Vulkan backend (off by default on Linux)
  gpu: ["--enable-features=Vulkan"],
  auto: ["--enable-features=Vulkan"],
};

let browser = null;
let page = null;
let profile = null;
let failure = null; // set once the page or the browser is gone: every later request fails with it
let failed = null; // a promise rejected with `failure`

function fail(message) {
  if (!failure) {
    failure = message;
    log(`[browser:error] ${message}`);
    failed.reject(new Error(message));
  }
}

async function launch(adapter) {
  if (!fs.existsSync(CHROMIUM)) {
    throw new Error(`Chromium not found at ${CHROMIUM} (Debian package chromium; or set MLCPIPE_CHROMIUM to its binary)`);
  }
  failure = null;
  let rejectFailed;
  failed = new Promise((_, reject) => { rejectFailed = reject; });
  failed.catch(() => {});
  failed.reject = rejectFailed;
  removeStaleProfiles();
  profile = fs.mkdtempSync(path.join(os.tmpdir(), `mlcpipe-chromium-${process.pid}-`));
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true, // --headless=new
    userDataDir: profile,
    pipe: true, // DevTools over a pipe: Chromium quits when this process goes, even when it is killed
    timeout: LAUNCH_MS,
    protocolTimeout: OP_MS + 30_000,
    args: [
      "--no-sandbox", // root in containers; the page only loads this runner's files
      "--disable-dev-shm-usage",
      "--enable-unsafe-webgpu", // WebGPU on Linux
      "--enable-webgpu-developer-features", // full-resolution timestamp queries, adapter descriptions
      "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", // nothing but the runner's server
      ...CHROMIUM_ARGS[adapter],
    ],
  }).catch((err) => {
    removeProfile();
    throw new Error(`Chromium (${CHROMIUM}) did not start: ${oneLine(err)}`);
  });
  browser.on("disconnected", () => fail("Chromium exited (or its DevTools connection closed)"));
  page = await browser.newPage();
  page.setDefaultTimeout(LAUNCH_MS);
  page.on("console", (msg) => {
    const type = msg.type();
    const kind = type === "warn" || type === "warning" ? "warning" : type === "error" || type === "assert" ? "error" : "log";
    log(`[browser:${kind}] ${msg.text()}`);
  });
  page.on("pageerror", (err) => log(`[browser:error] ${oneLine(err)}`));
  page.on("requestfailed", (req) => log(`[browser:error] ${req.url()}: ${req.failure()?.errorText || "failed"}`));
  page.on("response", (res) => { if (res.status() >= 400) log(`[browser:error] ${res.url()}: HTTP ${res.status()}`); });
  page.on("error", (err) => fail(`the browser page crashed: ${oneLine(err)}`));
}

async function closeBrowser() {
  const b = browser;
  browser = null;
  if (b) {
    b.removeAllListeners("disconnected");
    await Promise.race([b.close().catch(() => {}), new Promise((r) => setTimeout(r, 10_000))]);
    try { b.process()?.kill("SIGKILL"); } catch {}
  }
  removeProfile();
}

/** Profiles left by runners that were killed (SIGKILL: no exit handler ran); Chromium itself quits
 *  with its runner (DevTools pipe). */
function removeStaleProfiles() {
  for (const name of fs.readdirSync(os.tmpdir())) {
    const pid = Number(/^mlcpipe-chromium-(\d+)-/.exec(name)?.[1]);
    if (!pid || pid === process.pid) continue;
    try {
      process.kill(pid, 0);
    } catch (err) {
      if (err.code === "ESRCH") try { fs.rmSync(path.join(os.tmpdir(), name), { recursive: true, force: true }); } catch {}
    }
  }
}

function removeProfile() {
  if (profile) {
    try { fs.rmSync(profile, { recursive: true, force: true }); } catch {}
    profile = null;
  }
}

process.on("exit", () => {
  try { browser?.process()?.kill("SIGKILL"); } catch {}
  removeProfile();
});
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(sig, () => process.exit(1));

/** page.evaluate of one op, bounded by OP_MS and ended by a page crash or Chromium exiting. */
async function callPage(op, req) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const message = `${op} took longer than ${OP_MS / 1000} s in the browser (MLCPIPE_BROWSER_TIMEOUT_S)`;
      fail(message); // the page is still busy with it: later requests fail, a new open starts a new browser
      reject(new Error(message));
    }, OP_MS);
  });
  try {
    return await Promise.race([page.evaluate((o, r) => window.mlcpipe.call(o, r), op, req), timeout, failed]);
  } finally {
    clearTimeout(timer);
  }
}

// ---- the protocol -------------------------------------------------------------------------------

const ADAPTERS = ["swiftshader", "gpu", "auto"];
let opened = false;

async function open(req) {
  const adapter = req.adapter || "auto";
  if (!ADAPTERS.includes(adapter)) throw new Error(`adapter ${adapter}: in the browser Chromium picks the adapter (swiftshader, gpu or auto)`);
  const urls = serveArtifact(req.wasm, req.weights);
  if (!server.listening) await new Promise((resolve, reject) => server.listen(0, "127.0.0.1", resolve).once("error", reject));
  opened = false;
  if (browser && (failure || browser.adapter !== adapter)) await closeBrowser(); // a new browser after a crash
  if (!browser) {
    await launch(adapter);
    browser.adapter = adapter;
  }
  const origin = `http://127.0.0.1:${server.address().port}`;
  await Promise.race([page.goto(`${origin}/`, { waitUntil: "load", timeout: LAUNCH_MS }), failed]);
  const ready = await Promise.race([
    page.waitForFunction(() => window.mlcpipe || window.mlcpipeError, { timeout: LAUNCH_MS }).then((h) => h.jsonValue()).catch(() => null),
    failed,
  ]);
  if (!ready || typeof ready === "string") {
    throw new Error(`the runner page did not load: ${typeof ready === "string" ? ready : "window.mlcpipe never appeared (see [browser:error] lines)"}`);
  }
  const { wasm, weights, ...rest } = req;
  const out = await callPage("open", { ...rest, adapter, wasm: urls.wasm, weights: urls.weights });
  opened = Boolean(out.ok);
  if (out.ok) out.adapter = { ...out.adapter, browser: await browser.version() }; // e.g. Chrome/156.0.8078.79
  return out;
}

/** WebLLM's own engine (webllm.html) on a library + model directory: one completion. */
async function runWebLLM(req) {
  if (!fs.existsSync(WEBLLM_JS)) throw new Error(`npm package @mlc-ai/web-llm not found in ${MODULES} (npm ci)`);
  const adapter = req.adapter || "auto";
  if (!ADAPTERS.includes(adapter)) throw new Error(`adapter ${adapter}: in the browser Chromium picks the adapter (swiftshader, gpu or auto)`);
  const urls = serveWebLLM(req.wasm, req.model_dir);
  if (!server.listening) await new Promise((resolve, reject) => server.listen(0, "127.0.0.1", resolve).once("error", reject));
  opened = false; // the page is WebLLM's now, not a runner session
  if (browser && (failure || browser.adapter !== adapter)) await closeBrowser();
  if (!browser) {
    await launch(adapter);
    browser.adapter = adapter;
  }
  const origin = `http://127.0.0.1:${server.address().port}`;
  await Promise.race([page.goto(`${origin}/webllm.html`, { waitUntil: "load", timeout: LAUNCH_MS }), failed]);
  const ready = await Promise.race([
    page.waitForFunction(() => Boolean(window.mlcpipeWebLLM), { timeout: LAUNCH_MS }).then(() => true).catch(() => false),
    failed,
  ]);
  if (!ready) throw new Error("the WebLLM page did not load (see [browser:error] lines)");
  const { wasm, model_dir, op, ...rest } = req;
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const message = `webllm took longer than ${OP_MS / 1000} s in the browser (MLCPIPE_BROWSER_TIMEOUT_S)`;
      fail(message);
      reject(new Error(message));
    }, OP_MS);
  });
  try {
    const out = await Promise.race([page.evaluate((r) => window.mlcpipeWebLLM.generate(r), { ...rest, ...urls }), timeout, failed]);
    if (out && out.ok) out.browser = await browser.version();
    return out;
  } finally {
    clearTimeout(timer);
  }
}

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  let req;
  try {
    req = JSON.parse(line);
  } catch (err) {
    reply({ ok: false, error: `bad request: ${oneLine(err)}` });
    continue;
  }
  if (req.op === "close") break;
  try {
    let out;
    if (req.op === "open") {
      out = await open(req);
    } else if (req.op === "webllm") {
      out = await runWebLLM(req);
    } else {
      if (failure) throw new Error(failure);
      if (!opened) throw new Error("no session: send open first");
      out = await callPage(req.op, req);
    }
    reply(out && typeof out === "object" ? out : { ok: false, error: `the page answered ${JSON.stringify(out)}` });
  } catch (err) {
    reply({ ok: false, error: oneLine(err) });
  }
}
await closeBrowser();
server.close();
process.exit(0);
