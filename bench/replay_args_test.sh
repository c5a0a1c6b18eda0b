#!/usr/bin/env bash
# replay's command line: values after '=' or as the next argument, --help,
# one source for the device size, an empty trace refused with a message.
#   replay_args_test.sh REPLAY RMM_LOG
set -uo pipefail
replay="$1" rmm_log="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0

# expect STATUS PATTERN ARGS...: replay ARGS exits STATUS and its output
# (stdout and stderr) contains PATTERN.
expect() {
  local want_rc="$1" pattern="$2"
  shift 2
  local out rc
  out="$("$replay" "$@" 2>&1)"
  rc=$?
  if [[ $rc -ne $want_rc ]] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAIL: replay $*: exit $rc (want $want_rc), output:"
    echo "$out"
    echo "  (want: $pattern)"
    fails=$((fails + 1))
  elif grep -qi nan <<<"$out"; then
    echo "FAIL: replay $*: prints nan"
    fails=$((fails + 1))
  fi
}

expect 0 "capacity 64.0 MiB" --capacity 64MiB "$rmm_log"
expect 0 "capacity 64.0 MiB" --capacity=64MiB "$rmm_log"
expect 0 "capacity 32.0 MiB" --conf max_physical=32MiB "$rmm_log"
expect 0 "capacity 22.0 MiB" --headroom 1.1 "$rmm_log"
expect 0 "usage: replay" -h
expect 0 "--capacity SIZE" --help
expect 2 "each set the device size: give one" --capacity 64MiB --conf=max_physical=1GiB "$rmm_log"
expect 2 "each set the device size: give one" --capacity 64MiB --headroom=1.5 "$rmm_log"
expect 2 "--capacity needs a value" --capacity
expect 2 "'80Gx' is not a size" --capacity 80Gx "$rmm_log"
# One size, not a configuration: a comma would let more keys in (this was a
# capacity of 1 GiB).
expect 2 "'64MiB,max_physical=1GiB' is not a size" --capacity 64MiB,max_physical=1GiB "$rmm_log"
expect 2 "'0.5' is not a number >= 1" --headroom 0.5 "$rmm_log"
expect 2 "unknown option --bogus" --bogus "$rmm_log"
expect 2 "unknown key 'foo'" --conf foo=1 "$rmm_log"
expect 2 "--check-chunks: '0' is not a number > 0" --check-chunks 0 "$rmm_log"
# The RMM log makes 12 chunks under a 64 MiB budget (a granule each): a
# bound of 12 holds, one of 11 fails the run.
expect 0 "driver: 12 chunks created" --capacity 64MiB --check-chunks=12 "$rmm_log"
expect 1 "rmm_log.csv: 12 chunks created > 11" --capacity 64MiB --check-chunks=11 "$rmm_log"
expect 2 "--conf given twice" --conf max_physical=32MiB --conf superblock_size=4MiB "$rmm_log"
expect 2 "no trace given" --capacity 64MiB
# An option after a trace: refused before anything is replayed (it was
# replayed with the defaults, then "--capacity=64MiB: No such file").
expect 2 "option --capacity=64MiB after a trace: options go before TRACE.csv" \
  "$rmm_log" --capacity=64MiB
# After "--" every argument is a trace, whatever its name.
expect 1 "replay: -x.csv: No such file or directory" -- "$rmm_log" -x.csv
printf 'thread,stream,op,id,size,time_ns\n' >"$tmp/empty.csv"
expect 1 "the trace allocates nothing" "$tmp/empty.csv"
# A device size past what size_t arithmetic can round up to 2 MiB: refused,
# not replayed as "capacity 0.0 MiB".
expect 2 "beyond any device" --capacity 18446744073709551615 "$rmm_log"
expect 1 "beyond any device" --headroom 1e30 "$rmm_log"
# --snapshot=DIR as the docs run it: a folder that does not exist yet is
# made (it failed after the whole replay with "No such file or directory").
rm -rf "$tmp/snaps"
expect 0 "capacity 64.0 MiB" --capacity 64MiB --snapshot="$tmp/snaps" "$rmm_log"
if [[ ! -s "$tmp/snaps/rmm_log.json" ]]; then
  echo "FAIL: --snapshot=$tmp/snaps wrote no $tmp/snaps/rmm_log.json"
  fails=$((fails + 1))
fi
expect 2 "--snapshot: cannot make the folder" --snapshot="$tmp/no/such/dir" "$rmm_log"
# No hidden debugging hooks in the timed loop: the environment changes nothing.
out="$(TRACKPEAK=1 SNAPOP=0 "$replay" --capacity 64MiB "$rmm_log" 2>&1)"
rc=$?
if [[ $rc -ne 0 ]] || grep -q '^op ' <<<"$out"; then
  echo "FAIL: TRACKPEAK=1 SNAPOP=0 replay: exit $rc, output:"
  echo "$out"
  fails=$((fails + 1))
fi

echo "replay_args_test: 25 cases, $fails failed"
[[ $fails -eq 0 ]]
