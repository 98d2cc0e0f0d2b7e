# Two commands a new user needs: `make demo` and `make test`. Each builds .venv itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LINT_PATHS := astream tests $(wildcard benchmarks examples)

.PHONY: demo test lint docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m astream.cli demo

test: $(STAMP)
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
