#!/usr/bin/env bash
# Builds the test and benchmark binaries and the examples (train_loop, hello) here
# (Bazel, optimised) and stages
# them for the GPU machine, which has CUDA 13 and a driver but no Bazel, ck
# or cmocka: binaries, the shared libraries they need beyond the C runtime,
# and the runner tools/gpu-run.sh, all under <main checkout>/.gpu/ (ignored
# by git; the device tool carries it with carry [".gpu"]).
#
#   tools/gpu-check.sh [--no-build]
# then, with the device tool: run(command="bash .gpu/run.sh", carry=[".gpu"])
# (run.sh takes --only=, --sanitize=, --bench, --timeout=; see its header).
#
# Tests are built optimised with asserts on, as `bazel test` builds them, but
# linked statically against the library (--dynamic_mode=off: Bazel's tests
# otherwise load it from a _solib_ folder beside them), in their own output
# tree; benchmarks are built as `bazel build` does.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
# The device tool sends the main checkout, whichever worktree we are in.
main=$(cd "$(git rev-parse --git-common-dir)/.." && pwd)
dest=${GPU_DIR:-$main/.gpu}
cd "$root"

build=1
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    *) echo "gpu-check.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

test_flags=(-c opt --copt=-UNDEBUG --dynamic_mode=off --platform_suffix=gpu)
bench_flags=(-c opt)
# dlopen_test needs the path of the .so Bazel hands it; what it checks (the
# library's thread-local model when dlopened) does not depend on the device.
# Nor do cuda_fake_test's and cuda_missing_entry_test's (the CUDA backend
# against a fake libcuda, given by path; on a GPU cuda_backend_test runs the
# real one).
tests=$(bazel query --noshow_progress \
  'kind(cc_test, //test/...) except //test:dlopen_test except //test:cuda_fake_test
   except //test:cuda_missing_entry_test' \
  2>/dev/null || true)
benches=$(bazel query --noshow_progress 'kind(cc_binary, //bench/...) + //examples:train_loop + //examples:hello' \
  2>/dev/null || true)
if [ $build -eq 1 ]; then
  [ -n "$tests" ] && bazel build "${test_flags[@]}" $tests
  [ -n "$benches" ] && bazel build "${bench_flags[@]}" $benches
fi
test_bin=$(bazel info "${test_flags[@]}" bazel-bin 2>/dev/null)
bench_bin=$(bazel info "${bench_flags[@]}" bazel-bin 2>/dev/null)

rm -rf "$dest"
mkdir -p "$dest/bin/test" "$dest/bin/bench" "$dest/lib"
# Keep the staged files out of git, whatever .gitignore says.
exclude="$main/.git/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"

# label //pkg:name -> file under a bazel-bin
stage() { # bazel-bin, labels, destination folder
  local bin=$1 labels=$2 to=$3 label path
  for label in $labels; do
    path=${label#//}; path="$bin/${path%%:*}/${path##*:}"
    [ -x "$path" ] || { echo "gpu-check.sh: $label not built at $path" >&2; exit 1; }
    cp "$path" "$to/"
  done
}
stage "$test_bin" "$tests" "$dest/bin/test"
stage "$bench_bin" "$benches" "$dest/bin/bench"

# Libraries the binaries load beyond glibc and gcc's runtime (which the GPU
# machine's Ubuntu 24.04 has, newer than ours): libcmocka.so.0, libck.so.0.
for b in "$dest"/bin/*/*; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r soname path; do
  case "$soname" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libgcc_s.so.*|libstdc++.so.*) ;;
    *) cp -L "$path" "$dest/lib/$soname" ;;
  esac
done

cp tools/gpu-run.sh "$dest/run.sh"
cp tools/gpu-verify.sh "$dest/verify.sh"
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+dirty') ($(git rev-parse --abbrev-ref HEAD))"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "tests: ${test_flags[*]}; benches: ${bench_flags[*]}"
  (cd "$dest" && find bin lib -type f | sort)
} > "$dest/MANIFEST"

cat "$dest/MANIFEST"
echo "staged in $dest: $(du -sh "$dest" | cut -f1) (the tool carries at most 64 MiB with the tree)"
echo 'next: run(command="bash .gpu/run.sh", carry=[".gpu"])'
