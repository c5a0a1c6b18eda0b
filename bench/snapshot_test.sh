#!/usr/bin/env bash
# The snapshot is valid JSON with the documented structure, the renderer
# draws it as a well-formed SVG, and the out-of-memory report (summary, then
# snapshot) is written on stderr and can be drawn too.
#   snapshot_test.sh REPLAY RENDER_SNAPSHOT TRACE RMM_LOG
set -euo pipefail
replay="$1" render="$2" trace="$3" rmm_log="$4"
out="${TEST_TMPDIR:-$(mktemp -d)}"

"$replay" --snapshot="$out" "$trace" >/dev/null
snap="$out/$(basename "$trace" .csv).json"
python3 - "$snap" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("backend", "granularity", "physical_cap", "summary", "stats", "streams",
            "superblocks", "spans", "chunks"):
    assert key in d, f"snapshot lacks {key}"
s = d["summary"]
assert 0 <= s["in_use"] <= s["total"], s
assert 0 <= s["largest_free_span"] <= s["free"] <= s["total"], s
assert 0.0 <= s["fragmentation"] <= 1.0, s
assert s["reserved"] == d["stats"]["reserved_bytes"], (s, d["stats"])
assert sum(c["size"] for c in d["chunks"]) == s["reserved"], "chunks do not add up to reserved"
for sb in d["superblocks"]:
    assert sb["state"] in ("active", "empty", "free", "awaiting_event"), sb
    if "blocks" in sb:
        assert set(sb["blocks"]) <= set("FCLRD"), sb
for sp in d["spans"]:
    assert sp["state"] in ("live", "cached", "awaiting_event"), sp
    assert sp["size"] >= sp["request"], sp
live = sum(st["live_block_bytes"] + st["live_span_bytes"] for st in d["streams"])
assert live == s["in_use"], (live, s["in_use"])
print(f"snapshot ok: {len(d['superblocks'])} superblocks, {len(d['spans'])} spans")
PY

check_svg() {
  python3 - "$1" <<'PY'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
rects = root.findall(".//{http://www.w3.org/2000/svg}rect")
assert len(rects) > 20, len(rects)
print(f"svg ok: {len(rects)} rects")
PY
}
python3 "$render" "$snap" -o "$out/snapshot.svg" >/dev/null
check_svg "$out/snapshot.svg"
# Without -o the picture goes beside the snapshot, named after it, also
# when a folder's name has a dot and the file's has none.
mkdir -p "$out/run.1"
cp "$snap" "$out/run.1/snap"
python3 "$render" "$out/run.1/snap" >/dev/null
if [[ ! -f "$out/run.1/snap.svg" || -e "$out/run.svg" ]]; then
  echo "render_snapshot.py run.1/snap did not write run.1/snap.svg:"; ls "$out" "$out/run.1"; exit 1
fi
check_svg "$out/run.1/snap.svg"

# --excess: the parts of what is held above in use add up to it, none
# counted twice (the rest, in no descriptor, is not negative), and the
# table is printed.
python3 - "$render" "$snap" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("render_snapshot", sys.argv[1])
r = importlib.util.module_from_spec(spec)
spec.loader.exec_module(r)
snap = r.load(sys.argv[2])
rows = dict(r.excess(snap))
above = rows["held above in use"]
assert above == rows["reserved"] - rows["in use (live blocks and spans, whole)"], rows
parts = [n for label, n in rows.items() if label.startswith("- ")]
assert sum(parts) == above, (sum(parts), above, rows)
assert all(n >= 0 for n in parts), rows
assert len(parts) >= 2, rows
# The cached blocks by size are the table's cached blocks, split.
cached = sum(r.cached_by_size(snap).values())
assert cached == rows.get("- blocks in thread caches", 0), (cached, rows)
print(f"excess ok: {above} bytes in {len(parts)} parts, {cached} cached")
PY
python3 "$render" "$snap" --excess >"$out/excess.md"
for want in "^| held above in use |" "^superblocks: [0-9]* (.* MiB), [0-9]* of them with no live block"; do
  grep -q "$want" "$out/excess.md" || { echo "--excess printed no '$want':"; cat "$out/excess.md"; exit 1; }
done
[[ ! -e "$out/$(basename "$snap" .json).svg" ]] || { echo "--excess drew a picture"; exit 1; }

# Out of memory with the report on: in an 8 MiB device the RMM log's 6 MiB
# request fails (a 256-byte and a 1 MiB block pin two superblocks).
"$replay" --capacity=8MiB --conf=oom_report=1 "$rmm_log" >"$out/oom.out" 2>"$out/oom.err"
grep -q "OUT OF MEMORY" "$out/oom.out"
for want in "out of memory: 6291456 bytes" "total" "largest free span" "fragmentation" \
            "per stream" '"superblocks"'; do
  grep -qF -- "$want" "$out/oom.err" || { echo "report lacks '$want'"; cat "$out/oom.err"; exit 1; }
done
python3 "$render" "$out/oom.err" -o "$out/oom.svg" >/dev/null
check_svg "$out/oom.svg"

# What a user gets wrong: a path that is not there, a snapshot cut short, a
# JSON file of something else. A line that says so and exit 1, no traceback.
head -c 2000 "$snap" >"$out/cut.json"
echo '{"a": 1}' >"$out/other.json"
for bad in "$out/missing.json:cannot be read: No such file or directory" \
           "$out/cut.json:the snapshot is not whole JSON" \
           "$out/other.json:not a streamarena snapshot"; do
  file="${bad%%:*}" want="${bad#*:}"
  rc=0
  msg="$(python3 "$render" "$file" -o "$out/bad.svg" 2>&1)" || rc=$?
  if [[ $rc -ne 1 ]] || ! grep -qF -- "$file: $want" <<<"$msg" || grep -q Traceback <<<"$msg"; then
    echo "render_snapshot.py $file: exit $rc, output:"; echo "$msg"; echo "(want: $want)"; exit 1
  fi
done
echo "PASS"
