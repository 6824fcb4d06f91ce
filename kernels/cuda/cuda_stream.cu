/*
 * cuda_stream.cu — the cuda backend's compute stream (cuda_stream.h),
 * created by cuda_backend_init (on the process's GPU); asking for it before
 * that initialises the backend on device 0 (tests and tools).
 */
#include "cuda_common.h"
#include "cuda_stream.h"

static cudaStream_t cuda_compute_stream;

extern "C" void cuda_streams_create(void) {
    if (!cuda_compute_stream) CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_compute_stream, cudaStreamNonBlocking));
}

extern "C" cudaStream_t cuda_stream(void) {
    if (!cuda_compute_stream) cuda_backend_ensure();
    return cuda_compute_stream;
}
