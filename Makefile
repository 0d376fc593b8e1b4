# Two commands set up and run everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test test-fast demo setup clean

$(STAMP): requirements.txt requirements-interop.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==25.3
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q -r requirements-interop.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)

# The whole suite, slow end-to-end tests included.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup tests

# Everything but the tests marked slow.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "not slow" tests

demo: $(STAMP)
	$(PY) eval/demo.py --output_dir=demo_out

clean:
	rm -rf $(VENV) demo_out
