#!/usr/bin/env bash
# hello on the host simulator, forced and by auto where there is no GPU.
#   hello_test.sh HELLO
set -euo pipefail
hello="$1"
out="$("$hello" backend=host)"
echo "$out"
grep -qF "hello: backend host (backend set in the configuration)" <<<"$out"
grep -qF "hello: allocated, wrote and freed 1048576 bytes: ok" <<<"$out"
out="$("$hello")"
echo "$out"
grep -qE "^hello: backend (cuda \(backend auto, CUDA usable\)|host \(backend auto, CUDA not usable: .+\))$" <<<"$out"
grep -qE "^hello: allocated.* and freed 1048576 bytes: ok$" <<<"$out"
# A configuration that parses but breaks a rule: the rule, named.
rc=0
out="$("$hello" backend=host,superblock_size=3MiB 2>&1)" || rc=$?
echo "$out"
[ "$rc" -eq 1 ]
grep -qF "hello: sa_arena_create: bad configuration (superblock_size=3MiB:" <<<"$out"
