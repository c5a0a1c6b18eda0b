#!/usr/bin/env bash
# Builds the peer benchmark and its plug-ins here and stages them, with the
# runner, for a machine with a GPU (CUDA 13, python3 with torch; no Bazel).
#
#   RMM_ROOT=DIR TORCH_ROOT=DIR bench/peers/build.sh [--dest DIR]
#
#   RMM_ROOT    a folder holding librmm/ and rapids_logger/ as the PyPI wheels
#               librmm-cu13 (26.x) and rapids-logger unpack them (headers,
#               librmm.so, librapids_logger.so; RMM's own CCCL copy under
#               librmm/include/rapids). Default: where python3 imports them.
#   TORCH_ROOT  a folder holding torch/ as torch's wheel unpacks it
#               (torch/include, torch/lib). Default: where python3 imports it.
#   --dest      where to stage (default: <main checkout>/.gpu/peers, which
#               git ignores)
#   CUDA_HOME   the CUDA toolkit (default /usr/local/cuda): its headers, and
#               libcudart_static.a for the RMM plug-in
# A plug-in whose library is not found is left out with a message; the
# program itself (Bazel, -c opt) always builds. PyTorch's libraries are not
# staged: the runner loads the GPU machine's own, and rebuilds the torch
# plug-in there if that torch is another version.
#
# Staged: peer_bench, plugins/peer_rmm.so and peer_torch.so, lib/ (librmm,
# librapids_logger, and what peer_bench needs beyond the base system),
# run.sh (bench/peers/run.sh), plot.py, ab.sh and ab.py (two builds
# compared: tools/gpu-ab.sh), record_torch_trace.py with the converter it
# uses (bench/torch_trace.py), the shipped traces, src/ (the torch
# plug-in's source, for a rebuild there), MANIFEST.
# Then checks that the staged program and the RMM plug-in load here.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
main=$(cd "$(git rev-parse --git-common-dir)/.." && pwd)
dest=${GPU_DIR:-$main/.gpu}/peers
while [ $# -gt 0 ]; do
  case "$1" in
    --dest) dest=$2; shift 2 ;;
    --dest=*) dest=${1#*=}; shift ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
cd "$root"
cuda=${CUDA_HOME:-/usr/local/cuda}
say() { echo "build.sh: $*"; }

# Where python3 would import a package from ("" if it cannot).
py_root() { python3 -c "import os, $1; print(os.path.dirname(os.path.dirname($1.__file__)))" 2>/dev/null || true; }
rmm=${RMM_ROOT:-$(py_root librmm)}
torch=${TORCH_ROOT:-$(py_root torch)}

bazel build -c opt //bench/peers:peer_bench //plugins/python:libstreamarena_python.so
bazel_bin=$(bazel info -c opt bazel-bin 2>/dev/null)
bin=$bazel_bin/bench/peers/peer_bench

rm -rf "$dest"
mkdir -p "$dest/plugins" "$dest/lib" "$dest/traces" "$dest/src/bench/peers"
exclude="$main/.git/info/exclude"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
cp "$bin" "$dest/peer_bench"
chmod u+w "$dest/peer_bench"

cxx=(g++ -std=c++20 -O2 -DNDEBUG -fPIC -shared -fvisibility=hidden -Wall -Wextra -Werror
     -Wno-unused-parameter -I"$root")
plugins=()
if [ -n "$rmm" ] && [ -f "$rmm/librmm/lib64/librmm.so" ]; then
  say "RMM plug-in against $rmm ($(cat "$rmm/librmm/VERSION" 2>/dev/null || echo '?'))"
  # RMM's CCCL first: it is newer than the toolkit's. The CUDA runtime goes
  # in statically (librmm.so carries its own the same way). rmm-streamarena
  # is streamarena's RMM resource (plugins/rmm) over libstreamarena_python.so.
  "${cxx[@]}" -isystem "$rmm/librmm/include/rapids" -isystem "$rmm/librmm/include" \
    -isystem "$rmm/rapids_logger/include" -isystem "$cuda/include" \
    -I"$root/include" -I"$root/plugins/rmm" \
    bench/peers/rmm_backends.cc -o "$dest/plugins/peer_rmm.so" \
    -L"$rmm/librmm/lib64" -L"$rmm/rapids_logger/lib64" -lrmm -lrapids_logger \
    -L"$bazel_bin/plugins/python" -lstreamarena_python \
    -L"$cuda/lib64" -lcudart_static -ldl -lpthread -lrt -Wl,-rpath,'$ORIGIN/../lib' -Wl,-z,defs
  cp "$rmm/librmm/lib64/librmm.so" "$rmm/rapids_logger/lib64/librapids_logger.so" \
    "$bazel_bin/plugins/python/libstreamarena_python.so" "$dest/lib/"
  chmod u+w "$dest/lib/libstreamarena_python.so"
  plugins+=("rmm: $(cat "$rmm/librmm/VERSION" 2>/dev/null || echo '?')")
else
  say "no RMM (set RMM_ROOT): the rmm-* backends are left out"
fi

torch_version=
if [ -n "$torch" ] && [ -f "$torch/torch/lib/libc10_cuda.so" ]; then
  torch_version=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$torch/torch/version.py" 2>/dev/null)
  say "torch plug-in against $torch (${torch_version:-?})"
  # torch's wheels use the C++11 string ABI (their libc10.so exports
  # __cxx11 symbols); the plug-in must match.
  "${cxx[@]}" -D_GLIBCXX_USE_CXX11_ABI=1 -isystem "$torch/torch/include" -isystem "$cuda/include" \
    bench/peers/torch_backends.cc -o "$dest/plugins/peer_torch.so" \
    -L"$torch/torch/lib" -lc10_cuda -lc10
  plugins+=("torch: ${torch_version:-?}")
else
  say "no torch (set TORCH_ROOT): the torch backends are left out"
fi
cp bench/peers/torch_backends.cc bench/peers/backend.h "$dest/src/bench/peers/"

# What peer_bench loads beyond the C and C++ runtimes and zlib (the GPU
# machine's Ubuntu has those, newer): libck.
ldd "$dest/peer_bench" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r so path; do
  case "$so" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libgcc_s.so.*|libstdc++.so.*|libz.so.*) ;;
    *) cp -L "$path" "$dest/lib/$so" ;;
  esac
done

cp bench/peers/run.sh bench/peers/plot.py bench/peers/ab.sh bench/peers/ab.py \
  bench/peers/record_torch_trace.py bench/torch_trace.py "$dest/"
cp bench/traces/*.csv bench/traces/*.csv.gz "$dest/traces/"
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!*.md' || echo '+dirty') ($(git rev-parse --abbrev-ref HEAD))"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "torch_version ${torch_version:-none}"
  printf 'plugin %s\n' "${plugins[@]}"
  (cd "$dest" && find . -type f | sort)
} > "$dest/MANIFEST"

# The staged program must start here with the staged libraries alone, and
# load the RMM plug-in (no GPU needed to load it).
check=(--list)
[ -f "$dest/plugins/peer_rmm.so" ] && check+=(--plugin="$dest/plugins/peer_rmm.so")
if ! LD_LIBRARY_PATH="$dest/lib" "$dest/peer_bench" "${check[@]}" > "$dest/list.txt" 2>&1; then
  cat "$dest/list.txt" >&2
  say "the staged peer_bench does not start here"
  exit 1
fi
cat "$dest/list.txt"
rm "$dest/list.txt"
say "staged in $dest: $(du -sh "$dest" | cut -f1)"
say "on the GPU machine, from the checkout's root: bash ${dest#"$main"/}/run.sh [--quick]"
