/*
 * cuda_setup.cu — the cuda backend's process-wide state (cuda_setup.h,
 * cuda_common.h): the GPU of this process, the cuBLASLt handle and its
 * workspace, the kernel scratch, the device error word. Everything is made
 * once, by cuda_backend_init, and lives until the process ends (the driver
 * frees it at exit).
 *
 * Callers: lib/run/train.c and the parity tools (cuda_backend_init,
 * cuda_scratch_reserve); every kernel file (the getters).
 */
#include <stdio.h>

#include "backend/attn_hint.h"
#include "cuda_setup.h"
#include "cuda_common.h"
#include "cuda_stream.h"

static int              be_device = -1;
static cublasLtHandle_t be_lt;
static void            *be_lt_ws;
static void            *be_scratch;
static size_t           be_scratch_bytes;
static int             *be_error; /* device int[4] */
static int64_t          be_internal;

extern "C" void *cuda_internal_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    CUDA_CHECK(cudaMemset(p, 0, bytes));
    CUDA_CHECK(cudaDeviceSynchronize()); /* the legacy stream's memset is not ordered with the others */
    be_internal += (int64_t)bytes;
    return p;
}

extern "C" void cuda_internal_free(void *p, size_t bytes) {
    CUDA_CHECK(cudaFree(p));
    be_internal -= (int64_t)bytes;
}

extern "C" int64_t cuda_internal_bytes(void) { return be_internal; }

extern "C" int cuda_backend_probe(char *why, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear it: the probe is not a failure of the process */
        snprintf(why, n, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        return 0;
    }
    if (count == 0) snprintf(why, n, "no CUDA device is visible");
    return count;
}

extern "C" void cuda_backend_init(int local_rank) {
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    RS_CHECK(local_rank >= 0, "local rank %d", local_rank);
    int dev = local_rank < n ? local_rank : n == 1 ? 0 : -1;
    if (dev < 0)
        error_exit(RS_EXIT_FAIL, __FILE__, __LINE__,
                   "hint: start one process per GPU of the node (mpirun -np <GPUs per node> per node), or give each "
                   "task exactly one GPU (srun --gpus-per-task=1)",
                   "local rank %d, but this process sees %d GPUs", local_rank, n);
    if (be_device >= 0) {
        RS_CHECK(dev == be_device, "the cuda backend already runs on device %d; local rank %d asks for device %d",
                 be_device, local_rank, dev);
        return;
    }
    CUDA_CHECK(cudaSetDevice(dev));
    be_device = dev;
    cuda_streams_create();
    CUBLAS_CHECK(cublasLtCreate(&be_lt));
    be_lt_ws = cuda_internal_alloc(CUDA_LT_WORKSPACE_BYTES);
    be_scratch = cuda_internal_alloc(CUDA_SCRATCH_BYTES);
    be_scratch_bytes = CUDA_SCRATCH_BYTES;
    be_error = (int *)cuda_internal_alloc(4 * sizeof(int));
}

extern "C" void cuda_backend_ensure(void) {
    if (be_device < 0) cuda_backend_init(0);
}

extern "C" int cuda_backend_device(void) { return be_device; }

extern "C" cublasLtHandle_t cuda_lt_handle(void) {
    cuda_backend_ensure();
    return be_lt;
}

extern "C" void *cuda_lt_workspace(size_t *bytes) {
    cuda_backend_ensure();
    *bytes = CUDA_LT_WORKSPACE_BYTES;
    return be_lt_ws;
}

extern "C" void cuda_scratch_reserve(size_t bytes) {
    cuda_backend_ensure();
    if (bytes <= be_scratch_bytes) return;
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream())); /* no kernel may still use the old one */
    cuda_internal_free(be_scratch, be_scratch_bytes);
    be_scratch = cuda_internal_alloc(bytes);
    be_scratch_bytes = bytes;
}

extern "C" void *cuda_scratch(size_t bytes, const char *what) {
    cuda_backend_ensure();
    if (bytes > be_scratch_bytes)
        error_exit(RS_EXIT_FAIL, __FILE__, __LINE__,
                   "hint: call cuda_scratch_reserve(bytes) (kernels/cuda/cuda_setup.h) before the first step",
                   "%s needs %zu bytes of kernel scratch; the cuda backend holds %zu", what, bytes, be_scratch_bytes);
    return be_scratch;
}

extern "C" int *cuda_error_word(void) {
    cuda_backend_ensure();
    return be_error;
}

static int cuda_error_read(int w[4]) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    CUDA_CHECK(cudaMemcpy(w, be_error, 4 * sizeof(int), cudaMemcpyDeviceToHost));
    return w[0];
}

static long long cuda_error_index(const int w[4]) {
    return (long long)((uint64_t)(uint32_t)w[1] | ((uint64_t)(uint32_t)w[2] << 32));
}

extern "C" void cuda_error_check(void) {
    int w[4];
    if (!cuda_error_read(w)) return;
    long long i = cuda_error_index(w);
    switch (w[0]) {
    case CUDA_ERR_TOKEN_ID: RS_FATAL("embedding (cuda): token %lld has id %d < 0", i, w[3]);
    case CUDA_ERR_TARGET_ID: RS_FATAL("lm_head_loss (cuda): target %d of token %lld is >= the vocab size", w[3], i);
    case CUDA_ERR_DOC_POS: RS_FATAL("conv1d_silu (cuda): doc_pos[%lld] = %d < 0", i, w[3]);
    case CUDA_ERR_ATTN_HINT:
        RS_FATAL("attention (cuda, cuDNN route): a call's AttnHint says something else than its pos/doc_pos rows: "
                 "%s is %d in the rows (the caller's summary is wrong: lib/backend/attn_hint.h)", attn_hint_field_name((int)i),
                 w[3]);
    default: RS_FATAL("a cuda kernel recorded error code %d (index %lld, value %d)", w[0], i, w[3]);
    }
}

extern "C" int cuda_error_take(long long *index, int *value) {
    int w[4];
    int code = cuda_error_read(w);
    if (index) *index = cuda_error_index(w);
    if (value) *value = w[3];
    CUDA_CHECK(cudaMemsetAsync(be_error, 0, 4 * sizeof(int), cuda_stream()));
    return code;
}
