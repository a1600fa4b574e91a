# One command each, on a fresh clone:
#   make demo   - set up .venv and run the main job (python -m torchtpu.demo)
#   make test   - set up .venv and run the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-full bench clean

setup: $(VENV)/.installed

# torch is installed first, pinned to the CPU build: an unpinned torch pulls a
# multi-gigabyte CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: setup
	$(PY) -m torchtpu.demo $(ARGS)

test: setup
	$(PY) -m pytest tests $(ARGS)

test-full: setup
	TORCHTPU_FULL_OPINFO=1 $(PY) -m pytest tests $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info
