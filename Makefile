# One command each, on a fresh clone:
#   make demo   - set up .venv and run the main job (python -m torchtpu.demo)
#   make test   - set up .venv and run the test suite, then set up .venv-vision and run
#                 the vision tests (what CI runs; VISION=0 skips the vision part)
#   make conformance-vision - set up .venv-vision (torch 2.14.1 + torchvision) and run
#                 the torchvision classification sweep (ARGS='--filter ^resnet' etc.)
#   make test-vision - set up .venv-vision and run the vision tests (torchvision's
#                 detection ops and models, timm, transforms v2)
#   make test-vllm - set up .venv-vllm (vLLM 0.33 + torch 2.14.0) and run the serving
#                 tests (not part of `make test`: a 10 GB venv, ~2 min to install)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-full test-upstream bench clean conformance-vision test-vision test-vllm

setup: $(VENV)/.installed

# torch is installed first, pinned to the CPU build: an unpinned torch pulls a
# multi-gigabyte CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	# build the C++ helper (device guard, tpu:N>0) now rather than at the first backward
	$(PY) -c "from torchtpu._tensor import native; native.install_device_guard()"
	touch $@

demo: setup
	$(PY) -m torchtpu.demo $(ARGS)

# Test files run in parallel, a file per worker process (pytest-xdist, `--dist loadfile`):
# one worker per CPU core, at most 4 (each holds its own JAX runtime and executables).
# `make test JOBS=0` runs them in this process, one after the other.
JOBS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0))))")
XDIST := $(if $(filter 0 1,$(JOBS)),,-n $(JOBS) --dist loadfile)

# The main suite on torch 2.13.0, then the vision tests in their venv (below): both run
# even when the first fails; the exit status fails if either did.  ARGS goes to the main
# suite only.
VISION ?= 1
test: setup
	@rc=0; $(PY) -m pytest tests $(XDIST) $(ARGS) || rc=$$?; \
	if [ "$(VISION)" != 0 ]; then $(MAKE) --no-print-directory test-vision ARGS= || rc=1; fi; \
	exit $$rc

# Everything `make test` leaves out for CI's 20-minute budget (each skip names its reason):
# the whole OpInfo database, DEBUG mode in the mode-parametrized tests, the long smoke
# tests and subprocess examples, the larger sweeps; then the vision part's long models
# (Faster and Mask R-CNN training, the vision example).  VISION=0 skips the vision part.
test-full: setup
	@rc=0; TORCHTPU_FULL_OPINFO=1 TORCHTPU_FULL_TESTS=1 $(PY) -m pytest tests $(XDIST) $(ARGS) || rc=$$?; \
	if [ "$(VISION)" != 0 ]; then TORCHTPU_FULL_TESTS=1 $(MAKE) --no-print-directory test-vision ARGS= || rc=1; fi; \
	exit $$rc

# PyTorch's own device-generic test files on tpu, against
# tests/torch_upstream/expected_failures.txt (~40 min on 2 cores; `make test` runs only
# the fast subset in tests/torch_upstream/fast_subset.txt).  The files are not in the
# repository: copy them outside it and set TORCHTPU_TORCH_TESTS_DIR (or put them in
# ../shared/torch_tests; docs/conformance/torch-tests.md).  -rs prints one line for each
# file not found (it ran nothing); -rP the result line of each file that ran.
test-upstream: setup
	TORCHTPU_TORCH_TESTS=1 $(PY) -m pytest tests/torch_upstream -rsP $(ARGS)

# torchvision from PyPI does not import beside torch 2.13.0+cpu, so the vision tests and
# sweep have their own venv: torch 2.14.1 with its matching torchvision 0.29.1 (a CUDA
# build of torch, ~6 GB; it runs on the CPU), and timm.
VISION_VENV ?= .venv-vision
VPY := $(VISION_VENV)/bin/python

$(VISION_VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VISION_VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(VPY) -m pip install -q -e . tqdm pytest pytest-xdist timm==1.0.31
	touch $@

conformance-vision: $(VISION_VENV)/.installed
	$(VPY) -m torchtpu.conformance vision $(ARGS)

# torchvision's detection ops and models, timm's models and transforms v2 on tpu against
# CPU (these files skip in the main venv, where torchvision does not import)
VISION_TESTS := tests/test_detection_ops.py tests/test_vision_models.py tests/test_vision_sweep.py
test-vision: $(VISION_VENV)/.installed
	$(VPY) -m pytest $(VISION_TESTS) $(XDIST) -p no:cacheprovider $(ARGS)

# vLLM serving (torchtpu.integrations.vllm): vLLM 0.33 pins torch==2.14.0 (a CUDA build of
# torch that runs on the CPU), so it has its own venv; torchtpu goes in beside it with
# torch held at that version.
VLLM_VENV ?= .venv-vllm
VLPY := $(VLLM_VENV)/bin/python

$(VLLM_VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLPY) -m pip install -q --upgrade pip
	$(VLPY) -m pip install -q vllm==0.33.0
	echo torch==2.14.0 > $(VLLM_VENV)/torch-pin.txt
	$(VLPY) -m pip install -q -c $(VLLM_VENV)/torch-pin.txt -e . pytest tokenizers
	# the C++ helper for this torch (the worker would build it at its first start-up)
	$(VLPY) -c "from torchtpu._tensor import native; native.install_device_guard()"
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLPY) -m pytest tests/test_vllm_serving.py -p no:cacheprovider $(ARGS)

clean:
	rm -rf $(VENV) $(VISION_VENV) $(VLLM_VENV) *.egg-info
