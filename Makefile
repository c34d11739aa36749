# pflrepro — run `make help` for the targets.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
export WANDB_MODE ?= offline

# Paper tables: one target per spec conf/paper/<paper>/<table|figN>.yaml, e.g. `make fedcac-table2`.
SCALE    ?= mini          # mini (embedded stand-in data, CPU, minutes) | medium (real data, fewer rounds, hours) | paper
LAUNCHER ?= local         # local (capped processes) | slurm (job array) | inline (this process)
SEEDS    ?=               # e.g. SEEDS="0 1 2"; empty = the spec's seeds for SCALE
DATA_ROOT ?=              # where CIFAR/Tiny-ImageNet/... live (else $$PFL_DATA_ROOT, else ./data)
RERUN_STALE ?=            # 1: rerun finished cells computed by other code than this tree's (default: reuse, marked ‡)
ARGS     ?=               # more overrides for every cell / the launcher: ARGS="device=cuda launcher.partition=gpu"
SPECS    := $(sort $(wildcard conf/paper/*/table*.yaml conf/paper/*/fig*.yaml))
TABLES   := $(foreach s,$(SPECS),$(notdir $(patsubst %/,%,$(dir $(s))))-$(basename $(notdir $(s))))
# specs that only hold a figure's setup: its script trains or partitions their cells (`make plots`), so `make tables`
# skips them (their targets still run them as tables; `--dry-run` checks them)
SETUP_ONLY := fedcac-fig1a fedcac-fig1b fedcac-fig8
PAPERS   := fedcac pa3dfl fedc2i fedselect

.PHONY: help setup fashion-mnist opencv-digits chromium demo test test-fast reliability lint bench scale crosscheck crosscheck-ci crosscheck-table efficiency pa3dfl-table9 report report-screenshot wandb-tables clean-runs tables table2 plots collect claims $(TABLES)

help:
	@echo "make setup   create $(VENV) and install pflrepro with its dev tools (torch from pip)"
	@echo "make demo    FedCAC Table 1, one column, vs its baselines beside the paper's numbers -> results/demo/index.html"
	@echo "make test    the test suite on 2 processes (WANDB_MODE=offline; TEST_WORKERS=1 for one)"
	@echo "make test-fast  the tests not marked slow (no training, no subprocesses): the loop while working"
	@echo "make reliability  fault injection and bad inputs (part of make test too), with a summary table"
	@echo "make lint    ruff"
	@echo "make bench   engine vs naive loop, seconds per round -> results/bench/"
	@echo "make crosscheck  rerun our side of every cross-check against the committed reference curves of"
	@echo "             independent implementations (results/crosscheck/); fails on a drift beyond tolerance"
	@echo "make crosscheck-ci  the reduced set of conf/crosscheck.yaml's ci: (FedAvg and FedPer, pathological)"
	@echo "make crosscheck-table  rebuild results/crosscheck/README.md + table.json from the committed curves"
	@echo "make scale   seconds per round and peak memory vs clients (10 -> 10,000), model size, per-client state"
	@echo "             in memory or in files -> results/bench/scale.md (about 15 CPU-minutes)"
	@echo "make <paper>-<table>  one paper table or figure, e.g. make fedcac-table2 (alias: make table2);"
	@echo "             SCALE=mini|medium|paper LAUNCHER=local|slurm|inline SEEDS=\"0 1\" DATA_ROOT=... ARGS=\"device=cuda\""
	@echo "             targets: $(TABLES)"
	@echo "make tables  every table and figure above (finished cells are reused)"
	@echo "make collect rewrite every table from the runs that exist (trains nothing), then the claims ledgers"
	@echo "make claims  a verdict per pre-registered claim of each paper -> results/<paper>/[<scale>/]claims.{json,md}"
	@echo "make plots   every figure from run records -> results/<paper>/figures/ (PNG + PDF)"
	@echo "make pa3dfl-table9  Pa3dFL's hypernetwork cost per round (Table 9) -> results/pa3dfl/table9.md (about 35 min)"
	@echo "make efficiency  FLOPs, peak memory, model size per capacity method and width -> results/pa3dfl/"
	@echo "make report  one static page of every table, figure and provenance -> results/index.html"
	@echo "             (make report-screenshot: also results/index.png, needs Debian's chromium)"
	@echo "make wandb-tables  every table (+ its paper's figures) as a W&B run, offline -> runs/wandb-tables/ (then wandb sync)"

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Debian/Ubuntu: apt-get install python3.11 python3.11-venv)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed fashion-mnist opencv-digits chromium

