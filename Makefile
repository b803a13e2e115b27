# dpar.h build. `make` builds everything, `make run` trains the seed CNN on MNIST,
# `make test` runs the suite. Binaries go to build/.
#   VULKAN=0|1   Vulkan backend (default: 1 when the Vulkan headers exist)
#   CUDA=0|1     CUDA backend (default 0; needs nvcc, cuBLAS and NCCL headers)
#   SAN=address|thread   build everything with a sanitizer (into build-$(SAN)/)
#   JOBS=N       parallel jobs of `make test`'s build (default: one per core, or the caller's -j)
.DEFAULT_GOAL := all   # included mk/*.mk files define rules before `all`
CC      ?= cc
CSTD    ?= -std=c99
CXXSTD  ?= -std=c++17
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN     = -Wall -Wextra -Wshadow -Wconversion -Wpedantic -Werror -Wno-error=deprecated-declarations
CPPFLAGS = -I. -D_GNU_SOURCE
LDLIBS   = -lpthread -lm -ldl
ifeq ($(SAN),)
BUILD   ?= build
else
BUILD   ?= build-$(SAN)
ifeq ($(SAN),address)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=address,undefined
else
CFLAGS  += -fsanitize=$(SAN) -fno-omit-frame-pointer
LDFLAGS += -fsanitize=$(SAN)
endif
endif
ARGS    ?=
# `make test` builds its many binaries with one job per core unless the caller chose -j
# (JOBS=1 for a serial build): the README's command should not take twice as long on 2 cores.
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
PAR      = $(if $(findstring -j,$(MAKEFLAGS)),,-j$(JOBS))

IMPL_DEFS :=
IMPL_DEPS := dpar.h util/dpar_train.h tools/dpar_impl.c
IMPL_LIBS :=
TEST_LIBS := -lcmocka

include mk/vulkan.mk
include mk/cuda.mk
include mk/mpi.mk
include mk/install.mk

