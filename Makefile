# SPDX-License-Identifier: BSL-1.0
# The front door. On a fresh Debian machine:
#   make demo    build and run the flagship example (installs missing packages)
#   make test    the whole suite in two builds that between them cover both compilers, both
#                Asio backends and the sanitizers: g++ on standalone Asio 1.22 under
#                AddressSanitizer + UndefinedBehaviorSanitizer (test-gcc), clang++ on
#                Boost.Asio 1.81 (test-clang; without debug info: clang++ compiles 20% faster,
#                and Catch2 names the file and line of a failure anyway). What CI runs, with
#                make tsan and make fuzz-ci.
#   make asan    the same as make test-gcc (g++: clang 14 cannot emit debug info for
#                coroutines under the sanitizers; -Wmaybe-uninitialized gives false
#                positives in Asio/Catch2 there)
#   make test-plain   the whole suite with g++ on standalone Asio, no sanitizer (quickest)
#   make test-clang-asio  the whole suite with clang++ on standalone Asio
#   make test-boost  the whole suite with g++ on Boost.Asio (SLUICE_USE_BOOST_ASIO)
#   make tsan    the tests that cross threads under ThreadSanitizer (g++)
#   make bench   the benchmarks, each beside its baselines (Release), and the report:
#                build/bench/report.json, tables.md, makespan.{png,svg}, ns_per_task.{png,svg}
#   make bench-boost  the same, plus the Asio-version-dependent peers on Boost.Asio
#   make bench-docs  bench-boost, then copies the plots to docs/ and regenerates the
#                tables of docs/performance.md (the block between <!-- bench:begin/end -->)
#                and the README's headline (<!-- bench-headline:begin/end -->)
#   make bench-peers  sluice beside Go, tokio, asyncio and Trio on the same workloads
#                (benchmarks/peers.py; installs PEER_PACKAGES, builds the Go and Rust peers
#                offline): build/bench/peers.json, the blocks between <!-- bench-peers:begin/end -->
#                of docs/performance.md and README.md, and report.json + the ns/task plot rebuilt from every
#                JSON in build/bench (`make bench-docs` afterwards puts the plot in docs/).
#                Not in CI (it installs toolchains).
#   make compile-bench  what sluice costs at every compile: benchmarks/compile/'s TUs with g++ and
#                clang++ at -O0 and -O2, CPU-time medians of 3, as ratios to the Asio-only TUs
#                (benchmarks/compile_bench.py; COMPILE_BENCH_ARGS=--check fails on a missed target)
#   make adaptive-docs  the adaptive_limit table and plot (examples/adaptive_limits, virtual
#                time, exact): build/adaptive/table.md, docs/adaptive_limit.{png,svg}
#   make fanout-docs  the noisy-tenant and per-host crawl tables in docs/fanout.md (examples
#                noisy_tenant and crawler --hosts, virtual time, exact)
#   make policy-docs  the hedging and overload tables of docs/provider-limits.md "Call policies"
#                and the plot docs/hedging.{png,svg} (examples/call_policies, virtual time, exact)
#   make docs    README.md, docs/*.md and the API reference (Doxygen) as one site under
#                build/docs/html; fails on any warning or on a broken link (tests/docs/check_docs.py)
#   make fleet-demo  4 client processes sharing one sluice::redis::semaphore{5} on a private redis-server, then an LLM account (redis::acquire_all)
#                (FLEET_ARGS=--cluster: on a private 3-node Redis Cluster, resharded mid-run;
#                FLEET_ARGS=--sentinel: through Redis Sentinel, the primary SIGKILLed mid-run)
#   make fuzz    each libFuzzer target in tests/fuzz for FUZZ_SECONDS (default 60; clang)
#   make fuzz-ci replay the fuzz corpus, then fuzz each target for FUZZ_CI_SECONDS (10)

