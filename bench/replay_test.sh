#!/usr/bin/env bash
# The shipped traces' targets (docs/DEFRAG.md), then a log in RMM's format.
#   replay_test.sh REPLAY RMM_LOG TRACE...
# Every figure checked is a deterministic count of the host simulator, not
# a time.
set -euo pipefail
replay="$1" rmm_log="$2"
shift 2

# With a budget (max_physical) of 1.10 and of 1.03 x each trace's peak live
# bytes (rounded up to 2 MiB, so the ratio may pass them slightly): no trace
# runs out of memory; at 1.10 the first-fit reference does on some trace
# where streamarena does not.
"$replay" --headroom=1.10 --check-ratio=1.11 --expect-first-fit-oom "$@"
"$replay" --headroom=1.03 --check-ratio=1.04 "$@"

# No budget (the defaults on a device 4 x the peak): one chunk per growth,
# memory mapped ahead on a climb up to the footprint target (1/64 above the
# highest live bytes so far, plus 64 MiB), which reshapes free memory before
# it grows, within the remapping ledger. Peak reserved / peak live within
# 1.02 on the transformer traces (1.010, and 1.016 on PyTorch's own), 1.33
# on dataframe (1.317: superblocks past the target carved in free spans cost
# no driver call, where remapping them held 1.155 at 3 x the driver time;
# PyTorch's expandable segments held 1.449 on the GPU) and 1.57 on
# fragmentation (1.559; 1.02 takes 13 x its peak live remapped,
# docs/DEFRAG.md). Driver time at the H200's measured costs (a model,
# bench/driver_costs): at most 2.5 us per operation (0.06-0.66; with
# chunk_size=2MiB 1.73-11.8), and at most 100 virtual-memory calls per 1000
# operations (2-75).
for trace in "$@"; do
  case "$(basename "$trace")" in
    dataframe.csv) ratio=1.33 ;;
    fragmentation.csv) ratio=1.57 ;;
    *) ratio=1.02 ;;
  esac
  "$replay" --no-budget --headroom=4 --check-ratio="$ratio" --check-vmm-calls=100 \
    --check-driver-us=2.5 "$trace"
  # Kept spans (keep_spans=1) hold what the defaults hold: a span beside
  # free memory is not kept and one goes back at its thread's next slow
  # path (large/kept.h); kept otherwise, dataframe held 1.629.
  "$replay" --no-budget --headroom=4 --conf=keep_spans=1 --check-ratio="$ratio" "$trace"
  # Smaller chunks trade driver time for footprint where shapes vary:
  # chunk_size=8MiB keeps dataframe within 1.07 (1.063, at 4.4 us/op).
  if [ "$(basename "$trace")" = dataframe.csv ]; then
    "$replay" --no-budget --headroom=4 --conf=chunk_size=8MiB --check-ratio=1.07 "$trace"
  fi
done

# At RMM pool's footprint: footprint_target=2 (fast) holds transformer
# below the pool's 1.403 x peak live in fewer chunks than the pool's 8
# growths on the H200 (1.297 in 7; Note [Transformer at the pool's
# footprint]), and a larger target acts as 2 (at 3 it held 2.467 in 17).
for trace in "$@"; do
  [ "$(basename "$trace")" = transformer.csv ] || continue
  for target in fast 3; do
    "$replay" --no-budget --headroom=4 --conf=footprint_target=$target --check-ratio=1.40 \
      --check-chunks=8 "$trace"
  done
done

out="$("$replay" --capacity=64MiB "$rmm_log")"
echo "$out"
want="rmm_log.csv: rmm format, 12 ops, 3 streams, peak live 19.0 MiB"
grep -qF -- "$want" <<<"$out" || { echo "expected: $want"; exit 1; }
grep -qF -- "1 frees of unknown ids, 1 failed allocations, 0 never freed" <<<"$out" ||
  { echo "expected the unknown free and the failed allocation to be counted"; exit 1; }
