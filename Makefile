# Two commands a new machine needs: `make demo` and `make test`.  Everything else is set up here.
# `make docs` builds the documentation site (./site); `make package` builds the wheel and sdist into
# ./dist and checks that they install and work in a fresh virtual environment.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch imports its compiler when an optimizer is built, and that makes its cache folder, by default
# <temp>/torchinductor_<user>, left behind: every recipe here keeps it inside the venv instead
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/$(VENV)/torchinductor

.PHONY: demo test test-reliability setup setup-test setup-bench bench bench-quick reliability fuzz lint clean docs package

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

# what the library's tests need: the integrations' frameworks and moto, not the benchmark's packages
$(VENV)/.test: pyproject.toml $(VENV)/.core
	$(PIP) install -q -e ".[test,s3test,lightning,hf]"
	touch $@

# the benchmark's own packages (h5py, zipnn, matplotlib, the MiniLM model, psutil)
$(VENV)/.bench: pyproject.toml $(VENV)/.test
	$(PIP) install -q -e ".[test,s3test,lightning,hf,bench]"
	touch $@

$(VENV)/.docs: pyproject.toml $(VENV)/.core
	$(PIP) install -q -e ".[docs]"
	touch $@

setup: $(VENV)/.core
setup-test: $(VENV)/.test
setup-bench: $(VENV)/.bench

demo: $(VENV)/.core
	$(PY) examples/demo.py

# the first tier, the library's contract: within 6 minutes on an idle 2-core machine
test: $(VENV)/.test
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy deltackpt
	$(PY) -m pytest -q -m "not slow and not reliability" -p no:cacheprovider


# the second tier (tests/conftest.py SECOND_TIER: crash matrices, large states, long framework runs,
# the documentation's code), on the deterministic sample CI runs; with the bench extra, so a test
# needing one of its packages runs instead of skipping
test-reliability: $(VENV)/.bench
	$(PY) -m pytest -q -m "reliability and not slow" -p no:cacheprovider

# every study's quick run (CI: none rots); `python -m bench --list` names them
bench-quick: $(VENV)/.bench
	$(PY) -m bench all --quick

bench: $(VENV)/.bench
	$(PY) -m bench compare

# the crash, corruption and hostile-repository suites, every point (tests/RELIABILITY.md)
reliability: $(VENV)/.bench
	DELTACKPT_RELIABILITY=full $(PY) -m pytest -q tests/reliability tests/corruption tests/security -p no:cacheprovider

fuzz: $(VENV)/.test
	$(PIP) install -q atheris
	$(PY) fuzz/run_all.py --seconds 60

# --strict: a broken link, a missing page in the nav or a docstring mkdocstrings cannot read fails
docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site

# build the wheel and sdist into dist/ (what `pip install dist/deltackpt-*.whl` installs on another
# machine), install each into a fresh venv (torch first, pinned) outside the source tree, and
# smoke-test them there; the venv's temp folder goes however the recipe ends
package: $(VENV)/.test
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; rm -rf dist; \
	$(PY) -m build --outdir dist . >"$$tmp/build.log" 2>&1 || { tail -40 "$$tmp/build.log"; exit 1; }; \
	! grep -E "is deprecated|you need to update your project" "$$tmp/build.log" || { echo "make package: setuptools printed deprecation warnings"; exit 1; }; \
	ls dist; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install -q torch==2.13.0; \
	"$$tmp/venv/bin/python" -m pip install -q dist/*.whl; \
	(cd "$$tmp" && env -u PYTHONPATH "$$tmp/venv/bin/python" "$(CURDIR)/tests/package_smoke.py" wheel); \
	"$$tmp/venv/bin/python" -m pip install -q --no-deps --force-reinstall dist/*.tar.gz; \
	(cd "$$tmp" && env -u PYTHONPATH "$$tmp/venv/bin/python" "$(CURDIR)/tests/package_smoke.py" sdist)

clean:
	rm -rf $(VENV) demo-repo demo-out site dist
