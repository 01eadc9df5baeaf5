# Two commands for a fresh clone (see README):  make lab   and   make test
# (make check is the everyday loop: lint, the unit tests that run no lesson, and the lessons you changed.)
# Everything installs into ./.venv; nothing outside the clone is touched.
#   make lab FLAVOUR=gpu   on a Linux machine with an NVIDIA GPU (TensorFlow with CUDA), in ./.venv-gpu:
#   a flavour of its own, so the CUDA build never lands on top of tensorflow-cpu in the same environment
PYTHON  ?= python3
# Each module is compiled once, by the first process that imports it, into build/pycache (even where
# PYTHONDONTWRITEBYTECODE is set): otherwise every process would compile TensorFlow and Keras again. Only what
# is imported gets compiled, nothing is written outside the clone, and no source folder gets a __pycache__.
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(CURDIR)/build/pycache
FLAVOUR ?= cpu
VENV    ?= $(if $(filter cpu,$(FLAVOUR)),.venv,.venv-$(FLAVOUR))
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(FLAVOUR)

.PHONY: setup lab lab-setup check test test-main test-apart test-browser test-examples test-side test-busy test-colab test-binder test-oldest setup-colab setup-binder setup-oldest run-colab run-binder run-oldest test-others budgets budgets-commit lint lessons chromium site

setup: $(STAMP)

# uv installs the environment in seconds where pip takes a minute (.ci/uv); pip stays in it for you. make test's
# other environments are installed with this uv too (MGPU_EDU_UV tells .ci/uv which, FLAVOUR=gpu included, so no two
# set-ups make one of their own at once), so the Colab-like one starts as soon as it is here (test-others).
UV := $(BIN)/uv
export MGPU_EDU_UV := $(abspath $(UV))
$(UV):
	@# a supported Python, or a message that says which to name (PYTHON=python3.11): pyproject.toml's range
	@$(PYTHON) .ci/python-ok
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv

$(STAMP): pyproject.toml | $(UV)
	@$(BIN)/python .ci/python-ok
	@# --override: leave out what .ci/uv-overrides.txt names (a package that only slows every Jupyter tool's start).
	$(BIN)/uv pip install --quiet --override .ci/uv-overrides.txt --python $(BIN)/python -e ".[$(FLAVOUR),dev]"
	@# nbgrader is here for tests/test_nbgrader.py: keep its menus out of the JupyterLab that make lab opens
	$(BIN)/python .ci/lab-without-nbgrader.py
	touch $@

# A learner's environment: the lessons' packages and JupyterLab, nothing for the tests or the website (make
# setup adds those; where it has run, make lab uses its environment as it is). uv shows its progress.
LAB_STAMP := $(VENV)/.installed-lab-$(FLAVOUR)
$(LAB_STAMP): pyproject.toml | $(UV)
	@$(BIN)/python .ci/python-ok
	@echo "Installing the lessons' packages into $(VENV): TensorFlow is the largest, a few minutes the first time."
	$(BIN)/uv pip install --python $(BIN)/python -e ".[$(FLAVOUR),lab]"
	touch $@
lab-setup: $(if $(wildcard $(STAMP)),$(STAMP),$(LAB_STAMP))

# JupyterLab 4 in the repository root: exercises in student/, the solved lessons in lessons/ (--allow-root
# only when run as root, e.g. in a container).
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)
lab: lab-setup
	$(BIN)/jupyter lab $(ROOT_FLAG)

# Every test, in every environment the course promises (what CI runs). Each lesson runs once in each
# environment that runs whole lessons (Colab-like, Binder-like: the Binder-like run's timings and memory are
# the budget table) and its student version once (under nbgrader, in the main environment); the test runs
# note each run in build/executions.tsv and .ci/executions.py checks the counts.
EXECUTIONS := $(CURDIR)/build/executions.tsv
# Three tracks side by side (CONTRIBUTING.md): the main environment's tests; the Colab-like lessons, then the
# oldest Python's unit tests, then the example clusters (build/test-others.log); the Binder-like set-up, then the
# browser tests, then the Binder-like lessons (build/test-side.log). The browser tests and the clusters mostly
# wait, so they sit beside lessons that keep the cores busy, and the tracks end close together. The tracks keep
# the cores busy for each other, so the Colab-like lessons get no extra bursty load here. A track's log is
# printed whole when it ends, with its exit status.
test:
	rm -f $(EXECUTIONS)
	@# the last run's AutoGraph modules' .pyc files (their sources, in the temporary folder, are deleted at exit)
	@find build/pycache -name '__autograph_generated_file*' -delete 2>/dev/null || true
	@# -k: a track that fails leaves the others running; make test still fails
	MGPU_EDU_EXECUTION_LOG=$(EXECUTIONS) $(MAKE) --no-print-directory -k -j3 test-main test-others test-side
	$(BIN)/python .ci/executions.py $(EXECUTIONS)
# $(call track,LOG,WHAT,COMMANDS): run a track's shell COMMANDS into build/LOG.log, then print it whole
# and exit with their status.
track = @mkdir -p build; echo "$(2) (build/$(1).log)"; { $(3); } > build/$(1).log 2>&1; \
	status=$$?; echo "===== build/$(1).log (exit status $$status) ====="; cat build/$(1).log; exit $$status
test-others: $(UV)
	$(call track,test-others,The Colab-like environment then the oldest Python then the example clusters beside the main tests,\
	  $(MAKE) --no-print-directory -k -j2 setup-colab setup-oldest; set_up=$$?; \
	  BURSTY_LOAD=0 $(MAKE) --no-print-directory -k -j1 run-colab run-oldest test-examples && test $$set_up = 0)
test-side: setup chromium
	$(call track,test-side,The Binder-like environment set up then the browser tests then the Binder-like lessons,\
	  $(MAKE) --no-print-directory -k -j1 setup-binder test-browser run-binder)

