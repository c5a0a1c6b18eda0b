#!/usr/bin/env bash
# Stages the PyTorch integration for a machine with a GPU (which has PyTorch
# but no Bazel): builds the plugin here and copies it, the Python package,
# examples/torch/ and bench/torch_trace.py into <main checkout>/.gpu-torch/
# (ignored by git), in the checkout's own layout, with a runner:
#
#   tools/gpu-torch.sh
#   then on the GPU machine, from the checkout's root:
#   bash .gpu-torch/run.sh python3 examples/torch/check_hooks.py
#   bash .gpu-torch/run.sh python3 examples/torch/compare.py --out "$OUT/compare"
#   bash .gpu-torch/run.sh python3 examples/torch/train_ddp.py
#
# run.sh runs its arguments inside .gpu-torch/, where streamarena.torch finds
# the plugin beside itself.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
main=$(cd "$(git rev-parse --git-common-dir)/.." && pwd)
dest=${GPU_TORCH_DIR:-$main/.gpu-torch}
cd "$root"

[ $# -eq 0 ] || { echo "usage: tools/gpu-torch.sh (no arguments)" >&2; exit 2; }
bazel build -c opt //:streamarena_torch
so="$(bazel info -c opt bazel-bin 2>/dev/null)/plugins/torch/libstreamarena_torch.so"
[ -f "$so" ] || { echo "gpu-torch.sh: $so not built" >&2; exit 1; }

rm -rf "$dest"
mkdir -p "$dest/python/streamarena" "$dest/examples/torch" "$dest/bench"
exclude="$main/.git/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu-torch/' "$exclude" 2>/dev/null || echo '/.gpu-torch/' >> "$exclude"

cp python/streamarena/*.py "$dest/python/streamarena/"
cp "$so" "$dest/python/streamarena/"
chmod u+w "$dest/python/streamarena/libstreamarena_torch.so"
cp examples/torch/*.py "$dest/examples/torch/"
cp examples/checks.py "$dest/examples/"
cp bench/torch_trace.py "$dest/bench/"
cat > "$dest/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs its arguments inside .gpu-torch/ (tools/gpu-torch.sh staged it).
set -euo pipefail
cd "$(dirname "$0")"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
RUN
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+dirty') ($(git rev-parse --abbrev-ref HEAD))"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  (cd "$dest" && find . -type f | sort)
} > "$dest/MANIFEST"
cat "$dest/MANIFEST"
echo "staged in $dest: $(du -sh "$dest" | cut -f1)"
echo 'next: run(command="bash .gpu-torch/run.sh python3 examples/torch/check_hooks.py", carry=[".gpu-torch"])'
