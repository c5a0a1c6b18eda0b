#!/usr/bin/env bash
# Stages two builds of peer_bench for an A/B on the GPU machine: this
# checkout's (bench/peers/build.sh, with its plug-ins, libraries, traces and
# runners) and the one at BASE, built in a temporary worktree, as
# .gpu/peers/peer_bench.base. Both load the plug-ins built here, so BASE
# must share this checkout's plug-in interface (bench/peers/backend.h):
# the check below loads the RMM plug-in into the base build.
#
#   RMM_ROOT=DIR [TORCH_ROOT=DIR] tools/gpu-ab.sh BASE
# (after tools/gpu-check.sh where both are wanted: that one clears .gpu/)
# then, with the device tool (carry [".gpu"]), e.g.:
#   bash .gpu/peers/ab.sh --processes=4 -- \
#     --plugin=.gpu/peers/plugins/peer_rmm.so --require-gpu \
#     --backends=streamarena-ft2,rmm-pool --workloads=trace --trace-turns=20 \
#     .gpu/peers/traces/transformer.csv
# (bench/peers/ab.sh's header has its options; it prints the paired ratios.)
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
base_rev=$(git rev-parse --verify "$1^{commit}")
main=$(cd "$(git rev-parse --git-common-dir)/.." && pwd)
dest=${GPU_DIR:-$main/.gpu}/peers
say() { echo "gpu-ab.sh: $*"; }

bash "$(git rev-parse --show-toplevel)/bench/peers/build.sh" --dest "$dest"

tree=$(mktemp -d)
cleanup() {
  git worktree remove --force "$tree/base" 2>/dev/null || true
  rm -rf "$tree"
}
trap cleanup EXIT
git worktree add --detach --quiet "$tree/base" "$base_rev"
(cd "$tree/base" && bazel build -c opt //bench/peers:peer_bench > "$tree/build.log" 2>&1) || {
  tail -n 20 "$tree/build.log"
  say "peer_bench does not build at $1"
  exit 1
}
base_bin=$(cd "$tree/base" && bazel info -c opt bazel-bin 2>/dev/null)/bench/peers/peer_bench
cp "$base_bin" "$dest/peer_bench.base"
chmod u+w "$dest/peer_bench.base"
# Its Bazel output tree goes with it: a worktree per base is a full build.
(cd "$tree/base" && bazel clean --expunge > /dev/null 2>&1) || true
echo "ab base $(git rev-parse --short "$base_rev")" >> "$dest/MANIFEST"

check=(--list)
[ -f "$dest/plugins/peer_rmm.so" ] && check+=(--plugin="$dest/plugins/peer_rmm.so")
if ! LD_LIBRARY_PATH="$dest/lib" "$dest/peer_bench.base" "${check[@]}" > /dev/null 2>&1; then
  say "the base build does not start here with the staged libraries and plug-ins"
  exit 1
fi
say "staged $dest/peer_bench.base ($(git rev-parse --short "$base_rev")) beside this checkout's build"
