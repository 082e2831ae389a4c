#!/usr/bin/env bash
# Mixed-batch prefill chunk sweep on the GPU machine (one tree, carried as .device/after; see
# h200_serving.sh): the shared-prefix row at the default chunk (first server cold, discard),
# 2,048, 1,024 and 512 tokens, then the 512 x 1024/256 row at 1,024 and the default.
# Usage: bash benchmarks/h200_mixed_chunk.sh OUT
set -uo pipefail
OUT=${1:-benchmarks/out}
mkdir -p "$OUT"
. benchmarks/device_model.sh
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/pkg_after && ln -sfn "$PWD/.device/after" /tmp/pkg_after/radixlm
row() { PYTHONPATH=/tmp/pkg_after:/tmp/site python3 .device/after/benchmarks/serving_rows.py --tag "$1" --rows "$2" \
    --small-dir "$PWD/.device/smollm2-config" --output-file "$OUT/serving.jsonl" "${@:3}" 2>&1 | grep "^| \|Error\|error" | tail -8; }
mc() { echo --server-arg=--mixed-chunk-size --server-arg="$1"; }
row cold l8b_gsp_on
row mc2048 l8b_gsp_on $(mc 2048)
row mc1024 l8b_gsp_on $(mc 1024)
row mc512 l8b_gsp_on $(mc 512)
row mc1024 l8b_512 $(mc 1024)
row default l8b_512
