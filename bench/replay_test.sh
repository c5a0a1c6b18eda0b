#!/usr/bin/env bash
# Replays the shipped traces at a device size of 1.10 x each trace's peak
# live bytes and checks the targets (bench/BUILD.bazel, docs/DEFRAG.md);
# then reads a log in RMM's format and checks what it understood.
#   replay_test.sh REPLAY RMM_LOG TRACE...
set -euo pipefail
replay="$1" rmm_log="$2"
shift 2
"$replay" --headroom=1.10 --check-ratio=1.10 --expect-first-fit-oom "$@"

out="$("$replay" --capacity=64MiB "$rmm_log")"
echo "$out"
want="rmm_log.csv: rmm format, 12 ops, 3 streams, peak live 19.0 MiB"
grep -qF -- "$want" <<<"$out" || { echo "expected: $want"; exit 1; }
grep -qF -- "1 frees of unknown ids, 1 failed allocations, 0 never freed" <<<"$out" ||
  { echo "expected the unknown free and the failed allocation to be counted"; exit 1; }
