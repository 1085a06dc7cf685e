# loom: the two commands. `make demo` and `make test` install what is needed, build, then run.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
# Tests run one more at a time than there are cores: many of them wait on sockets, timeouts and
# child processes (under -j 2 the suite used 1.4 of 2 cores); PROCESSORS and RUN_SERIAL still
# keep the rank-heavy and timing tests apart (docs/TESTING.md).
TEST_JOBS ?= $(shell expr $$(nproc) + 1)
CTEST_ARGS ?=

.PHONY: deps configure build test test-all check demo bench clean

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)
	@echo "[build] CLI at $(BUILD_DIR)/bin/loom"

# Every test but those labelled `peer` (they install llama.cpp, a numpy reference or the openai
# client into venvs: minutes, and the package index) and `long` (minutes of training a real
# model); `make test-all` (CI) runs those too. Labels: docs/TESTING.md.
test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(TEST_JOBS) -LE "peer|long" $(CTEST_ARGS)

test-all: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(TEST_JOBS) $(CTEST_ARGS)

# Sanitizer builds (ASan+UBSan, TSan) of the suites and the fuzz targets: scripts/check.sh.
check: deps
	@bash scripts/check.sh

demo: build
	@bash scripts/demo.sh

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fuzz