# Main environment (current releases): lint, the unit tests, the student versions and nbgrader's round trip,
# the website (built and opened in Debian's chromium), in one pytest run; make test-apart runs the rest of
# this environment's tests (SIDE_TRACK). It runs no whole lesson under nbval: the Binder-like environment
# (the same releases, as binder/ installs them) does, and the Colab-like one; here every lesson's cells but
# its solutions run in its student version. Everything runs with the network blocked (see conftest.py).
test-main: lint chromium
	@date +'== main environment: tests (%T)'
	MGPU_EDU_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest tests $(IN_PARALLEL) --durations=20 \
		$(addprefix --ignore ,$(SIDE_TRACK))
# make test-main and make check run their tests in two processes (pytest-xdist), a test file at a time in
# each, the longest files first (tests/conftest.py), so that neither ends long after the other;
# --no-loadscope-reorder keeps that order (pytest-xdist 3.5 and later would hand out the largest files first).
WORKERS ?= 2
IN_PARALLEL = -n $(WORKERS) --dist loadfile --no-loadscope-reorder

# The main environment's tests that make test runs on its other two tracks, beside the main one: the browser
# tests (JupyterLab in headless Chromium, driving every widget the lessons show: test-browser, third track) and
# the example scripts' clusters of TensorFlow processes (mostly waiting on purpose for heartbeats and timeouts:
# test-examples, second track). Same environment (.venv), same checks; make test-main leaves them out, and
# make test-apart runs both.
SIDE_TRACK := tests/test_browser.py tests/test_examples.py
test-apart: test-browser test-examples
test-browser test-examples: setup chromium
	@date +'== main environment: tests/$(subst -,_,$@).py (%T)'
	MGPU_EDU_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -p no:randomly --durations=10 tests/$(subst -,_,$@).py

# The everyday loop, a few minutes from a warm .venv: lint, the unit tests that run no lesson (those marked
# `lessons` or `slow` are make test's), and every lesson that differs from BASE's merge base (committed or
# not; BASE=origin/main to compare with another branch).
BASE ?= main
check: lint
	@lessons=$$(.ci/changed-lessons $(BASE)) || exit 2; \
	echo "Lessons changed since the merge base with $(BASE): $${lessons:-none}"; \
	MGPU_EDU_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest tests $(IN_PARALLEL) -m "not lessons and not slow" $$lessons

# Every lesson under nbval while other processes keep all the cores busy in bursts, as on a shared host
# (benchmarks/bursty_load.py): no lesson may fail because the machine is slow. CI runs the Colab-like
# environment's lessons this way.
# Each lesson's time under that load goes to build/budgets/busy.md.
test-busy: setup
	$(BIN)/python benchmarks/budgets.py --busy --name busy

# Colab-like (Python 3.13, TF 2.20, Keras 3.13, ipywidgets 7.7.1: .ci/colab-constraints.txt),
# Binder-like (binder/: every lesson, its time and its kernel's peak memory: make test's budget table), and
# the oldest supported Python's unit tests but those whose processes import TensorFlow (marked `processes`; those
# marked `light` run; nothing where the main environment is that Python, as here: make test-main runs them all);
# each in a fresh virtual environment of its own (.venv-colab, .venv-binder, .venv-oldest).
# (setup-X installs one, run-X tests it: each of make test's tracks does its installs first.)
test-colab:
	.ci/env-colab
test-binder:
	.ci/env-binder
test-oldest:
	.ci/env-oldest
setup-colab setup-binder setup-oldest:
	.ci/env-$(subst setup-,,$@) setup
run-colab run-binder:
	.ci/env-$(subst run-,,$@) run
run-oldest:
	.ci/env-oldest run
# .ci/env-oldest compares the oldest Python with this main environment's (FLAVOUR=gpu: .venv-gpu)
test-oldest setup-oldest run-oldest: export MAIN_PYTHON := $(abspath $(BIN))/python

# The course website, never executed, offline, warnings as errors (docs/site/build.py): the learner
# edition into build/site/html (open its index.html; exercises unsolved, buttons open student/), or
# with EDITION=instructor the instructor edition into build/site-instructor/html (solutions folded,
# the course guide). tests/test_site.py builds both and checks them in Chromium;
# .github/workflows/pages.yml publishes the learner edition.
EDITION ?= learner
site: setup
	$(BIN)/python docs/site/build.py --edition $(EDITION)

# Time and memory of every lesson, and import time, into build/budgets/ (ignored by git), in this environment
# (make test runs the same script in the Binder-like one). Only `make budgets-commit` writes the tracked
# benchmarks/results.md and the guide's time table.
budgets: setup
	$(BIN)/python benchmarks/budgets.py
budgets-commit: setup
	$(BIN)/python benchmarks/budgets.py --commit

# The browser test drives Debian's chromium package (Playwright's browser downloads are not used).
CHROMIUM ?= /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u 2>/dev/null)),,sudo -n)
chromium:
	@test -x $(CHROMIUM) || { echo "Installing chromium with apt for the browser test"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
		|| { echo "Could not install chromium: install it (apt-get install chromium) or set CHROMIUM=/path"; exit 1; }

lint: setup
	$(BIN)/ruff check .

# Re-execute every lesson in place, refreshing its stored outputs (run after editing one), then
# point its badges and Colab cell at lessons/course.toml's repo and ref and strip run metadata.
# LESSONS=lessons/03_allreduce.ipynb re-executes one lesson only.
LESSONS ?= lessons/*.ipynb
lessons: setup
	MGPU_EDU_PLATFORM=local $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=600 --ExecutePreprocessor.record_timing=False $(LESSONS)
	$(BIN)/python -m mgpu_edu.course .
