#!/usr/bin/env bash
# The peer benchmark on a machine with a GPU (CUDA 13, python3 with torch,
# g++; no Bazel), from what bench/peers/build.sh staged. Staged as
# .gpu/peers/run.sh; run from anywhere:
#
#   bash .gpu/peers/run.sh [--quick] [--backends=a,b] [--only=traces|after] [--no-record]
#                          [--steps=N] [--per-backend-s=S] [--trace-rounds=R]
#                          [--trace-processes] [--deadline-s=S] [--after-rounds=R]
#                          [TRACE...]
#   --quick          small counts (a smoke run, not figures to report)
#   --backends       default: streamarena,streamarena-torch,
#                    streamarena-prefill,streamarena-ft1.2,streamarena-ft1.5,
#                    streamarena-ft2,cudaMallocAsync,rmm-pool,
#                    rmm-arena,rmm-async,rmm-streamarena,torch,torch-expandable
#                    (rmm-streamarena: streamarena through RMM's resource
#                    interface; streamarena-torch and the points of
#                    streamarena's footprint curve, streamarena-ft<target>:
#                    the trace replays only; streamarena-prefill: the random
#                    allocations, with half the free device memory mapped up
#                    front, the size RMM's arena takes)
#   --only=traces    the trace replays only (no pairs, threads, random or
#                    prodcons): the curve beside each peer's point, e.g.
#                      run.sh --only=traces --no-record --trace-rounds=2
#   --only=after     RMM's random allocations up to 4 GiB on a fresh
#                    instance and on one that first replayed the traces and
#                    ran the pairs and threads (peer_bench --workloads=after),
#                    each backend but streamarena-torch and
#                    streamarena-prefill (the curve's points too: what a
#                    larger footprint target buys); a process per backend and
#                    round (--after-rounds, default 3; 1 quick: a single
#                    run of the 4 GiB case lasts milliseconds), RESULTS.md
#                    gives the median of the processes
#   --no-record      do not record a PyTorch trace (it is replayed with the
#                    shipped traces and any TRACE given)
#   --steps          training steps of the recorded trace (default 30; 8 quick)
#   --per-backend-s  time limit of one backend's process (default 75; 45 quick)
#   --trace-rounds   rounds of trace replays, the backends taking turns in
#                    each (default 3; 1 quick): RESULTS.md gives the median
#   --trace-processes  a process per backend and round of trace replays (the
#                    first backend moving on by one each round), instead of
#                    the rounds in one process (peer_bench --trace-turns),
#                    where the machine's spells fall on every backend alike
#                    (docs/BENCHMARKS.md, runs CL-CP); PyTorch's default
#                    allocator has a process of its own either way
#   --deadline-s     the whole run's time limit (default 420; 240 quick): a
#                    backend that would start past it is left out, and one
#                    that would end past it gets less time
#
# A process per backend for the timed workloads, and one for the trace
# replays of all but PyTorch's default allocator (each replay on a fresh
# instance): PyTorch's settings (expandable segments) are fixed per
# process. Writes three files under $OUT (default /tmp/peers-out):
# results.jsonl (every result as it comes, what plot.py reads), RESULTS.md,
# and peers.tar.gz with the rest: the plots peers_*.png, machine.txt, the
# recorded torch_trace.csv.gz, a log per process. Prints the tables last.
# Exit 1 if a backend failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
FINAL=${OUT:-/tmp/peers-out}
mkdir -p "$FINAL"
OUT=$(mktemp -d /tmp/peers-run.XXXXXX) # the work folder; bundled at the end

start=$(date +%s)
quick=0 record=1 turns=1 only="" steps="" per_s="" deadline="" trace_rounds="" after_rounds="" backends="streamarena,streamarena-torch,streamarena-prefill,streamarena-ft1.2,streamarena-ft1.5,streamarena-ft2,cudaMallocAsync,rmm-pool,rmm-arena,rmm-async,rmm-streamarena,torch,torch-expandable"
extra=()
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --no-record) record=0 ;;
    --backends=*) backends=${a#*=} ;;
    --only=traces|--only=after) only=${a#*=} ;;
    --only=*) echo "run.sh: --only takes traces or after" >&2; exit 2 ;;
    --steps=*) steps=${a#*=} ;;
    --per-backend-s=*) per_s=${a#*=} ;;
    --deadline-s=*) deadline=${a#*=} ;;
    --trace-rounds=*) trace_rounds=${a#*=} ;;
    --trace-processes) turns=0 ;;
    --after-rounds=*) after_rounds=${a#*=} ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --*) echo "run.sh: unknown argument $a" >&2; exit 2 ;;
    *) extra+=("$(realpath "$a")") ;;
  esac
