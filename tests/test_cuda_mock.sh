#!/bin/sh
# Runs the CUDA backend's host code without a GPU: tests/cuda_mock/mock_cuda.cc
# stands in for libcuda.so.1, libcublas.so.13 and libnccl.so.2 (host memory;
# the real kernels compiled for the host), loaded through LD_LIBRARY_PATH.
# Checks: test_cuda on virtual devices (1 mock GPU) and through the NCCL path
# (4 mock GPUs), with asynchronous streams and random delays (so missing
# stream/event waits show up), the "no device" error text, a hung NCCL
# collective turning into DPAR_ERR_TIMEOUT / an asynchronous NCCL error, the
# mock's NCCL communicators spanning processes (tests/cuda_mock/xproc.c), the
# driver calls of a steady recorded training step (tests/cuda_mock/step_calls.c),
# dpar_k_cast at every start offset (tests/cuda_mock/cast_offsets.c), and the
# digits training on 4 devices matching the CPU backend. The PTX itself,
# real NCCL and timing are NOT exercised: that needs a GPU (scripts/gpu-check.sh).
# Prints PASS / FAIL / SKIPPED lines for tests/run.sh. Needs a CUDA=1 build.
BUILD=${BUILD:-build}
CXX=${CXX:-c++}
if [ ! -x "$BUILD/test_cuda" ] || ! grep -q dpar_k_vreduce "$BUILD/test_cuda" 2>/dev/null; then
    echo "SKIPPED cuda_mock: $BUILD/test_cuda is not a CUDA=1 build (run: make CUDA=1 test)"
    exit 0
fi
if ! command -v "$CXX" >/dev/null 2>&1; then
    echo "SKIPPED cuda_mock: no C++ compiler ($CXX) to build the mock driver"
    exit 0
