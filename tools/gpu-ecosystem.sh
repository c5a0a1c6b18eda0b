#!/usr/bin/env bash
# streamarena's CuPy, Numba and RMM shims (docs/ECOSYSTEM.md) on a GPU. One
# script, two steps:
#
#   tools/gpu-ecosystem.sh stage
#       here, in a checkout (Bazel, pip with PyPI, nvcc, a Python 3.12):
#       builds and stages everything into <main checkout>/.gpu-eco/ (git
#       ignores it), this script included, then checks what it can without
#       a GPU. Environment:
#         CUPY_GIT      a git directory of CuPy holding the tag v14.2.0, whose
#                       tests are staged (default /work/.mirror/cupy+cupy/repo)
#         PYTHON312     a python3.12 for the RMM extension (default: found)
#         ECO_WHEELS    a folder with the RMM wheels (default: pip downloads
#                       them)
#   bash .gpu-eco/gpu-ecosystem.sh [--only=a,b] [--jobs=N]
#       on the GPU machine (CUDA 13, python3 3.12 with CuPy, numba-cuda,
#       pytest; no Bazel, no network), from the checkout's root. Parts, each
#       with its own time limit; one failing does not stop the others:
#         suites     CuPy's own tests (core_tests, math_tests,
#                    cuda_tests/test_memory.py, v14.2.0), subsampled with
#                    one seed (CuPy's CUPY_TEST_RANDOM_SUBSAMPLE), once with
#                    CuPy's pool and once with streamarena.cupy installed,
#                    both at once (--jobs xdist workers each): counts, and
#                    the tests whose outcome differs
#         rmm-cpp    streamarena::rmm_resource through RMM's own resource
#                    checks (rmm_resource_test)
#         rmm-py     the Python resource: set_current_device_resource,
#                    DeviceBuffer, CuPy on RMM, MemoryError (check_rmm.py)
#         numba      the EMM plugin: 4 threads on their own streams writing
#                    and checking patterns (check_numba.py)
#         rmm-bench  RMM's random allocations through RMM's interface
#                    (rmm-streamarena) against the direct C call
#                    (streamarena), interleaved rounds, medians
#         cupy-bench cupy.empty+del pairs and a random-size workload's peak,
#                    streamarena against CuPy's pool (bench_cupy.py)
#       The timing parts run after the others, alone. Everything goes under
#       $OUT (default /tmp/eco-out): summary.txt (the table, printed last),
#       logs.tar.gz (each part's log and results), bench.json.
set -uo pipefail
# The parts runner (want, part, parts_table), beside this script here and
# where it is staged.
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gpu-parts.sh"

SUBSAMPLE_SEED=20261202 # the same subsample of CuPy's tests in both runs
RMM_WHEELS="librmm-cu13==26.10.0 rmm-cu13==26.10.0 rapids-logger==0.3.0"
CUPY_TAG=v14.2.0
SUITES="tests/cupy_tests/core_tests tests/cupy_tests/math_tests tests/cupy_tests/cuda_tests/test_memory.py"

