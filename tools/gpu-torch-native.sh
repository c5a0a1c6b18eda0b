#!/usr/bin/env bash
# streamarena's native PyTorch backend (docs/TORCH.md, "The native backend")
# on a GPU, against PyTorch's own allocator. One script, two steps:
#
#   tools/gpu-torch-native.sh stage
#       here, in a checkout (Bazel, pip with PyPI, g++, CUDA headers): builds
#       the plugin and the native backend against torch 2.11.0+cu130's wheel
#       (the GPU machine's torch: the same build, so the same ABI; the run
#       rebuilds there if its torch differs) and stages them with the Python
#       package, the examples, the backend's sources and PyTorch's
#       test_cuda.py into <main checkout>/.gpu-torch-native/ (git ignores
#       it), this script included; then checks what it can without a GPU.
#       Environment:
#         TORCH_TEST_CUDA  PyTorch's test/test_cuda.py, or the allocator tests
#                          of it (default <main checkout>/.torch-tests/
#                          test_cuda.py; without it that part is skipped,
#                          saying so)
#   bash .gpu-torch-native/gpu-torch-native.sh [--only=a,b]
#       on the GPU machine (CUDA 13, python3 3.12 with torch 2.11.0+cu130,
#       pytest; no Bazel, no network), from the checkout's root. Parts, each
#       with its own time limit; one failing does not stop the others:
#         setup      torch's version against the build's; a rebuild with
#                    python -m streamarena.torch build where they differ
#         rows       examples/torch/check_native.py: cudnn.benchmark,
#                    torch.compile default and reduce-overhead, CUDA graphs,
#                    MemPool, OOM, memory fraction, memory history and
#                    _memory_viz, memory_summary, IPC; each row under both
#                    allocators, one line each
#         test-cuda  PyTorch's test_cuda.py allocator tests (memory, OOM,
#                    fraction, record_stream, streaming backwards, CUDA
#                    graphs, MemPool, snapshots) under PyTorch's allocator,
#                    then under streamarena: counts and differing tests
#         train      examples/torch/train.py, the CNN variant (cudnn.benchmark)
#                    compiled with mode="reduce-overhead", on streamarena (one
#                    sequence length: one compilation within the limit)
#         compare-graphs, compare-eager
#                    examples/torch/compare.py: train.py under streamarena,
#                    PyTorch's default allocator and expandable segments,
#                    3 rounds in rotated order; the CNN compiled with
#                    reduce-overhead, then the language model eagerly
#       (--only picks parts: the limits of all add up past one device call;
#       TEST_SELECT, a pytest -k expression, replaces test-cuda's selection,
#       and TEST_CUDA_WHO="streamarena" runs it under streamarena alone)
#       Everything goes under $OUT (default /tmp/native-out), written after
#       each part: summary.txt (the table, printed last), logs.tar.gz,
#       rows.json.
set -uo pipefail
# The parts runner (want, part, parts_table), beside this script here and
# where it is staged.
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gpu-parts.sh"

TORCH_VERSION=2.11.0
# PyTorch's allocator tests in test_cuda.py (pytest -k).
# TestCudaOptims (each optimizer captured in a graph, a matrix of dozens)
# is left out: with it neither run ends within ten minutes.
TEST_SELECT=${TEST_SELECT:-}
[ -n "$TEST_SELECT" ] || TEST_SELECT="(memory or oom or out_of_memory or fraction or record_stream or streaming_backward or graph or MemPool or mem_pool or snapshot or caching_allocator or empty_cache or allocator or cudnn) and not TestCudaOptims"