done
[ -n "$steps" ] || steps=$([ $quick -eq 1 ] && echo 8 || echo 30)
[ -n "$per_s" ] || per_s=$([ $quick -eq 1 ] && echo 45 || echo 75)
[ -n "$deadline" ] || deadline=$([ $quick -eq 1 ] && echo 240 || echo 420)
[ -n "$trace_rounds" ] || trace_rounds=$([ $quick -eq 1 ] && echo 1 || echo 3)
case "$trace_rounds" in ''|*[!0-9]*) echo "run.sh: --trace-rounds needs a number" >&2; exit 2 ;; esac
[ -n "$after_rounds" ] || after_rounds=$([ $quick -eq 1 ] && echo 1 || echo 3)
case "$after_rounds" in ''|*[!0-9]*) echo "run.sh: --after-rounds needs a number" >&2; exit 2 ;; esac
bench_args=(--require-gpu)
[ $quick -eq 1 ] && bench_args+=(--quick) || bench_args+=(--random-max-s=15)
[ "$only" = after ] && bench_args+=(--random-n=0,1000) # the case up to 4 GiB alone
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
results=$FINAL/results.jsonl # written as results come: a run cut short keeps them
rm -f "$results" "$FINAL/RESULTS.md" "$FINAL/peers.tar.gz"

