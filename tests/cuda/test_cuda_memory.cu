/*
 * test_cuda_memory.cu — the first case of build/test_cuda (the GPU parity
 * harness; tests/cuda/README.md): a host -> device -> host round trip through
 * the compute stream, so the harness itself is known to run on the GPU.
 *
 * build/test_cuda uses the driver of tests/unit (test_util.h: TEST, EXPECT,
 * test_check_rel): `build/test_cuda --list`, `build/test_cuda NAME...`.
 */
#include <stdio.h>

#include "cuda_common.h"
#include "test_util.h"

TEST(cuda_memory_round_trip) {
    const int64_t n = 1 << 20;
    float *h = (float *)test_alloc(n * 4), *back = (float *)test_alloc(n * 4);
    test_fill_normal(h, n, 1.0);
    float *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, n * 4));
    CUDA_CHECK(cudaMemsetAsync(d, 0xff, n * 4, cuda_stream())); /* poison: NaN everywhere */
    CUDA_CHECK(cudaMemcpyAsync(d, h, n * 4, cudaMemcpyHostToDevice, cuda_stream()));
    CUDA_CHECK(cudaMemcpyAsync(back, d, n * 4, cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    CUDA_CHECK(cudaFree(d));
    test_check_rel_f("round trip", back, h, n, 0.0);
}
