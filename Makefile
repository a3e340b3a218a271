# Two commands: `make book` builds the site into _build/html, `make test` runs everything CI runs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv book test lint unit chapters clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (leakagelib)"
	touch $@

venv: $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W --keep-going

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

unit: $(STAMP)
	$(BIN)/pytest -q tests --ignore=tests/test_chapters.py

chapters: $(STAMP)
	$(BIN)/pytest -q tests/test_chapters.py

# The whole suite: lint, unit tests, every chapter through papermill and nbval,
# then the book built with warnings as errors.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest tests
	$(BIN)/jupyter-book build . -W --keep-going

clean:
	rm -rf _build
