#!/usr/bin/env bash
# Offline-throughput run on a GPU machine (issue 2's benchmark): dummy-weight Llama-3.1-8B, bf16,
# radixlm Engine vs HF transformers generate in the same run. Needs torch + transformers only.
# Usage: bash benchmarks/h200_offline.sh [OUT_DIR]
set -uo pipefail
OUT_DIR=${1:-benchmarks/out}
mkdir -p "$OUT_DIR" /tmp/radixlm_pkg
ln -sfn "$PWD" /tmp/radixlm_pkg/radixlm
export PYTHONPATH=/tmp/radixlm_pkg${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
} | tee "$OUT_DIR/env.txt"
CFG=/tmp/llama-3.1-8b-config
run() { echo "+ $*" | tee -a "$OUT_DIR/offline.md"; $PY benchmarks/bench_offline.py "$@" 2>&1 | grep -v Warning | tee -a "$OUT_DIR/offline.md"; }
run --write-config llama-3.1-8b $CFG --load-format dummy --device cuda --num-prompts 64 --input-len 1024 --output-len 128 --context-length 4096
run --model-path $CFG --load-format dummy --device cuda --num-prompts 1 --input-len 128 --output-len 128 --context-length 4096
