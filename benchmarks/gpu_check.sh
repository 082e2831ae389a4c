#!/usr/bin/env bash
# GPU check (issue 7): install missing wheels if brought along in .whl/, run the GPU tests, the
# HF agreement check and the throughput benchmarks; write benchmarks/results/h200.md.
# Usage: bash benchmarks/gpu_check.sh [OUT_DIR] [PART]   (PART: tests | bench | offline | all)
set -uo pipefail
OUT_DIR=${1:-benchmarks/out}; PART=${2:-all}
mkdir -p "$OUT_DIR" /tmp/radixlm_pkg
ln -sfn "$PWD" /tmp/radixlm_pkg/radixlm
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=/tmp/radixlm_pkg${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
LOG="$OUT_DIR/h200.md"
{ echo "# H200 check ($(date -u +%F)): \`bash benchmarks/gpu_check.sh OUT $PART\`"; echo '```';
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
  echo '```'; } >> "$LOG"
section() { echo; echo "## $1"; echo '```'; shift; echo "+ $*"; "$@" 2>&1 | grep -v -i warn | tail -40; echo '```'; }
if [[ $PART == tests || $PART == all ]]; then
  section "GPU tests" python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py tests/test_kernels_ops.py tests/test_gpu_engine.py >> "$LOG"
  section "Greedy agreement with HF (random-weight Llama-3.1-8B, bf16)" python3 benchmarks/gpu_agreement.py >> "$LOG"
fi
if [[ $PART == bench || $PART == all ]]; then
  section "Decode and prefill vs HF (dummy Llama-3.1-8B, bf16)" python3 benchmarks/bench_decode.py --write-config llama-3.1-8b /tmp/l8b --json-out "$OUT_DIR/decode.json" >> "$LOG"
fi
if [[ $PART == offline || $PART == all ]]; then
  section "Offline throughput, 512 requests 1024 in / 512 out" python3 benchmarks/bench_offline.py --write-config llama-3.1-8b /tmp/l8b --load-format dummy --device cuda --num-prompts 512 --input-len 1024 --output-len 512 --hf-batch-size 256 --context-length 4096 >> "$LOG"
fi
cat "$LOG"
