// The page side of the runner's `webllm` op: WebLLM (npm @mlc-ai/web-llm, served as /web-llm.js)
// loads an mlcpipe webgpu library and model directory the way an app would (a `model_list` record
// with model = the directory's URL, model_lib = the lib.wasm URL) and completes a prompt.
// Resolves to {ok: true, text, usage, adapter} or {ok: false, error}; never throws.
import * as webllm from "/web-llm.js";

const MODEL_ID = "mlcpipe-model";

async function generate(req) {
  const progress = [];
  let engine = null;
  try {
    const appConfig = {
      model_list: [{ model: new URL(req.model, location.href).href, model_id: MODEL_ID,
                     model_lib: new URL(req.model_lib, location.href).href, required_features: req.required_features || [] }],
      cacheBackend: "cache",
    };
    engine = await webllm.CreateMLCEngine(MODEL_ID, {
      appConfig, logLevel: "WARN", initProgressCallback: (p) => progress.push(p.text),
    });
    const request = {
      prompt: req.prompt, max_tokens: req.max_tokens, temperature: req.temperature, top_p: req.top_p,
      frequency_penalty: req.frequency_penalty, presence_penalty: req.presence_penalty, ignore_eos: req.ignore_eos,
      stream: false,
    };
    if (req.repetition_penalty !== undefined) request.repetition_penalty = req.repetition_penalty;
    if (req.seed !== undefined && req.seed !== null) request.seed = req.seed;
    const out = await engine.completions.create(request);
    const adapter = await (await navigator.gpu.requestAdapter())?.info;
    return {
      ok: true, text: out.choices[0].text, finish_reason: out.choices[0].finish_reason, usage: out.usage,
      adapter: adapter ? { vendor: adapter.vendor, architecture: adapter.architecture, description: adapter.description } : null,
      progress: progress.slice(-1),
    };
  } catch (err) {
    return { ok: false, error: `WebLLM: ${err && err.message ? err.message : err}` };
  } finally {
    if (engine) try { await engine.unload(); } catch {}
  }
}

window.mlcpipeWebLLM = { generate };
