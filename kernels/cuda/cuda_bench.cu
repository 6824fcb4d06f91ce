/*
 * cuda_bench.cu — see cuda_bench.h: event timing on the compute stream,
 * random fills, the device's name, for `ringscan bench`.
 */
#include "cuda_bench.h"

#include <stdio.h>
#include <stdlib.h>

#include "cuda_common.h"

struct CudaBenchTimer {
    cudaEvent_t ev[CUDA_BENCH_MARKS];
};

extern "C" CudaBenchTimer *cuda_bench_timer_create(void) {
    CudaBenchTimer *t = (CudaBenchTimer *)calloc(1, sizeof *t);
    RS_CHECK(t != NULL, "out of host memory");
    for (int i = 0; i < CUDA_BENCH_MARKS; i++) CUDA_CHECK(cudaEventCreate(&t->ev[i]));
    return t;
}

extern "C" void cuda_bench_timer_free(CudaBenchTimer *t) {
    if (!t) return;
    for (int i = 0; i < CUDA_BENCH_MARKS; i++) CUDA_CHECK(cudaEventDestroy(t->ev[i]));
    free(t);
}

extern "C" void cuda_bench_mark(CudaBenchTimer *t, int i) {
    RS_CHECK(i >= 0 && i < CUDA_BENCH_MARKS, "timer mark %d", i);
    CUDA_CHECK(cudaEventRecord(t->ev[i], cuda_stream()));
}

extern "C" double cuda_bench_elapsed_ms(CudaBenchTimer *t, int i, int j) {
    CUDA_CHECK(cudaEventSynchronize(t->ev[j]));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t->ev[i], t->ev[j]));
    return (double)ms;
}

extern "C" void cuda_bench_sync(void) { CUDA_CHECK(cudaStreamSynchronize(cuda_stream())); }

/* splitmix64 of (seed, i) -> 24 random bits -> [0, 1) */
__device__ __forceinline__ float bench_unit(uint64_t seed, int64_t i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

__global__ void bench_fill_bf16_kernel(bf16 *dst, int64_t n, uint64_t seed, float lo, float hi) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(lo + (hi - lo) * bench_unit(seed, i));
}

__global__ void bench_fill_f32_kernel(float *dst, int64_t n, uint64_t seed, float lo, float hi) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = lo + (hi - lo) * bench_unit(seed, i);
}

static int bench_grid(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (int)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

extern "C" void cuda_bench_fill_bf16(void *dst, int64_t n, uint64_t seed, float lo, float hi) {
    bench_fill_bf16_kernel<<<bench_grid(n), 256, 0, cuda_stream()>>>((bf16 *)dst, n, seed, lo, hi);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_bench_fill_f32(float *dst, int64_t n, uint64_t seed, float lo, float hi) {
    bench_fill_f32_kernel<<<bench_grid(n), 256, 0, cuda_stream()>>>(dst, n, seed, lo, hi);
    CUDA_LAUNCH_CHECK();
}

extern "C" int cuda_bench_device(char *name, size_t n, int *sms, double *mem_gib) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(name, n, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        return -1;
    }
    snprintf(name, n, "%s", p.name);
    *sms = p.multiProcessorCount;
    *mem_gib = (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0);
    return 0;
}
