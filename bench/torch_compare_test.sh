#!/usr/bin/env bash
# torch_compare.py where torch cannot be imported: one message and exit 2,
# no traceback. A stand-in torch module that fails to import makes the case
# the same on every machine.
#   torch_compare_test.sh TORCH_COMPARE_PY
set -uo pipefail
script="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
mkdir -p "$tmp/notorch"
echo 'raise ImportError("stand-in: no torch here")' >"$tmp/notorch/torch.py"
out="$(PYTHONPATH="$tmp/notorch" python3 "$script" 2>&1)"
rc=$?
echo "$out"
[[ $rc -eq 2 ]] || { echo "FAIL: exit $rc, want 2"; exit 1; }
grep -q "PyTorch is not importable here" <<<"$out" || { echo "FAIL: no message"; exit 1; }
! grep -q Traceback <<<"$out" || { echo "FAIL: a traceback"; exit 1; }
echo "torch_compare_test: message without torch, exit 2"