# ---------------------------------------------------------------------------
# stage (here)
# ---------------------------------------------------------------------------
stage() {
  set -e
  local root main dest plugin cache tests
  root=$(git rev-parse --show-toplevel)
  main=$(cd "$(git rev-parse --git-common-dir)/.." && pwd)
  dest=${GPU_TORCH_NATIVE_DIR:-$main/.gpu-torch-native}
  cd "$root"

  # The torch wheel's headers and libraries, cached as CI caches them.
  bash tools/torch-native-check.sh "$TORCH_VERSION"
  cache=${STREAMARENA_CACHE:-$HOME/.cache/streamarena}/torch-$TORCH_VERSION
  bazel build -c opt //:streamarena_torch
  plugin="$(bazel info -c opt bazel-bin 2>/dev/null)/plugins/torch/libstreamarena_torch.so"

  rm -rf "$dest"
  mkdir -p "$dest"/{python/streamarena,examples/torch,tests,include/streamarena,src/small}
  mkdir -p "$dest"/plugins/torch/native/{core,torch}
  local exclude="$main/.git/info/exclude"
  mkdir -p "$(dirname "$exclude")"
  for d in /.gpu-torch-native/ /.torch-tests/; do
    grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"
  done

  cp python/streamarena/*.py "$plugin" "$dest/python/streamarena/"
  chmod u+w "$dest/python/streamarena/libstreamarena_torch.so"
  cp examples/torch/*.py "$dest/examples/torch/"
  cp examples/checks.py "$dest/examples/"
  # The backend's sources, for a rebuild against another torch there.
  cp plugins/torch/native/core/* "$dest/plugins/torch/native/core/"
  cp plugins/torch/native/torch/* "$dest/plugins/torch/native/torch/"
  cp plugins/torch/streamarena_torch.h "$dest/plugins/torch/"
  cp include/streamarena/*.h "$dest/include/streamarena/"
  cp src/small/size_class.h "$dest/src/small/"
  PYTHONPATH="$dest/python" python3 -m streamarena.torch build --torch-root "$cache" \
    --plugin "$dest/python/streamarena/libstreamarena_torch.so" --out "$dest/python/streamarena" \
    --source-root "$root" --werror
  rm -rf "$dest/python/streamarena/build-native"

  # What torch's testing modules need and the GPU machine lacks: pure
  # Python wheels, unpacked there (the run's test-cuda part).
  mkdir -p "$dest/wheels"
  pip download --no-deps -q -d "$dest/wheels" pytest pluggy iniconfig packaging pygments \
    expecttest || echo "gpu-torch-native.sh: no test wheels: test-cuda needs pytest there" >&2
  # test_cuda.py imports psutil: a binary wheel, for the GPU machine's Python.
  pip download --no-deps -q -d "$dest/wheels" --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 psutil ||
    echo "gpu-torch-native.sh: no psutil wheel: test_cuda.py needs psutil there" >&2

  tests=${TORCH_TEST_CUDA:-$main/.torch-tests/test_cuda.py}
  if [ -f "$tests" ]; then
    cp "$tests" "$dest/tests/test_cuda.py"
  else
    echo "gpu-torch-native.sh: no $tests: the test-cuda part will be skipped" >&2
  fi
  cp tools/gpu-torch-native.sh tools/gpu-parts.sh "$dest/"
  {
    echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+dirty') ($(git rev-parse --abbrev-ref HEAD))"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}')"
    echo "native backend built for $(sed -n 's/.*"torch_version": "\(.*\)".*/\1/p' "$dest/python/streamarena/libstreamarena_torch_native.json")"
    echo "test_cuda.py: $( [ -f "$tests" ] && echo "$tests ($(sha256sum "$tests" | cut -c1-12))" || echo none)"
    (cd "$dest" && find . -type f | sort)
  } > "$dest/MANIFEST"
  self_check "$dest" "$cache"
  echo "staged in $dest: $(du -sh "$dest" | cut -f1) (the device tool carries at most 64 MiB)"
  echo 'next: run(command="bash .gpu-torch-native/gpu-torch-native.sh", carry=[".gpu-torch-native"], timeout_s=600)'
}

