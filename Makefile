# `make run` and `make test` set up .venv from pyproject.toml on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test test-agents bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Stamps re-install when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/agent-bridge run profiles/echo.yaml "hello"

# Real coding agents the tests drive (against fake API servers on loopback): installed once into a
# cache outside the repo, re-installed when this list changes. Pinned: their output formats are what we test.
TEST_CACHE  ?= $(HOME)/.cache/agent-bridge-tests
NPM_AGENTS  := @openai/codex@0.169.0 @google/gemini-cli@0.61.0 @anthropic-ai/claude-code@2.1.197
NPM_STAMP   := $(TEST_CACHE)/npm/.installed-$(shell echo '$(NPM_AGENTS)' | cksum | cut -d' ' -f1)

$(NPM_STAMP):
	mkdir -p $(TEST_CACHE)/npm
	npm install --prefix $(TEST_CACHE)/npm --no-audit --no-fund --loglevel=error $(NPM_AGENTS)
	touch $@

test-agents: $(NPM_STAMP)

test: $(VENV)/.installed-dev $(NPM_STAMP)
	AGENT_BRIDGE_TEST_CACHE=$(TEST_CACHE) $(BIN)/python -m pytest -q

# `make bench` (QUICK=1 for a smoke run): its own venv, the project installed non-editable as users get it
# (re-installed whenever bridge/ changes), plus the comparison and plotting tools of bench/requirements.txt.
BENCH_VENV := bench/.venv
BENCH_BIN  := $(BENCH_VENV)/bin

$(BENCH_BIN)/python:
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_BIN)/python -m pip install -q --upgrade pip

$(BENCH_VENV)/.tools: bench/requirements.txt pyproject.toml | $(BENCH_BIN)/python
	$(BENCH_BIN)/python -m pip install -q -r bench/requirements.txt .
	touch $@

$(BENCH_VENV)/.bridge: pyproject.toml $(shell find bridge -name '*.py' -o -name py.typed) | $(BENCH_VENV)/.tools
	$(BENCH_BIN)/python -m pip install -q --no-deps --force-reinstall .
	touch $@

bench: $(BENCH_VENV)/.bridge
	$(BENCH_BIN)/python bench/run.py $(if $(QUICK),--quick) $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
