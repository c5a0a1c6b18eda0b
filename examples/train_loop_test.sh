#!/usr/bin/env bash
# Runs the train_loop example briefly on the host simulator; it exits
# non-zero on any failed call, canary mismatch or block left at the end.
set -euo pipefail
"$1" --threads 3 --steps 24 --layers 3 --min-seq 64 --max-seq 512 --progress 8 \
  --conf backend=host,check_stream_order=1
