# NeuronFrontier-LM. `make speedrun` and `make test` are the two commands of the quick start.
# Environment: inside an activated virtualenv (e.g. the Neuron SDK's torch-neuronx venv) we install into it
# and never touch its torch; otherwise we create .venv (with system site-packages visible) and add the CPU
# wheel torch==2.13.0 only if no torch is importable.
PY      ?= python3
VENV    ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
BIN     := $(VENV)/bin
BUDGET  ?= 300
CONFIG  ?= cpu-tiny
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install speedrun test sync-check lint nbtest pytest export clean-nbs bench help browser

help:
	@echo "make speedrun   # install, build data + tokenizer, train $(CONFIG) for $(BUDGET)s, print val_bpb"
	@echo "make test       # notebooks/library in sync, static check, nbdev-test, pytest"

install: $(VENV)/.nf-installed

$(VENV)/.nf-installed: pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv --system-site-packages $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $@

speedrun: install
	$(BIN)/neuronfrontier speedrun --config $(CONFIG) --budget $(BUDGET)

export: install
	$(BIN)/nbdev-export && $(BIN)/nbdev-clean

# Fails if exporting/cleaning the notebooks changes any file: library and notebooks must match.
sync-check: install
	@bash tools/check_sync.sh $(BIN)

# Static check of the exported library and the tests: unused imports (F401), undefined names (F821) and
# redefinitions (F811). An exported function that uses a name only a notebook cell imports fails here.
# Then the style of the library: no line over 120 characters, no `;` between statements (tools/lint_style.py),
# and the bundler's rules over every module a submission bundles (notebook 95_bundler).
lint: install
	$(BIN)/ruff check --select F401,F821,F811 neuronfrontier tests
	$(BIN)/python tools/lint_style.py
	$(BIN)/python -c "from neuronfrontier.submission.bundler import lint_bundled as l; p = l(); p and print(*p, sep='\n'); exit(bool(p))"

nbtest: install
	$(BIN)/nbdev-test --n-workers 2

# The dashboard's browser test drives Debian's chromium (playwright cannot download browsers here). Installed when
# missing and apt is usable (root); otherwise that one test is skipped with the reason (and fails when CI is set).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "chromium is missing and apt-get is not usable: the browser test will be skipped"; }

pytest: install browser
	$(BIN)/python -m pytest -q -m "not slow and not neuron and not cuda"

test: sync-check lint nbtest pytest
