/*
 * gdn_timing.cu — one-GPU timings of the chunked Gated DeltaNet kernels (kernels/cuda/gdn/) under the
 * state passes' choice sets (kernels/cuda/cuda_gdn_tune.h), for experiments: `build/bench_kernels gdn`
 * times the forward and the backward (median of a few runs after a warm-up) at T = 32k and 128k, 16 and 64
 * heads of 128, one document and documents of mean length 1000, under the first 5 sets (the default, 3
 * pipeline stages, 32 columns in 1, 2 and 3 segments); `gdn every-set` adds the wgmma state passes forced
 * on and off at 32k / 16 heads. Each shape then prints the per-kernel profile (cuda_gdn_profile) of the
 * first set, the default and the fastest (with the state passes' cycles). Every set gives the same bits:
 * build/test_cuda checks them; nothing here is checked. `ringscan bench gdn --gdn-tune` times one set.
 *
 * Caller: bench/cuda/bench_kernels.cu (main).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_kernels.h"
#include "cuda_common.h"
#include "cuda_gdn_tune.h"
#include "cuda_kernels.h"

/* a choice set of cuda_gdn_tune.h, as bench gdn --gdn-tune names its keys */
static const char *gdn_timing_set_name(const CudaGdnTune *c, char *buf, size_t n) {
    static const CudaGdnTune none = {};
    if (!memcmp(c, &none, sizeof none)) snprintf(buf, n, " [default]");
    else
        snprintf(buf, n,
                 " [split=%d nst=%d bv=%d dseg=%d dual=%d state_fwd_wgmma=%d state_bwd_wgmma=%d dual_wgmma=%d "
                 "state_fwd_wgmma_cols=%d state_bwd_wgmma_cols=%d]",
                 c->split, c->nst, c->bv, c->dseg, c->dual, c->sfwd, c->sbwd, c->dwg, c->sfbv, c->sbcols);
    return buf;
}


