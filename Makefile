# spaced — the entry points. Every target installs what is missing first
# (scripts/setup.sh), then builds with Meson + Ninja.
#
#   make            build (build/, optimized, with debug info)
#   make demo       build and run the tour on the embedded default
#   make check      build build/ and, with ASan/UBSan and -Werror, build-san/; run every test suite: the
#                   unit suites, the fuzz smoke runs and the scripts marked sanitized on build-san/, the
#                   other scripts on build/
#   make check-san  the same, every script on the ASan/UBSan build (slower)
#   make bench-*    benchmarks (build/, optimized)
#   make fuzz       run every libFuzzer target for FUZZ_SECONDS each
#   make sdk        build the TypeScript SDK (npm ci when its lock changed, tsc); the Python SDK needs no build

BUILD      ?= build
SANBUILD   ?= build-san
FUZZBUILD  ?= build-fuzz
FUZZ_SECONDS ?= 30
MESON      ?= meson
NINJA      ?= ninja

.PHONY: all setup build check check-san demo fuzz fuzz-build clean sdk sdk-test conformance
.PHONY: bench-token bench-substrate bench-node bench-cp bench-guest bench-launch bench-pidref bench-client bench-limits
.PHONY: bench-hostile bench-netgtw bench-exec bench-create check-vm bench-vm bench-cp-scale bench-snapshot-io
.PHONY: chaos chaos-quick

all: build

setup:
	@sh scripts/setup.sh

# ninja in a build directory, quiet; its "no work to do" left out
ninja_quiet = $(NINJA) --quiet -C $(1) > $(1)/.ninja.out 2>&1; rc=$$?; \
	grep -v '^ninja: no work to do\.$$' $(1)/.ninja.out; exit $$rc

$(BUILD)/build.ninja:
	$(MESON) setup $(BUILD) --buildtype=debugoptimized >/dev/null

build: setup $(BUILD)/build.ninja
	@$(call ninja_quiet,$(BUILD))

$(SANBUILD)/build.ninja:
	$(MESON) setup $(SANBUILD) --buildtype=debug -Dwerror=true \
		-Db_sanitize=address,undefined -Db_lundef=false >/dev/null

$(FUZZBUILD)/build.ninja:
	CC=clang $(MESON) setup $(FUZZBUILD) --buildtype=debugoptimized -Dfuzz=true \
		-Db_sanitize=address,undefined -Db_lundef=false >/dev/null

# the TypeScript SDK: dependencies from the npm registry by its lock file (only when the lock changed),
# then tsc (sdk/typescript/dist, and build/ with its tests and examples)
sdk: setup
	@cd sdk/typescript && { [ node_modules/.package-lock.json -nt package-lock.json ] || \
		npm ci --no-audit --no-fund --loglevel=error >/dev/null; } && npm run --silent build

# the SDKs' unit tests (no cluster)
sdk-test: sdk
	@SPACED_TOP=$$(pwd) sh tests/sdk_unit.t.sh

# the client conformance suite alone: spacectl, the Python SDK and the TypeScript SDK on a dev cluster
conformance: build sdk
	@SPACED_BUILD=$$(cd $(BUILD) && pwd) SPACED_TOP=$$(pwd) sh tests/conformance.t.sh

# The integration scripts run on the optimized build, where they take about half the time (a
# dev cluster under ASan starts in five times the CPU): what they check is behaviour. Memory errors
# are the sanitizers' part: the unit suites, the fuzz targets and the scripts whose header says
# "# run-tests: sanitized" (hostile input to the daemons) run on the ASan/UBSan build, every
# script with make check-san.
check: setup sdk $(BUILD)/build.ninja $(SANBUILD)/build.ninja $(FUZZBUILD)/build.ninja
	@$(call ninja_quiet,$(BUILD))
	@$(call ninja_quiet,$(SANBUILD))
	@$(call ninja_quiet,$(FUZZBUILD))
	@SCRIPT_BUILD=$(BUILD) sh scripts/run-tests.sh $(SANBUILD) $(FUZZBUILD)

check-san: setup sdk $(SANBUILD)/build.ninja $(FUZZBUILD)/build.ninja
	@$(call ninja_quiet,$(SANBUILD))
	@$(call ninja_quiet,$(FUZZBUILD))
	@SCRIPT_BUILD= PAIRED_JOBS=1 sh scripts/run-tests.sh $(SANBUILD) $(FUZZBUILD)

# spaced-cp on a throwaway PostgreSQL server (also part of `make check`)
check-pg: setup $(SANBUILD)/build.ninja
	@$(call ninja_quiet,$(SANBUILD))
	@SPACED_BUILD=$$(cd $(SANBUILD) && pwd) SPACED_TOP=$$(pwd) sh tests/cp_pg.t.sh; rc=$$?; \
		if [ $$rc -eq 77 ]; then echo "check-pg: SKIPPED (PostgreSQL could not start here)"; exit 0; fi; exit $$rc

