# CUDA backend (backends/dpar_cuda.h), included by the Makefile.
#   CUDA=0|1    compile the backend in (default 0). Nothing is linked: the driver
#               (libcuda.so.1), cuBLAS and NCCL are dlopen'ed at run time, so a
#               CUDA=1 binary starts anywhere and, without a GPU, reports the
#               backend unavailable. No CUDA header is needed to build.
#   CUDA_HOME   CUDA toolkit (default /usr/local/cuda): nvcc, and the headers
#               that check-cuda-abi compares the backend's declarations with.
#   NVCC        nvcc that regenerates backends/dpar_cuda_kernels.h from
#               kernels/*.cu (default $(CUDA_HOME)/bin/nvcc, else nvcc on PATH);
#               without it the committed header is used.
#   CUDA_ARCH   virtual architecture of the embedded PTX (default compute_75).
#   make CUDA=1 cuda-kernels    regenerate the embedded PTX header
#   make CUDA=1 check-ptx       regenerate into a temporary file, fail on any difference
#   make CUDA=1 check-cuda-abi  the hand-declared driver/cuBLAS/NCCL constants
#                               against the real headers (part of `all` with CUDA=1)

CUDA      ?= 0
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA_ARCH ?= compute_75
CU_KERNELS := $(sort $(wildcard kernels/*.cu))
CU_PTX_H   := backends/dpar_cuda_kernels.h

ifeq ($(CUDA),1)
IMPL_DEFS += -DDPAR_CUDA
IMPL_DEPS += backends/dpar_cuda.h $(CU_PTX_H)
ifneq ($(wildcard $(CUDA_HOME)/include/cuda.h),)
all: check-cuda-abi
endif
endif

ifneq ($(NVCC),)
$(CU_PTX_H): $(CU_KERNELS) $(wildcard kernels/*.cuh) tools/embed_ptx.py
	python3 tools/embed_ptx.py --nvcc $(NVCC) --arch $(CUDA_ARCH) -o $@ $(CU_KERNELS)
endif

.PHONY: cuda-kernels check-ptx check-cuda-abi
cuda-kernels:
	@test -n "$(NVCC)" || { echo "cuda-kernels: nvcc not found (set CUDA_HOME or NVCC)"; exit 1; }
	python3 tools/embed_ptx.py --nvcc $(NVCC) --arch $(CUDA_ARCH) -o $(CU_PTX_H) $(CU_KERNELS)

check-ptx:
	@test -n "$(NVCC)" || { echo "check-ptx: nvcc not found (set CUDA_HOME or NVCC)"; exit 1; }
	@tmp=$$(mktemp) && \
	python3 tools/embed_ptx.py --nvcc $(NVCC) --arch $(CUDA_ARCH) -o $$tmp $(CU_KERNELS) && \
	if cmp -s $$tmp $(CU_PTX_H); then echo "check-ptx: $(CU_PTX_H) is up to date"; rm -f $$tmp; \
	else diff -u $(CU_PTX_H) $$tmp | head -20; rm -f $$tmp; \
	     echo "check-ptx: $(CU_PTX_H) is stale (or made by another nvcc: $$($(NVCC) --version | tail -1)): run 'make CUDA=1 cuda-kernels' and commit it"; exit 1; fi

check-cuda-abi: backends/dpar_cuda.h $(CU_PTX_H) dpar.h tools/cuda_abi_check.c
	$(CC) $(CSTD) $(CPPFLAGS) -isystem $(CUDA_HOME)/include $(WARN) -fsyntax-only tools/cuda_abi_check.c
	@echo "check-cuda-abi: backends/dpar_cuda.h matches the CUDA, cuBLAS and NCCL headers in $(CUDA_HOME)/include"

# Rebuild the implementation object when the backend switches or flags change
# (make CUDA=1 after make CUDA=0 would otherwise reuse a stale build/dpar.o).
IMPL_STAMP := $(BUILD)/.impl-flags
IMPL_DEPS += $(IMPL_STAMP)
.PHONY: dpar-force-stamp
dpar-force-stamp:
$(IMPL_STAMP): dpar-force-stamp | $(BUILD)
	@echo '$(CC) $(CSTD) $(CPPFLAGS) $(IMPL_DEFS) $(CFLAGS)' | cmp -s - $@ || echo '$(CC) $(CSTD) $(CPPFLAGS) $(IMPL_DEFS) $(CFLAGS)' > $@
