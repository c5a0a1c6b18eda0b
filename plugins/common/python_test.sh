#!/usr/bin/env bash
# Runs a plugin's Python test (plugins/torch/plugin_test.py,
# plugins/python/package_test.py) on the shared library Bazel built:
#   python_test.sh TEST_PY LIBRARY_SO [ARGS...]
# Under a sanitizer config the plugin needs that sanitizer's runtime, which
# an uninstrumented python3 does not load first: it is preloaded. Python's
# own allocations are not the plugin's to leak-check. The interpreter is
# found first: a python3 that is a wrapper script (pyenv's) would run a shell
# under the preloaded runtime.
set -euo pipefail
test_py="$1" so="$2"
shift 2
python="$(python3 -c 'import sys; print(sys.executable)')"
runtime="$(ldd "$so" | awk '$1 ~ /^lib(asan|tsan|ubsan)\.so/ { print $3; exit }')"
if [ -n "$runtime" ]; then
  export LD_PRELOAD="$runtime"
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fi
exec "$python" "$test_py" "$so" "$@"