# the qemu substrate (issue 15): every VM test in its full form on the ASan/UBSan build
# (make check runs the same tests in their short form); skipped with the reason when no VM can boot
check-vm: setup $(SANBUILD)/build.ninja
	@$(call ninja_quiet,$(SANBUILD))
	@SCRIPT_BUILD= SPACED_VM_FULL=1 sh scripts/run-tests.sh $(SANBUILD) "" 'test-vmm' 'vm_*'

demo: build
	@sh scripts/demo.sh $(BUILD)

bench-token: build
	@$(BUILD)/bench/bench-token

# process substrate + bridge: create-to-ready (cold and warm pool), bwrap baseline,
# idle memory, 4 KiB reads direct and through spaced-host (needs root)
bench-substrate: build
	@$(BUILD)/bench/bench-substrate $(SEQ) $(CONC)

bench-node: build
	@$(BUILD)/bench/bench-node

# sandbox creation as users get it (POST /v1/sandboxes through the control plane, kept-alive client,
# a worker with a warm pool), sequential and 50 concurrent, against bwrap --unshare-all (needs root)
bench-create: build
	@$(BUILD)/bench/bench-create $(SEQ) $(CONC)

# a victim tenant's latency on a worker under attack, against the same worker quiet; R4 under load
bench-hostile: build
	@python3 bench/hostile_bench.py $(BUILD)

# a victim's fsync latency while another tenant's sandbox is snapshotted and resumed (SECS, SIZE_MB)
bench-snapshot-io: build
	@sh bench/snapshot_io_bench.sh $(BUILD) $(or $(SECS),30) $(or $(SIZE_MB),1200)

# control plane: route issuance, move latency, R4 window (SQLite; CP_DB=postgresql://… for PostgreSQL)
bench-cp: build
	@sh bench/cp_bench.sh $(BUILD) $(ROUTES) $(MOVES)

# a create's cost with 20,000 live sandboxes against one, SQLite and PostgreSQL (LIVE, CREATES)
bench-cp-scale: build
	@sh bench/cp_scale_bench.sh $(BUILD) $(or $(LIVE),20000) $(or $(CREATES),40)

# the same with two real spaced-node workers: R4 window = move request -> old worker's first refusal
bench-cp-node: build
	@sh bench/cp_node_bench.sh $(BUILD) $(ROUTES) $(MOVES)

# spacectl on a dev cluster: dev up, cached-route reads and execs, a stale route repaired after a move
bench-client: build
	@sh bench/client_bench.sh $(BUILD) $(READS) $(MOVES)

# streams (issue 12): 1 GiB through exec stdout, fs read and fs write on a dev cluster, in MB/s,
# against cat of the same file on this host in the same run (REPS runs each, median)
bench-exec: build
	@sh bench/exec_bench.sh $(BUILD) $(REPS)

# route chaos (docs/client.md "Route chaos"): a 3-worker dev cluster, 20 sandboxes paused, resumed
# and moved while client threads write, read and exec through cached routes and watches stay open.
# OPS=N operations (chaos: 1000000); CHAOS_DIR=DIR uses a running cluster. chaos-quick is the short
# run make check does (tests/chaos_quick.t.sh: 3000 operations, CHAOS_QUICK_OPS=N), with its checks.
chaos: build
	@$(BUILD)/bench/bench-chaos $(or $(OPS),1000000)

chaos-quick: build
	@SPACED_BUILD=$(BUILD) sh tests/chaos_quick.t.sh

# containment (issue 11): CPU shares of a hog and a job under equal --cpus, the memory peak at
# --memory, the bytes written at --disk, on a dev cluster (needs root); WINDOW=S per CPU run
bench-limits: build
	@sh bench/limits_bench.sh $(BUILD) $(WINDOW)

# the qemu substrate against the process substrate in the same run: cold boot, create from a
# snapshot, pause, resume, snapshot save, idle host memory (needs root); ROUNDS=N (5)
bench-vm: build
	@sh bench/vm_bench.sh $(BUILD) $(or $(ROUNDS),5)

# ServicePorts and egress (issue 14): spaced-netgtw vs nginx (HTTP req/s, p99) and socat (bulk TCP),
# the sandbox's egress vs the host's, same upstream, same load generator (needs root);
# ROUNDS, SECS, CONNS, BYTES
bench-netgtw: build
	@sh bench/netgtw_bench.sh $(BUILD) $(or $(ROUNDS),3) $(or $(SECS),4) $(or $(CONNS),16) $(or $(BYTES),1000000000)

bench-guest: build
	@$(BUILD)/bench/bench-guest

bench-launch: build
	@$(BUILD)/bench/bench-launch $(ROUNDS)

bench-pidref: build
	@$(BUILD)/bench/bench-pidref

fuzz-build: setup $(FUZZBUILD)/build.ninja
	@$(call ninja_quiet,$(FUZZBUILD))

fuzz: fuzz-build
	@sh scripts/fuzz.sh $(FUZZBUILD) $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(SANBUILD) $(FUZZBUILD)
