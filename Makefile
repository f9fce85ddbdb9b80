# Two commands a new machine needs: `make demo` and `make test`.  Everything else is set up here.
# `make docs` builds the documentation site (./site); `make package` builds the wheel and sdist and
# checks that they install and work in a fresh virtual environment.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test setup setup-test setup-bench bench bench-quick reliability fuzz lint clean docs package

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
	$(PIP) install -q -e ".[test,s3test,lightning,hf,bench]"
	touch $@

$(VENV)/.docs: pyproject.toml $(VENV)/.core
	$(PIP) install -q -e ".[docs]"
	touch $@

setup: $(VENV)/.core
setup-test: $(VENV)/.test

demo: $(VENV)/.core
	$(PY) examples/demo.py

test: $(VENV)/.test
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy deltackpt
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

# --strict: a broken link, a missing page in the nav or a docstring mkdocstrings cannot read fails
docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site

# build the wheel and sdist, install each into a fresh venv (torch first, pinned) outside the source
# tree, and smoke-test them there; the temp folder goes however the recipe ends
package: $(VENV)/.test
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PY) -m build --outdir "$$tmp/dist" . >"$$tmp/build.log" 2>&1 || { tail -40 "$$tmp/build.log"; exit 1; }; \
	! grep -E "is deprecated|you need to update your project" "$$tmp/build.log" || { echo "make package: setuptools printed deprecation warnings"; exit 1; }; \
	ls "$$tmp/dist"; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install -q torch==2.13.0; \
	"$$tmp/venv/bin/python" -m pip install -q "$$tmp"/dist/*.whl; \
	(cd "$$tmp" && env -u PYTHONPATH "$$tmp/venv/bin/python" "$(CURDIR)/tests/package_smoke.py" wheel); \
	"$$tmp/venv/bin/python" -m pip install -q --no-deps --force-reinstall "$$tmp"/dist/*.tar.gz; \
	(cd "$$tmp" && env -u PYTHONPATH "$$tmp/venv/bin/python" "$(CURDIR)/tests/package_smoke.py" sdist)

clean:
	rm -rf $(VENV) demo-repo demo-out site
