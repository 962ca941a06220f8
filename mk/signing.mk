# Signing and verification targets. Include from the top-level Makefile:
#
#     include mk/signing.mk
#
# and make `image` sign what it pushed, by default with a local key generated on first use:
#
#     image: ... | $(SIGNING_KEY)
#         <build and push>; then for each pushed ref: $(KERNELBAKE) sign --key $(SIGNING_KEY) REF
#
#   make signing-deps            cosign 2.5.0 + 3.1.1 and the @sigstore/mock server (idempotent; tests need them)
#   make signing-key             build/signing/kernelbake.{key,pub}, once
#   make sign IMAGE=ref          sign + attest IMAGE (SIGN_FLAGS=--keyless for Fulcio/Rekor, --legacy for .sig/.att too)
#   make verify IMAGE=ref        verify IMAGE against POLICY (default: trust the local public key)
#   make bench-verify            bench/verify_latency.py -> bench/results/verify_latency.json

KERNELBAKE ?= .venv/bin/kernelbake
BENCH_PYTHON ?= .venv/bin/python
SIGNING_DIR ?= build/signing
SIGNING_KEY ?= $(SIGNING_DIR)/kernelbake.key
SIGNING_PUB ?= $(SIGNING_DIR)/kernelbake.pub
SIGN_FLAGS ?= --legacy
POLICY ?=
# Where `make image` writes the reference it pushed (the top-level Makefile sets it from BUILD).
IMAGE_REF ?= build/image.ref

.PHONY: signing-deps signing-key sign verify bench-verify

signing-deps: ## cosign 2.5.0 + 3.1.1 and the @sigstore/mock server (the signing tests need them)
	scripts/setup-signing-deps.sh

$(SIGNING_KEY):
	$(KERNELBAKE) generate-key-pair --dir $(SIGNING_DIR)

signing-key: $(SIGNING_KEY) ## build/signing/kernelbake.{key,pub}, once

sign: $(if $(findstring --keyless,$(SIGN_FLAGS)),,$(SIGNING_KEY)) ## sign and attest IMAGE= (SIGN_FLAGS=--keyless for Fulcio/Rekor)
	@test -n "$(IMAGE)" || { echo "usage: make sign IMAGE=host/repo:tag" >&2; exit 2; }
	$(KERNELBAKE) sign $(if $(findstring --keyless,$(SIGN_FLAGS)),,--key $(SIGNING_KEY)) $(SIGN_FLAGS) $(IMAGE)

verify: ## verify the last image built, or IMAGE=, against POLICY= or the local public key
	$(if $(IMAGE),,$(error verify: nothing was built ($(IMAGE_REF) is missing or empty): run make image, or pass IMAGE=host/repo@sha256:... [POLICY=policy.yaml]))$(KERNELBAKE) verify $(IMAGE) $(if $(POLICY),--policy $(POLICY),--key $(SIGNING_PUB))

bench-verify: ## the verification latency benchmark
	$(BENCH_PYTHON) bench/verify_latency.py
