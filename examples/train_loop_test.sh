#!/usr/bin/env bash
# The train_loop example, as a new user meets it:
#   1. a short run on the host simulator with the stream-order checker on
#      (exits non-zero on any failed call, canary mismatch or block left);
#      its first line names the backend and why;
#   2. out of memory: a failure, a summary with the real figures, nothing
#      leaked beyond it;
#   3. --help lists ranges, defaults and every configuration key of the
#      README's table; bad arguments get precise messages;
#   4. backend=cuda says why where there is no GPU.
#   train_loop_test.sh TRAIN_LOOP README
set -uo pipefail
tl="$1" readme="$2"
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
# has TEXT PATTERN WHAT: fixed-string PATTERN is in TEXT.
has() { grep -qF -- "$2" <<<"$1" || fail "$3: no '$2' in:"$'\n'"$1"; }

out="$("$tl" --threads 3 --steps 24 --layers 3 --min-seq 64 --max-seq 512 --progress 8 \
  --conf backend=host,check_stream_order=1 2>&1)"
rc=$?
echo "$out"
[[ $rc -eq 0 ]] || fail "short run exited $rc"
has "$(head -n 1 <<<"$out")" "train_loop: backend host (backend set in the configuration); 3 threads" \
  "first line"
has "$out" "large allocations" "summary"

out="$("$tl" --threads 2 --steps 5 --conf backend=host,max_physical=64MiB 2>&1)"
rc=$?
echo "$out"
[[ $rc -eq 1 ]] || fail "out-of-memory run exited $rc, want 1"
has "$out" "out of memory" "out-of-memory run"
grep -qE '^out-of-memory events +[1-9]' <<<"$out" || fail "no out-of-memory events counted"
grep -qE '^peak live +[1-9]' <<<"$out" || fail "peak live shows no figure"
grep -qE '^steps completed +0\.\.[0-9]+ of 5 per thread \(stopped: sa_alloc of' <<<"$out" ||
  fail "summary does not say where it stopped"
! grep -q "still allocated" <<<"$out" || fail "blocks left behind after out of memory"

help="$("$tl" --help)" || fail "--help exited non-zero"
has "$help" "--max-seq" "--help"
has "$help" "(1..65536, default 1024)" "--help"
keys="$(sed -n '/^## Configuration keys/,/^## /p' "$readme" | sed -n 's/^| `\([a-z_]*\)` |.*/\1/p')"
[[ -n "$keys" ]] || fail "no configuration keys found in the README"
for k in $keys; do
  grep -qE "^  $k=" <<<"$help" ||
    fail "train_loop --help lacks the configuration key $k (README's table has it): add it to help() in examples/train_loop.c"
done

out="$("$tl" extra 2>&1)"
[[ $? -eq 2 ]] || fail "a stray argument must exit 2"
has "$out" "unexpected argument 'extra'" "stray argument"
out="$("$tl" --max-seq 100000 2>&1)"
has "$out" "--max-seq: 100000 is out of range (1..65536)" "range"
out="$("$tl" --steps x 2>&1)"
has "$out" "--steps: 'x' is not a whole number" "not a number"

# A bad STREAMARENA_BACKEND is the variable's fault, not --conf's (none given).
out="$(STREAMARENA_BACKEND=bogus "$tl" --threads 1 --steps 1 2>&1)"
[[ $? -eq 2 ]] || fail "a bad STREAMARENA_BACKEND must exit 2"
has "$out" "train_loop: backend=auto,device=0: bad configuration: STREAMARENA_BACKEND" \
  "bad STREAMARENA_BACKEND"
! grep -qF -- "--conf" <<<"$out" || fail "a bad STREAMARENA_BACKEND blamed on --conf:"$'\n'"$out"

out="$("$tl" --threads 1 --steps 1 --progress 0 --conf backend=cuda 2>&1)"
if [[ "$(head -n 1 <<<"$out")" != "train_loop: backend cuda"* ]]; then
  has "$out" "sa_arena_create: no usable device (" "backend=cuda without a GPU"
fi

# Under `bazel run` (BUILD_WORKING_DIRECTORY set) a relative trace path is
# the typing folder's: it was written into the runfiles tree, out of sight.
tmpd="${TEST_TMPDIR:-$(mktemp -d)}/typed_here"
mkdir -p "$tmpd"
out="$(BUILD_WORKING_DIRECTORY="$tmpd" "$tl" --threads 1 --steps 2 --progress 0 \
  --conf backend=host,trace=rel_trace.csv 2>&1)" || fail "run with a relative trace exited $?"
header="$(head -n 1 "$tmpd/rel_trace.csv" 2>/dev/null)"
if [[ "$header" != "thread,stream,op,id,size,time_ns" ]]; then
  fail "trace=rel_trace.csv under bazel run is not in BUILD_WORKING_DIRECTORY:"$'\n'"$out"
fi
out="$(BUILD_WORKING_DIRECTORY="$tmpd/none" "$tl" --steps 1 2>&1)"
[[ $? -eq 2 ]] || fail "a BUILD_WORKING_DIRECTORY that is not there must exit 2"
has "$out" "cannot enter $tmpd/none (BUILD_WORKING_DIRECTORY)" "missing working directory"

echo "train_loop_test: $fails failed"
[[ $fails -eq 0 ]]
