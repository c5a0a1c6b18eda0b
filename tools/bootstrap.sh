#!/usr/bin/env bash
# Installs what building and testing streamarena needs, and nothing that is
# already there. Safe to run again: a second run installs nothing and does
# not touch the network.
#
#   tools/bootstrap.sh            install what is missing (Debian/Ubuntu)
#   tools/bootstrap.sh --check    only report; exit 1 if anything is missing
#
# Needs: Bazel 4 (Debian's bazel-bootstrap), Concurrency Kit (libck-dev),
# cmocka (libcmocka-dev), zlib (zlib1g-dev: the benchmarks read gzipped
# traces), gcc with its sanitizer runtimes (asan, tsan, ubsan configs), the
# CUDA toolkit headers (cuda.h; no GPU or driver needed: the CUDA backend
# loads libcuda.so.1 at run time), and clang with libFuzzer
# (libclang-rt-N-dev) for fuzz/run.sh.
set -euo pipefail

check_only=0
if [[ "${1:-}" == "--check" ]]; then check_only=1; fi

say() { printf 'bootstrap: %s\n' "$*"; }

missing=()

have_pkg() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
  say "this script installs with apt on Debian/Ubuntu; elsewhere install by hand:"
  say "  Bazel 4.2 (bazel-bootstrap), Concurrency Kit 0.7 (libck-dev), cmocka (libcmocka-dev),"
  say "  zlib (zlib1g-dev), gcc with libasan/libtsan/libubsan, and the CUDA toolkit headers."
  exit 1
fi

for pkg in bazel-bootstrap libck-dev libcmocka-dev zlib1g-dev; do
  have_pkg "$pkg" || missing+=("$pkg")
done

# fuzz/run.sh: clang with libFuzzer (libclang_rt.fuzzer).
if ! command -v clang >/dev/null 2>&1; then missing+=(clang); fi
have_pkg libclang-rt-14-dev || have_pkg "libclang-rt-$(clang -dumpversion 2>/dev/null | cut -d. -f1)-dev" ||
  missing+=(libclang-rt-14-dev)

# gcc and its sanitizer runtimes (they ship in libgcc-N-dev).
if ! command -v gcc >/dev/null 2>&1; then
  missing+=(gcc)
else
  gcc_major="$(gcc -dumpversion | cut -d. -f1)"
  for lib in libasan.so libtsan.so libubsan.so; do
    if [[ "$(gcc -print-file-name="$lib")" == "$lib" ]]; then
      missing+=("libgcc-${gcc_major}-dev")
      break
    fi
  done
fi

if ((${#missing[@]} > 0)); then
  if ((check_only)); then
    say "missing: ${missing[*]}"
    exit 1
  fi
  sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      say "missing ${missing[*]}, and not root (no sudo): install them as root"
      exit 1
    fi
  fi
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq ||
    say "apt-get update failed; installing from the package lists at hand"
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  say "packages: all present"
fi

# The CUDA toolkit headers: where the WORKSPACE looks (repositories.bzl,
# cuda_path: /usr/local/cuda unless WORKSPACE passes another). Not installed
# here: the toolkit is large and not in Debian main.
root="$(cd "$(dirname "$0")/.." && pwd)"
cuda_path="$(sed -nE 's/.*cuda_path *= *"([^"]+)".*/\1/p' "$root/WORKSPACE" | head -n 1)"
cuda_include="${cuda_path:-/usr/local/cuda}/include"
if [[ ! -f "$cuda_include/cuda.h" ]]; then
  say "CUDA toolkit headers not found: $cuda_include/cuda.h is missing."
  say "  Only the headers are used (no GPU or driver needed). Either install NVIDIA's"
  say "  CUDA toolkit under /usr/local/cuda, or take them from PyPI:"
  say "    python3 -m pip install --target /opt/cuda-headers nvidia-cuda-runtime"
  say "  (cuda.h lands in /opt/cuda-headers/nvidia/cu13/include), then call"
  say "    streamarena_dependencies(cuda_path = \"/opt/cuda-headers/nvidia/cu13\")"
  say "  in $root/WORKSPACE (and in a consumer's WORKSPACE);"
  say "  this script and fuzz/run.sh then look there too."
  exit 1
fi
say "CUDA headers: $cuda_include/cuda.h"

for tool in bazel gcc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    say "$tool is still not on PATH after installing"
    exit 1
  fi
done
say "ready"
