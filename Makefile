# Two commands for a fresh clone (see README):  make lab   and   make test
# Everything installs into ./.venv; nothing outside the clone is touched.
#   make lab FLAVOUR=gpu   on a Linux machine with an NVIDIA GPU (TensorFlow with CUDA)
PYTHON  ?= python3
VENV    ?= .venv
FLAVOUR ?= cpu
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(FLAVOUR)

.PHONY: setup lab test lint lessons

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(FLAVOUR),dev]"
	touch $@

# Open the lessons in JupyterLab 4 (--allow-root only when run as root, e.g. in a container).
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)
lab: setup
	$(BIN)/jupyter lab $(ROOT_FLAG) lessons/

# Lint, unit tests, and every lesson under nbval.
test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .

# Re-execute every lesson in place, refreshing its stored outputs (run after editing one).
lessons: setup
	$(BIN)/python -m mgpu_edu.course .
	MGPU_EDU_PLATFORM=local $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=600 lessons/*.ipynb
