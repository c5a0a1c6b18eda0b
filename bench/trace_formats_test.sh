#!/usr/bin/env bash
# //bench:replay reads a PyTorch memory history (free at free_requested),
# gzipped, named by a path relative to the folder `bazel run` was typed in
# (BUILD_WORKING_DIRECTORY); on the host simulator.
#   trace_formats_test.sh REPLAY PYTORCH_TRACE
set -euo pipefail
replay="$(realpath "$1")" pt="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}/cwd"
mkdir -p "$dir"
gzip -c "$pt" > "$dir/pt.csv.gz"

# The run starts in /: the sanitizer settings' relative suppressions path
# (.bazelrc) must point at this test's runfiles from there.
export TSAN_OPTIONS="${TSAN_OPTIONS:-}"
TSAN_OPTIONS="${TSAN_OPTIONS//suppressions=tools\//suppressions=$PWD/tools/}"
out="$(cd / && BUILD_WORKING_DIRECTORY="$dir" "$replay" --capacity=64MiB pt.csv.gz)"
echo "$out"
# 4, 8 and 1 MiB live before the first free
want="pt.csv.gz: pytorch format, 8 ops, 2 streams, peak live 13.0 MiB"
grep -qF -- "$want" <<<"$out" || { echo "expected: $want"; exit 1; }
grep -qF -- "0 frees of unknown ids, 1 failed allocations, 0 never freed" <<<"$out" ||
  { echo "expected the oom event counted as a failed allocation"; exit 1; }
grep -qF -- "2 events of the recording allocator skipped, 0 addresses" <<<"$out" ||
  { echo "expected the segment events skipped"; exit 1; }
echo PASS
