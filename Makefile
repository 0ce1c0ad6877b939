# `make run` and `make test` set up .venv from pyproject.toml on a fresh machine;
# `make install` puts the agent-bridge command on your PATH (`make install EXTRAS=postgres`: with an extra).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Where `make install` links the command: the per-user directory pip --user and pipx use, on PATH in most logins.
BINDIR ?= $(HOME)/.local/bin

.PHONY: run install uninstall lint test test-agents test-synapse bubblewrap bench clean fleet-db try-claude try-codex

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
	@command -v agent-bridge >/dev/null || echo "agent-bridge is in $(BIN)/; 'make install' puts it on your PATH \
	(or activate the venv in each shell: . $(BIN)/activate)"

# A link, as pipx makes: no Python is touched (PEP 668 systems refuse pip --user), and the command keeps
# running this checkout's venv. Never replaces a file or link it did not make.
LINK   := $(BINDIR)/agent-bridge
TARGET := $(abspath $(BIN))/agent-bridge

# Optional dependencies of pyproject.toml to add to the venv, comma-separated: `make install EXTRAS=postgres`.
EXTRAS ?=

install: $(VENV)/.installed
	$(if $(EXTRAS),$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]')
	@mkdir -p $(BINDIR)
	@if [ -e $(LINK) -o -L $(LINK) ] && [ "$$(readlink $(LINK))" != "$(TARGET)" ]; then \
	    echo "make install: $(LINK) exists and is not a link to $(TARGET); remove it, or choose another BINDIR=DIR" >&2; \
	    exit 2; fi
	@ln -sfn $(TARGET) $(LINK)
	@echo "installed $(LINK) -> $(TARGET)"
	@case ":$$PATH:" in *":$(BINDIR):"*) ;; *) echo "$(BINDIR) is not on your PATH: add it in your shell's \
	profile (export PATH=\"$(BINDIR):\$$PATH\") and open a new terminal";; esac

uninstall:
	@if [ "$$(readlink $(LINK))" = "$(TARGET)" ]; then rm $(LINK) && echo "removed $(LINK)"; \
	else echo "nothing to remove: $(LINK) is not a link to $(TARGET)"; fi

# Real coding agents the tests drive (against fake API servers on loopback): installed once into a
# cache outside the repo, re-installed when this list changes. Pinned: their output formats are what we test.
TEST_CACHE  ?= $(HOME)/.cache/agent-bridge-tests
NPM_AGENTS  := @openai/codex@0.169.0 @google/gemini-cli@0.61.0 @anthropic-ai/claude-code@2.1.197 \
               @zed-industries/codex-acp@0.16.0 acpx@0.19.1
NPM_STAMP   := $(TEST_CACHE)/npm/.installed-$(shell echo '$(NPM_AGENTS)' | cksum | cut -d' ' -f1)

$(NPM_STAMP):
	mkdir -p $(TEST_CACHE)/npm
	npm install --prefix $(TEST_CACHE)/npm --no-audit --no-fund --loglevel=error $(NPM_AGENTS)
	touch $@

test-agents: $(NPM_STAMP)

# A real Synapse homeserver for the Matrix tests (tools/synapse.py starts it on loopback), installed once into a
# venv of its own in the same cache; the pin is tools/synapse.py's SYNAPSE_VERSION line.
SYNAPSE_VERSION := $(shell sed -n 's/^SYNAPSE_VERSION = "\([^"]*\)".*/\1/p' tools/synapse.py)
SYNAPSE_STAMP   := $(TEST_CACHE)/synapse-venv/.installed-$(SYNAPSE_VERSION)

$(SYNAPSE_STAMP):
	AGENT_BRIDGE_TEST_CACHE=$(TEST_CACHE) $(PYTHON) tools/synapse.py install

test-synapse: $(SYNAPSE_STAMP)

# A throwaway PostgreSQL on loopback for trying the fleet (docs/fleet.md): prints its DSN; Ctrl-C stops it and
# removes its data. Needs PostgreSQL's server installed (as `make test`) and the postgres extra, added here.
fleet-db: $(VENV)/.installed
	@$(BIN)/python -c 'import psycopg' 2>/dev/null || $(BIN)/python -m pip install -q -e '.[postgres]'
	@$(BIN)/python tools/fleet_db.py

# Chat with the real Claude Code or Codex offline: a fake model server on loopback, the ready profile
# (profiles/clis/claude-sdk.yaml, codex-app-server.yaml), and what to type to see an approval and a question.
try-claude try-codex: $(VENV)/.installed $(NPM_STAMP)
	@AGENT_BRIDGE_TEST_CACHE=$(TEST_CACHE) $(BIN)/python tools/try_cli.py $(@:try-%=%)

