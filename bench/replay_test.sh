#!/usr/bin/env bash
# Replays the shipped traces at a device size of 1.10 x each trace's peak
# live bytes and checks the targets (bench/BUILD.bazel, docs/DEFRAG.md).
set -euo pipefail
replay="$1"
shift
"$replay" --headroom=1.10 --check-ratio=1.10 --expect-first-fit-oom "$@"
