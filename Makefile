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

# Executes every chapter once (afresh: the cache of an earlier build is dropped, since it keys
# on the notebooks' code, not on the library's) and builds the site; the executed notebooks
# stay in _build/.jupyter_cache, where the chapter tests read them.
book: $(STAMP)
	rm -rf _build/.jupyter_cache
	$(BIN)/jupyter-book build . -W --keep-going

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

unit: $(STAMP)
	$(BIN)/pytest tests --ignore=tests/test_chapters.py

# Checks the chapters the last `make book` executed (conventions, errors, marked outputs).
chapters: $(STAMP)
	$(BIN)/pytest tests/test_chapters.py

# The whole suite: lint, unit tests, the book built with warnings as errors (which executes
# every chapter once), then the chapter tests on those executed notebooks.
test: lint unit book chapters

clean:
	rm -rf _build
