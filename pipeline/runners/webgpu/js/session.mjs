// A model session on a WebGPU device: TVM's web runtime running an mlcpipe lib.wasm.
// Shared by the node runner (Dawn) and the browser page (headless Chromium); it touches
// neither the file system nor the DOM.

const LIMITS = [
  "maxBufferSize", "maxStorageBufferBindingSize", "maxComputeWorkgroupStorageSize",
  "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX", "maxComputeWorkgroupSizeY",
  "maxComputeWorkgroupSizeZ", "maxStorageBuffersPerShaderStage", "maxComputeWorkgroupsPerDimension",
];

/** Adapter + device with the adapter's largest limits and the features the artifact can use. */
export async function openDevice(gpu, { compatibility = false, powerPreference } = {}) {
  const options = compatibility ? { featureLevel: "compatibility" } : {};
  if (powerPreference) options.powerPreference = powerPreference;
  const adapter = await gpu.requestAdapter(options);
  if (!adapter) throw new Error("no WebGPU adapter");
  const requiredLimits = {};
  for (const key of LIMITS) if (adapter.limits[key] !== undefined) requiredLimits[key] = adapter.limits[key];
  const requiredFeatures = ["shader-f16", "timestamp-query", "subgroups"].filter((f) => adapter.features.has(f));
  const device = await adapter.requestDevice({ requiredLimits, requiredFeatures });
  const info = adapter.info || {};
  const errors = [];
  device.addEventListener?.("uncapturederror", (e) => errors.push(String(e.error?.message || e.error)));
  return {
    gpu, adapter, device, errors, // keep `gpu` referenced: Dawn for node frees its instance when it is collected
    info: {
      vendor: info.vendor || "", architecture: info.architecture || "", device: info.device || "",
      description: info.description || "", fallback: Boolean(info.isFallbackAdapter),
      features: requiredFeatures, compatibility,
      limits: Object.fromEntries(Object.entries(requiredLimits)),
    },
  };
}

/** Times every compute pass the runtime records with timestamp queries (when the device has
 *  them): patches the device so each pass gets timestampWrites and each encoder resolves its
 *  queries before it is finished. `take()` returns [[kernel, ns], ...] in dispatch order. */
export class PassTimer {
  constructor(device) {
    this.device = device;
    this.enabled = false;
    this.supported = device.features.has("timestamp-query");
    this.names = new WeakMap(); // pipeline -> entry point (the kernel's name)
    this.pending = []; // promises of [[name, ns], ...] per finished encoder
    const timer = this;
    for (const create of ["createComputePipeline", "createComputePipelineAsync"]) {
      const orig = device[create].bind(device);
      device[create] = (desc) => {
        const out = orig(desc);
        const name = desc.compute.entryPoint;
        if (out && typeof out.then === "function") return out.then((p) => (timer.names.set(p, name), p));
        timer.names.set(out, name);
        return out;
      };
    }
    const createEncoder = device.createCommandEncoder.bind(device);
    device.createCommandEncoder = (desc) => timer.wrapEncoder(createEncoder(desc));
  }

