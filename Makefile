# Two commands set up and run everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CORE_STAMP := $(VENV)/.core-installed
TEST_STAMP := $(VENV)/.test-installed
TPU_STAMP := $(VENV)/.tpu-installed

.PHONY: test test-fast demo demo-all demo-dape demo-fox setup clean

# The requirements files pin every version; pyproject.toml names what each part needs (core,
# [training], [evaluation], [tests], [tpu]). The pinned files are installed first, then the
# package with its extras under the same pins (-c): pip only checks that they are satisfied.
# What the library, training and the demo need (requirements.txt).
$(CORE_STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip==25.3
	$(PY) -m pip install -qq -r requirements.txt
	$(PY) -m pip install -qq --no-build-isolation -c requirements.txt -e '.[training,evaluation]'
	touch $(CORE_STAMP)

# The TPU compiler (requirements-tpu.txt): train/compile.py and its tests compile for TPU
# topologies on this host. CPU runs do not need it (and start without probing for a TPU).
$(TPU_STAMP): $(CORE_STAMP) requirements-tpu.txt
	$(PY) -m pip install -qq -r requirements-tpu.txt
	touch $(TPU_STAMP)

# The tests also compare against PyTorch / Hugging Face models (requirements-interop.txt).
$(TEST_STAMP): $(CORE_STAMP) $(TPU_STAMP) requirements-interop.txt
	$(PY) -m pip install -qq -r requirements-interop.txt
	$(PY) -m pip install -qq --no-build-isolation -c requirements.txt -c requirements-interop.txt -e '.[tests]'
	touch $(TEST_STAMP)

setup: $(TEST_STAMP)

# The whole suite, slow end-to-end tests included.
test: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup tests

# Everything but the tests marked slow.
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 -m "not slow" tests

# rope and bipe_rope; demo-all adds alibi and bipe_alibi (reusing the first two runs).
demo: $(CORE_STAMP)
	$(PY) eval/demo.py --output_dir=demo_out

demo-all: $(CORE_STAMP)
	$(PY) eval/demo.py --output_dir=demo_out --encodings=rope,bipe_rope,alibi,bipe_alibi

# DAPE's claim: kerple, dape_kerple, bipe_dape_kerple, 1000 steps each, evaluated at 1x..64x.
demo-dape: $(CORE_STAMP)
	$(PY) eval/demo.py --output_dir=demo_dape_out --encodings=kerple,dape_kerple,bipe_dape_kerple --steps=1000 --multipliers=1,2,4,8,16,32,64

# Data-dependent positions (issue 38): nope, fox, bipe_fox and cope beside the four of demo-all,
# on the demo's budget (reusing demo_out's runs of the others when they are there).
demo-fox: $(CORE_STAMP)
	$(PY) eval/demo.py --output_dir=demo_out --encodings=rope,bipe_rope,alibi,bipe_alibi,nope,fox,bipe_fox,cope

clean:
	rm -rf $(VENV) demo_out demo_dape_out
