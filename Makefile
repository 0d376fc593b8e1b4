# Two commands set up and run everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CORE_STAMP := $(VENV)/.core-installed
TEST_STAMP := $(VENV)/.test-installed
TPU_STAMP := $(VENV)/.tpu-installed
CUDA_STAMP := $(VENV)/.cuda-installed
# pip byte-compiles what it installs one file at a time; instead the installs skip it
# (--no-compile) and PYC compiles the whole virtualenv once on every core (without it, the
# suite's processes would compile the modules they import, several processes at once). The
# interop requirements on the 2-core machine: 100 s with pip's compile, 40 + 32 s this way.
# compileall's only errors are files this Python never imports (torch's Python 3.12-only test
# helpers), so its report and status are dropped. Left out: the packages' own test suites and
# Transformers' other model families (4,500 of the virtualenv's 17,100 files; nothing imports
# them here).
PIP := $(PY) -m pip install -qq --no-compile
# The pinned files go through uv where it works (tools/install_requirements.py: pip's own
# configuration passed on, pip where uv fails): requirements.txt in 7 s against pip's 33 s.
INSTALL := $(PY) tools/install_requirements.py
PYC := $(PY) -m compileall -q -j 0 -x '/tests/|/transformers/models/(?!llama/|auto/|__init__)' \
	$(VENV)/lib >/dev/null || true

.PHONY: test test-fast test-times test-gpu demo demo-all demo-dape demo-segments demo-che demo-fox setup setup-cuda clean