# What can be checked here, without a GPU: the libraries find theirs, the
# native library exports its entry points, every script parses.
self_check() {
  local dest=$1 cache=$2 so=$1/python/streamarena/libstreamarena_torch_native.so
  # The libraries it names: torch's three (the GPU machine has them), the
  # CUDA runtime torch brings, and the plugin beside it.
  local lib
  for lib in $(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    case "$lib" in
      libc10.so|libc10_cuda.so|libtorch_cuda.so) [ -f "$cache/torch/lib/$lib" ] ;;
      libstreamarena_torch.so) [ -f "$dest/python/streamarena/$lib" ] ;;
      libcudart.so.*|libstdc++.so.*|libgcc_s.so.*|libc.so.*|libm.so.*|ld-linux*) true ;;
      *) false ;;
    esac || { echo "gpu-torch-native.sh: $so needs $lib, which the GPU machine may lack" >&2; exit 1; }
  done
  for sym in sa_torch_native_install sa_torch_native_get_stats sa_torch_native_built_for; do
    nm -D --defined-only "$so" | grep " T $sym$" >/dev/null ||
      { echo "gpu-torch-native.sh: $so does not export $sym" >&2; exit 1; }
  done
  python3 -m py_compile "$dest"/examples/*.py "$dest"/examples/torch/*.py \
    "$dest"/python/streamarena/*.py
  [ ! -f "$dest/tests/test_cuda.py" ] || python3 -m py_compile "$dest/tests/test_cuda.py"
  find "$dest" -name __pycache__ -type d -prune -exec rm -rf {} +
  bash -n "$dest/gpu-torch-native.sh" && bash -n "$dest/gpu-parts.sh"
  echo "self-check here: passed"
}

# ---------------------------------------------------------------------------
# run (the GPU machine)
# ---------------------------------------------------------------------------
run() {
  local only=""
  for a in "$@"; do
    case "$a" in
      --only=*) only=${a#*=} ;;
      *) echo "gpu-torch-native.sh: unknown argument $a" >&2; exit 2 ;;
    esac
  done
  E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  [ -f "$E/MANIFEST" ] || E=$PWD/.gpu-torch-native
  [ -f "$E/MANIFEST" ] || { echo "gpu-torch-native.sh: nothing staged (tools/gpu-torch-native.sh stage)" >&2; exit 2; }
  OUT=${OUT:-/tmp/native-out}
  LOGS=$(mktemp -d /tmp/native-logs.XXXXXX)
  export E LOGS TEST_SELECT
  mkdir -p "$OUT"
  START=$(date +%s)
  declare -gA RESULT DETAIL
  PARTS=()
  export PYTHONUNBUFFERED=1
  export PYTHONPATH="$E/python:$E/examples/torch:$E/examples${PYTHONPATH:+:$PYTHONPATH}"
  unset STREAMARENA_CONF STREAMARENA_BACKEND STREAMARENA_TORCH PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF

  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    head -4 "$E/MANIFEST"
    echo "$gpu"
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, torch.version.git_version, "cuda", torch.version.cuda)' 2>&1
    echo "g++: $(g++ --version 2>/dev/null | head -1); nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$LOGS/machine.txt"
  cat "$LOGS/machine.txt"

  # setup to train add up to about 550 s at worst, inside the device call's
  # 600; the compare parts need a call of their own (--only).
  part setup 60 setup_native
  part rows 210 python3 "$E/examples/torch/check_native.py" --json "$LOGS/rows.json" --limit 170
  part test-cuda 440 test_cuda
  # One sequence length: one compilation, its CUDA graphs in the backend's pools.
  part train 100 env STREAMARENA_CONF=large_threshold=1KiB python3 "$E/examples/torch/train.py" \
    --allocator streamarena --model cnn --compile reduce-overhead --steps 20 --warmup 5 \
    --layers 4 --d-model 512 --min-seq 512 --max-seq 512 --no-progress

  # train.py under the three allocators, 3 rounds in rotated order
  # (compare.py): compiled with CUDA graphs, then eager.
  local cnn=(--model cnn --warmup 5 --layers 4 --d-model 512 --min-seq 512 --max-seq 512
             --no-progress)
  part compare-graphs 340 python3 "$E/examples/torch/compare.py" --rounds 3 --steps 25 \
    --check-steps 0 --out "$LOGS/compare-graphs" -- --compile reduce-overhead "${cnn[@]}"
  part compare-eager 240 python3 "$E/examples/torch/compare.py" --rounds 3 --steps 60 \
    --check-steps 0 --out "$LOGS/compare-eager" -- --warmup 15 --no-progress

  echo
  for c in compare-graphs compare-eager; do
    [ -f "$LOGS/$c.log" ] && sed -n '/^| allocator/,$p' "$LOGS/$c.log" | grep -v '^results and'
  done
  [ -f "$LOGS/rows.log" ] && grep -E '^(PASS|FAIL| )' "$LOGS/rows.log"
  [ -f "$LOGS/test-cuda.log" ] && sed -n '/^pytorch /,$p' "$LOGS/test-cuda.log" | head -60
  echo
  cat "$OUT/summary.txt"
  for p in "${PARTS[@]}"; do [ "${RESULT[$p]}" = PASS ] || return 1; done
}

# $OUT as it stands: written after every part, so a call stopped at its
# limit still brings back what finished.
save() {
  tar -C "$LOGS" -czf "$OUT/logs.tar.gz" .
  [ -f "$LOGS/rows.json" ] && cp "$LOGS/rows.json" "$OUT/rows.json"
  {
    echo "streamarena native backend on $gpu, $(($(date +%s) - START)) s ($(head -1 "$E/MANIFEST"))"
    parts_table 10
  } > "$OUT/summary.txt"
}

# The staged build where it matches this torch; else a build here.
setup_native() {
  local built
  built=$(python3 -c "
import json, torch
m = json.load(open('$E/python/streamarena/libstreamarena_torch_native.json'))
print('same' if (m['torch_version'], m['torch_git_version']) == (torch.__version__, torch.version.git_version) else m['torch_version'])")
  if [ "$built" != same ]; then
    echo "the staged build is for torch $built: building for this torch"
    python3 -m streamarena.torch build --out "$E/python/streamarena" \
      --plugin "$E/python/streamarena/libstreamarena_torch.so" || return 1
  fi
  python3 -c "
import torch, streamarena.torch as sat
b = sat.install(native=True)
x = torch.ones(1 << 20, device='cuda'); y = (x * 2).sum().item()
assert y == 2 * (1 << 20), y
print('result: native backend', b.built_for(), 'allocates;', torch.cuda.memory_allocated(), 'bytes allocated')"
}

# PyTorch's allocator tests, under each allocator in turn (their memory
# tests size themselves by the device's free memory: one run at a time).
test_cuda() {
  [ -f "$E/tests/test_cuda.py" ] || { echo "result: no test_cuda.py staged"; return 3; }
  if ! python3 -c 'import pytest, expecttest, psutil' 2> /dev/null && ls "$E"/wheels/*.whl > /dev/null 2>&1; then
    local site=/tmp/native-site
    python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
      "$site" "$E"/wheels/*.whl || return 1
    export PYTHONPATH="$site:$PYTHONPATH"
    echo "unpacked $(ls "$E"/wheels | tr '\n' ' ')"
  fi
  python3 -c 'import pytest, expecttest, psutil' 2> /dev/null ||
    { echo "result: pytest, expecttest (torch's testing modules need it) or psutil (test_cuda.py's) is missing"; return 3; }
  local timeout_arg=() rc=0
  python3 -c 'import pytest_timeout' 2> /dev/null && timeout_arg=(--timeout=60)
  cd "$E/tests" || return 1
  for who in ${TEST_CUDA_WHO:-pytorch streamarena}; do
    local sa=0 t0
    t0=$(date +%s)
    [ "$who" = streamarena ] && sa=1
    # SIGINT at the limit: pytest stops as after a ^C and still writes the
    # XML of what ran.
    STREAMARENA_TORCH=$sa STREAMARENA_CONF=large_threshold=1KiB timeout -s INT -k 15 200 \
      python3 -m pytest -p streamarena_pytest -p no:cacheprovider -v -rN \
      "${timeout_arg[@]}" --junitxml="$LOGS/test-cuda-$who.xml" -k "$TEST_SELECT" test_cuda.py \
      > "$LOGS/test-cuda-$who.log" 2>&1
    echo "$who: pytest exit $? after $(($(date +%s) - t0)) s; $(tail -1 "$LOGS/test-cuda-$who.log")"
  done
  python3 "$E/examples/torch/compare_tests.py" "$LOGS/test-cuda-pytorch.xml" \
    "$LOGS/test-cuda-streamarena.xml" --name test_cuda
}

case "${1:-run}" in
  stage) shift; [ $# -eq 0 ] || { echo "usage: tools/gpu-torch-native.sh stage" >&2; exit 2; }; stage ;;
  run) shift; run "$@" ;;
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) run "$@" ;;
esac