# Lint, format and types: the quick loop, and the first step of `make test` (so CI keeps them).
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The sandbox tests run the real bwrap: installed here when missing and the machine allows it (root with apt-get);
# elsewhere the run stops, naming the package. Never skipped.
bubblewrap:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing bubblewrap (bwrap) for the sandbox tests"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null; }; \
	  else \
	    echo "make test needs bwrap for the sandbox tests: install the bubblewrap package" \
	      "(Debian, Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)" >&2; exit 1; \
	  fi; }
	@command -v bwrap >/dev/null || { echo "make test: installing bubblewrap failed; install it by hand" >&2; exit 1; }

# pytest runs in a network namespace of its own with only loopback up, where the machine allows it (root, unshare
# and ip): no test, broken or not, can reach anything beyond this machine. Everything installs before, outside it.
# Elsewhere it runs in the machine's network, and says so (docs/contributing.md).
LOOPBACK_ONLY := unshare --net sh -c 'ip link set lo up && exec "$$@"' sh
# Every core; an idle worker takes tests queued for a busy one, so a few slow files (the ACP door's, Matrix's) that
# land on one worker late do not keep the run waiting on it alone. (More workers than cores: -n 3 on 2 cores took 5%
# less than -n 2, and loads the tests' short timeouts beyond what they are chosen for; see docs/contributing.md.)
XDIST := -n auto --dist worksteal

# The tests start ~550 bridge processes; each would compile its modules again where PYTHONDONTWRITEBYTECODE is set
# (the machines this project is built and tested on set it): compiled once here, they load it instead. pytest
# caches the test modules it rewrites (their asserts) only where bytecode may be written, so every worker would
# rewrite all of them again (~10 s of CPU each): one collection here, with bytecode allowed, writes that cache.
test: lint bubblewrap $(NPM_STAMP) $(SYNAPSE_STAMP)
	@$(BIN)/python -m compileall -q bridge tests tools sample_agents >/dev/null
	@PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q --collect-only -p no:cacheprovider >/dev/null
	@if [ "$$(id -u)" = 0 ] && command -v ip >/dev/null && unshare --net true 2>/dev/null; then \
	  echo "make test: pytest runs in a network namespace of its own, only loopback up"; \
	  AGENT_BRIDGE_TEST_CACHE=$(TEST_CACHE) $(LOOPBACK_ONLY) $(BIN)/python -m pytest -q $(XDIST); \
	else \
	  echo "make test: not root, or no unshare or ip here: pytest runs in the machine's network" \
	    "(the tests connect to loopback only, but nothing stops one that would not)"; \
	  AGENT_BRIDGE_TEST_CACHE=$(TEST_CACHE) $(BIN)/python -m pytest -q $(XDIST); \
	fi

# `make bench` (QUICK=1 for a smoke run): its own venv, the project installed non-editable as users get it
# (re-installed whenever bridge/ changes) with the postgres extra (the scale-out cases), the http extra (the
# network door's) and the chat extra (connect's rows), plus the comparison and plotting tools of
# bench/requirements.txt. The scale-out cases need PostgreSQL's server (as `make test`), the cases of Claude Code and codex the npm agents of `make test-agents`.
BENCH_VENV := bench/.venv
BENCH_BIN  := $(BENCH_VENV)/bin

$(BENCH_BIN)/python:
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_BIN)/python -m pip install -q --upgrade pip

$(BENCH_VENV)/.tools: bench/requirements.txt pyproject.toml Makefile | $(BENCH_BIN)/python
	$(BENCH_BIN)/python -m pip install -q -r bench/requirements.txt '.[postgres,http,mcp,chat]'
	touch $@

$(BENCH_VENV)/.bridge: pyproject.toml $(shell find bridge -name '*.py' -o -name py.typed) | $(BENCH_VENV)/.tools
	rm -rf build  # setuptools' build/lib keeps modules since renamed or removed, and they would be installed
	$(BENCH_BIN)/python -m pip install -q --no-deps --force-reinstall .
	touch $@

# agentproc 0.20, the wire-0.4 peer (case 15), in a venv of its own: bench/.venv holds agentproc 0.4.2 for the
# wire-0.1 comparisons, and one venv cannot hold both.
AP020_VENV := bench/.venv-ap020

$(AP020_VENV)/.installed:
	$(PYTHON) -m venv $(AP020_VENV)
	$(AP020_VENV)/bin/python -m pip install -q agentproc==0.20.0
	touch $@

# Cases claude-sdk and codex-app-server run the real CLIs the tests run, from the same cache.
bench: $(BENCH_VENV)/.bridge $(AP020_VENV)/.installed $(NPM_STAMP)
	AGENT_BRIDGE_TEST_CACHE=$(TEST_CACHE) $(BENCH_BIN)/python bench/run.py $(if $(QUICK),--quick) $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
