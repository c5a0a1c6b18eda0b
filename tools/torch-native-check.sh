#!/usr/bin/env bash
# Compiles and links the native PyTorch backend (plugins/torch/native) against
# the headers and libraries of the torch wheel from PyPI, the way users build
# it (python -m streamarena.torch build), so that a header change in a torch
# release breaks CI rather than a user. No GPU, no importable torch needed.
#
#   tools/torch-native-check.sh [TORCH_VERSION]      (default 2.11.0, the tested one)
#
# The wheel (about 530 MB) is downloaded once with pip into
# ~/.cache/streamarena/wheels/, the parts the build needs are unpacked into
# ~/.cache/streamarena/torch-VERSION/ (torch/include, the three libraries it
# links, version.py; about 500 MB) and the wheel is deleted: a rerun
# downloads and unpacks nothing.
# Exit status: 0 built, 1 failed, 3 skipped (PyPI unreachable, or no CUDA
# runtime headers), with a line saying which.
set -uo pipefail

version=${1:-2.11.0}
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${STREAMARENA_CACHE:-$HOME/.cache/streamarena}
wheels=$cache/wheels
unpacked=$cache/torch-$version
say() { echo "torch-native-check: $*"; }
t0=$SECONDS

if [ ! -f "$unpacked/.complete" ]; then
  mkdir -p "$wheels"
  whl=$(ls "$wheels"/torch-"$version"-cp3*-manylinux*_x86_64.whl 2>/dev/null | head -1)
  if [ -z "$whl" ]; then
    say "downloading torch $version's wheel (once; cached in $wheels)"
    if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 -d "$wheels" "torch==$version" \
        > "$wheels/pip.log" 2>&1; then
      say "SKIPPED: pip could not download torch==$version (no PyPI here?):"
      tail -3 "$wheels/pip.log"
      exit 3
    fi
    whl=$(ls "$wheels"/torch-"$version"-cp3*-manylinux*_x86_64.whl | head -1)
  fi
  say "unpacking the headers and libraries it links from $(basename "$whl")"
  rm -rf "$unpacked"
  mkdir -p "$unpacked"
  python3 - "$whl" "$unpacked" <<'PY' || { say "FAILED: unpacking $whl"; exit 1; }
import sys, zipfile
whl, dest = sys.argv[1:]
keep = ("torch/include/", "torch/version.py", "torch/lib/libc10.so", "torch/lib/libc10_cuda.so",
        "torch/lib/libtorch_cuda.so")
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(keep):
            z.extract(name, dest)
PY
  touch "$unpacked/.complete"
  rm -f "$whl"
fi

# The CUDA runtime's headers and libcudart: the WORKSPACE's CUDA folder.
cuda=$(sed -nE 's/.*cuda_path *= *"([^"]+)".*/\1/p' "$root/WORKSPACE" | head -n 1)
cuda=${CUDA_HOME:-${cuda:-/usr/local/cuda}}
if [ ! -f "$cuda/include/cuda_runtime_api.h" ]; then
  say "SKIPPED: no CUDA runtime headers in $cuda/include (tools/bootstrap.sh says where to get them)"
  exit 3
fi

cd "$root" || exit 1
if ! bazel build -c opt --color=no --curses=no //:streamarena_torch > /tmp/torch-native-check.bazel.log 2>&1; then
  say "FAILED: bazel build //:streamarena_torch"
  tail -20 /tmp/torch-native-check.bazel.log
  exit 1
fi
plugin="$(bazel info -c opt bazel-bin 2>/dev/null)/plugins/torch/libstreamarena_torch.so"
out=$(mktemp -d /tmp/torch-native-check.XXXXXX)
trap 'rm -rf "$out"' EXIT
if PYTHONPATH="$root/python" python3 -m streamarena.torch build --torch-root "$unpacked" \
    --cuda-home "$cuda" --plugin "$plugin" --out "$out" --werror; then
  say "passed: built and linked against torch $version in $((SECONDS - t0)) s"
  exit 0
fi
say "FAILED: the native backend does not build against torch $version"
exit 1
