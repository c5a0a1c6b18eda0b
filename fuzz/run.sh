#!/usr/bin/env bash
# Builds the libFuzzer target fuzz/arena_fuzz.c with clang straight from the
# sources (Bazel here builds with gcc, which has no libFuzzer) and runs it
# for a bounded time, starting from the seed corpus in fuzz/corpus/.
#
#   fuzz/run.sh [seconds]        default 60 (or $FUZZ_SECONDS)
#
# New inputs go to a scratch corpus under the work folder ($FUZZ_WORK, else
# a temporary folder), never into the repository; a crashing input is kept
# there as crash-* and its path printed. To replay one:
#   <work>/arena_fuzz <input>
# Needs clang and libclang-rt-14-dev (tools/bootstrap.sh installs them), ck
# and the CUDA headers (only cuda.h's types are compiled in). -I. is for
# test/util.h (sizes).
# The last line is the summary: fuzz: inputs N, operations M, ..., failures F
set -uo pipefail

cd "$(dirname "$0")/.."
seconds="${1:-${FUZZ_SECONDS:-60}}"
# The CUDA headers where the WORKSPACE finds them (cuda_path), unless
# CUDA_INCLUDE names their folder.
cuda_path="$(sed -nE 's/.*cuda_path *= *"([^"]+)".*/\1/p' WORKSPACE | head -n 1)"
cuda_include="${CUDA_INCLUDE:-${cuda_path:-/usr/local/cuda}/include}"
work="${FUZZ_WORK:-$(mktemp -d)}"
mkdir -p "$work/corpus"
cc="${CLANG:-clang}"

if ! command -v "$cc" >/dev/null 2>&1; then
  echo "fuzz: $cc not found (tools/bootstrap.sh installs clang)"
  echo "fuzz: inputs 0, operations 0, failures 1"
  exit 1
fi

bin="$work/arena_fuzz"
# One compile of the whole library with the target: ASan and UBSan on, as
# the unit tests' sanitizer builds have them; -O1 keeps it quick. ck keeps
# its ABA generation counter in a char * that starts NULL and is
# incremented (ck_stack.h): clang's pointer-overflow check would stop there
# on ck's code, not ours, so that one check is off.
if ! "$cc" -std=c11 -D_GNU_SOURCE -O1 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize=pointer-overflow \
    -fno-sanitize-recover=undefined \
    -Wall -Wextra -Werror -Wno-unused-parameter \
    -I. -Iinclude -Isrc -I"$cuda_include" \
    fuzz/arena_fuzz.c $(find src -name "*.c" | sort) -lck -lpthread -ldl -o "$bin"; then
  echo "fuzz: build failed"
  echo "fuzz: inputs 0, operations 0, failures 1"
  exit 1
fi

# The seeds are read, not written: libFuzzer adds new inputs to the first
# corpus folder only.
log="$work/fuzz.log"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" \
  "$bin" "$work/corpus" fuzz/corpus \
  -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=4096 \
  -artifact_prefix="$work/crash-" -print_final_stats=1 >"$log" 2>&1
rc=$?

summary=$(grep '^fuzz: ' "$log" | tail -1)
runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
if ((rc != 0)); then
  tail -n 60 "$log"
  crash=$(ls "$work"/crash-* 2>/dev/null | head -1)
  echo "fuzz: FAILED (exit $rc); input: ${crash:-none}; log: $log"
  echo "fuzz: inputs ${runs:-?}, ${seconds}s, failures 1"
  exit 1
fi
grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)' "$log" | tail -2
echo "fuzz: ${seconds}s, executed units ${runs:-?}, corpus $(ls "$work/corpus" | wc -l) new inputs (in $work/corpus)"
echo "${summary:-fuzz: no summary printed, failures 1}"
[[ -n "$summary" ]]
