# The parts runner the GPU scripts share (gpu-torch-native.sh,
# gpu-ecosystem.sh; staged beside them), sourced. The caller sets LOGS (the
# logs folder), only (--only's list, or empty) and declares
#   declare -gA RESULT DETAIL; PARTS=()
# and a function save, which writes $OUT as it stands (parts_table helps).

# Whether --only asks for part $1 (an empty list: every part).
want() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

# One part: its command under a time limit, its log, a row: PASS, FAIL(rc),
# SKIPPED (exit 3) or TIMEOUT, and the detail (the log's last "N passed, M
# failed" or "result:" line); then save.
#   part NAME SECONDS COMMAND [ARGS...]
part() {
  local name=$1 limit=$2
  shift 2
  want "$name" || return 0
  PARTS+=("$name")
  echo "== $name (at most $limit s)"
  local t0=$(date +%s)
  # A function of the script runs in a bash of its own, under the limit.
  if declare -F "$1" > /dev/null; then set -- bash -c "$(declare -f "$1"); $1"; fi
  timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then RESULT[$name]=TIMEOUT
  elif [ $rc -eq 3 ]; then RESULT[$name]=SKIPPED
  elif [ $rc -ne 0 ]; then RESULT[$name]="FAIL($rc)"
  else RESULT[$name]=PASS
  fi
  DETAIL[$name]="$(grep -E '^(result: |[A-Za-z_-]+: [0-9]+ passed, [0-9]+ failed)' "$LOGS/$name.log" | tail -1 | sed 's/^result: //') ($(($(date +%s) - t0)) s)"
  echo "$name: ${RESULT[$name]} ${DETAIL[$name]}"
  [ "${RESULT[$name]}" = PASS ] || tail -n 30 "$LOGS/$name.log"
  save
}

# The parts' table: a header and a row each, names padded to $1 columns.
parts_table() {
  local width=$1 p
  printf "%-${width}s %-9s %s\n" part result detail
  for p in "${PARTS[@]}"; do printf "%-${width}s %-9s %s\n" "$p" "${RESULT[$p]}" "${DETAIL[$p]}"; done
}
