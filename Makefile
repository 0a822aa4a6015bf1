# SPDX-License-Identifier: BSL-1.0
# The front door. On a fresh Debian machine:
#   make demo    build and run the flagship example (installs missing packages)
#   make test    the whole suite, with g++ and with clang++
#   make asan    the whole suite under AddressSanitizer + UndefinedBehaviorSanitizer (g++:
#                clang 14 cannot emit debug info for coroutines under the sanitizers;
#                -Wmaybe-uninitialized gives false positives in Asio/Catch2 there)
#   make test-boost  the whole suite on Boost.Asio (SLUICE_USE_BOOST_ASIO, g++)
#   make bench   the benchmarks, each beside its baselines (Release), and the report:
#                build/bench/report.json, tables.md, makespan.{png,svg}, ns_per_task.{png,svg}
#   make bench-boost  the same, plus the Asio-version-dependent peers on Boost.Asio
#   make bench-docs  bench-boost, then copies the plots to docs/ and regenerates the
#                README's tables (the block between <!-- bench:begin/end -->)
#   make docs    the API reference (Doxygen) under build/docs/html; fails on any warning

JOBS     ?= $(shell nproc 2>/dev/null || echo 2)
GENERATOR = $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")
PACKAGES  = cmake make g++ clang libasio-dev catch2 libbenchmark-dev python3 ninja-build libboost1.81-dev doxygen python3-matplotlib
PYTHON   ?= $(shell [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)
SUDO      = $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ASAN_FLAGS = -O1 -g -Wno-maybe-uninitialized -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
CTEST     = ctest --output-on-failure -j$(JOBS) --timeout 600

.PHONY: deps demo test test-gcc test-clang test-boost asan bench bench-docs bench-boost docs clean

deps:
	@missing=$$(for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing missing packages:" $$missing; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi


define configure
	cmake -S . -B build/$(1) -G "$(GENERATOR)" -DCMAKE_CXX_COMPILER=$(2) $(3) >/dev/null
endef

demo: deps
	$(call configure,release,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCHMARKS=OFF)
	cmake --build build/release -j$(JOBS) --target amenity_discovery
	./build/release/examples/amenity_discovery

test: deps test-gcc test-clang

test-gcc:
	$(call configure,gcc,g++,-DCMAKE_BUILD_TYPE=Debug -DSLUICE_BUILD_BENCHMARKS=OFF)
	cmake --build build/gcc -j$(JOBS)
	cd build/gcc && $(CTEST)

test-clang:
	$(call configure,clang,clang++,-DCMAKE_BUILD_TYPE=Debug -DSLUICE_BUILD_BENCHMARKS=OFF)
	cmake --build build/clang -j$(JOBS)
	cd build/clang && $(CTEST)

test-boost: deps
	$(call configure,boost,g++,-DCMAKE_BUILD_TYPE=Debug -DSLUICE_BUILD_BENCHMARKS=OFF -DSLUICE_USE_BOOST_ASIO=ON)
	cmake --build build/boost -j$(JOBS)
	cd build/boost && $(CTEST)

asan: deps
	$(call configure,asan,g++,-DCMAKE_BUILD_TYPE=Debug -DSLUICE_BUILD_BENCHMARKS=OFF -DSLUICE_SKIP_PACKAGING_TESTS=ON "-DCMAKE_CXX_FLAGS=$(ASAN_FLAGS)")
	cmake --build build/asan -j$(JOBS)
	cd build/asan && ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1 UBSAN_OPTIONS=print_stacktrace=1 $(CTEST)

bench: deps
	$(call configure,bench,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_EXAMPLES=OFF)
	cmake --build build/bench -j$(JOBS)
	$(PYTHON) benchmarks/report.py --build build/bench --out build/bench $(BENCH_ARGS)

bench-docs:
	$(MAKE) bench-boost BENCH_ARGS="--docs docs --readme README.md"

bench-boost: deps
	$(call configure,bench-boost,g++,-DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_EXAMPLES=OFF -DSLUICE_USE_BOOST_ASIO=ON)
	cmake --build build/bench-boost -j$(JOBS) --target gather_bench primitives_bench
	$(MAKE) bench BENCH_ARGS="--boost-build build/bench-boost $(BENCH_ARGS)"

docs: deps
	@mkdir -p build
	doxygen docs/Doxyfile

clean:
	rm -rf build
