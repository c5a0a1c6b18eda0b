#!/usr/bin/env bash
# Stages the benchmarks for the GPU machine, on top of what
# tools/gpu-check.sh stages (test and benchmark binaries, libcmocka.so.0,
# libck.so.0, run.sh): bench/torch_compare.py and the runner
# tools/gpu-bench-run.sh, as .gpu/bench/torch_compare.py and .gpu/bench.sh.
# Then checks that the staged alloc_bench starts here, on the host backend,
# with only the staged libraries.
#
#   tools/gpu-bench.sh [--no-build]
# then, with the device tool, one call runs the tests and the benchmarks:
#   run(command="bash .gpu/bench.sh --with-tests", carry=[".gpu"], timeout_s=600)
# (bench.sh's header lists its options; it writes everything under $OUT and
# prints the tables last).
set -euo pipefail

root=$(git rev-parse --show-toplevel)
main=$(cd "$(git rev-parse --git-common-dir)/.." && pwd)
dest=${GPU_DIR:-$main/.gpu}
cd "$root"

# gpu-check.sh starts from an empty $dest: it goes first.
GPU_DIR=$dest bash tools/gpu-check.sh "$@"

bin=$dest/bin/bench/alloc_bench
[ -x "$bin" ] || { echo "gpu-bench.sh: $bin was not staged" >&2; exit 1; }
mkdir -p "$dest/bench"
cp bench/torch_compare.py "$dest/bench/torch_compare.py"
cp tools/gpu-bench-run.sh "$dest/bench.sh"
{
  echo "bench: bench/torch_compare.py, bench.sh (tools/gpu-bench-run.sh)"
} >> "$dest/MANIFEST"

# The staged binary must run with the staged libraries alone (the GPU
# machine has no ck or cmocka): a short host-backend run, no GPU used.
if ! LD_LIBRARY_PATH="$dest/lib" STREAMARENA_BACKEND=host "$bin" --quick --cases=4KiB \
  --threaded=none > /dev/null; then
  echo "gpu-bench.sh: the staged alloc_bench does not run here" >&2
  exit 1
fi
echo "staged benchmarks in $dest: $(du -sh "$dest" | cut -f1) (the tool carries at most 64 MiB)"
echo 'next: run(command="bash .gpu/bench.sh --with-tests", carry=[".gpu"], timeout_s=600)'
