#!/usr/bin/env bash
# System packages the non-CPU targets need, on Debian/Ubuntu:
#   lld                 ld64.lld links the Metal target's Mach-O dylib
#   emscripten, nodejs  emcc links the WebGPU target's .wasm (with TVM's web runtime)
#   mesa-vulkan-drivers lavapipe: runs WebGPU kernels on the CPU (mlcpipe check, tests)
#   libegl1 libegl-mesa0 libegl-dev  Mesa's EGL: Dawn's OpenGL ES adapter on llvmpipe (--adapter gles)
#   chromium            its SwiftShader Vulkan ICD (--adapter swiftshader) and headless pages (--browser)
#   gcc                 the host C compiler (tests build small shared objects with it)
#   qemu-user gcc-aarch64-linux-gnu  run aarch64 builds of the CPU rules under emulation (tests, qemu marker)
# then `npm ci`: the WebGPU runner's npm packages (webgpu = Dawn for node, @mlc-ai/web-runtime,
# puppeteer-core), pinned by package-lock.json. No browser is downloaded.
# CUDA builds need nvcc (the CUDA toolkit), which is not a Debian package here.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(gcc lld emscripten nodejs mesa-vulkan-drivers libegl1 libegl-mesa0 libegl-dev chromium qemu-user gcc-aarch64-linux-gnu)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-debian: all of ${packages[*]} already installed"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}"
  echo "setup-debian: installed ${missing[*]}"
fi
PUPPETEER_SKIP_DOWNLOAD=1 npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
echo "setup-debian: npm packages installed (node_modules/)"