__device__ static uint32_t gdn_timing_hash(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

__device__ static float gdn_timing_u(uint64_t i, uint32_t seed) { /* in (0, 1) */
    return ((float)(gdn_timing_hash(i * 0x9E3779B97F4A7C15ULL + seed) >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

/* q and k rows (T, nh2 heads of dk <= 128): uniform, then L2-normalised; one warp per row */
__global__ void gdn_timing_qk_kernel(bf16 *qk, int64_t T, int nh2, int dk, int ldq, uint32_t seed) {
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (row >= T * nh2) return;
    const int64_t t = row / nh2;
    const int hh = (int)(row % nh2);
    float x[4], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        x[i] = i < dk / 32 ? gdn_timing_u(row * dk + lane + 32 * i, seed) - 0.5f : 0.0f;
        ss += x[i] * x[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss);
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < dk / 32) qk[t * ldq + (int64_t)hh * dk + lane + 32 * i] = __float2bfloat16(x[i] * r);
}

__global__ void gdn_timing_fill_kernel(bf16 *x, int64_t n, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(2.0f * gdn_timing_u(i, seed) - 1.0f);
}

__global__ void gdn_timing_gates_kernel(float *g, float *beta, int64_t n, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        g[i] = -0.3f * gdn_timing_u(i, seed);
        beta[i] = 0.2f + 0.6f * gdn_timing_u(i, seed + 1);
    }
}

static int gdn_timing_cmp(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* T tokens, nh heads of 128 (nk = nv), documents of mean length doc_mean (0: one document); the
 * median of `reps` runs per switch set; then the per-kernel profile of the first set, the default and the fastest */
static void gdn_timing_shape(int64_t T, int nh, int doc_mean, const CudaGdnTune *cfgs, int ncfg, int reps) {
    const int dk = 128, dv = 128, ldq = 2 * nh * dk, ldv = nh * dv;
    cudaStream_t st = cuda_stream();
    bf16 *qk = (bf16 *)bk_dev_alloc((size_t)T * ldq * 2), *v = (bf16 *)bk_dev_alloc((size_t)T * ldv * 2);
    bf16 *o = (bf16 *)bk_dev_alloc((size_t)T * ldv * 2), *dout = (bf16 *)bk_dev_alloc((size_t)T * ldv * 2);
    bf16 *dqk = (bf16 *)bk_dev_alloc((size_t)T * ldq * 2), *dvv = (bf16 *)bk_dev_alloc((size_t)T * ldv * 2);
    float *g = (float *)bk_dev_alloc((size_t)T * nh * 4), *beta = (float *)bk_dev_alloc((size_t)T * nh * 4);
    float *dg = (float *)bk_dev_alloc((size_t)T * nh * 4), *db = (float *)bk_dev_alloc((size_t)T * nh * 4);
    int32_t *hpos = (int32_t *)bk_host_alloc((size_t)T * 4);
    int ndocs = 1;
    uint64_t lcg = 12345;
    int64_t next = T;
    if (doc_mean > 0) {
        lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
        next = doc_mean / 4 + (int64_t)((lcg >> 33) % (uint64_t)(3 * doc_mean / 2));
    }
    for (int64_t t = 0; t < T; t++) {
        if (t == next) {
            ndocs++;
            lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
            next = t + doc_mean / 4 + (int64_t)((lcg >> 33) % (uint64_t)(3 * doc_mean / 2));
            hpos[t] = 0;
        } else hpos[t] = t == 0 ? 0 : hpos[t - 1] + 1;
    }
    int32_t *pos = (int32_t *)bk_upload(hpos, (size_t)T * 4);
    gdn_timing_qk_kernel<<<(unsigned)((T * 2 * nh + 7) / 8), 256, 0, st>>>(qk, T, 2 * nh, dk, ldq, 1);
    gdn_timing_fill_kernel<<<2048, 256, 0, st>>>(v, T * ldv, 2);
    gdn_timing_fill_kernel<<<2048, 256, 0, st>>>(dout, T * ldv, 3);
    gdn_timing_gates_kernel<<<1024, 256, 0, st>>>(g, beta, T * nh, 4);
    CUDA_LAUNCH_CHECK();
    cudaEvent_t ev[3];
    for (int i = 0; i < 3; i++) CUDA_CHECK(cudaEventCreate(&ev[i]));
    float best = 1e30f;
    int bi = 0;
    for (int ci = 0; ci < ncfg; ci++) {
        cuda_gdn_tune_set(&cfgs[ci]);
        float tf[16], tb[16], ts[16];
        for (int r = -1; r < reps && r < 16; r++) {
            CUDA_CHECK(cudaEventRecord(ev[0], st));
            cuda_gdn_chunk_forward(o, NULL, qk, qk + nh * dk, v, g, beta, NULL, pos, T, nh, nh, dk, dv, ldq, ldv, ldv, NULL, 0);
            CUDA_CHECK(cudaEventRecord(ev[1], st));
            cuda_gdn_chunk_backward(dqk, dqk + nh * dk, dvv, dg, db, NULL, dout, NULL, qk, qk + nh * dk, v, g, beta,
                                    NULL, pos, T, nh, nh, dk, dv, ldq, ldv, ldv, NULL, 0);
            CUDA_CHECK(cudaEventRecord(ev[2], st));
            CUDA_CHECK(cudaEventSynchronize(ev[2]));
            if (r < 0) continue; /* warm-up */
            CUDA_CHECK(cudaEventElapsedTime(&tf[r], ev[0], ev[1]));
            CUDA_CHECK(cudaEventElapsedTime(&tb[r], ev[1], ev[2]));
            ts[r] = tf[r] + tb[r];
        }
        const int n = reps < 16 ? reps : 16;
        qsort(tf, n, 4, gdn_timing_cmp);
        qsort(tb, n, 4, gdn_timing_cmp);
        qsort(ts, n, 4, gdn_timing_cmp);
        char cn[160];
        printf("bench T=%lld H=%d docs=%d%s: fwd %.3f ms, bwd %.3f ms, fwd+bwd %.3f ms (median of %d)\n",
               (long long)T, nh, ndocs, gdn_timing_set_name(&cfgs[ci], cn, sizeof cn), tf[n / 2], tb[n / 2], ts[n / 2], n);
        if (ts[n / 2] < best) {
            best = ts[n / 2];
            bi = ci;
        }
    }
    char cn[160];
    printf("bench T=%lld H=%d docs=%d: fastest%s %.3f ms\n", (long long)T, nh, ndocs,
           gdn_timing_set_name(&cfgs[bi], cn, sizeof cn), best);
    for (int pass = 0; pass < 3; pass++) { /* per-kernel profiles: the first set, the default, the fastest (+ cycles) */
        CudaGdnTune c = pass == 0 ? cfgs[0] : pass == 1 ? CudaGdnTune{} : cfgs[bi];
        cuda_gdn_tune_set(&c);
        cuda_gdn_profile(pass == 2 ? 2 : 1);
        printf("profile%s:\n", gdn_timing_set_name(&c, cn, sizeof cn));
        cuda_gdn_chunk_forward(o, NULL, qk, qk + nh * dk, v, g, beta, NULL, pos, T, nh, nh, dk, dv, ldq, ldv, ldv, NULL, 0);
        cuda_gdn_chunk_backward(dqk, dqk + nh * dk, dvv, dg, db, NULL, dout, NULL, qk, qk + nh * dk, v, g, beta, NULL,
                                pos, T, nh, nh, dk, dv, ldq, ldv, ldv, NULL, 0);
    }
    cuda_gdn_profile(0);
    cuda_gdn_tune_set(NULL);
    for (int i = 0; i < 3; i++) CUDA_CHECK(cudaEventDestroy(ev[i]));
    bk_dev_free_all();
}

void bk_gdn_timing(int every_set) {
    /* the default, 3 pipeline stages, 32 columns (one segment, 2 and 3 segments), the wgmma state passes
     * forced on and off; every_set: every set at T = 32k, H = 16, else the first 5 */
    static const CudaGdnTune few[] = {
        {0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 3, 0, 0, 0, 0, 0, 0, 0}, {2, 0, 32, 0, 0, 0, 0, 0, 0},
        {3, 0, 32, 0, 0, 0, 0, 0, 0}, {0, 0, 32, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 1, 1, 0, 0},
        {0, 0, 0, 0, 0, 2, 2, 0, 0},
    };
    const int nf = (int)(sizeof few / sizeof few[0]);
    gdn_timing_shape(32768, 16, 0, few, every_set ? nf : 5, 5);
    gdn_timing_shape(32768, 16, 1000, few, 5, 5);
    gdn_timing_shape(32768, 64, 0, few, 5, 3);
    gdn_timing_shape(32768, 64, 1000, few, 5, 3);
    gdn_timing_shape(131072, 16, 0, few, 5, 3);
    gdn_timing_shape(131072, 16, 1000, few, 5, 3);
    gdn_timing_shape(131072, 64, 0, few, 5, 3);
    gdn_timing_shape(131072, 64, 1000, few, 5, 3);
}
