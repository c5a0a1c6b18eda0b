#!/usr/bin/env bash
# What a new user does with the README, scripted: clone the repository
# fresh, write a consumer workspace from nothing but README.md's "Using it as
# a Bazel dependency" section (its WORKSPACE, BUILD.bazel, .bazelrc and
# hello.c blocks, the path filled in), then build and run it offline. Also
# checks that the README's program is examples/hello.c, so the two cannot
# drift apart.
#
#   tools/newcomer-check.sh [COMMIT]   default: HEAD (committed work only,
#                                      as a clone sees it)
# Exits 0 when the consumer builds and prints its "ok" line. Runs from
# tools/test.sh. Uses its own Bazel output base and shuts its server down.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
commit="$(git -C "$root" rev-parse "${1:-HEAD}")" || exit 2
tmp="$(mktemp -d "${TMPDIR:-/tmp}/newcomer.XXXXXX")"
ob="$tmp/output_base"
cleanup() {
  [[ -d "$ob" ]] && bazel --output_base="$ob" shutdown >/dev/null 2>&1
  chmod -R u+w "$tmp" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
say() { printf 'newcomer-check: %s\n' "$*"; }

say "fresh clone of ${commit:0:12} in $tmp/streamarena"
git clone --quiet --no-checkout "$root" "$tmp/streamarena" &&
  git -C "$tmp/streamarena" checkout --quiet --detach "$commit" || {
  say "FAILED: could not clone"
  exit 1
}

# The section's fenced blocks, each written to the file that the prose just
# before it names last ("Its `WORKSPACE`:", "`examples/hello.c`, ...").
mkdir -p "$tmp/consumer"
python3 - "$tmp/streamarena/README.md" "$tmp/consumer" "$tmp/streamarena" <<'EOF' || exit 1
import re, sys
readme, out, clone = sys.argv[1:]
text = open(readme).read()
m = re.search(r"^## Using it as a Bazel dependency\n(.*?)^## ", text, re.S | re.M)
if not m:
    sys.exit("newcomer-check: README.md has no 'Using it as a Bazel dependency' section")
section = m.group(1)
blocks = {}
# A fenced block and the prose before it; the file is the last `name` there
# that is one of the four a consumer writes.
names = ("WORKSPACE", "BUILD.bazel", ".bazelrc", "hello.c")
pos = 0
for b in re.finditer(r"^```[a-z]*\n(.*?)^```\n", section, re.S | re.M):
    before = section[pos:b.start()]
    pos = b.end()
    said = [n.split("/")[-1] for n in re.findall(r"`([^`]+)`", before)]
    said = [n for n in said if n in names]
    if said and said[-1] not in blocks:
        blocks[said[-1]] = b.group(1)
missing = [n for n in names if n not in blocks]
if missing:
    sys.exit("newcomer-check: README.md's section gives no block for " + ", ".join(missing))
if "/path/to/streamarena" not in blocks["WORKSPACE"]:
    sys.exit("newcomer-check: the README's WORKSPACE has no /path/to/streamarena to fill in")
blocks["WORKSPACE"] = blocks["WORKSPACE"].replace("/path/to/streamarena", clone)
for name, body in blocks.items():
    with open(f"{out}/{name}", "w") as f:
        f.write(body)
print("newcomer-check: wrote " + ", ".join(names) + " from README.md")
EOF

if ! diff -u "$tmp/streamarena/examples/hello.c" "$tmp/consumer/hello.c"; then
  say "FAILED: README.md's hello.c is not examples/hello.c (diff above)"
  exit 1
fi

# Offline: downloads go to a proxy that is not there, so anything Bazel
# would fetch from the network fails the build instead of succeeding
# quietly on a connected machine.
offline=(env http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9
  HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9)
say "bazel run //:hello in $tmp/consumer (offline)"
out="$(cd "$tmp/consumer" &&
  "${offline[@]}" bazel --output_base="$ob" run --color=no --curses=no \
    --show_progress_rate_limit=30 //:hello 2>&1)"
rc=$?
echo "$out" | tail -n 20
if [[ $rc -ne 0 ]] || ! grep -qE '^hello: allocated.* bytes: ok$' <<<"$out"; then
  say "FAILED: the README's consumer did not build and run (bazel exit $rc)"
  exit 1
fi
say "passed"
