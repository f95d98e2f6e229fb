# The README's commands. Every target creates .venv and installs the project when needed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: install test test-unit lint clean

install: $(STAMP)

# torch first, so the CPU build of 2.13.0 is taken and no other package pulls a different one.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet --editable ".[pipeline,demo,dev]" --config-settings editable_mode=compat
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

lint: $(STAMP)
	$(BIN)/ruff check capt pipelines tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
