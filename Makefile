# Two commands a new user needs: `make demo` and `make test`. Each builds .venv itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make demo` needs only the core package (numpy, zstandard, xxhash, aiohttp, aiofiles, uvloop,
# tqdm): a stamp of its own, so that a first demo does not install the dev tools.
CORE_STAMP := $(VENV)/.installed-core
LINT_PATHS := astream tests $(wildcard benchmarks examples)

.PHONY: demo test lint docs clean azurite
# Azurite (the Azure Blob emulator of the azure:// tests) from npm, pinned: later ones need a newer Node than 20.
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob

$(CORE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e .
	touch $(CORE_STAMP)

$(STAMP): pyproject.toml $(CORE_STAMP)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(CORE_STAMP)
	$(PY) -m astream.cli demo

azurite: $(STAMP)
	@if [ -x $(AZURITE) ]; then :; elif command -v npm >/dev/null 2>&1; then \
		npm install --silent --no-audit --no-fund --prefix $(VENV)/azurite azurite@3.35.0; \
	else echo "npm not found: the azure:// tests will skip"; fi

test: $(STAMP) azurite
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m mypy
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir .venv/site
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m mypy

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .demo
