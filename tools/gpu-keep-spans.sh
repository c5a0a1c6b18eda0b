#!/bin/bash
# keep_spans on a GPU: the library's and CuPy's hook pairs with it on and
# off (interleaved rounds), CuPy's pairs and workload (bench_cupy.py) on and
# off, the 16 MiB pair against the peers (one process each), the soak and
# kept_span_test with it on; a table last (docs/BENCHMARKS.md, run X).
#
# Staged here by tools/gpu-check.sh (.gpu), tools/gpu-ecosystem.sh stage
# (.gpu-eco) and bench/peers/build.sh with GPU_DIR=.gpu30; copied into
# .gpu-eco and run from the checkout's root on the GPU machine:
#   cp tools/gpu-keep-spans.sh .gpu-eco/keep.sh
#   run(command="bash .gpu-eco/keep.sh", carry=[".gpu", ".gpu-eco", ".gpu30"])
# Environment: OUT (default /tmp/keep), SOAK_S (default 90).
set -u
OUT=${OUT:-/tmp/keep}; mkdir -p "$OUT"
E=.gpu-eco; P=.gpu30/peers
export LD_LIBRARY_PATH=.gpu/lib:$P/lib
torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null | tail -1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
# 1. the library's and the hooks' pairs
for r in 1 2 3; do
  for v in off on; do
    conf=backend=cuda; [ $v = on ] && conf=backend=cuda,keep_spans=1
    STREAMARENA_CONF=$conf .gpu/bin/bench/hook_pairs --pairs=20000 --reps=5 > "$OUT/hook-$v-$r.txt" 2>&1
  done
done
# 2. CuPy's pairs and workload: the package turns keep_spans on unless told
for r in 1 2 3; do
  for v in on off; do
    if [ $v = off ]; then export STREAMARENA_CONF=keep_spans=0; else unset STREAMARENA_CONF; fi
    PYTHONPATH=$E/python:$E/examples timeout 200 python3 $E/examples/bench_cupy.py --rounds 7 \
      --pairs 2000 --steps 1500 --json "$OUT/cupy-$v-$r.json" > "$OUT/cupy-$v-$r.txt" 2>&1
  done
done
unset STREAMARENA_CONF
# 3. the 16 MiB pair (peer_bench pairs) against the peers, one process each
for b in streamarena streamarena-keep rmm-pool cudaMallocAsync; do
  timeout 120 $P/peer_bench --require-gpu --workloads=pairs --backends=$b --plugin=$P/plugins/peer_rmm.so \
    --json="$OUT/peers.jsonl" > "$OUT/peers-$b.txt" 2>&1
done
for b in torch torch-expandable; do
  env -u PYTORCH_ALLOC_CONF -u PYTORCH_CUDA_ALLOC_CONF LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$torch_lib:/usr/local/cuda/lib64" \
    $( [ $b = torch-expandable ] && echo PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ) \
    timeout 120 $P/peer_bench --require-gpu --workloads=pairs --backends=$b --plugin=$P/plugins/peer_torch.so \
    --json="$OUT/peers.jsonl" > "$OUT/peers-$b.txt" 2>&1
done
# 4. the soak with keep_spans on, on the CUDA backend
STREAMARENA_SOAK_CONF=keep_spans=1 STREAMARENA_SOAK_SECONDS=${SOAK_S:-90} STREAMARENA_BACKEND=cuda \
  timeout 300 .gpu/bin/test/gpu_soak_test > "$OUT/soak.txt" 2>&1; echo "soak rc=$?" >> "$OUT/soak.txt"
.gpu/bin/test/kept_span_test > "$OUT/kept_span_test.txt" 2>&1; echo "kept_span_test rc=$?" >> "$OUT/kept_span_test.txt"
# the table
echo "== hook_pairs (least ns per pair), off / on"
for r in 1 2 3; do
  paste <(grep -E "^(library|cupy) " "$OUT/hook-off-$r.txt" | awk '{print $1, $2, $3, $5}') \
        <(grep -E "^(library|cupy) " "$OUT/hook-on-$r.txt" | awk '{print $5}') | grep -E " (4096|16777216|268435456) " | sed "s/^/r$r /"
done
echo "== bench_cupy pairs (us, median of 3): pool / streamarena"
for f in "$OUT"/cupy-*.txt; do echo "-- $(basename $f)"; sed -n '/per pair/,/^$/p' "$f" | tail -n +3; grep -A3 "random arrays" "$f" | tail -2; done
echo "== peers 16 MiB pair"
grep -h "16MiB" "$OUT"/peers-*.txt | head -20
echo "== soak"; grep -E "gpu_soak:|PASSED|FAILED|rc=" "$OUT/soak.txt" | tail -4
tail -3 "$OUT/kept_span_test.txt"
