#!/usr/bin/env bash
# System packages the non-CPU targets need, on Debian/Ubuntu:
#   lld                 ld64.lld links the Metal target's Mach-O dylib
#   emscripten, nodejs  emcc links the WebGPU target's .wasm (with TVM's web runtime)
#   mesa-vulkan-drivers lavapipe: runs WebGPU kernels on the CPU (mlcpipe check, tests)
# CUDA builds need nvcc (the CUDA toolkit), which is not a Debian package here.
set -euo pipefail
packages=(lld emscripten nodejs mesa-vulkan-drivers)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-debian: all of ${packages[*]} already installed"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}"
echo "setup-debian: installed ${missing[*]}"
