/*
 * bench_kernels.cu — build/bench_kernels: the one-GPU timings of single cuda kernels that experiments
 * compare (median of a few runs after a warm-up, CUDA events on the compute stream; information only,
 * nothing checked). `ringscan bench attn|gdn` is the measurement of record (docs/performance.md); this
 * program times shapes and kernel choices bench does not offer:
 *
 *   build/bench_kernels attn [all|32k|hd256|128k|ring2|dense]   (attention_timing.cu; default all)
 *   build/bench_kernels gdn [every-set]                         (gdn_timing.cu)
 *   build/bench_kernels glue                                    (glue_timing.cu: per-token glue, GB/s)
 *   build/bench_kernels gemm [ROWS]                             (gemm_timing.cu: cuBLASLt's algorithms; 8384)
 *   build/bench_kernels loss [ROWS]                             (loss_timing.cu: lm_head + CE, its GEMMs; 3533)
 *
 * Links like build/test_cuda (the kernels, lib/core/error.o; no MPI, no NCCL). Also: the scratch of
 * bench_kernels.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_kernels.h"
#include "cuda_common.h"

#define BK_MAX 256
static void *bk_dev[BK_MAX], *bk_host[BK_MAX];
static int bk_ndev, bk_nhost;

void *bk_dev_alloc(size_t bytes) {
    void *p = NULL;
    if (bk_ndev == BK_MAX) {
        fprintf(stderr, "bench_kernels: raise BK_MAX\n");
        exit(2);
    }
    CUDA_CHECK(cudaMalloc(&p, bytes + 16));
    CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes + 16, cuda_stream()));
    bk_dev[bk_ndev++] = p;
    return p;
}

void *bk_host_alloc(size_t bytes) {
    if (bk_nhost == BK_MAX) {
        fprintf(stderr, "bench_kernels: raise BK_MAX\n");
        exit(2);
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of host memory (%zu bytes)\n", bytes);
        exit(2);
    }
    bk_host[bk_nhost++] = p;
    return p;
}

/* x[i] = a hash of i and seed mapped to [-1, 1), bf16 */
__global__ void bk_random_bf16_kernel(bf16 *x /* (n) */, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        x[i] = __float2bfloat16((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

void *bk_dev_random_bf16(int64_t n, uint32_t seed) {
    bf16 *x = (bf16 *)bk_dev_alloc((size_t)n * 2);
    bk_random_bf16_kernel<<<1024, 256, 0, cuda_stream()>>>(x, n, seed);
    CUDA_CHECK(cudaGetLastError());
    return x;
}

void *bk_upload(const void *host, size_t bytes) {
    void *d = bk_dev_alloc(bytes);
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, cuda_stream()));
    return d;
}

void bk_dev_free_all(void) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    while (bk_ndev) CUDA_CHECK(cudaFree(bk_dev[--bk_ndev]));
}

void bk_host_free_all(void) {
    while (bk_nhost) free(bk_host[--bk_nhost]);
}

float bk_median(float *x, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (x[j] < x[i]) {
                const float t = x[i];
                x[i] = x[j], x[j] = t;
            }
    return x[n / 2];
}

static int bk_usage(void) {
    fprintf(stderr, "usage: bench_kernels attn [all|32k|hd256|128k|ring2|dense]\n"
                    "       bench_kernels gdn [every-set]\n"
                    "       bench_kernels glue\n"
                    "       bench_kernels gemm [ROWS]\n"
                    "       bench_kernels loss [ROWS]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) return bk_usage();
    if (!strcmp(argv[1], "attn")) {
        if (bk_attention_timing(argc == 3 ? argv[2] : "all")) return bk_usage();
    } else if (!strcmp(argv[1], "gdn") && (argc == 2 || !strcmp(argv[2], "every-set"))) {
        bk_gdn_timing(argc == 3);
    } else if (!strcmp(argv[1], "glue") && argc == 2) {
        bk_glue_timing();
    } else if (!strcmp(argv[1], "gemm")) {
        const long long rows = argc == 3 ? atoll(argv[2]) : 8384;
        if (rows <= 0) return bk_usage();
        bk_gemm_timing(rows);
    } else if (!strcmp(argv[1], "loss")) {
        const long long rows = argc == 3 ? atoll(argv[2]) : 3533;
        if (rows <= 0) return bk_usage();
        bk_loss_timing(rows);
    } else {
        return bk_usage();
    }
    bk_dev_free_all();
    bk_host_free_all();
    return 0;
}
