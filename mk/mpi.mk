# Multi-process support (DPAR_MPI), included by the Makefile.
#   MPICC=mpicc   the MPI compiler wrapper (Open MPI or MPICH)
# The MPI programs are built into $(BUILD)/mpi_* from tests/mpi/*.c and run by
# tests/test_mpi.sh under mpirun; they are not part of `make all` when no
# mpicc exists (then tests/test_mpi.sh fails: MPI is required in CI).
MPICC ?= mpicc
MPI_SRCS := $(wildcard tests/mpi/*.c)
MPI_BINS := $(patsubst tests/mpi/%.c,$(BUILD)/mpi_%,$(MPI_SRCS)) $(BUILD)/train_digits_mpi
HAVE_MPICC := $(shell command -v $(MPICC) 2>/dev/null)

$(BUILD)/dpar_mpi.o: $(IMPL_DEPS) backends/dpar_mpi.h | $(BUILD)
	$(MPICC) $(CSTD) $(CPPFLAGS) $(IMPL_DEFS) -DDPAR_MPI $(CFLAGS) $(WARN) -c tools/dpar_impl.c -o $@

$(BUILD)/mpi_%: tests/mpi/%.c $(BUILD)/dpar_mpi.o
	$(MPICC) $(CSTD) $(CPPFLAGS) $(IMPL_DEFS) -DDPAR_MPI $(CFLAGS) $(WARN) $< $(BUILD)/dpar_mpi.o -o $@ $(LDFLAGS) $(IMPL_LIBS) $(LDLIBS)

$(BUILD)/train_digits_mpi: examples/train_digits.c examples/digits_common.h $(BUILD)/dpar_mpi.o
	$(MPICC) $(CSTD) $(CPPFLAGS) $(IMPL_DEFS) -DDPAR_MPI $(CFLAGS) $(WARN) $< $(BUILD)/dpar_mpi.o -o $@ $(LDFLAGS) $(IMPL_LIBS) -lz $(LDLIBS)

.PHONY: mpi
mpi: $(MPI_BINS)

# benchmarks that need MPI: bench/mpi/*.c -> $(BUILD)/mpibench_*
MPI_BENCH_SRCS := $(wildcard bench/mpi/*.c)
MPI_BENCHES := $(patsubst bench/mpi/%.c,$(BUILD)/mpibench_%,$(MPI_BENCH_SRCS))
$(BUILD)/mpibench_%: bench/mpi/%.c $(BUILD)/dpar_mpi.o
	$(MPICC) $(CSTD) $(CPPFLAGS) $(IMPL_DEFS) -DDPAR_MPI $(CFLAGS) $(WARN) $< $(BUILD)/dpar_mpi.o -o $@ $(LDFLAGS) $(IMPL_LIBS) $(LDLIBS)
mpi: $(MPI_BENCHES)
