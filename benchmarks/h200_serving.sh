#!/usr/bin/env bash
# Issue 16 serving rows on the GPU machine, same run for two source trees (e.g. before / after a
# change). Trees are `git archive` copies carried in .device/<name> (device_prepare.sh makes the
# wheels; copy the default model's config.json to .device/smollm2-config).
# Usage: bash benchmarks/h200_serving.sh OUT_DIR ROWS "before after" [tests]
set -uo pipefail
OUT=${1:-benchmarks/out}; ROWS=${2:-l8b_512,small_2048}; TREES=${3:-before after}; PART=${4:-}
mkdir -p "$OUT"
. benchmarks/device_model.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for t in $TREES; do mkdir -p /tmp/pkg_$t && ln -sfn "$PWD/.device/$t" /tmp/pkg_$t/radixlm; done
if [[ $PART == tests ]]; then
  (cd .device/after && PYTHONPATH=/tmp/pkg_after:/tmp/site python3 -m pytest -q -p no:cacheprovider tests/test_gpu_engine.py \
     tests/test_kernels_attention.py 2>&1 | tail -6)
fi
for t in $TREES; do
  PYTHONPATH=/tmp/pkg_$t:/tmp/site python3 .device/after/benchmarks/serving_rows.py --tag "$t" --rows "$ROWS" \
    --small-dir "$PWD/.device/smollm2-config" --output-file "$OUT/serving.jsonl" 2>&1 | grep "^| \|Error\|error" | tail -20
done
