# Process snapshots (docs/snapshot.md). Included from the top-level Makefile; `make image
# SNAPSHOT=1` runs `snapshot` after the image is pushed and signed.
#
#   make criu                      build/criu: CRIU from images/base/criu/criu.lock (version + sha256)
#   make snapshot IMAGE=ref        take a snapshot of IMAGE (default: the last image built), push and sign it
#                                  (with the image's own CRIU; build/criu mounted into one without)
#   make bench-snapshot            bench/snapshot_cpu.py -> bench/results/snapshot_cpu.json

CRIU_PREFIX ?= $(BUILD)/criu
SNAPSHOT_DIR ?= $(BUILD)/snapshot
# Only the capabilities CRIU measured to need in a container, none of Docker's defaults
# (contract.snapshot.SNAPSHOT_CAPABILITIES): the pod recipe restores with the same set.
SNAPSHOT_DOCKER_ARGS ?= --cap-drop ALL --cap-add SYS_ADMIN --cap-add NET_ADMIN --cap-add SYS_TIME \
  --cap-add SYS_CHROOT --cap-add SETGID --security-opt seccomp=unconfined --shm-size 1g

.PHONY: criu snapshot bench-snapshot

criu: ## CRIU into build/criu from the pinned Debian packages (images/base/criu/criu.lock)
	@test -x $(CRIU_PREFIX)/bin/criu || images/base/criu/install.sh $(CRIU_PREFIX)

snapshot: criu ## snapshot of IMAGE (default: the last built): take in a container, push as a referrer, sign
	@test -n "$(IMAGE)" || { echo "snapshot: no IMAGE (make image first, or IMAGE=ref@sha256:...)"; exit 2; }
	rm -rf $(SNAPSHOT_DIR) && mkdir -p $(SNAPSHOT_DIR)
	@# An image whose spec says `snapshot: true` carries CRIU; another gets build/criu mounted.
	criu=$$(docker run --rm --entrypoint test "$(IMAGE)" -x /opt/kernelbake/criu/bin/criu \
	  || echo "-v $(abspath $(CRIU_PREFIX)):/opt/kernelbake/criu:ro"); \
	docker run --rm $(SNAPSHOT_DOCKER_ARGS) $$criu \
	  -v $(abspath $(SNAPSHOT_DIR)):/work --entrypoint python3 "$(IMAGE)" \
	  -m kernelbake snapshot take --out /work/snap --image-digest "$(lastword $(subst @, ,$(IMAGE)))"
	$(KERNELBAKE) snapshot push $(SNAPSHOT_DIR)/snap --base "$(IMAGE)" --key $(SIGNING_KEY)

bench-snapshot: criu ## baked vs restored start on the last image built (bench/snapshot_cpu.py)
	$(BENCH_PYTHON) bench/snapshot_cpu.py --image "$(IMAGE)" --criu $(abspath $(CRIU_PREFIX)) \
	  --out bench/results/snapshot_cpu.json
