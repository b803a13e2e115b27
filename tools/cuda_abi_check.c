/* Compile-time check (make CUDA=1 check-cuda-abi) that the constants and
   types backends/dpar_cuda.h declares by hand — so that programs build without
   the CUDA toolkit — match the real CUDA driver, cuBLAS and NCCL headers. */
#include <cuda.h>
#include <cublas_api.h>
#include <nccl.h>
#define DPAR_CUDA
#define DPAR_IMPLEMENTATION
#include "../dpar.h"

#define ABI(a, b) _Static_assert((long long)(a) == (long long)(b), #a " != " #b)
ABI(DPAR__CUDA_SUCCESS, CUDA_SUCCESS);
ABI(DPAR__CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
ABI(DPAR__CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
ABI(DPAR__CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
ABI(DPAR__CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);
ABI(DPAR__CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
ABI(DPAR__CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_RELAXED);
ABI(DPAR__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
ABI(DPAR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
ABI(DPAR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
ABI(DPAR__CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER);
ABI(DPAR__CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
ABI(DPAR__CUBLAS_OP_N, CUBLAS_OP_N);
ABI(DPAR__CUBLAS_OP_T, CUBLAS_OP_T);
ABI(DPAR__CUDA_R_32F, CUDA_R_32F);
ABI(DPAR__CUDA_R_16F, CUDA_R_16F);
ABI(DPAR__CUDA_R_16BF, CUDA_R_16BF);
ABI(DPAR__CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F);
ABI(DPAR__CUBLAS_GEMM_DEFAULT, CUBLAS_GEMM_DEFAULT);
ABI(DPAR__CUBLAS_STATUS_ALLOC_FAILED, CUBLAS_STATUS_ALLOC_FAILED);
ABI(DPAR__ncclSuccess, ncclSuccess);
ABI(DPAR__ncclInProgress, ncclInProgress);
ABI(DPAR__ncclInt32, ncclInt32);
ABI(DPAR__ncclFloat16, ncclFloat16);
ABI(DPAR__ncclFloat32, ncclFloat32);
ABI(DPAR__ncclBfloat16, ncclBfloat16);
ABI(DPAR__ncclSum, ncclSum);
ABI(DPAR__ncclMax, ncclMax);
ABI(DPAR__ncclMin, ncclMin);
ABI(DPAR__ncclAvg, ncclAvg);
ABI(sizeof(dpar__ncclUniqueId), sizeof(ncclUniqueId));
ABI(sizeof(dpar__CUuuid), sizeof(CUuuid));
ABI(sizeof(dpar__CUdeviceptr), sizeof(CUdeviceptr));
ABI(sizeof(dpar__CUdevice), sizeof(CUdevice));
ABI(sizeof(dpar__CUresult), sizeof(CUresult));
ABI(sizeof(int), sizeof(cublasStatus_t));
ABI(sizeof(int), sizeof(ncclResult_t));
ABI(sizeof(int), sizeof(ncclDataType_t));
ABI(sizeof(int), sizeof(ncclRedOp_t));
ABI(sizeof(int), sizeof(cublasOperation_t));
ABI(sizeof(int), sizeof(cudaDataType));
ABI(sizeof(int), sizeof(cublasComputeType_t));
ABI(sizeof(int), sizeof(cublasGemmAlgo_t));
ABI(sizeof(int), sizeof(CUjit_option));
ABI(sizeof(int), sizeof(CUdevice_attribute));
ABI(sizeof(int), sizeof(CUstreamCaptureMode));
ABI(sizeof(dpar__CUgraph), sizeof(CUgraph));
ABI(sizeof(dpar__CUgraphExec), sizeof(CUgraphExec));

int dpar__cuda_abi_check_unused(void);