TEST_SRCS    := $(wildcard tests/test_*.c)
EXAMPLE_SRCS := $(wildcard examples/*.c)
# bench_mpi_allreduce.c is the MPI peer: bench/run.sh builds it with mpicc
BENCH_SRCS   := $(filter-out bench/bench_mpi_allreduce.c,$(wildcard bench/*.c))
TESTS    := $(patsubst tests/%.c,$(BUILD)/%,$(TEST_SRCS))
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/%,$(EXAMPLE_SRCS)) $(BUILD)/cpp_example
ifeq ($(VULKAN),1)
EXAMPLES += $(BUILD)/engine_vulkan
endif
BENCHES  := $(patsubst bench/%.c,$(BUILD)/%,$(BENCH_SRCS))

.PHONY: all run run-gpt run-digits test test-build examples bench clean check-cxx check-macos deps-run deps-test \
	amalgamate format check-format fuzz
all: $(EXAMPLES) $(TESTS) $(BENCHES) $(if $(HAVE_MPICC),$(MPI_BINS) $(MPI_BENCHES))
examples: $(EXAMPLES)

$(BUILD)/dpar.o: $(IMPL_DEPS) | $(BUILD)
	$(CC) $(CSTD) $(CPPFLAGS) $(IMPL_DEFS) $(CFLAGS) $(WARN) -c tools/dpar_impl.c -o $@

$(BUILD)/test_%: tests/test_%.c tests/testutil.h util/dpar_train.h $(BUILD)/dpar.o
	$(CC) $(CSTD) $(CPPFLAGS) $(IMPL_DEFS) $(CFLAGS) $(WARN) $< $(BUILD)/dpar.o -o $@ $(LDFLAGS) $(TEST_LIBS) $(IMPL_LIBS) $(LDLIBS)

# test_alloc holds its own implementation (CPU backend) with counting DPAR_MALLOC hooks
$(BUILD)/test_alloc: tests/test_alloc.c tests/testutil.h dpar.h | $(BUILD)
	$(CC) $(CSTD) $(CPPFLAGS) $(CFLAGS) $(WARN) $< -o $@ $(LDFLAGS) $(TEST_LIBS) $(LDLIBS)
# test_exp calls the private exp paths (>>cpu exp), so it holds its own implementation too
$(BUILD)/test_exp: tests/test_exp.c tests/testutil.h dpar.h | $(BUILD)
	$(CC) $(CSTD) $(CPPFLAGS) $(CFLAGS) $(WARN) $< -o $@ $(LDFLAGS) $(TEST_LIBS) $(LDLIBS)

$(BUILD)/%: examples/%.c $(wildcard examples/*.h) util/dpar_train.h $(BUILD)/dpar.o
	$(CC) $(CSTD) $(CPPFLAGS) $(IMPL_DEFS) $(CFLAGS) $(WARN) $< $(BUILD)/dpar.o -o $@ $(LDFLAGS) $(IMPL_LIBS) -lz $(LDLIBS)

# The C++17 example: how a C++ program fills descs (see its header comment).
$(BUILD)/cpp_example: examples/cpp_example.cpp $(BUILD)/dpar.o
	$(CXX) $(CXXSTD) $(CPPFLAGS) $(IMPL_DEFS) $(CFLAGS) $(WARN) $< $(BUILD)/dpar.o -o $@ $(LDFLAGS) $(IMPL_LIBS) $(LDLIBS)

# An engine that owns its Vulkan device (VULKAN=1 builds): it links the Vulkan loader, as engines do.
$(BUILD)/engine_vulkan: examples/engine_vulkan.cpp examples/example_util.h examples/flags.h $(BUILD)/dpar.o
	$(CXX) $(CXXSTD) $(CPPFLAGS) $(IMPL_DEFS) $(CFLAGS) $(WARN) $< $(BUILD)/dpar.o -o $@ $(LDFLAGS) $(IMPL_LIBS) -lvulkan -lz $(LDLIBS)

$(BUILD)/%: bench/%.c bench/bench_util.h examples/flags.h util/dpar_train.h $(BUILD)/dpar.o
	$(CC) $(CSTD) $(CPPFLAGS) $(IMPL_DEFS) $(CFLAGS) $(WARN) $< $(BUILD)/dpar.o -o $@ $(LDFLAGS) $(IMPL_LIBS) -lz $(LDLIBS)

$(BUILD):
	mkdir -p $(BUILD)

# Installs missing Debian packages (compiler, zlib; for tests cmocka, Vulkan, glslang).
deps-run:
	@sh tools/deps.sh run
deps-test:
	@sh tools/deps.sh test

# The main job: the seed CNN on 5,000 MNIST images, data-parallel on 4
# emulated CPU devices (build/train_cnn; `make run-digits`: the digits MLP).
# The build runs in a sub-make so that what deps-run/deps-test just installed
# (mpicc, the Vulkan headers) is seen: this make parsed the Makefile before.
run: deps-run
	$(MAKE) $(BUILD)/train_cnn
	./$(BUILD)/train_cnn --devices 4 $(ARGS)

# The character-level GPT on tiny Shakespeare, data- and tensor-parallel on a 2x2
# (data, model) mesh of 4 emulated CPU devices (build/train_gpt; minutes).
run-gpt: deps-run
	$(MAKE) $(BUILD)/train_gpt
	./$(BUILD)/train_gpt $(ARGS)

run-digits: deps-run
	$(MAKE) $(BUILD)/train_digits
	./$(BUILD)/train_digits --devices 4 $(ARGS)

# The suite: every test binary, one closing line "N passed, N failed, N skipped".
test: deps-test
	$(MAKE) $(PAR) test-build
	sh tests/run.sh $(BUILD)

test-build: $(TESTS) $(EXAMPLES) $(if $(HAVE_MPICC),$(MPI_BINS)) check-cxx check-macos

# The header must also compile as C++ (and with clang when present).
check-cxx: | $(BUILD)
	$(CXX) -x c++ -std=c++11 $(CPPFLAGS) $(IMPL_DEFS) $(WARN) -DDPAR_IMPLEMENTATION -fsyntax-only dpar.h
	$(CXX) -x c++ -std=c++11 $(CPPFLAGS) $(IMPL_DEFS) $(WARN) -DDPAR_IMPLEMENTATION -fsyntax-only util/dpar_train.h
	if command -v clang >/dev/null 2>&1; then clang -std=c99 -x c $(CPPFLAGS) $(IMPL_DEFS) $(WARN) -DDPAR_IMPLEMENTATION -fsyntax-only dpar.h; fi
	if command -v clang >/dev/null 2>&1; then clang -std=c99 -x c $(CPPFLAGS) $(IMPL_DEFS) $(WARN) -DDPAR_IMPLEMENTATION -fsyntax-only util/dpar_train.h; fi

# macOS's branches of the platform layer (no pthread_condattr_setclock, F_FULLFSYNC, the .dylib
# loader) compiled here on strict POSIX.1-2008/XSI headers, so no GNU-only call slips in. It shows
# that they compile, not that they run: only a Mac can (see README, Platforms).
check-macos:
	$(CC) -std=c99 -D_XOPEN_SOURCE=700 -I. $(IMPL_DEFS) $(WARN) -DDPAR_PLATFORM_FORCE_MACOS \
	    -DDPAR_IMPLEMENTATION -x c -fsyntax-only util/dpar_train.h
	$(CC) -std=c99 -D_XOPEN_SOURCE=700 -I. $(WARN) -DDPAR_PLATFORM_FORCE_MACOS -DDPAR_TRAIN_IMPLEMENTATION \
	    -x c -fsyntax-only util/dpar_train.h

# The single-file distribution: dpar.h with backends/ (SPIR-V and PTX included)
# and util/ inlined, for users who want one file (tests/test_amalgamate.sh
# builds every example against it).
# clang-format (.clang-format: 4 spaces, 120 columns) over every C/C++ source.
format:
	sh tools/format.sh

check-format:
	sh tools/format.sh --check

amalgamate: $(BUILD)/dpar_single.h
$(BUILD)/dpar_single.h: dpar.h $(wildcard backends/*.h util/*.h) tools/amalgamate.py | $(BUILD)
	python3 tools/amalgamate.py -o $@

bench: $(BENCHES) $(BUILD)/train_gpt $(BUILD)/train_cnn
	sh bench/run.sh $(BUILD)

# libFuzzer harnesses of the parsers of outside input (checkpoint files, axis
# and spec strings, environment variables): clang with ASan + UBSan, each run
# FUZZ_SECONDS on its seed corpus tests/fuzz/corpus/<name>/ (CPU backend only).
FUZZ_SECONDS ?= 60
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_CFLAGS = -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c dpar.h util/dpar_train.h
	@mkdir -p build-fuzz
	clang $(FUZZ_CFLAGS) $(CPPFLAGS) $(WARN) $< -o $@ $(LDLIBS)
fuzz: $(patsubst %,build-fuzz/fuzz_%,$(FUZZ_NAMES))
	sh tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_NAMES)

clean:
	rm -rf build build-address build-thread build-fuzz