  wrapEncoder(encoder) {
    if (!this.enabled || !this.supported) return encoder;
    const timer = this;
    const sets = [];
    const names = [];
    const CAP = 2048; // queries per set (two per pass)
    const begin = encoder.beginComputePass.bind(encoder);
    encoder.beginComputePass = (desc = {}) => {
      const index = names.length;
      if (index % (CAP / 2) === 0) sets.push(timer.device.createQuerySet({ type: "timestamp", count: CAP }));
      const set = sets[sets.length - 1];
      const slot = (index % (CAP / 2)) * 2;
      names.push("?");
      const pass = begin({ ...desc, timestampWrites: { querySet: set, beginningOfPassWriteIndex: slot, endOfPassWriteIndex: slot + 1 } });
      const setPipeline = pass.setPipeline.bind(pass);
      pass.setPipeline = (p) => { names[index] = timer.names.get(p) || "?"; setPipeline(p); };
      return pass;
    };
    const finish = encoder.finish.bind(encoder);
    encoder.finish = (desc) => {
      const reads = [];
      sets.forEach((set, i) => {
        const count = Math.min(CAP, (names.length - i * (CAP / 2)) * 2);
        const resolve = timer.device.createBuffer({ size: count * 8, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC });
        const read = timer.device.createBuffer({ size: count * 8, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
        encoder.resolveQuerySet(set, 0, count, resolve, 0);
        encoder.copyBufferToBuffer(resolve, 0, read, 0, count * 8);
        reads.push({ read, resolve, set, count });
      });
      const buffer = finish(desc);
      timer.pending.push(async () => {
        const out = [];
        for (const [i, { read, resolve, set, count }] of reads.entries()) {
          await read.mapAsync(GPUMapMode.READ);
          const stamps = new BigInt64Array(read.getMappedRange().slice(0));
          read.unmap();
          for (let k = 0; k < count / 2; ++k) {
            out.push([names[i * (CAP / 2) + k], Number(stamps[2 * k + 1] - stamps[2 * k])]);
          }
          read.destroy(); resolve.destroy(); set.destroy();
        }
        return out;
      });
      return buffer;
    };
    return encoder;
  }

  async take() {
    const jobs = this.pending;
    this.pending = [];
    const out = [];
    for (const job of jobs) out.push(...(await job()));
    return out;
  }
}

/** The artifact's VM on a WebGPU device, with its weights and one paged KV cache. */
export class ModelSession {
  /** openGpu() -> openDevice(...)'s result; called after the wasm is instantiated (Dawn for
   *  node aborts with a futex error when a device exists while V8 compiles the module). */
  static async create(tvmjs, wasmBytes, openGpu, { logger = () => {} } = {}) {
    const s = new ModelSession();
    s.tvmjs = tvmjs;
    const started = performance.now();
    s.tvm = await tvmjs.instantiate(wasmBytes, tvmjs.createPolyfillWASI(), logger);
    s.gpu = await openGpu();
    s.timer = new PassTimer(s.gpu.device);
    s.tvm.initWebGPU(s.gpu.device);
    s.dev = s.tvm.webgpu();
    s.tvm.beginScope();
    s.vm = s.tvm.detachFromCurrentScope(s.tvm.createVirtualMachine(s.dev));
    // No asyncLoadWebGPUPipelines: Dawn for node crashes in createComputePipelineAsync; each
    // pipeline is compiled synchronously on its kernel's first call instead.
    s.fn = {};
    for (const name of ["embed", "prefill", "decode", "create_paged_kv_cache"]) {
      s.fn[name] = s.tvm.detachFromCurrentScope(s.vm.getFunction(name));
    }
    for (const name of ["add_sequence", "remove_sequence", "begin_forward", "end_forward"]) {
      s.fn[name] = s.tvm.detachFromCurrentScope(s.tvm.getGlobalFunc(`vm.builtin.kv_state_${name}`));
    }
    s.tvm.endScope();
    s.loadMs = performance.now() - started;
    return s;
  }

  /** params: [{name, shape, dtype, bytes}] in the order the functions take them. */
  setParams(params) {
    this.tvm.beginScope();
    const tensors = params.map((p) => this.tvm.empty(p.shape, p.dtype, this.dev).copyFromRawBytes(p.bytes));
    this.params = this.tvm.detachFromCurrentScope(this.tvm.makeTVMArray(tensors));
    this.tvm.endScope();
  }

  reset(sizes) {
    this.tvm.beginScope();
    if (this.kv) this.kv.dispose();
    const shape = (n) => this.tvm.makeShapeTuple([n]);
    this.kv = this.tvm.detachFromCurrentScope(this.fn.create_paged_kv_cache(...sizes.map(shape)));
    this.fn.add_sequence(this.kv, new this.tvmjs.Scalar(0, "int64"));
    this.tvm.endScope();
  }

  /** One forward step (prefill chunk or decode): logits of the last token as float32 bytes. */
  async forward(kind, tokens, hidden) {
    this.tvm.beginScope();
    const ids = this.tvm.empty([tokens.length], "int32", this.dev).copyFrom(Int32Array.from(tokens));
    const embed = this.fn.embed(ids, this.params).view([1, tokens.length, hidden]);
    this.fn.begin_forward(this.kv, this.tvm.makeShapeTuple([0]), this.tvm.makeShapeTuple([tokens.length]));
    const out = this.fn[kind](embed, this.kv, this.params);
    this.fn.end_forward(this.kv);
    const logits = out.get(0);
    const host = this.tvm.empty(logits.shape, "float32", this.tvm.cpu()).copyFrom(logits);
    await this.dev.sync();
    const bytes = host.toRawBytes();
    this.tvm.endScope();
    return bytes;
  }

  /** One token from `logits` (float32 bytes of one row) by the library's sampler functions on the
   *  device: apply_penalty_inplace (when `penalty`), softmax_with_temperature, argsort_probs,
   *  sample_with_top_p, as WebLLM and MLC-LLM call them. */
  async sample(logits, { temperature, top_p, uniform, penalty }) {
    this.tvm.beginScope();
    const vocab = logits.byteLength / 4;
    const dev = this.dev;
    const f32 = (shape, values) => this.tvm.empty(shape, "float32", dev).copyFrom(Float32Array.from(values));
    const i32 = (values) => this.tvm.empty([values.length], "int32", dev).copyFrom(Int32Array.from(values));
    const fn = (name) => this.vm.getFunction(name);
    const x = this.tvm.empty([1, vocab], "float32", dev).copyFromRawBytes(logits);
    if (penalty) {
      fn("apply_penalty_inplace")(x, i32([0]), i32(penalty.token_ids.map(() => 0)), i32(penalty.token_ids),
        i32(penalty.token_cnt), f32([1, 3], penalty.penalties));
    }
    const probs = fn("softmax_with_temperature")(x.view([1, 1, vocab]), f32([1], [temperature]));
    const ordered = fn("argsort_probs")(probs.view([1, vocab]));
    const token = fn("sample_with_top_p")(ordered.get(0), ordered.get(1), f32([1], [uniform]), i32([0]), f32([1], [top_p]));
    const host = this.tvm.empty([1], "int32", this.tvm.cpu()).copyFrom(token);
    await dev.sync();
    const out = host.toArray()[0];
    this.tvm.endScope();
    return out;
  }

  /** Run one kernel of the shipped library; returns every tensor argument's bytes afterwards. */
  async runKernel(name, args) {
    this.tvm.beginScope();
    const func = this.tvm.systemLib().getFunction(name);
    const values = args.map((a) =>
      a.tensor ? this.tvm.empty(a.shape, a.dtype, this.dev).copyFromRawBytes(a.bytes) : new this.tvmjs.Scalar(a.value, a.dtype));
    func(...values);
    const hosts = values.map((v, i) => (args[i].tensor ? this.tvm.empty(v.shape, v.dtype, this.tvm.cpu()).copyFrom(v) : null));
    await this.dev.sync();
    const out = hosts.map((h) => (h ? h.toRawBytes() : null));
    this.tvm.endScope();
    return out;
  }
}

/** The runner protocol's ops on an open session (node and browser alike; `open` is theirs):
 *  `state()` gives {session, gpu}; `codec` {b64, unb64} moves bytes as base64 text. */
export function sessionOps(state, { b64, unb64 }) {
  return {
    async reset(req) {
      state().session.reset(req.sizes);
      return { ok: true };
    },
    async forward(req) {
      const { session } = state();
      session.timer.enabled = Boolean(req.timed);
      const t0 = performance.now();
      const logits = await session.forward(req.kind, req.tokens, req.hidden);
      const ms = performance.now() - t0;
      const kernels = req.timed ? await session.timer.take() : [];
      session.timer.enabled = false;
      return { ok: true, logits: b64(logits), ms, kernels };
    },
    async sample(req) {
      const token = await state().session.sample(unb64(req.logits), req);
      return { ok: true, token };
    },
    async kernel(req) {
      const args = req.args.map((a) => (a.tensor ? { ...a, bytes: unb64(a.bytes) } : a));
      const outs = await state().session.runKernel(req.name, args);
      return { ok: true, outputs: outs.map((o) => (o ? b64(o) : null)) };
    },
    async errors() {
      const { gpu } = state();
      return { ok: true, errors: gpu ? gpu.errors.splice(0) : [] };
    },
  };
}