# ---------------------------------------------------------------------------
# stage (here)
# ---------------------------------------------------------------------------
stage() {
  set -e
  local root main dest bin py whl
  root=$(git rev-parse --show-toplevel)
  main=$(cd "$(git rev-parse --git-common-dir)/.." && pwd)
  dest=${GPU_ECO_DIR:-$main/.gpu-eco}
  cd "$root"
  STAGE_WORK=$(mktemp -d /tmp/gpu-eco-stage.XXXXXX)
  trap 'rm -rf "$STAGE_WORK"' EXIT
  local work=$STAGE_WORK

  bazel build -c opt //plugins/python:libstreamarena_python.so //examples/ecosystem:libcupy_floor.so
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
  local lib=$bin/plugins/python/libstreamarena_python.so

  rm -rf "$dest"
  mkdir -p "$dest"/{whl,python/streamarena,examples,rmm,src/include/streamarena,src/plugins/rmm/streamarena,cupy}
  # Keep it out of git, whatever .gitignore says (a folder elsewhere,
  # GPU_ECO_DIR, is git's business not).
  if [ "$dest" = "$main/.gpu-eco" ]; then
    local exclude="$main/.git/info/exclude"
    mkdir -p "$(dirname "$exclude")"
    grep -qxF '/.gpu-eco/' "$exclude" 2>/dev/null || echo '/.gpu-eco/' >> "$exclude"
  fi

  # RMM's wheels, for the GPU machine to install and for the builds here.
  if [ -n "${ECO_WHEELS:-}" ]; then
    cp "$ECO_WHEELS"/librmm_cu13-*.whl "$ECO_WHEELS"/rmm_cu13-*.whl \
      "$ECO_WHEELS"/rapids_logger-*.whl "$dest/whl/"
  else
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 -d "$dest/whl" $RMM_WHEELS
  fi
  mkdir -p "$work/rmm"
  for whl in "$dest"/whl/*.whl; do (cd "$work/rmm" && python3 -m zipfile -e "$whl" .); done

  # A Python 3.12 with Cython and cuda.bindings' .pxd (RMM's cimport them).
  # The first python3.12 that runs: a pyenv shim on the PATH may name a
  # version that no environment selects.
  py=${PYTHON312:-}
  if [ -z "$py" ]; then
    for cand in $(command -v python3.12) $(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null); do
      if "$cand" -c 'import sys' >/dev/null 2>&1; then py=$cand; break; fi
    done
  fi
  [ -n "$py" ] && "$py" -c 'import sys' >/dev/null 2>&1 ||
    { echo "gpu-ecosystem.sh: no python3.12 that runs (set PYTHON312)" >&2; exit 1; }
  "$py" -m venv "$work/venv"
  "$work/venv/bin/pip" install -q cython 'cuda-bindings==13.*'
  bash plugins/rmm/build.sh --rmm "$work/rmm" --lib "$lib" --python "$work/venv/bin/python" \
    --out "$work/build"

  cp python/streamarena/*.py "$lib" "$work"/build/_rmm*.so "$dest/python/streamarena/"
  cp examples/ecosystem/*.py examples/checks.py "$bin/examples/ecosystem/libcupy_floor.so" \
    "$dest/examples/"
  cp "$work/build/rmm_resource_test" "$lib" "$work/rmm/librmm/lib64/librmm.so" \
    "$work/rmm/rapids_logger/lib64/librapids_logger.so" "$dest/rmm/"
  # The test's sources, to build it again there if the binary does not start.
  cp include/streamarena/streamarena.h "$dest/src/include/streamarena/"
  cp plugins/rmm/rmm_resource_test.cu "$dest/src/plugins/rmm/"
  cp plugins/rmm/streamarena/rmm_resource.hpp "$dest/src/plugins/rmm/streamarena/"
  chmod -R u+w "$dest"

  # peer_bench and its RMM plug-in (rmm-streamarena), against the same RMM.
  RMM_ROOT="$work/rmm" TORCH_ROOT=/nonexistent bash bench/peers/build.sh --dest "$dest/peers" \
    > "$work/peers.log" 2>&1 || { cat "$work/peers.log"; exit 1; }
  rm -rf "$dest/peers/traces" "$dest/peers/src"

  # CuPy's tests, as the tag has them.
  local cupy_git=${CUPY_GIT:-/work/.mirror/cupy+cupy/repo}
  # shellcheck disable=SC2086
  git --git-dir="$cupy_git" archive "$CUPY_TAG" pyproject.toml tests/conftest.py \
    tests/cupy_tests/__init__.py tests/cupy_tests/cuda_tests/__init__.py $SUITES |
    tar -x -C "$dest/cupy"

  cp tools/gpu-ecosystem.sh tools/gpu-parts.sh "$dest/"
  {
    echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+dirty') ($(git rev-parse --abbrev-ref HEAD))"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}')"
    echo "cupy tests: $CUPY_TAG of $cupy_git"
    (cd "$dest" && find . -type f | sort)
  } > "$dest/MANIFEST"
  self_check "$dest" "$work"
  echo "staged in $dest: $(du -sh "$dest" | cut -f1) (the device tool carries at most 64 MiB)"
  echo 'next: run(command="bash .gpu-eco/gpu-ecosystem.sh", carry=[".gpu-eco"], timeout_s=600)'
}

# What can be checked here, without a GPU: the staged Python package loads
# its library and allocates on the simulator, the binaries find their
# libraries, peer_bench lists rmm-streamarena, every script parses.
self_check() {
  local dest=$1 work=$2
  STREAMARENA_CONF=backend=host PYTHONPATH="$dest/python" python3 -c '
import streamarena._hooks as h
k = h.get()
st, p = k.alloc(0, 1 << 20)
assert st == 0 and p, (st, p)
assert k.free(0, p, 1 << 20) == 0
print("staged package: allocates and frees on the simulator through", k.path)'
  for f in "$dest"/rmm/rmm_resource_test "$dest"/python/streamarena/_rmm*.so; do
    if LD_LIBRARY_PATH="$work/rmm/librmm/lib64:$work/rmm/rapids_logger/lib64" ldd "$f" | grep -q 'not found'; then
      echo "gpu-ecosystem.sh: $f lacks a library:" >&2
      ldd "$f" | grep 'not found' >&2
      exit 1
    fi
  done
  LD_LIBRARY_PATH="$dest/peers/lib" "$dest/peers/peer_bench" --list \
    --plugin="$dest/peers/plugins/peer_rmm.so" | grep -q '^rmm-streamarena ' ||
    { echo "gpu-ecosystem.sh: the staged peer_bench has no rmm-streamarena" >&2; exit 1; }
  python3 -m py_compile "$dest"/examples/*.py "$dest"/python/streamarena/*.py
  find "$dest" -name __pycache__ -type d -prune -exec rm -rf {} +
  bash -n "$dest/gpu-ecosystem.sh" && bash -n "$dest/gpu-parts.sh"
  echo "self-check here: passed"
}

# ---------------------------------------------------------------------------
# run (the GPU machine)
# ---------------------------------------------------------------------------
run() {
  local only="" jobs=6
  for a in "$@"; do
    case "$a" in
      --only=*) only=${a#*=} ;;
      --jobs=*) jobs=${a#*=} ;;
      *) echo "gpu-ecosystem.sh: unknown argument $a" >&2; exit 2 ;;
    esac
  done
  # The staged folder: this script's own, or .gpu-eco under the checkout's
  # root when it runs from tools/.
  E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  [ -f "$E/MANIFEST" ] || E=$PWD/.gpu-eco
  [ -f "$E/MANIFEST" ] || { echo "gpu-ecosystem.sh: nothing staged (tools/gpu-ecosystem.sh stage)" >&2; exit 2; }
  OUT=${OUT:-/tmp/eco-out}
  LOGS=$(mktemp -d /tmp/eco-logs.XXXXXX)
  export E LOGS jobs # for the parts, which run in a bash of their own
  mkdir -p "$OUT"
  START=$(date +%s)
  declare -gA RESULT DETAIL
  PARTS=()
  export PYTHONUNBUFFERED=1
  export PYTHONPATH="/tmp/eco-site:$E/python:$E/examples${PYTHONPATH:+:$PYTHONPATH}"
  unset STREAMARENA_CONF STREAMARENA_BACKEND

  local gpu
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    head -3 "$E/MANIFEST"
    echo "$gpu"
    python3 -c 'import sys, cupy, numba, numpy; import numba.cuda as c
print("python", sys.version.split()[0], "cupy", cupy.__version__, "numba", numba.__version__, "numpy", numpy.__version__)' 2>&1
    echo "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$LOGS/machine.txt"
  cat "$LOGS/machine.txt"

  # The limits add up to about 450 s at worst (the suites run beside the
  # checks), inside the device call's 600.
  part setup 45 setup_rmm
  if want suites; then
    suite pool 0 &
    local pool_pid=$!
    suite streamarena 1 &
    local sa_pid=$!
  fi
  part rmm-cpp 60 rmm_cpp
  part rmm-py 45 python3 "$E/examples/check_rmm.py"
  part numba 90 env NUMBA_CUDA_MEMORY_MANAGER=streamarena.numba python3 "$E/examples/check_numba.py"
  if want suites; then
    wait "$pool_pid" "$sa_pid"
    part suites 20 python3 "$E/examples/compare_suites.py" "$LOGS/suite-pool.jsonl" \
      "$LOGS/suite-streamarena.jsonl"
  fi
  part rmm-bench 100 rmm_bench
  part cupy-bench 90 python3 "$E/examples/bench_cupy.py" --rounds 7 --json "$LOGS/bench_cupy.json"

  echo
  [ -f "$LOGS/suites.log" ] && sed -n '1,200p' "$LOGS/suites.log"
  echo
  cat "$OUT/summary.txt"
  for p in "${PARTS[@]}"; do [ "${RESULT[$p]}" = PASS ] || return 1; done
}

# $OUT as it stands: written after every part, so a call stopped at its
# limit still brings back what finished.
save() {
  tar -C "$LOGS" -czf "$OUT/logs.tar.gz" .
  [ -f "$LOGS/bench_cupy.json" ] && cp "$LOGS/bench_cupy.json" "$OUT/bench.json"
  {
    echo "streamarena ecosystem on $gpu, $(($(date +%s) - START)) s ($(head -1 "$E/MANIFEST"))"
    parts_table 11
  } > "$OUT/summary.txt"
}

setup_rmm() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/eco-site "$E"/whl/*.whl || return 1
  python3 -c 'import rmm, streamarena.rmm as r; print("result: rmm", rmm.__version__, "compiled resource:", r.compiled())'
}

# One run of CuPy's suites: name, STREAMARENA_CUPY. Outcomes as they come.
suite() {
  local name=$1 sa=$2 xdist=() timeout_arg=()
  python3 -c 'import xdist' 2> /dev/null && xdist=(-n "$jobs")
  python3 -c 'import pytest_timeout' 2> /dev/null && timeout_arg=(--timeout=120)
  rm -f "$LOGS/suite-$name.jsonl"
  # shellcheck disable=SC2086
  (cd "$E/cupy" && STREAMARENA_CUPY=$sa ECO_OUTCOMES="$LOGS/suite-$name.jsonl" \
    CUPY_TEST_RANDOM_SUBSAMPLE=1 _CUPY_TEST_SUBSAMPLE_SEED=$SUBSAMPLE_SEED \
    timeout -k 10 180 python3 -m pytest -p cupy_suite_plugin -p no:cacheprovider -q -rN \
    --continue-on-collection-errors \
    "${xdist[@]}" "${timeout_arg[@]}" $SUITES) > "$LOGS/suite-$name.log" 2>&1
  local rc=$? n=0
  [ -f "$LOGS/suite-$name.jsonl" ] && n=$(wc -l < "$LOGS/suite-$name.jsonl")
  echo "suite $name: exit $rc after $(($(date +%s) - START)) s, $n tests"
}

rmm_cpp() {
  local bin=$E/rmm/rmm_resource_test
  if ldd "$bin" 2>&1 | grep -q 'not found'; then
    # The staged binary does not start here: build it again from the staged
    # sources against the installed wheel.
    local r=/tmp/eco-site
    nvcc -std=c++20 -O2 -arch=sm_90 -I"$E/src/include" -I"$E/src/plugins/rmm" \
      -isystem "$r/librmm/include/rapids" -isystem "$r/librmm/include" \
      -isystem "$r/rapids_logger/include" "$E/src/plugins/rmm/rmm_resource_test.cu" \
      -o /tmp/rmm_resource_test -L"$r/librmm/lib64" -L"$r/rapids_logger/lib64" -lrmm \
      -lrapids_logger -L"$E/rmm" -lstreamarena_python -Xlinker -rpath,"$E/rmm" || return 1
    bin=/tmp/rmm_resource_test
  fi
  "$bin"
}

# RMM's random allocations: streamarena called directly against streamarena
# through RMM's resource interface, a process per backend and round, the
# order alternating; medians per case of the cold runs (a process's first,
# which maps the arena's memory) and of the warm ones (its seven later runs,
# pooled over the rounds: a warm 4 GiB run lasts about a millisecond), the
# 1.5x bound on the warm medians.
rmm_bench() {
  local P=$E/peers r b
  for r in 1 2 3; do
    for b in $([ $((r % 2)) -eq 1 ] && echo streamarena rmm-streamarena || echo rmm-streamarena streamarena); do
      LD_LIBRARY_PATH="$P/lib" timeout -k 5 25 "$P/peer_bench" --require-gpu --workloads=random \
        --backends="$b" --plugin="$P/plugins/peer_rmm.so" --random-runs=8 --random-max-s=5 \
        --json="$LOGS/random.jsonl" > "$LOGS/random-$b-$r.log" 2>&1 ||
        echo "round $r $b: exit $? (random-$b-$r.log)"
    done
  done
  python3 "$E/examples/random_summary.py" "$LOGS/random.jsonl"
}

case "${1:-run}" in
  stage) shift; [ $# -eq 0 ] || { echo "usage: tools/gpu-ecosystem.sh stage" >&2; exit 2; }; stage ;;
  run) shift; run "$@" ;;
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) run "$@" ;;
esac
