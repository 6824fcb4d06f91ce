/*
 * cuda_stream.cu — the cuda backend's compute stream (cuda_common.h): created
 * once, on first use, non-blocking with respect to the legacy default stream.
 */
#include "cuda_common.h"

static cudaStream_t cuda_compute_stream;

extern "C" cudaStream_t cuda_stream(void) {
    if (!cuda_compute_stream) CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_compute_stream, cudaStreamNonBlocking));
    return cuda_compute_stream;
}