fi
MOCK=$BUILD/cuda_mock
mkdir -p "$MOCK"
if [ ! -f "$MOCK/libdparmock.so" ] ||
   find tests/cuda_mock/mock_cuda.cc kernels/*.cu kernels/*.cuh -newer "$MOCK/libdparmock.so" | grep -q .; then
    if ! "$CXX" -std=c++17 -O1 -g -fPIC -shared -Wall -Wextra -Werror -o "$MOCK/libdparmock.so" \
            tests/cuda_mock/mock_cuda.cc -lpthread; then
        echo "FAIL cuda_mock: building the mock driver failed"
        exit 0
    fi
fi
for l in libcuda.so.1 libcublas.so.13 libnccl.so.2 libnvidia-ml.so.1; do ln -sf libdparmock.so "$MOCK/$l"; done
log=$(mktemp)
unset DPAR_REQUIRE_BACKENDS DPAR_BACKEND DPAR_DEVICES

# LeakSanitizer cannot see the mock's quarantine of freed device memory;
# device-memory leaks are checked by the mock itself (MOCK_CUDA_REPORT).
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export ASAN_OPTIONS
# run_mock NAME GPUS BIN CHECK DETAIL WHAT: runs $BUILD/BIN (nothing when it was not built) against the
# mock driver on GPUS mock GPU(s), its output in $log; "PASS NAME (DETAIL's output)" when it exits 0 and
# the command CHECK succeeds, else the output and "FAIL NAME: WHAT against the mock driver".
has() { grep -q "$1" "$log"; }
no_leaks() { has '^mock cuda: 0 allocation(s) never freed'; }
run_mock() {
    [ -x "$BUILD/$3" ] || return 0
    if LD_LIBRARY_PATH="$MOCK${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" MOCK_CUDA_GPUS=$2 MOCK_CUDA_REPORT=1 \
            DPAR_REQUIRE_BACKENDS=cuda ${DPAR_TEST_WRAPPER:-} "$BUILD/$3" >"$log" 2>&1 && eval "$4"; then
        echo "PASS $1 ($(eval "$5"))"
    else
        cat "$log"
        echo "FAIL $1: $6 against the mock driver"
    fi
}
for gpus in 1 4; do
    name=cuda_mock_virtual_devices
    [ "$gpus" = 1 ] || name=cuda_mock_nccl_path
    run_mock $name $gpus test_cuda "has '^\[  PASSED  \] 13 test' && no_leaks" 'grep "^mock cuda: 0 allocation" "$log"' \
        "test_cuda ($gpus mock GPU(s))"
done

# the layer ops (norms, batched matmul, attention) against the CPU backend (tests/test_norm_attn.c)
run_mock cuda_mock_norm_attn_parity 1 test_norm_attn "has '^\[       OK \] test_parity_cuda' && ! has '^\[  FAILED  \]'" \
    "echo 'layer_norm, rms_norm, matmul_batched, attention vs cpu'" test_norm_attn

# the optimizer and training ops (kernels/optim.cu) against the CPU reference
run_mock cuda_mock_half_parity 1 test_dtypes \
    "has '^\[       OK \] test_cuda_half_parity' && has '^\[       OK \] test_cuda_half_queued' && has '^\[       OK \] test_cuda_f16_reduce' && has '^\[       OK \] test_cuda_cast_bits' && no_leaks" \
    'grep "^cuda bf16:" "$log" | cut -d: -f2' "test_dtypes (f16/bf16 layer ops)"
run_mock cuda_mock_optim_parity 1 test_optim "has '^\[       OK \] test_parity_cuda' && no_leaks" \
    "echo 'AdamW, xent with ignore/smoothing, embedding, dropout, bad labels vs cpu'" test_optim

# recorded graph programs as CUDA Graphs (stream capture, cuGraphLaunch) against op-by-op replay,
# bit for bit (tests/test_graph_record.c), on virtual devices and on the NCCL path
cuda_cases() { grep -c '^\[       OK \] test_[a-z_0-9]*_cuda$' "$log"; }
megatron() { grep '^Megatron MLP on a 2x2 CUDA' "$log" | cut -d: -f2 | cut -d, -f1; }
for gpus in 1 4; do
    run_mock cuda_mock_graph_record_$gpus $gpus test_graph_record '[ "$(cuda_cases)" = 11 ] && no_leaks' \
        'echo "11 CUDA cases bit for bit with op by op (queued steps among them); 2x2 Megatron:$(megatron)"' \
        "test_graph_record's CUDA cases ($gpus mock GPU(s))"
done

if LD_LIBRARY_PATH="$MOCK" MOCK_CUDA_NO_DEVICE=1 "$BUILD/test_cuda" >"$log" 2>&1; then :; fi
if grep -q 'SKIPPED: cuda backend unavailable: dpar_runtime_create: cuda: cuInit: CUDA_ERROR_NO_DEVICE' "$log" &&
   grep -q '^\[  SKIPPED \] 13 test' "$log"; then
    echo "PASS cuda_mock_no_device_skips"
else
    cat "$log"
    echo "FAIL cuda_mock_no_device_skips: expected 13 skips naming cuInit: CUDA_ERROR_NO_DEVICE"
fi

# the elementwise family (kernels/elementwise.cu) against the CPU reference
run_mock cuda_mock_elementwise_parity 1 test_elem "has '^cuda: [0-9]* results within'" \
    'grep "^cuda: [0-9]* results within" "$log"' test_elem

# conv2d and the pools (kernels/conv.cu) against the CPU backend, eager
run_mock cuda_mock_conv_pool_parity 1 test_conv "has '^\[       OK \] test_cuda_vs_cpu'" \
    "echo 'every conv and pool case of test_conv against the CPU backend'" test_conv

# CUDA has no f64: buffers and arrays are refused naming the backend (tests/test_f64.c)
run_mock cuda_mock_f64_refused 1 test_f64 "has '^\[       OK \] test_cuda_refuses_f64'" \
    "echo 'f64 buffers and arrays on CUDA: DPAR_ERR_DTYPE naming cuda'" test_f64

# a hung NCCL collective must become an error (timeout / asynchronous error), never a hang
CC=${CC:-cc}
SANFLAGS=
if nm "$BUILD/dpar.o" 2>/dev/null | grep -q __asan_init; then SANFLAGS=-fsanitize=address,undefined; fi
if nm "$BUILD/dpar.o" 2>/dev/null | grep -q __tsan_init; then SANFLAGS=-fsanitize=thread; fi
if [ -f "$BUILD/dpar.o" ] && "$CC" -std=c99 -Wall -Wextra -Werror -D_GNU_SOURCE -I. $SANFLAGS tests/cuda_mock/stall.c \
        "$BUILD/dpar.o" -o "$MOCK/stall" $SANFLAGS -lpthread -lm -ldl 2>"$log"; then
    if LD_LIBRARY_PATH="$MOCK" MOCK_CUDA_GPUS=2 MOCK_NCCL_STALL=3 timeout 60 "$MOCK/stall" >"$log" 2>&1; then
        echo "PASS cuda_mock_nccl_hang_times_out ($(cat "$log"))"
    else
        cat "$log"; echo "FAIL cuda_mock_nccl_hang_times_out"
    fi
    if LD_LIBRARY_PATH="$MOCK" MOCK_CUDA_GPUS=2 MOCK_NCCL_STALL=3 MOCK_NCCL_STALL_ERROR=1 timeout 60 "$MOCK/stall" error >"$log" 2>&1; then
        echo "PASS cuda_mock_nccl_async_error ($(cat "$log"))"
    else
        cat "$log"; echo "FAIL cuda_mock_nccl_async_error"
    fi
    # a buffer read behind a hung collective (the copy itself blocks in the driver)
    if LD_LIBRARY_PATH="$MOCK" MOCK_CUDA_GPUS=2 MOCK_NCCL_STALL=3 timeout 60 "$MOCK/stall" read >"$log" 2>&1; then
        echo "PASS cuda_mock_nccl_hang_read_times_out ($(cat "$log"))"
    else
        cat "$log"; echo "FAIL cuda_mock_nccl_hang_read_times_out (exit status $?; 124: hung)"
    fi
    # the function returns without waiting: the pmap's clean-up finds the hang and the pmap returns it
    if LD_LIBRARY_PATH="$MOCK" MOCK_CUDA_GPUS=2 MOCK_NCCL_STALL=3 timeout 60 "$MOCK/stall" none >"$log" 2>&1; then
        echo "PASS cuda_mock_nccl_hang_seen_by_pmap ($(cat "$log"))"
    else
        cat "$log"; echo "FAIL cuda_mock_nccl_hang_seen_by_pmap (a pmap over a hung collective returned without its error)"
    fi
else
    cat "$log"; echo "FAIL cuda_mock_stall_build: could not build tests/cuda_mock/stall.c against $BUILD/dpar.o"
fi

# what a steady recorded training step asks of the driver, counted by the mock (tests/cuda_mock/step_calls.c):
# no allocation, no NCCL or polling on 1 device, two feeds put, one loss read, CUDA Graphs replayed; clipped by
# the global norm: still no allocation or synchronization, one more read (the norms)
if [ -f "$BUILD/dpar.o" ] && "$CC" -std=c99 -Wall -Wextra -Werror -D_GNU_SOURCE -I. $SANFLAGS tests/cuda_mock/step_calls.c \
        "$BUILD/dpar.o" -o "$MOCK/step_calls" $SANFLAGS -lpthread -lm -ldl 2>"$log" &&
   LD_LIBRARY_PATH="$MOCK" MOCK_CUDA_JITTER_US=0 timeout 120 "$MOCK/step_calls" >"$log" 2>&1; then
    echo "PASS cuda_mock_step_calls ($(sed -n 's/^step calls (per step, \([0-9]*\) .*cuMemAlloc_v2 \([0-9.]*\) .*cuStreamSynchronize \([0-9.]*\) .*cuMemcpyDtoHAsync_v2:pageable \([0-9.]*\) .*cuGraphLaunch \([0-9.]*\) .*/\1 segment(s); per step: \2 allocations, \3 syncs, \4 blocking reads, \5 graph launches/p' "$log"); clipped by the global norm: $(sed -n 's/^step calls (per step, clip_norm.*cuMemAlloc_v2 \([0-9.]*\) .*cuStreamSynchronize \([0-9.]*\) .*cuMemcpyDtoHAsync_v2:pageable \([0-9.]*\) .*/\1 allocations, \2 syncs, \3 blocking reads/p' "$log"))"
else
    cat "$log"; echo "FAIL cuda_mock_step_calls: a recorded CNN step, or its clipped variant, allocates, synchronizes or reads more than it should"
fi

# dpar_k_cast between f32 and f16 / bf16 at every start offset within 16 bytes, both ways, launched through the
# driver API (tests/cuda_mock/cast_offsets.c): the word paths and the scalar path equal the host conversions
if [ -f "$BUILD/dpar.o" ] && "$CC" -std=c99 -Wall -Wextra -Werror -D_GNU_SOURCE -I. $SANFLAGS tests/cuda_mock/cast_offsets.c \
        "$BUILD/dpar.o" -o "$MOCK/cast_offsets" -L"$MOCK" -ldparmock $SANFLAGS -lpthread -lm -ldl 2>"$log" &&
   LD_LIBRARY_PATH="$MOCK" MOCK_CUDA_JITTER_US=0 timeout 120 "$MOCK/cast_offsets" >"$log" 2>&1; then
    echo "PASS cuda_mock_cast_offsets ($(sed -n 's/^cast offsets: \([0-9]*\) casts.*/\1 casts at offsets 0..7 bit for bit/p' "$log"))"
else
    cat "$log"; echo "FAIL cuda_mock_cast_offsets: dpar_k_cast at unaligned offsets against the host conversions"
fi

# NCCL communicators spanning processes (ncclGetUniqueId + ncclCommInitRank,
# through shared memory): tests/cuda_mock/xproc.c forks 2 and 3 processes
# holding 1 or 2 ranks each and checks every collective with exact data
if "$CC" -std=c99 -Wall -Wextra -Werror -D_GNU_SOURCE $SANFLAGS tests/cuda_mock/xproc.c -o "$MOCK/xproc" \
        -L"$MOCK" -ldparmock $SANFLAGS -lpthread 2>"$log"; then
    if LD_LIBRARY_PATH="$MOCK" MOCK_CUDA_GPUS=4 MOCK_CUDA_REPORT=1 timeout 120 "$MOCK/xproc" >"$log" 2>&1 &&
       ! grep -q '^FAIL' "$log" &&
       grep -q '^mock nccl: [1-9][0-9]* communicator rank(s) spanning processes, [1-9][0-9]* collective(s) through shared memory' "$log"; then
        x=$(awk '/^mock nccl: .* spanning processes/ { r += $3; c += $8 } END { print r " rank(s) spanning processes ran " c }' "$log")
        echo "PASS cuda_mock_nccl_across_processes ($(grep -c '^PASS xproc_' "$log") checks in forked processes; $x collective(s) through shared memory)"
    else
        cat "$log"; echo "FAIL cuda_mock_nccl_across_processes: tests/cuda_mock/xproc.c against the mock driver"
    fi
else
    cat "$log"; echo "FAIL cuda_mock_nccl_across_processes: could not build tests/cuda_mock/xproc.c"
fi

if [ -x "$BUILD/bench_cuda" ]; then
    if LD_LIBRARY_PATH="$MOCK" MOCK_CUDA_JITTER_US=0 timeout 120 "$BUILD/bench_cuda" --quick 1 --mb 1 >"$log" 2>&1 &&
       grep -q '^all-reduce 1 rank' "$log" && grep -q '^matmul bf16' "$log" &&
       grep -q '^conv2d conv2 bwd-filter .* dpar/GEMM time' "$log"; then
        echo "PASS cuda_mock_bench_smoke (bench_cuda --quick 1 --mb 1 runs end to end; figures meaningless on the mock)"
    else
        cat "$log"; echo "FAIL cuda_mock_bench_smoke"
    fi
fi

if [ -x "$BUILD/train_digits" ]; then
    a=$("$BUILD/train_digits" --backend cpu --devices 4 --epochs 1 --batch 256 2>&1 | sed -n 's/.*train_loss=\([0-9.eE+-]*\).*/\1/p')
    b=$(LD_LIBRARY_PATH="$MOCK" MOCK_CUDA_GPUS=1 "$BUILD/train_digits" --backend cuda --devices 4 --epochs 1 --batch 256 2>&1 |
        sed -n 's/.*train_loss=\([0-9.eE+-]*\).*/\1/p')
    if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * (a < 0 ? -a : a)) }'; then
        echo "PASS cuda_mock_digits_matches_cpu (train_loss cpu $a, cuda-mock $b)"
    else
        echo "FAIL cuda_mock_digits_matches_cpu: train_loss cpu '$a', cuda-mock '$b'"
    fi
fi
rm -f "$log"

# the CUDA backend across MPI processes (NCCL across processes) on this mock
BUILD=$BUILD sh tests/cuda_mock/mpi.sh
