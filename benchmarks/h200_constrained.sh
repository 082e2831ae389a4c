#!/usr/bin/env bash
# H200 run for issue 12 (and the window kernels of issue 11): GPU tests, then constrained vs free
# decoding through the server on Llama-3.1-8B dims (dummy weights) with the DeepSeek-LLM tokenizer.
# Needs .whl/ (benchmarks/device_prepare.sh) and the tokenizer copied to .device/deepseek-llm.
# Usage: bash benchmarks/h200_constrained.sh OUT_DIR [tests|bench|overlap|all]
# (bench: the server's defaults, two passes; overlap: the same with overlap scheduling off)
set -uo pipefail
OUT=${1:-benchmarks/out}; PART=${2:-all}
mkdir -p "$OUT"
. benchmarks/device_model.sh
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
BENCH="python3 benchmarks/bench_constrained.py --write-config llama-3.1-8b /tmp/llama-3.1-8b-config --load-format dummy
  --tokenizer-path .device/deepseek-llm --device cuda --num-prompts 128 --max-new-tokens 256"
if [[ $PART == tests || $PART == all ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_kernels_attention.py tests/test_gpu_window.py \
    tests/test_gpu_engine.py 2>&1 | tail -15
fi
if [[ $PART == bench || $PART == all ]]; then
  $BENCH --passes 2 --output-file "$OUT/constrained_h200.md" 2>&1 | grep -v -i warn | tail -25
fi
if [[ $PART == overlap || $PART == all ]]; then
  $BENCH --overlap off --output-file "$OUT/constrained_h200.md" 2>&1 | grep -v -i warn | tail -25
fi
