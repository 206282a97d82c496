"""The WebGPU run side, all of it: `dawn` (an artifact's lib.wasm on Dawn for node or, with
`browser`, in headless Chromium: engine and kernel runner), `webllm` (WebLLM itself loading a
build), `lavapipe` (single WGSL kernels on wgpu-py / Vulkan for the schedule tests), `profile` (the
profiler's WebGPU driver: timestamp queries through the Dawn engine) and `js/` (the node and
browser programs they drive). The compile side is backends/webgpu.py.
"""
