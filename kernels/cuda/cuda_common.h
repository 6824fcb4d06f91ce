/*
 * cuda_common.h — what every file of the cuda backend shares: checked calls
 * that report file:line, rank and host (through lib/error.h), the bf16
 * activation type, and the backend's one compute stream.
 *
 * Streams: every kernel of the Backend table runs on cuda_stream() (the
 * compute stream, created once by cuda_backend_init); communication (NCCL)
 * runs on its own stream owned by lib/comm and is ordered with events. A
 * Backend entry never synchronises the device except where its contract
 * returns a host value (to_host, sum_squares).
 *
 * Callers: every .cu file of kernels/cuda, tests/cuda.
 */
#ifndef RS_CUDA_COMMON_H
#define RS_CUDA_COMMON_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "error.h"

typedef __nv_bfloat16 bf16; /* the activation type of the cuda backend (Backend.act_size == 2) */

#define CUDA_CHECK(call)                                                                              \
    do {                                                                                              \
        cudaError_t e_ = (call);                                                                      \
        if (e_ != cudaSuccess)                                                                        \
            error_exit(RS_EXIT_FAIL, __FILE__, __LINE__, NULL, "%s failed: %s (%s)", #call,           \
                       cudaGetErrorString(e_), cudaGetErrorName(e_));                                 \
    } while (0)

#define CUBLAS_CHECK(call)                                                                            \
    do {                                                                                              \
        cublasStatus_t s_ = (call);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                              \
            error_exit(RS_EXIT_FAIL, __FILE__, __LINE__, NULL, "%s failed: cublas status %d", #call, (int)s_); \
    } while (0)

/* After a kernel launch: the launch configuration was accepted (asynchronous faults surface at
 * the next synchronising call, which CUDA_CHECK reports). */
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

#ifdef __cplusplus
extern "C" {
#endif

/* The compute stream every Backend entry of the cuda backend uses. */
cudaStream_t cuda_stream(void);

#ifdef __cplusplus
}
#endif

#endif