# --- the machine, and PyTorch's libraries ---------------------------------
torch_info=$(python3 -c 'import os, torch; print(torch.__version__, os.path.join(os.path.dirname(torch.__file__), "lib"), os.path.dirname(torch.__file__), torch.version.cuda)' 2>/dev/null | tail -1)
read -r torch_version torch_lib torch_dir torch_cuda <<<"${torch_info:-none none none none}"
machine="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "staged: $(head -1 "$here/MANIFEST" 2>/dev/null)"
  echo "machine: $machine"
  nvidia-smi 2>&1 | head -15
  uname -srm
  echo "torch: $torch_version (CUDA $torch_cuda), libraries in $torch_lib"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  for so in "$here"/plugins/*.so; do # what a plug-in would load, or lack
    echo "ldd $(basename "$so"):"
    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$torch_lib" ldd "$so" 2>&1 | grep -E 'rmm|rapids|c10|cudart|not found' | sed 's/^/  /'
  done
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

# The torch plug-in must match this torch: the staged one if it was built
# against this version, else one built here from the staged source.
torch_plugin=""
built_for=$(sed -n 's/^torch_version //p' "$here/MANIFEST" 2>/dev/null)
if [ "$torch_version" = none ]; then
  echo "run.sh: no importable torch: the torch backends are left out"
elif [ -f "$here/plugins/peer_torch.so" ] && [ "$built_for" = "$torch_version" ]; then
  torch_plugin=$here/plugins/peer_torch.so
else
  echo "run.sh: the staged torch plug-in is for torch ${built_for:-none}, this is $torch_version: building it here"
  mkdir -p "$OUT/build"
  if timeout 300 g++ -std=c++17 -O2 -DNDEBUG -fPIC -shared -fvisibility=hidden \
    -D_GLIBCXX_USE_CXX11_ABI="$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')" \
    -I"$here/src" -isystem "$torch_dir/include" -isystem /usr/local/cuda/include \
    "$here/src/bench/peers/torch_backends.cc" -o "$OUT/build/peer_torch.so" \
    -L"$torch_lib" -lc10_cuda -lc10 > "$OUT/build/torch_plugin.log" 2>&1; then
    torch_plugin=$OUT/build/peer_torch.so
  else
    echo "run.sh: the torch plug-in did not build (build/torch_plugin.log): torch backends left out"
    tail -5 "$OUT/build/torch_plugin.log"
  fi
fi

# --- a PyTorch trace of its own ------------------------------------------
traces=("$here"/traces/*.csv "$here"/traces/*.csv.gz)
if [ $record -eq 1 ] && [ "$torch_version" != none ]; then
  echo "== recording a PyTorch trace ($steps steps)"
  if timeout -k 10 120 python3 "$here/record_torch_trace.py" --steps "$steps" \
    "$OUT/torch_trace.csv.gz" > "$OUT/record_torch_trace.log" 2>&1; then
    traces+=("$OUT/torch_trace.csv.gz")
  else
    echo "run.sh: recording failed (record_torch_trace.log)"
  fi
  tail -2 "$OUT/record_torch_trace.log"
fi
traces+=("${extra[@]}")

python3 - "$results" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(head -1 "$here/MANIFEST" 2>/dev/null | cut -d' ' -f2)" \
  "$machine" "bash .gpu/peers/run.sh $*" "$torch_version (CUDA $torch_cuda)" "$quick" <<'PY'
import json, sys
f, date, commit, machine, command, torch, quick = sys.argv[1:]
with open(f, "a") as out:
    out.write(json.dumps({"type": "run", "date": date, "commit": commit, "machine": machine,
                          "command": command, "torch": torch, "quick": quick == "1"}) + "\n")
PY

# --- one process per backend and workload group ----------------------------
# Phase 1: each backend's pairs, threads, random and prodcons in one process.
# Phase 2: the trace replays in rounds, every backend once per round, so
# that a noisy spell of the machine falls on all of them alike: in one
# process, the backends taking turns (or, --trace-processes, a process
# each, the first backend moving on by one each round); plot.py reports
# the median.
declare -A rc
keys=() # every process, in order
IFS=, read -r -a list <<<"$backends"
# A process ended: its exit status kept, a stop for time recorded in the
# results (what it measured before stays there), its log's tail on failure.
process_done() { # key, exit status, seconds it had, log, backend, workload, start
  local key=$1 r=$2 limit=$3 log=$4 b=$5 workload=$6 t0=$7
  rc[$key]=$r
  echo "$key: exit $r in $(($(date +%s) - t0)) s"
  if [ "$r" -eq 124 ] || [ "$r" -eq 137 ]; then
    echo "{\"type\": \"error\", \"backend\": \"$b\", \"workload\": \"$workload\", \"error\": \"stopped after $limit s (what it measured before is kept)\"}" >> "$results"
  fi
  [ "$r" -eq 0 ] || tail -n 15 "$log"
}
# What a process running backend $1 needs: its plug-in (bplugin, empty for
# a built-in backend) and for PyTorch's an environment (benv, else empty).
# Returns 1 where that plug-in is not there (the torch backends without
# torch).
backend_needs() {
  bplugin=() benv=()
  case "$1" in
    rmm-*) bplugin=("$here/plugins/peer_rmm.so") ;;
    torch|torch-expandable)
      [ -n "$torch_plugin" ] || return 1
      bplugin=("$torch_plugin")
      # torch's libraries find its CUDA runtime through their own rpath;
      # the toolkit's is the fallback.
      # The allocator's settings are the backend's alone: none inherited
      # from the caller's environment ("default settings" means default).
      benv=(-u PYTORCH_ALLOC_CONF -u PYTORCH_CUDA_ALLOC_CONF
            LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$torch_lib:/usr/local/cuda/lib64")
      [ "$1" = torch-expandable ] && benv+=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;
  esac
  return 0
}
# The seconds the run has left, in left; where fewer than 20 remain the
# process for key (backend, workload) is left out, with a skip row saying
# so, and it returns 1.
time_left() { # key, backend, workload
  left=$((deadline - ($(date +%s) - start)))
  [ $left -lt 20 ] || return 0
  echo "run.sh: $1 left out: the run's deadline (${deadline} s) is near"
  echo "{\"type\": \"skip\", \"backend\": \"$2\", \"workload\": \"$3\", \"why\": \"left out: the run's deadline (${deadline} s) came\"}" >> "$results"
  rc[$1]=deadline
  return 1
}
run_backend() { # backend, workloads (peer_bench --workloads), round (0: not the traces), [label]
  local b=$1 workloads=$2 round=$3 plugin=() env=() conf=() left limit t0 key=$1 bplugin benv
  [ "$round" = 0 ] || key="$b/trace $round"
  [ -z "${4:-}" ] || key="$b/$4"
  keys+=("$key")
  if ! backend_needs "$b"; then rc[$key]=skipped; return; fi
  [ ${#bplugin[@]} -eq 0 ] || plugin=(--plugin="${bplugin[0]}")
  env=("${benv[@]}")
  if [ "$b" = streamarena-prefill ]; then
    free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
    if [ -z "$free_mib" ]; then rc[$key]=skipped; return; fi
    conf=(--sa-conf=initial_physical=$((free_mib / 2))MiB)
  fi
  time_left "$key" "$b" "${workloads%%,*}" || return 0
  limit=$((left < per_s ? left : per_s))
  local round_arg=()
  [ "$round" = 0 ] || round_arg=(--trace-round="$round")
  echo "== $key"
  t0=$(date +%s)
  env "${env[@]}" timeout -k 10 "$limit" "$here/peer_bench" "${bench_args[@]}" --workloads="$workloads" \
    "${round_arg[@]}" "${conf[@]}" --backends="$b" "${plugin[@]}" --json="$results" "${traces[@]}" \
    >> "$OUT/peer_bench-$b.log" 2>&1
  process_done "$key" $? "$limit" "$OUT/peer_bench-$b.log" "$b" "${workloads%%,*}" "$t0"
}
for b in "${list[@]}"; do
  [ "$only" = traces ] || [ "$only" = after ] && break
  case "$b" in
    streamarena-torch|streamarena-ft*) ;;      # the traces only
    streamarena-prefill) run_backend "$b" random 0 ;; # the random allocations only
    *) run_backend "$b" pairs,threads,random,prodcons 0 ;;
  esac
done
# --only=after: a process per backend and round, the order moved on by one
# each round as for the traces; plot.py gives the median of the processes.
if [ "$only" = after ]; then
  afters=()
  for b in "${list[@]}"; do
    case "$b" in streamarena-torch|streamarena-prefill) ;; *) afters+=("$b") ;; esac
  done
  n=${#afters[@]}
  for ((round = 1; round <= after_rounds && n > 0; round++)); do
    for ((k = 0; k < n; k++)); do
      run_backend "${afters[$(((k + round - 1) % n))]}" random,after 0 "after $round"
    done
  done
fi
replayers=()
[ "$only" = after ] && list=() # no trace rounds
for b in "${list[@]}"; do [ "$b" = streamarena-prefill ] || replayers+=("$b"); done
n=${#replayers[@]}
# The replayers but PyTorch's default allocator in one process, in turns.
run_turns() {
  local names=() plugins=() plugin=() env=() b p left key="turns/trace" t0 bplugin benv
  for b in "${replayers[@]}"; do
    # torch: a process of its own, its settings are not expandable segments'.
    [ "$b" != torch ] || continue
    if ! backend_needs "$b"; then rc["$b/trace"]=skipped; keys+=("$b/trace"); continue; fi
    for p in "${bplugin[@]}"; do # each plug-in once, however many backends it has
      [[ " ${plugins[*]} " == *" $p "* ]] || plugins+=("$p")
    done
    [ ${#benv[@]} -eq 0 ] || env=("${benv[@]}")
    names+=("$b")
  done
  [ ${#names[@]} -gt 0 ] || return 0
  for p in "${plugins[@]}"; do plugin+=(--plugin="$p"); done
  keys+=("$key")
  time_left "$key" turns trace || return 0
  echo "== trace turns: $(IFS=,; echo "${names[*]}")"
  t0=$(date +%s)
  env "${env[@]}" timeout -k 10 "$left" "$here/peer_bench" "${bench_args[@]}" --workloads=trace \
    --trace-turns="$trace_rounds" --backends="$(IFS=,; echo "${names[*]}")" "${plugin[@]}" \
    --json="$results" "${traces[@]}" >> "$OUT/peer_bench-turns.log" 2>&1
  process_done "$key" $? "$left" "$OUT/peer_bench-turns.log" turns trace "$t0"
}
if [ $turns -eq 1 ] && [ $n -gt 0 ]; then
  run_turns
  for b in "${replayers[@]}"; do
    [ "$b" != torch ] || for ((round = 1; round <= trace_rounds; round++)); do run_backend torch trace "$round"; done
  done
else
  for ((round = 1; round <= trace_rounds && n > 0; round++)); do
    for ((k = 0; k < n; k++)); do
      run_backend "${replayers[$(((k + round - 1) % n))]}" trace "$round"
    done
  done
fi

# --- the tables, RESULTS.md and plots --------------------------------------
echo
python3 "$here/plot.py" --out "$OUT" "$results" 2>&1 | tee "$OUT/plot.log" | tail -n 80
[ -f "$OUT/RESULTS.md" ] && mv "$OUT/RESULTS.md" "$FINAL/RESULTS.md"
tar -C "$OUT" -czf "$FINAL/peers.tar.gz" . && rm -rf "$OUT"
echo "run.sh: $FINAL/results.jsonl, RESULTS.md, peers.tar.gz (plots, logs, the recorded trace) in $(($(date +%s) - start)) s"
echo
failed=0
for k in "${keys[@]}"; do
  echo "backend $k: exit ${rc[$k]}"
  case "${rc[$k]}" in 0|skipped) ;; *) failed=1 ;; esac
done
exit $failed
