# Two commands do all the set-up on a fresh machine:
#   make run    create .venv if missing, install, check (and as root install) the system libraries
#               Qt's platform plugin needs, then start the app
#   make test   the same set-up, then the whole test suite (offscreen: needs no display)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.gaudi-gui-installed

.PHONY: run test lint bench screenshots clean setup check-display

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh
	PYTHON=$(PYTHON) VENV=$(VENV) sh scripts/bootstrap.sh
	touch $(STAMP)

# Missing xcb libraries (libxcb-cursor0, libxcb-icccm4 ...) or no display stop here with what to do,
# instead of Qt aborting inside the app.
check-display: $(STAMP)
	$(PY) scripts/check_qt_platform.py

run: check-display
	$(PY) -m gaudi_gui

# -rs: every skipped test is listed with its reason; --durations=25: the 25 slowest, so a test that
# grows slow is seen. lint-imports: the layer contracts in pyproject.toml.
test: $(STAMP)
	$(VENV)/bin/lint-imports
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -rs -p no:cacheprovider -n 2 --dist loadgroup --durations=25
	$(PY) -m ruff check gaudi_gui bench tests scripts
	$(PY) -m mypy

lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m ruff check gaudi_gui bench tests scripts
	$(PY) -m mypy

bench: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) bench/run.py

# Under the current QT_QPA_PLATFORM, else the display, else xvfb-run, else offscreen.
screenshots: $(STAMP)
	$(PY) scripts/screenshots.py docs
	$(PY) scripts/screenshot_training.py docs
	$(PY) scripts/screenshot_hosts.py docs/hosts.png
	$(PY) scripts/screenshot_sft.py docs

clean:
	rm -rf $(VENV) build *.egg-info
