# Admission webhook targets. Include from the top-level Makefile:
#
#     include mk/admission.mk
#
#   make admission-cert            deploy/make-cert.sh into build/admission/certs (CA + cert for 127.0.0.1 and the Service,
#                                  and the client certificate a client must show)
#   make admission-serve POLICY=p  kernelbake admission on https://127.0.0.1:8443 with that cert (--client-ca its CA)
#   make admission-review POLICY=p REQUEST=r.json    one AdmissionReview through the same code
#   make admission-check POLICY=p  validate a policy file
#   make admission-try             the ready example: the last image `make image` built, in
#                                  deploy/examples/local-pod.json, against deploy/examples/local-policy.yaml
#   make test-admission            tests/admission (needs Debian's docker-registry; keyless test needs make signing-deps)
#   make bench-admission           bench/admission_load.py -> bench/results/admission_load.json
#   make bench-admission-adversarial   bench/admission_adversarial.py -> bench/results/admission_adversarial.json
#   make bench-admission-cpu       bench/admission_cpu.py -> bench/results/admission_cpu.json (CPU per review against d6fcc27)
#   make admission-image [ADMISSION_IMAGE=ref]   deploy/build-image.sh (wheels downloaded on the host)

KERNELBAKE ?= .venv/bin/kernelbake
BENCH_PYTHON ?= .venv/bin/python
ADMISSION_DIR ?= build/admission
ADMISSION_CERTS ?= $(ADMISSION_DIR)/certs
POLICY ?=
REQUEST ?=
need-policy = $(if $(POLICY),,$(error POLICY=path/to/policy.yaml is required (see docs/admission.md)))

ADMISSION_IMAGE ?=
# The last image `make image` built (the top-level Makefile sets it too).
IMAGE_REF ?= build/image.ref
IMAGE ?= $(shell cat $(IMAGE_REF) 2>/dev/null)
EXAMPLE_POLICY := deploy/examples/local-policy.yaml

.PHONY: admission-cert admission-serve admission-review admission-check admission-try test-admission bench-admission bench-admission-adversarial bench-admission-cpu admission-image

$(ADMISSION_CERTS)/tls.crt:
	deploy/make-cert.sh --out $(ADMISSION_CERTS) --ip 127.0.0.1 --dns localhost

admission-cert: $(ADMISSION_CERTS)/tls.crt ## a CA and a serving certificate for the webhook in build/admission/certs

admission-serve: $(ADMISSION_CERTS)/tls.crt ## serve the admission webhook on https://127.0.0.1:8443 with POLICY=
	$(need-policy)$(KERNELBAKE) admission --policy $(POLICY) --tls-cert $(ADMISSION_CERTS)/tls.crt \
		--tls-key $(ADMISSION_CERTS)/tls.key --client-ca $(ADMISSION_CERTS)/ca.crt --host 127.0.0.1 --port 8443

admission-review: ## one AdmissionReview REQUEST= through the webhook code, with POLICY=
	$(need-policy)$(if $(REQUEST),,$(error REQUEST=request.json is required))$(KERNELBAKE) admission review --policy $(POLICY) $(REQUEST)

admission-check: ## validate the policy file POLICY=
	$(need-policy)$(KERNELBAKE) admission check-policy $(POLICY)

admission-try: ## review the last image built in an example pod against the example policy
	@test -n "$(IMAGE)" || { echo "admission-try: no image built yet (make image first)" >&2; exit 2; }
	@mkdir -p $(ADMISSION_DIR)
	sed 's|"IMAGE"|"$(IMAGE)"|' deploy/examples/local-pod.json > $(ADMISSION_DIR)/local-pod.json
	$(KERNELBAKE) admission review --policy $(EXAMPLE_POLICY) $(ADMISSION_DIR)/local-pod.json

test-admission: ## the admission tests
	$(BENCH_PYTHON) -m pytest tests/admission

bench-admission: ## the admission load benchmark
	$(BENCH_PYTHON) bench/admission_load.py

bench-admission-adversarial: ## hostile reviews against the real webhook (bench/results/admission_adversarial.json)
	$(BENCH_PYTHON) bench/admission_adversarial.py

bench-admission-cpu: ## the webhook's CPU time per review, this tree against d6fcc27 (bench/results/admission_cpu.json)
	$(BENCH_PYTHON) bench/admission_cpu.py

admission-image: ## the webhook's image (ADMISSION_IMAGE=)
	deploy/build-image.sh $(ADMISSION_IMAGE)
