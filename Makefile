# Two commands a new machine needs: `make demo` and `make test`.  Everything else is set up here.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test setup setup-test setup-bench bench bench-quick reliability fuzz lint clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first, pinned: a bare torch requirement would pull a multi-GB CUDA build
$(VENV)/.torch: | $(VENV)/bin/python
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	touch $@

$(VENV)/.core: pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.core
	$(PIP) install -q -e ".[test,s3test,adapters,bench]"
	touch $@

setup: $(VENV)/.core
setup-test: $(VENV)/.test

demo: $(VENV)/.core
	$(PY) examples/demo.py

test: $(VENV)/.test
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider

bench-quick: $(VENV)/.test
	$(PY) -m bench.run --quick

bench: $(VENV)/.test
	$(PY) -m bench.run

reliability: $(VENV)/.test
	DELTACKPT_RELIABILITY=full $(PY) -m pytest -q tests/reliability tests/corruption tests/security -p no:cacheprovider

fuzz: $(VENV)/.test
	$(PIP) install -q atheris
	$(PY) fuzz/run_all.py --seconds 60

clean:
	rm -rf $(VENV) demo-repo demo-out
