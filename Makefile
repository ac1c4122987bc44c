# `make run` and `make test` each set up .venv (idempotent) and then do their job.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROMPT ?= What is 17 + 25? Answer briefly.
# the member set the README's Results recommend (Qwen + Gemma: nowhere worse than Qwen alone beyond noise)
MODELS ?= qwen2.5-coder-0.5b-instruct,gemma-3-270m
# where pip finds torch's CPU wheel: empty = pip's own indexes (this project's machines hold the wheel
# locally); elsewhere e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu (else PyPI's CUDA build comes in)
TORCH_INDEX ?=

.PHONY: setup browser run lint test test-fast bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: this takes the local CPU wheel instead of a CUDA build (pyproject only
	# asks for a range, which this satisfies, so the install below adds no other torch).
	$(PY) -m pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[langchain,llamaindex,server,eval,test]'
	touch $(STAMP)

# Debian's chromium for the server page's browser test (tests/test_server_zoo.py), which skips
# with a reason if it is still missing (e.g. no root to run apt-get).
browser:
	@test -x /usr/bin/chromium || { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "note: could not install chromium"; }

run: setup
	$(VENV)/bin/safe-ensemble run --models $(MODELS) --max-new-tokens 64 "$(PROMPT)"

# ruff (lint) and mypy (types), configured in pyproject.toml; `make test` runs them first.
lint: setup
	$(VENV)/bin/ruff check
	$(VENV)/bin/mypy

test: setup browser lint
	$(PY) -m pytest -q -rs

test-fast: setup
	$(PY) -m pytest -q -rs -m "not zoo"

# the speed issue's pair (Qwen drafts, SmolLM2 verifies); `make bench BENCH_MODELS=...` measures others.
# The results go to test-artifacts/ (ignored by git), not the repository root; `BENCH_JSON=path` elsewhere.
BENCH_MODELS ?= qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct
BENCH_JSON ?= test-artifacts/bench.json
bench: setup
	mkdir -p $(dir $(BENCH_JSON))
	$(VENV)/bin/safe-ensemble bench --models $(BENCH_MODELS) --prompts 4 --json $(BENCH_JSON)

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache
