# The front door: `make demo` and `make test` work on a fresh Debian 12
# machine as root. Everything below wraps CMake (build/ for Release builds).
BUILD_DIR   ?= build
BUILD_TYPE  ?= Release
SANITIZE    ?=
JOBS        ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all deps configure build test demo bench format clean sanitize sanitize-core chaos chaos-survive fuzz package plots scaling simulate simulate-scale horovod-suite

all: build

deps:
	@scripts/deps.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DPUSHPULL_SANITIZE=$(SANITIZE) $(CMAKE_FLAGS)

configure: $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: deps
	@$(MAKE) --no-print-directory build
	scripts/run-tests.sh $(BUILD_DIR) $(CTEST_FLAGS)

# ASan+UBSan build and test run in build-asan/ (without the libtorch and
# Python parts: their host processes are not built with the sanitizers).
sanitize: deps
	@$(MAKE) --no-print-directory test BUILD_DIR=build-asan BUILD_TYPE=RelWithDebInfo \
	  SANITIZE=address,undefined \
	  CMAKE_FLAGS="-DPUSHPULL_BUILD_TORCH=OFF -DPUSHPULL_BUILD_PYTHON=OFF"

# The core under ASan+UBSan, quicker than `make sanitize`: the libraries,
# tools, examples and tests (no libtorch, Python or benchmarks) in
# build-asan-core/, and only the core layers' own tests (not the
# multi-process launch, e2e and security jobs, nor chaos, install, lenet,
# torch, bench, scripts, sim: those stay in `make sanitize`). .ci/run runs it
# when a change touches src/ or include/ (docs/reliability.md, "Sanitizers
# in CI").
SANITIZE_CORE_LABELS ?= base|net|cluster|collective|ps|kvstore|compress|optim|data|frontend
sanitize-core: deps
	@$(MAKE) --no-print-directory build BUILD_DIR=build-asan-core BUILD_TYPE=RelWithDebInfo \
	  SANITIZE=address,undefined \
	  CMAKE_FLAGS="-DPUSHPULL_BUILD_TORCH=OFF -DPUSHPULL_BUILD_PYTHON=OFF -DPUSHPULL_BUILD_BENCHMARKS=OFF"
	ctest --test-dir build-asan-core --output-on-failure -j $$(( $$(nproc) * 2 )) --timeout 900 \
	  -L '^($(SANITIZE_CORE_LABELS))$$' -LE 'chaos|install|lenet|torch|bench|launch|e2e|security'

# Horovod's own torch suite (its test/parallel/test_torch.py, not part of this
# repository: pass a copy) run against pushpull.torch, each test alone under
# `pushpull launch` (docs/python.md, "Horovod's own suite").
# HOROVOD_SUITE_FLAGS: e.g. --ranks 2,3,4 --jobs 2 -k alltoall.
HOROVOD_TEST        ?=
HOROVOD_SUITE_FLAGS ?= --ranks 2,3,4
horovod-suite:
	@test -n "$(HOROVOD_TEST)" || { echo "make horovod-suite HOROVOD_TEST=/path/to/horovod/test/parallel/test_torch.py"; exit 2; }
	@$(MAKE) --no-print-directory configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target pushpull pushpull_python
	/usr/bin/python3 scripts/horovod_suite.py "$(HOROVOD_TEST)" --bin $(BUILD_DIR)/bin/pushpull \
	  --pythonpath $(BUILD_DIR)/python $(HOROVOD_SUITE_FLAGS)

# The chaos suite (docs/reliability.md): 100 randomized fault trials (kill,
# stop or terminate a worker, a server or the launcher mid-training) and the
# summary table. CHAOS_FLAGS: e.g. --seed 7 --engines collective --signals STOP.
CHAOS_TRIALS ?= 100
CHAOS_FLAGS  ?=
chaos: deps
	@$(MAKE) --no-print-directory build
	/usr/bin/python3 tests/chaos/chaos.py --build-dir $(BUILD_DIR) --trials $(CHAOS_TRIALS) $(CHAOS_FLAGS)

# The deterministic simulation of parameter-server recovery (tests/sim/,
# docs/reliability.md): SIM_SEEDS seeds of random fault schedules, each
# checked against the reference values; a failing seed prints its schedule
# (replay: build/bin/ps_sim --seed N). `make test` runs 2000 of them.
SIM_SEEDS ?= 10000
simulate: deps
	@$(MAKE) --no-print-directory build
	$(BUILD_DIR)/bin/ps_sim --seeds $(SIM_SEEDS)

# The control plane at scale (tests/sim/scale_sim.h, docs/scaling.md "The
# control plane at 1,024 and 4,096 ranks"): PS and collectives (full mesh and
# the sparse topology) on a simulated network, 100 us per message; prints the
# table. `make test` runs a 256-rank sample (scale_sim_test). Fails when the
# topologies pushpull runs (ps, sparse) do not start up or detect the fault;
# the full mesh, for comparison, only at 1,024 ranks (at 4,096 it does not
# start up: `scale_sim --ranks 4096 --engines full` shows how far it gets).
# About 2 minutes.
SCALE_RANKS ?= 1024,4096
simulate-scale: deps
	@$(MAKE) --no-print-directory build
	$(BUILD_DIR)/bin/scale_sim --ranks $(SCALE_RANKS) --engines ps,sparse
	$(BUILD_DIR)/bin/scale_sim --ranks 1024 --engines full

# Survive mode of the chaos suite (docs/reliability.md "Survive mode"): random
# faults (kills, stops and continues, stops for good, faults during a server's
# catch-up, two at once) against PS jobs with the default replicas and
# --max-restarts; every round checked in closed form, recovery times measured.
# SURVIVE_FLAGS: e.g. --seed 7 --json survive.json.
# Then SURVIVE_ELASTIC_TRIALS random elastic trials (tests/chaos/elastic_chaos.py:
# --min-workers jobs that must re-form and finish).
SURVIVE_TRIALS ?= 200
SURVIVE_ELASTIC_TRIALS ?= 20
SURVIVE_FLAGS  ?=
chaos-survive: deps
	@$(MAKE) --no-print-directory build
	/usr/bin/python3 tests/chaos/survive.py --build-dir $(BUILD_DIR) --trials $(SURVIVE_TRIALS) $(SURVIVE_FLAGS)
	/usr/bin/python3 tests/chaos/elastic_chaos.py --build-dir $(BUILD_DIR) --trials $(SURVIVE_ELASTIC_TRIALS)

# libFuzzer targets of every wire decoder (tests/fuzz/) over a clang
# ASan+UBSan build in build-fuzz/, 10^7 executions each (FUZZ_RUNS=N to change;
# FUZZ_SECONDS=S also bounds each target's time).
fuzz: deps
	cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DPUSHPULL_SANITIZE=fuzzer-no-link,address,undefined -DPUSHPULL_FUZZ=ON \
	  -DPUSHPULL_BUILD_TORCH=OFF -DPUSHPULL_BUILD_PYTHON=OFF \
	  -DPUSHPULL_BUILD_BENCHMARKS=OFF
	cmake --build build-fuzz -j $(JOBS) --target fuzz_all
	tests/fuzz/run.sh build-fuzz $${FUZZ_RUNS:-10000000} $(JOBS) $${FUZZ_SECONDS:-0}

demo: deps
	@$(MAKE) --no-print-directory build
	scripts/demo.sh $(BUILD_DIR)

bench: deps
	@$(MAKE) --no-print-directory build
	scripts/bench.sh $(BUILD_DIR)

# The scaling study on network-namespace hosts (docs/scaling.md; needs root,
# about 15 min): the reference setting into bench/results/scaling.csv (the
# full table, with waits, CPU and per-server bytes, in scaling.txt), push+pull
# of 40 MiB over 8 workers and 1/2/4/8 server hosts in ps_netns.csv, figures.
SCALING_FLAGS ?= --netns 8 --rate 500mbit --grad-mb 5 --layers 16 --compute-ms 400 --repeats 3
scaling: deps
	@$(MAKE) --no-print-directory build
	PUSHPULL_LOG_LEVEL=warning $(BUILD_DIR)/bin/pushpull bench scaling $(SCALING_FLAGS) --format csv \
	  > bench/results/scaling.csv 2> bench/results/scaling.txt
	PUSHPULL_LOG_LEVEL=warning $(BUILD_DIR)/bin/pushpull bench ps --netns 4 -s 4 --rate 1gbit \
	  --sizes 40M --repeats 3 > bench/results/ps_netns.txt
	PUSHPULL_LOG_LEVEL=warning $(BUILD_DIR)/bin/pushpull bench ps --netns 8 --rate 250mbit \
	  --sizes 10M --iters 3 >> bench/results/ps_netns.txt
	/usr/bin/python3 scripts/plot.py --out docs/img bench/results/scaling.csv

# The .deb of `cmake --install` (CPack): $(BUILD_DIR)/package/pushpull_<version>_<arch>.deb.
package: build
	cmake --build $(BUILD_DIR) --target package

# docs/img/*.png from the benchmark CSVs checked in under bench/results/
# (docs/performance.md shows them; regenerate the CSVs with the commands there).
plots: deps
	/usr/bin/python3 scripts/plot.py --out docs/img bench/results/*.csv

format:
	git ls-files '*.h' '*.cpp' '*.cc' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) build-asan