# The requirements files pin every version; pyproject.toml names what each part needs (core,
# [training], [evaluation], [tests], [tpu]). The pinned files are installed first, then the
# package with its extras under the same pins (-c): pip only checks that they are satisfied.
# What the library, training and the demo need (requirements.txt).
$(CORE_STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip==25.3 uv==0.13.9
	$(INSTALL) -r requirements.txt
	$(INSTALL) --no-build-isolation -c requirements.txt -e '.[training,evaluation]'
	$(PYC)
	touch $(CORE_STAMP)

# The TPU compiler (requirements-tpu.txt): train/compile.py and its tests compile for TPU
# topologies on this host. CPU runs do not need it (and start without probing for a TPU).
$(TPU_STAMP): $(CORE_STAMP) requirements-tpu.txt
	$(INSTALL) -r requirements-tpu.txt
	$(PYC)
	touch $(TPU_STAMP)

# XLA's GPU compiler (requirements-cuda.txt): train/compile.py --platform=cuda compiles for GPUs
# on this host. Kept in its own folder, outside the virtualenv's site-packages, so that CPU runs
# never load it; train/compile.py puts it on the path for --platform=cuda only.
$(CUDA_STAMP): $(CORE_STAMP) requirements-cuda.txt
	rm -rf $(VENV)/cuda-plugin
	$(INSTALL) --no-deps --target $(VENV)/cuda-plugin -r requirements-cuda.txt
	touch $(CUDA_STAMP)

setup-cuda: $(CUDA_STAMP)

# The tests also compare against PyTorch / Hugging Face models (requirements-interop.txt).
$(TEST_STAMP): $(CORE_STAMP) $(TPU_STAMP) $(CUDA_STAMP) requirements-interop.txt
	$(INSTALL) -r requirements-interop.txt
	$(INSTALL) --no-build-isolation -c requirements.txt -c requirements-interop.txt -e '.[tests]'
	$(PYC)
	touch $(TEST_STAMP)

setup: $(TEST_STAMP)

# The whole suite, slow end-to-end tests included (what .ci/run runs); the 25 slowest tests are
# listed at the end. --dist loadfile keeps a test file on one worker, so a module's shared
# fixture (a compile, a subprocess run) is built once, not once per worker; the files go out
# in conftest.py's order, longest first (--no-loadscope-reorder: xdist would otherwise order
# them by their number of tests).
# Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it) Python compiles every
# module it imports from source in every process; the project's own modules are byte-compiled
# first (half a second; stale files only), as the virtualenv is at set-up.
# Three workers on two cores: the storage, multi-process and CLI tests spend much of their time
# waiting (servers, retries, signals, subprocesses), which a third worker fills (a fresh clone on
# the 2-core Intel Xeon host: 647-684 s of pytest with three, 825-853 s with two).
PYTEST := $(PY) -m compileall -q -j 0 bipe_jax benchmarks configs eval tests tools train >/dev/null; \
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder
test: $(TEST_STAMP)
	$(PYTEST) --durations=25 --ignore=tests/gpu tests

# On a host with an NVIDIA GPU: the CUDA runtime (requirements-gpu.txt), the GPU suite (cuDNN and
# the Triton tile-bias kernels against dense attention, bf16 training) and the 151M step
# benchmark. Elsewhere it says so in one line and runs nothing.
test-gpu: $(TEST_STAMP)
	@if ! nvidia-smi -L >/dev/null 2>&1; then \
	  echo "make test-gpu: no NVIDIA GPU on this host (nvidia-smi lists none); nothing run"; \
	else \
	  $(PIP) -r requirements-gpu.txt && \
	  JAX_PLATFORMS=cuda $(PY) -m pytest -q tests/gpu && \
	  JAX_PLATFORMS=cuda $(PY) benchmarks/gpu_step.py; \
	fi

# The edit loop: everything but the slow tier: the tests marked slow in their files (end-to-end
# runs, subprocesses) and those that took 1 s or more in the recorded run (tests/test_seconds.json,
# conftest.py). One package's tests: `.venv/bin/python -m pytest tests/attention`.
test-fast: $(TEST_STAMP)
	$(PYTEST) -m "not slow" --ignore=tests/gpu tests

# The whole suite, then tests/test_seconds.json rewritten from it: each file's seconds (the
# order in which conftest.py hands files to the workers, longest first) and the tests of 1 s or
# more (the slow tier). Run it after adding or changing long tests.
test-times: $(TEST_STAMP)
	$(PYTEST) --junitxml=$(VENV)/test-times.xml --ignore=tests/gpu tests
	$(PY) tests/record_test_seconds.py $(VENV)/test-times.xml

# rope and bipe_rope; demo-all adds alibi and bipe_alibi (reusing the first two runs).
demo: $(CORE_STAMP)
	$(PY) eval/demo.py --output_dir=demo_out

demo-all: $(CORE_STAMP)
	$(PY) eval/demo.py --output_dir=demo_out --encodings=rope,bipe_rope,alibi,bipe_alibi

# DAPE's claim: kerple, dape_kerple, bipe_dape_kerple, 1000 steps each, evaluated at 1x..64x
# (the table also under DAPE's protocol: the last 256 tokens of each window).
demo-dape: $(CORE_STAMP)
	$(PY) eval/demo.py --output_dir=demo_dape_out --encodings=kerple,dape_kerple,bipe_dape_kerple --steps=1000 --multipliers=1,2,4,8,16,32,64 --extra_protocols=last:256

# BiPE's segmentation, in the demo's budget and protocol: bipe_rope on natural segments vs
# fixed-length ones of the corpus's mean segment length (the paper's ablation), and
# hierarchical BiPE (bipe3_rope: sentences within paragraphs) vs bilevel, at 1x..16x.
demo-segments: $(CORE_STAMP)
	$(PY) eval/demo.py --output_dir=demo_segments_out --encodings=bipe_rope,bipe_rope@fixed:auto,bipe3_rope

# DAPE's Chomsky-hierarchy tasks, reduced: 2 tasks x 4 encodings x 1 seed, 300 steps each,
# scored at 9 lengths (4 in 1..40, 5 in 41..500; docs/results.md, section CHE); prints table and wall time.
demo-che: $(CORE_STAMP)
	$(PY) eval/che_sweep.py --output_dir=demo_che_out --tasks=reverse_string,missing_duplicate_string --encodings=rope,kerple,dape_kerple,bipe_rope --seeds=0 --steps=300 --eval_lengths=1-40:13,41-500:92 --eval_samples=16 --bucket=128

# Data-dependent positions (issue 38): nope, fox, bipe_fox and cope beside the four of demo-all,
# on the demo's budget (reusing demo_out's runs of the others when they are there).
demo-fox: $(CORE_STAMP)
	$(PY) eval/demo.py --output_dir=demo_out --encodings=rope,bipe_rope,alibi,bipe_alibi,nope,fox,bipe_fox,cope

clean:
	rm -rf $(VENV) demo_out demo_dape_out demo_segments_out demo_che_out
