# Two commands: `make book` builds the site into _build/html, `make test` runs everything CI runs.
# (`make coursework` writes the student versions and autograders for a course.)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv book test lint unit chapters seeds offline-check coursework grading clean

# pip compiles the modules it installs to bytecode on one core; compileall does it on all of them
# (torch's thousands of modules: about a quarter of the install's time on two cores). A few files
# shipped in the packages do not compile (pip skips them too), hence the `|| true`.
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -r requirements.txt
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (leakagelib)"
	touch $@

venv: $(STAMP)

# The site reads offline: MathJax comes from the sphinx-mathjax-offline package (requirements.txt),
# and the two scripts that render widget cells, RequireJS and the ipywidgets HTML manager, are
# fetched by name and pinned version from the npm registry into _static/widgets (git-ignored) and
# joined into widgets.js (tools/widgets-paths.js between them), instead of being loaded from
# CDNs (`nb_ipywidgets_js` in _config.yml).
WIDGETS := _static/widgets
WIDGET_JS := requirejs@2.3.8 @jupyter-widgets/html-manager@1.0.15

$(WIDGETS)/.fetched: Makefile tools/widgets-paths.js
	rm -rf $(WIDGETS) && mkdir -p $(WIDGETS)/pack
	cd $(WIDGETS)/pack && npm pack --silent $(WIDGET_JS) >/dev/null
	tar -xzf $(WIDGETS)/pack/requirejs-*.tgz -C $(WIDGETS)/pack package/require.js
	tar -xzf $(WIDGETS)/pack/jupyter-widgets-html-manager-*.tgz -C $(WIDGETS)/pack package/dist
	cat $(WIDGETS)/pack/package/require.js tools/widgets-paths.js \
	    $(WIDGETS)/pack/package/dist/embed-amd.js > $(WIDGETS)/widgets.js
	mv $(WIDGETS)/pack/package/dist/*.woff* $(WIDGETS)/pack/package/dist/*.ttf $(WIDGETS)/
	mv $(WIDGETS)/pack/package/dist/*.eot $(WIDGETS)/pack/package/dist/*.svg $(WIDGETS)/
	rm -rf $(WIDGETS)/pack
	touch $@

# Writes every chapter's install cell from _config.yml's repository.url and the library's version
# (tools/install_cells.py: a pinned install of the tag v<version>), executes every chapter once
# (afresh: the cache of an earlier build is dropped, since it keys on the notebooks' code, not on
# the library's, and `--all` makes Sphinx read every page again, since otherwise it skips the
# chapters whose files did not change and nothing would be executed) and builds the site; the
# executed notebooks stay in _build/.jupyter_cache, where the chapter tests read them.
book: $(STAMP) $(WIDGETS)/.fetched
	$(BIN)/python tools/install_cells.py
	rm -rf _build/.jupyter_cache
	$(BIN)/jupyter-book build . -W --keep-going --all

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The unit tests; the slowest 25 are listed at the end, for the CI time (README, "The two commands").
unit: $(STAMP)
	$(BIN)/pytest tests --ignore=tests/test_chapters.py --durations=25

# Checks the chapters the last `make book` executed (conventions, errors, marked outputs).
chapters: $(STAMP)
	$(BIN)/pytest tests/test_chapters.py

# The whole suite: lint; the unit tests and the book built with warnings as errors (which
# executes every chapter once) side by side, each on one thread, since the build executes one
# chapter at a time and the tests take the second core (their output lines interleave); then the
# chapter tests on those executed notebooks. README.md gives the times measured.
test: lint
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j2 unit book
	$(MAKE) --no-print-directory chapters

# Every chapter of the book (a notebook in book/).
ALL_CHAPTERS := $(basename $(notdir $(wildcard book/*.ipynb)))

# The chapters executed with the seeds of leakagelib.experiments.paired.CLAIM_SEEDS (make test
# runs the two cheapest; this target all twelve, 8.5 minutes on one core of the machine the
# README names).
seeds: $(STAMP)
	SEED_CHAPTERS="$(ALL_CHAPTERS)" $(BIN)/pytest tests/test_chapter_seeds.py

# Opens every page of the built site in headless Chromium with every host but this machine
# unreachable, and fails on raw TeX or a widget cell that did not render (tools/check_offline.py;
# needs `chromium`, e.g. `apt-get install chromium`). Screenshots go to $(SHOTS) (SHOTS= for none).
SHOTS ?= _build/offline
offline-check: $(STAMP)
	$(BIN)/python tools/check_offline.py _build/html $(if $(SHOTS),--screenshots $(SHOTS))

# Coursework (book/teachers.md): a student version of every chapter, its exercises' solutions
# and hidden checks stripped, and an otter-grader autograder whose tests are those checks, in
# _build/coursework/<chapter>/{student,autograder}. Nothing is executed; grading a submission is
# `$(BIN)/python tools/coursework.py grade CHAPTER SUBMISSION.ipynb ...`.
coursework: $(STAMP)
	$(BIN)/python tools/coursework.py build

# Every chapter graded for real, its reference solutions and its blank student version (make test
# grades client_updates alone; this target runs each chapter twice, about as long as two builds).
grading: $(STAMP)
	GRADED_CHAPTERS="$(ALL_CHAPTERS)" $(BIN)/pytest tests/test_coursework.py -k score_full_marks

clean:
	rm -rf _build $(WIDGETS)
