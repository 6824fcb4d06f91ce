/*
 * cuda_common.h — what every file of the cuda backend shares: checked calls
 * that report file:line, rank and host (through lib/core/error.h), the bf16
 * activation type, the backend's one compute stream, and the process-wide
 * state the kernels use (cuBLASLt handle and workspace, the kernel scratch,
 * the device error word), all created once by cuda_backend_init
 * (cuda_setup.h, cuda_setup.cu).
 *
 * Streams: every kernel of the Backend table runs on cuda_stream() (the
 * compute stream, cuda_stream.h); communication (NCCL) runs on the streams
 * of kernels/cuda/comm_nccl.c, one per group, ordered against it with events. A
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
#include <stdint.h>

#include "core/error.h"

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

/* The compute stream every Backend entry of the cuda backend uses (cuda_stream.h). */
cudaStream_t cuda_stream(void);

/* ---- process-wide state (cuda_setup.cu); each getter initialises the backend on device 0 when
 * cuda_backend_init has not run (tests, tools), so the trainer calls cuda_backend_init first ---- */
cublasLtHandle_t cuda_lt_handle(void);
/* the cuBLASLt workspace (CUDA_LT_WORKSPACE_BYTES), used by GEMMs on the compute stream */
void *cuda_lt_workspace(size_t *bytes);
/* The kernels' scratch: partial sums of the deterministic reductions, sort buffers. One buffer of
 * the compute stream; what a kernel puts there is dead once the entry that asked returns. Fatal
 * (naming `what` and the size) when `bytes` exceeds it; cuda_scratch_reserve (cuda_setup.h)
 * raises it before training. */
void *cuda_scratch(size_t bytes, const char *what);

/* The device error word: int[4] {code, index low, index high, value}. Kernels that meet an input
 * they cannot compute with (a token id < 0, a target >= V) record the first such input there
 * (cuda_raise in cuda_device.cuh) and skip it; cuda_error_check, at every point where the host
 * waits for the device (to_host, sum_squares), turns it into a fatal error naming the entry. */
enum {
    CUDA_ERR_NONE = 0,
    CUDA_ERR_TOKEN_ID,  /* embedding: token id < 0 */
    CUDA_ERR_TARGET_ID, /* lm_head_loss: target >= V */
    CUDA_ERR_DOC_POS,   /* conv1d_silu: doc_pos < 0 */
    CUDA_ERR_ATTN_HINT, /* attention through cuDNN: the caller's AttnHint is not the rows' (index: the field) */
};
int *cuda_error_word(void);
/* Waits for the compute stream; fatal if a kernel recorded an error. */
void cuda_error_check(void);
/* Waits for the compute stream; returns the recorded code (CUDA_ERR_NONE if none) and clears the
 * word (tests of the error path). */
int  cuda_error_take(long long *index, int *value);

/* ---- internal to kernels/cuda ---- */
void    cuda_streams_create(void);        /* cuda_stream.cu, called by cuda_backend_init */
void    cuda_backend_ensure(void);        /* cuda_backend_init(0) unless it ran */
void   *cuda_internal_alloc(size_t bytes); /* the backend's own buffers, counted apart */
void    cuda_internal_free(void *p, size_t bytes);
int64_t cuda_internal_bytes(void);

/* Bytes of alignment of a pointer (largest power of two dividing it, up to 256). */
static inline int cuda_ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 1;
    while (al < 256 && !(a & (uintptr_t)al)) al <<= 1;
    return al;
}

#ifdef __cplusplus
}
#endif

#endif