JOBS     ?= $(shell nproc 2>/dev/null || echo 2)
GENERATOR = $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")
PACKAGES  = cmake make g++ clang libasio-dev catch2 libbenchmark-dev python3 ninja-build libboost1.81-dev doxygen redis-server libhiredis-dev libssl-dev openssl redis-sentinel pkg-config python3-matplotlib wrk curl
# The peers of `make bench-peers` only (not CI's): Go + x/sync, Rust + tokio + futures, Trio.
PEER_PACKAGES = golang-go golang-golang-x-sync-dev cargo librust-tokio-dev librust-futures-dev python3-trio
PYTHON   ?= $(shell [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)
SUDO      = $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# UBSan without its null, alignment and vptr checks: ASan already stops at a
# null dereference and at a use of a freed object, sluice casts no buffers, and
# the three checks instrument every pointer access and member call (g++ -O0, one
# test: 49 s with all of UBSan, 43 s without vptr, 34.5 s without null and
# alignment; the rest of UBSan stays: integers, shifts, bounds, enums, returns).
ASAN_FLAGS = -O0 -g1 -Wno-maybe-uninitialized -fsanitize=address,undefined -fno-sanitize=null,alignment,vptr -fno-sanitize-recover=all -fno-omit-frame-pointer
ASAN_ENV   = ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1 UBSAN_OPTIONS=print_stacktrace=1
CTEST     = ctest --output-on-failure -j$(JOBS) --timeout 600
# TSan at -O0: every access instrumented as at -O1, 20% less compile (make tsan
# from a clean clone: 270 s against 339 s; the runs 30 s against 8 s).
TSAN_FLAGS = -O0 -g1 -Wno-maybe-uninitialized -Wno-tsan -fsanitize=thread -fno-omit-frame-pointer
# Every test that starts a thread (ThreadSanitizer sees nothing in a test that has one).
TSAN_TESTS = to_thread shared_semaphore affinity strand_bound strand_bound_review acquire_all stats keyed_semaphore rate_limiter asyncio_guide docs_snippets policy redis_acquire_all fair_limit

.PHONY: bench-peers compile-bench deps demo fleet-demo test test-gcc test-clang test-plain test-clang-asio test-boost asan tsan bench bench-docs bench-boost adaptive-docs fanout-docs policy-docs docs fuzz fuzz-ci fuzz-build clean

deps:
	@missing=$$(for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing missing packages:" $$missing; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi


# Debug builds keep line tables only (-g1): full DWARF for these coroutine-heavy
# tests triples assembly time; stack traces still name files and lines.
define configure
	cmake -S . -B build/$(1) -G "$(GENERATOR)" -DCMAKE_CXX_COMPILER=$(2) -DCMAKE_CXX_FLAGS_DEBUG=-g1 $(3) >/dev/null
endef

demo: deps
	$(call configure,release,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCHMARKS=OFF)
	cmake --build build/release -j$(JOBS) --target amenity_discovery
	./build/release/examples/amenity_discovery

fleet-demo: deps
	$(call configure,release,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCHMARKS=OFF)
	cmake --build build/release -j$(JOBS) --target fleet
	./build/release/examples/fleet $(FLEET_ARGS)

test: deps test-gcc test-clang

# The examples and the packaging tests are built and run by test-clang; here
# they would be compiled a second time under the sanitizers (their logic is in
# examples/support/, which the tests compile here).
test-gcc asan: deps
	$(call configure,gcc,g++,-DCMAKE_BUILD_TYPE=Debug -DSLUICE_BUILD_BENCHMARKS=OFF -DSLUICE_BUILD_EXAMPLES=OFF -DSLUICE_SKIP_PACKAGING_TESTS=ON "-DCMAKE_CXX_FLAGS=$(ASAN_FLAGS)")
	cmake --build build/gcc -j$(JOBS)
	cd build/gcc && $(ASAN_ENV) $(CTEST)

test-clang: deps
	$(call configure,clang,clang++,-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g0 -DSLUICE_BUILD_BENCHMARKS=OFF -DSLUICE_USE_BOOST_ASIO=ON -DSLUICE_HEADER_CHECKS=OFF)
	cmake --build build/clang -j$(JOBS)
	cd build/clang && $(CTEST)

test-plain: deps
	$(call configure,plain,g++,-DCMAKE_BUILD_TYPE=Debug -DSLUICE_BUILD_BENCHMARKS=OFF)
	cmake --build build/plain -j$(JOBS)
	cd build/plain && $(CTEST)

test-clang-asio: deps
	$(call configure,clang-asio,clang++,-DCMAKE_BUILD_TYPE=Debug -DSLUICE_BUILD_BENCHMARKS=OFF)
	cmake --build build/clang-asio -j$(JOBS)
	cd build/clang-asio && $(CTEST)

test-boost: deps
	$(call configure,boost,g++,-DCMAKE_BUILD_TYPE=Debug -DSLUICE_BUILD_BENCHMARKS=OFF -DSLUICE_USE_BOOST_ASIO=ON -DSLUICE_HEADER_CHECKS=OFF)
	cmake --build build/boost -j$(JOBS)
	cd build/boost && $(CTEST)

tsan: deps
	$(call configure,tsan,g++,-DCMAKE_BUILD_TYPE=Debug -DSLUICE_BUILD_BENCHMARKS=OFF -DSLUICE_BUILD_EXAMPLES=OFF -DSLUICE_SKIP_PACKAGING_TESTS=ON "-DCMAKE_CXX_FLAGS=$(TSAN_FLAGS)")
	cmake --build build/tsan -j$(JOBS) --target $(addsuffix _test,$(TSAN_TESTS))
	cd build/tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/support/tsan.supp" $(CTEST) -R '^($(shell echo $(TSAN_TESTS) | tr ' ' '|'))_test$$'

bench: deps
	$(call configure,bench,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_EXAMPLES=OFF)
	cmake --build build/bench -j$(JOBS)
	$(PYTHON) benchmarks/report.py --build build/bench --out build/bench $(BENCH_ARGS)

bench-docs:
	$(MAKE) bench-boost BENCH_ARGS="--docs docs --page docs/performance.md --readme README.md"

bench-peers: deps
	@$(MAKE) --no-print-directory deps PACKAGES="$(PEER_PACKAGES)"
	$(call configure,bench,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_EXAMPLES=OFF)
	cmake --build build/bench -j$(JOBS) --target sluice_peer
	$(call configure,bench-boost,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_EXAMPLES=OFF -DSLUICE_USE_BOOST_ASIO=ON)
	cmake --build build/bench-boost -j$(JOBS) --target sluice_peer
	$(PYTHON) benchmarks/peers.py --build build/bench --boost-build build/bench-boost --out build/bench --page docs/performance.md --readme README.md $(PEERS_ARGS)
	$(PYTHON) benchmarks/report.py --no-run --out build/bench >/dev/null

compile-bench: deps
	$(PYTHON) benchmarks/compile_bench.py $(COMPILE_BENCH_ARGS)

adaptive-docs: deps
	$(call configure,adaptive,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCHMARKS=OFF)
	cmake --build build/adaptive -j$(JOBS) --target adaptive_limits
	build/adaptive/examples/adaptive_limits --csv build/adaptive/limits.csv | tee build/adaptive/table.md
	$(PYTHON) examples/adaptive_limits_plot.py build/adaptive/limits.csv docs/adaptive_limit

# Replaces what PAGE holds between <!-- begin NAME --> and <!-- end NAME --> by FILE:
# $(call splice_doc,PAGE,NAME,FILE).
define splice_doc
	awk -v f=$(3) 'index($$0, "<!-- begin $(2) -->") { print; while ((getline l < f) > 0) print l; skip = 1; next } \
	  index($$0, "<!-- end $(2) -->") { skip = 0 } !skip' $(1) >$(1).new && mv $(1).new $(1)
endef
define splice_fanout
	$(call splice_doc,docs/fanout.md,$(1),$(2))
endef

fanout-docs: deps
	$(call configure,fanout,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCHMARKS=OFF)
	cmake --build build/fanout -j$(JOBS) --target noisy_tenant crawler
	build/fanout/examples/noisy_tenant | tee build/fanout/noisy_tenant.md
	(echo '```text'; build/fanout/examples/crawler --hosts | tail -n +2; echo '```') | tee build/fanout/crawler.md
	$(call splice_fanout,noisy_tenant,build/fanout/noisy_tenant.md)
	$(call splice_fanout,crawler,build/fanout/crawler.md)

policy-docs: deps
	$(call configure,policy,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCHMARKS=OFF)
	cmake --build build/policy -j$(JOBS) --target call_policies
	build/policy/examples/call_policies --table hedge --csv build/policy/latency.csv | tee build/policy/hedge.md
	build/policy/examples/call_policies --table overload | tee build/policy/overload.md
	$(PYTHON) examples/call_policies_plot.py build/policy/latency.csv docs/hedging
	$(call splice_doc,docs/provider-limits.md,hedge,build/policy/hedge.md)
	$(call splice_doc,docs/provider-limits.md,overload,build/policy/overload.md)

bench-boost: deps
	$(call configure,bench-boost,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_EXAMPLES=OFF -DSLUICE_USE_BOOST_ASIO=ON)
	cmake --build build/bench-boost -j$(JOBS) --target gather_bench primitives_bench
	$(MAKE) bench BENCH_ARGS="--boost-build build/bench-boost $(BENCH_ARGS)"

FUZZ_SECONDS    ?= 60
FUZZ_CI_SECONDS ?= 10
FUZZ_TARGETS = $(patsubst tests/fuzz/%_fuzz.cpp,%,$(wildcard tests/fuzz/*_fuzz.cpp))

fuzz-build: deps
	$(call configure,fuzz,clang++,-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_BUILD_FUZZERS=ON -DSLUICE_BUILD_EXAMPLES=OFF -DSLUICE_BUILD_BENCHMARKS=OFF -DSLUICE_SKIP_PACKAGING_TESTS=ON)
	cmake --build build/fuzz -j$(JOBS) --target $(addsuffix _fuzz,$(FUZZ_TARGETS))

# New inputs go to build/fuzz/corpus/<target>; a crash lands in the repo's
# tests/fuzz/corpus/<target>/ (keep it: ctest replays it as a regression).
define run_fuzzers
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build/fuzz/corpus/$$t; \
	  ./build/fuzz/tests/fuzz/$${t}_fuzz build/fuzz/corpus/$$t tests/fuzz/corpus/$$t \
	    -max_total_time=$(1) -print_final_stats=1 -artifact_prefix=tests/fuzz/corpus/$$t/crash- \
	    >build/fuzz/$$t.log 2>&1 || { tail -30 build/fuzz/$$t.log; exit 1; }; \
	  printf '%-10s %10s execs in %ss, %6s execs/s\n' $$t \
	    $$(sed -n 's/^stat::number_of_executed_units: *//p' build/fuzz/$$t.log) $(1) \
	    $$(sed -n 's/^stat::average_exec_per_sec: *//p' build/fuzz/$$t.log); \
	done
endef

fuzz: fuzz-build
	$(call run_fuzzers,$(FUZZ_SECONDS))

fuzz-ci: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	  ./build/fuzz/tests/fuzz/$${t}_fuzz -runs=0 tests/fuzz/corpus/$$t >build/fuzz/$$t.log 2>&1 \
	    || { tail -30 build/fuzz/$$t.log; exit 1; }; \
	  echo "$$t: corpus replayed ($$(ls tests/fuzz/corpus/$$t | wc -l) inputs)"; \
	done
	$(call run_fuzzers,$(FUZZ_CI_SECONDS))

docs: deps
	$(PYTHON) tests/docs/check_docs.py
	@mkdir -p build
	doxygen docs/Doxyfile

clean:
	rm -rf build