# Fashion-MNIST (the Tiny-ImageNet stand-in of the FedCAC mini tables) from Debian, when root with apt;
# otherwise the tables' pre-launch check says how to get it. Never fails the setup.
fashion-mnist:
	@if [ ! -d /usr/share/datasets/fashion-mnist ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's dataset-fashion-mnist (FedCAC mini tables)"; \
	  timeout 300 apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null 2>&1 || \
	  { timeout 300 apt-get update -qq >/dev/null 2>&1 && \
	    timeout 300 apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null 2>&1; } || \
	  echo "could not install dataset-fashion-mnist; tables that need it will say how to get it"; fi

# OpenCV's digits.png (Debian's opencv-doc) for the fifth Digit-5 stand-in domain (SVHN-like, FedC2I mini tables),
# when root with apt; otherwise the tables' pre-launch check says how to get it. Never fails the setup.
OPENCV_DIGITS := /usr/share/doc/opencv-doc/examples/data/digits.png
opencv-digits:
	@if [ ! -f $(OPENCV_DIGITS) ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's opencv-doc (digits.png, FedC2I mini tables)"; \
	  timeout 300 apt-get install -y -qq --no-install-recommends opencv-doc >/dev/null 2>&1 || \
	  { timeout 300 apt-get update -qq >/dev/null 2>&1 && \
	    timeout 300 apt-get install -y -qq --no-install-recommends opencv-doc >/dev/null 2>&1; } || \
	  echo "could not install opencv-doc; tables that need it will say how to get it"; fi

# Debian's Chromium for the headless-browser test of `make report`, when root with apt. Never fails the setup;
# without it that test fails with the command that installs it.
chromium:
	@if ! command -v chromium >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's chromium (make report's browser test)"; \
	  timeout 600 apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
	  { timeout 300 apt-get update -qq >/dev/null 2>&1 && \
	    timeout 600 apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; } || \
	  echo "could not install chromium; tests/test_report.py's browser test will say how to get it"; fi

demo: setup
	$(PY) scripts/demo.py --out results/demo

# the suite on TEST_WORKERS processes (pytest-xdist; a test file stays on one worker, its fixtures shared)
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# what a developer runs while working: every test not marked slow (training, subprocesses), needs only the venv
test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile

reliability: setup
	$(PY) scripts/reliability.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) scripts/benchmark.py --out results/bench

scale: setup
	$(PY) scripts/scale.py --out results/bench

# Cross-checks against independent implementations (conf/crosscheck.yaml; the external side:
# scripts/crosscheck_external.py). Our runs go to a fresh temporary folder, so the current code is what runs.
crosscheck: setup
	$(PY) -m bench.experiment.crosscheck

crosscheck-ci: setup
	$(PY) -m bench.experiment.crosscheck --set ci

# rebuild results/crosscheck/README.md + table.json from the committed curves (no training)
crosscheck-table: setup
	$(PY) -m bench.experiment.crosscheck --table-only

clean-runs:
	rm -rf runs cache results/demo/runs

$(TABLES): setup
	$(PY) -m bench.experiment.table conf/paper/$(firstword $(subst -, ,$@))/$(word 2,$(subst -, ,$@)).yaml \
	  --scale $(strip $(SCALE)) --launcher $(strip $(LAUNCHER)) $(if $(strip $(SEEDS)),--seeds $(SEEDS)) \
	  $(if $(strip $(RERUN_STALE)),--rerun-stale) \
	  -- $(if $(strip $(DATA_ROOT)),data_root=$(strip $(DATA_ROOT))) $(ARGS)

table2: fedcac-table2

tables: $(filter-out $(SETUP_ONLY),$(TABLES))

collect: setup
	$(PY) -m bench.experiment.collect $(SPECS) --scale $(strip $(SCALE))
	$(PY) -m bench.experiment.ledger --scale $(strip $(SCALE))

claims: setup
	$(PY) -m bench.experiment.ledger --scale $(strip $(SCALE))

plots: setup
	$(PY) -m bench.experiment.plots --scale $(strip $(SCALE))
	$(PY) scripts/fedcac/figures.py all --scale $(strip $(SCALE))
	$(PY) scripts/fedc2i/figures.py all --scale $(strip $(SCALE))
	$(PY) scripts/fedc2i/figures.py fig4 --skip-missing --scale $(strip $(SCALE)) $(if $(strip $(DATA_ROOT)),--data-root $(strip $(DATA_ROOT)))
	$(PY) scripts/fedselect/figures.py all --scale $(strip $(SCALE))
	$(PY) scripts/pa3dfl/figures.py all --scale $(strip $(SCALE))

efficiency: setup
	$(PY) -m scripts.pa3dfl.efficiency --out results/pa3dfl

# the READMEs' generated blocks (numbers from results files, bench/experiment/readme_blocks.py), then the page
report: setup
	$(PY) -m bench.experiment.readme_blocks --write
	$(PY) -m bench.experiment.report --results results --out results/index.html

report-screenshot: setup
	$(PY) -m bench.experiment.report --results results --out results/index.html --screenshot

wandb-tables: setup
	$(PY) -m bench.experiment.wandb_tables --results results --scale $(strip $(SCALE))

# Pa3dFL Table 9: the hypernetwork's generation / update time per round and its memory (a measurement, no runs)
pa3dfl-table9: setup
	$(PY) scripts/pa3dfl/hn_cost.py --repeats 5 --repeats-for resnet18_gn=2

# a paper table without a spec yet (its methods are not built): say so instead of "no rule"
$(addsuffix -table%,$(PAPERS)):
	@echo "$@: no spec conf/paper/$(firstword $(subst -, ,$@))/$(word 2,$(subst -, ,$@)).yaml yet; the methods of this"
	@echo "paper are not built in this repository yet. Available: $(TABLES)"; exit 2
