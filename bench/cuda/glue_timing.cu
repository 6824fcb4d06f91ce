/*
 * glue_timing.cu — one-GPU timings of the per-token glue kernels of a decoder block (the conv + SiLU, the
 * norms, SwiGLU, the sigmoid gate, the 2-D copies) at the 1B config's shapes
 * (configs/hybrid-1b-256k-h200x4.yaml: hidden 1536, intermediate 4096, GDN 16 + 16 heads of 128, attention
 * 16 / 2 heads of 128), for experiments: `build/bench_kernels glue` times each kernel at the remat row chunk
 * (8,384 rows: model_acts.c's rule at T = 131,072 on one GPU), at the whole T = 131,072 and, for the input
 * norm, at the Kc-1 = 3 rows of a conv halo's gradient. Each line gives the time per call (the median of 5
 * trials of back-to-back calls after a warm-up), the bytes the call must move at least (every input read
 * once, every output written once, fp32 weight gradients and statistics included) and that rate as GB/s
 * and % of the H200's 4.8 TB/s datasheet bandwidth. Nothing is checked (build/test_cuda checks the same
 * kernels against the cpu oracle).
 *
 * The GDN layer's fused conv + split (gdn_conv_split_*) is timed beside the plain conv1d_silu_* (KDA's; the
 * GDN layer ran it with a separate split kernel before, docs/bench-log/2026-11-30-i-packed-step-fusions.md)
 * and left out of the sum. Only the backend entry points (cuda_kernels.h) are called, with the
 * arguments model_block.c passes, so this file compiles against an older tree's kernels (drop the two
 * gdn_conv_split rows where it has none): copy bench/cuda/glue_timing.cu, bench_kernels.cu and
 * bench_kernels.h into that checkout and `make build/bench_kernels` there.
 *
 * Caller: bench/cuda/bench_kernels.cu (main).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_kernels.h"
#include "cuda_common.h"
#include "cuda_kernels.h"
#include "cuda_setup.h"

#define GLUE_PEAK_GBS 4800.0 /* the H200's HBM3e datasheet bandwidth */

/* the 1B config's widths (model_block.c Dims) */
enum {
    G_H = 1536, G_I = 4096, G_NK = 16, G_NV = 16, G_DK = 128, G_DV = 128, G_KD = G_NK * G_DK, G_VD = G_NV * G_DV,
    G_CC = 2 * G_KD + G_VD, G_KC = 4, G_PG = G_CC + G_VD + 2 * G_NV, G_NH = 16, G_NKV = 2, G_HD = 128,
    G_QD = G_NH * G_HD, G_KVD = G_NKV * G_HD, G_PA = 2 * G_QD + 2 * G_KVD
};

typedef struct {
    int64_t  T;                 /* rows of this call */
    bf16    *a, *b, *c, *d, *e; /* (Tmax, G_PG) bf16 each */
    float   *f0, *f1, *dw;      /* (Tmax, 64) fp32 statistics; fp32 weight gradients */
    bf16    *w, *halo, *dhalo;  /* bf16 weights (G_CC * G_KC), halo rows (G_KC-1, G_CC) */
    float   *A_log, *dt_bias;   /* (G_NV) */
    int32_t *doc_pos;           /* (Tmax) documents of 8,192 tokens */
} GlueBufs;

typedef struct {
    const char *name;
    double      bytes_per_row; /* bytes a row moves at least */
    void (*run)(const GlueBufs *g);
    int         alternative; /* 1: does the work of rows above (the fused GDN conv + split): not in the sum */
} GlueCase;

#define GB(p, off) ((p) + (int64_t)(off))

static void g_conv_fwd(const GlueBufs *g) {
    cuda_conv1d_silu_forward(g->b, g->a, g->halo, g->w, g->doc_pos, g->T, G_CC, G_KC, G_PG, G_CC);
}
static void g_conv_bwd(const GlueBufs *g) {
    cuda_conv1d_silu_backward(g->c, g->dhalo, g->dw, g->b, g->a, g->halo, g->w, g->doc_pos, g->T, G_CC, G_KC, G_PG,
                              G_CC);
}
static void g_rms_fwd(const GlueBufs *g) {
    cuda_rmsnorm_forward(g->b, g->f0, g->a, g->w, g->T, 1, G_H, G_H, G_H, 1e-6f, 1);
}
static void g_rms_bwd(const GlueBufs *g) {
    cuda_rmsnorm_backward(g->c, g->dw, g->b, g->a, g->w, g->f0, g->T, 1, G_H, G_H, G_H, 1);
}
static void g_qnorm_fwd(const GlueBufs *g) { /* q_norm: the proj's q columns into attn_q */
    cuda_rmsnorm_forward(g->b, g->f0, g->a, g->w, g->T, G_NH, G_HD, G_PA, G_QD, 1e-6f, 1);
}
static void g_qnorm_bwd(const GlueBufs *g) {
    cuda_rmsnorm_backward(g->c, g->dw, g->b, g->a, g->w, g->f0, g->T, G_NH, G_HD, G_PA, G_QD, 1);
}
static void g_knorm_fwd(const GlueBufs *g) { /* k_norm: into [k|v] rows */
    cuda_rmsnorm_forward(g->b, g->f0, GB(g->a, 2 * G_QD), g->w, g->T, G_NKV, G_HD, G_PA, 2 * G_KVD, 1e-6f, 1);
}
static void g_knorm_bwd(const GlueBufs *g) {
    cuda_rmsnorm_backward(GB(g->c, 2 * G_QD), g->dw, g->b, GB(g->a, 2 * G_QD), g->w, g->f0, g->T, G_NKV, G_HD, G_PA,
                          2 * G_KVD, 1);
}
static void g_swiglu_fwd(const GlueBufs *g) { cuda_swiglu_forward(g->b, g->a, g->T, G_I); }
static void g_swiglu_bwd(const GlueBufs *g) { /* with out, as the MLP's backward calls it */
    cuda_swiglu_backward(g->c, g->d, g->b, g->a, g->T, G_I);
}
static void g_conv_split_fwd(const GlueBufs *g) { /* the conv and the GDN split in one pass: no conv output */
    cuda_gdn_conv_split_forward(g->b, g->f0, g->c, g->d, g->a, g->halo, g->w, g->doc_pos, g->T, G_NK, G_DK, G_VD, G_KC,
                                G_PG);
}
static void g_conv_split_bwd(const GlueBufs *g) {
    cuda_gdn_conv_split_backward(g->c, g->dhalo, g->dw, g->e, g->b, g->f0, g->d, GB(g->d, (int64_t)g->T * G_VD), g->a,
                                 g->halo, g->w, g->doc_pos, g->T, G_NK, G_DK, G_VD, G_KC, G_PG);
}
static void g_gated_fwd(const GlueBufs *g) {
    cuda_gated_rmsnorm_forward(g->b, g->f0, g->a, g->c, g->w, g->T, G_NV, G_DV, G_VD, 1e-6f);
}
static void g_gated_bwd(const GlueBufs *g) {
    cuda_gated_rmsnorm_backward(g->d, g->e, g->dw, g->b, g->a, g->c, g->w, g->f0, g->T, G_NV, G_DV, G_VD);
}
static void g_sgate_fwd(const GlueBufs *g) { cuda_sigmoid_gate_forward(g->b, g->a, g->c, g->T, G_QD, G_QD); }
static void g_sgate_bwd(const GlueBufs *g) { cuda_sigmoid_gate_backward(g->d, g->e, g->b, g->a, g->c, g->T, G_QD, G_QD); }
static void g_gates_fwd(const GlueBufs *g) {
    cuda_gdn_gates_forward(g->f0, g->f1, GB(g->a, G_CC + G_VD), GB(g->a, G_CC + G_VD + G_NV), g->A_log, g->dt_bias,
                           g->T, G_NV, G_PG);
}
static void g_gates_bwd(const GlueBufs *g) {
    cuda_gdn_gates_backward(GB(g->c, G_CC + G_VD), GB(g->c, G_CC + G_VD + G_NV), g->dw, g->dw + G_NV, g->f0, g->f1,
                            GB(g->a, G_CC + G_VD), GB(g->a, G_CC + G_VD + G_NV), g->A_log, g->dt_bias, g->T, G_NV, G_PG);
}
static void g_copy_gate(const GlueBufs *g) { /* d_gate into d_proj's gate columns */
    cuda_copy_2d(GB(g->c, G_QD), g->b, g->T, G_QD, G_PA, G_QD);
}
static void g_copy_v(const GlueBufs *g) { /* v beside k */
    cuda_copy_2d(GB(g->b, G_KVD), GB(g->a, 2 * G_QD + G_KVD), g->T, G_KVD, 2 * G_KVD, G_PA);
}

static const GlueCase glue_cases[] = {
    {"conv1d_silu_forward", (double)G_CC * 4 + 4, g_conv_fwd},
    {"conv1d_silu_backward", (double)G_CC * 6 + 4, g_conv_bwd},
    {"rmsnorm_forward H", (double)G_H * 4 + 4, g_rms_fwd},
    {"rmsnorm_backward H", (double)G_H * 8 + 4, g_rms_bwd},
    {"rmsnorm_forward q_norm", (double)G_QD * 4 + 4 * G_NH, g_qnorm_fwd},
    {"rmsnorm_backward q_norm", (double)G_QD * 8 + 4 * G_NH, g_qnorm_bwd},
    {"rmsnorm_forward k_norm", (double)G_KVD * 4 + 4 * G_NKV, g_knorm_fwd},
    {"rmsnorm_backward k_norm", (double)G_KVD * 8 + 4 * G_NKV, g_knorm_bwd},
    {"swiglu_forward", (double)G_I * 6, g_swiglu_fwd},
    {"swiglu_backward", (double)G_I * 12, g_swiglu_bwd},
    /* the conv + SiLU with the GDN split (L2 norm of q, k; v, z copies) in one pass: read proj's q|k|v|z, write
     * qk, rstd, v, z */
    {"gdn_conv_split_forward", (double)(G_CC + G_VD) * 4 + 4 * 2 * G_NK + 4, g_conv_split_fwd, 1},
    /* its backward: read proj's q|k|v, dqk, qk, rstd, dv, dz; write dproj's q|k|v|z */
    {"gdn_conv_split_backward", (double)(G_CC + 4 * G_KD + 2 * G_VD + G_CC + G_VD) * 2 + 4 * 2 * G_NK + 4,
     g_conv_split_bwd, 1},
    {"gated_rmsnorm_forward", (double)G_VD * 6 + 4 * G_NV, g_gated_fwd},
    {"gated_rmsnorm_backward", (double)G_VD * 10 + 4 * G_NV, g_gated_bwd},
    {"sigmoid_gate_forward", (double)G_QD * 6, g_sgate_fwd},
    {"sigmoid_gate_backward", (double)G_QD * 10, g_sgate_bwd},
    {"gdn_gates_forward", (double)G_NV * (4 + 8), g_gates_fwd},
    {"gdn_gates_backward", (double)G_NV * (8 + 8 + 4), g_gates_bwd},
    {"copy_2d gate (2048 cols)", (double)G_QD * 4, g_copy_gate},
    {"copy_2d v (256 cols)", (double)G_KVD * 4, g_copy_v},
};

__global__ void glue_fill_kernel(bf16 *x, int64_t n, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t h = (uint64_t)i * 0x9E3779B97F4A7C15ULL + seed;
        h ^= h >> 33;
        h *= 0xff51afd7ed558ccdULL;
        h ^= h >> 33;
        x[i] = __float2bfloat16(((float)(h >> 40) * (1.0f / 16777216.0f)) * 2.0f - 1.0f);
    }
}

__global__ void glue_fill_f32_kernel(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = lo + (hi - lo) * (float)((i * 2654435761u) % 1000u) * 1e-3f;
}

static int glue_cmp(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* median over 5 trials of the mean time of `calls` back-to-back calls, in microseconds */
static float glue_time(const GlueCase *c, const GlueBufs *g, int calls) {
    cudaStream_t st = cuda_stream();
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 2; i++) c->run(g); /* warm-up */
    float t[5];
    for (int k = 0; k < 5; k++) {
        CUDA_CHECK(cudaEventRecord(e0, st));
        for (int i = 0; i < calls; i++) c->run(g);
        CUDA_CHECK(cudaEventRecord(e1, st));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        t[k] = ms * 1000.0f / calls;
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    qsort(t, 5, sizeof t[0], glue_cmp);
    return t[2];
}

void bk_glue_timing(void) {
    const int64_t Tmax = 131072, R = 8384;
    cudaStream_t st = cuda_stream();
    cuda_scratch_reserve((size_t)256 << 20);
    GlueBufs g = {};
    bf16 **big[] = {&g.a, &g.b, &g.c, &g.d, &g.e};
    for (int i = 0; i < 5; i++) {
        *big[i] = (bf16 *)bk_dev_alloc((size_t)Tmax * G_PG * 2);
        glue_fill_kernel<<<4096, 256, 0, st>>>(*big[i], Tmax * G_PG, 17u * (i + 1));
    }
    g.f0 = (float *)bk_dev_alloc((size_t)Tmax * 64 * 4);
    g.f1 = (float *)bk_dev_alloc((size_t)Tmax * 64 * 4);
    glue_fill_f32_kernel<<<4096, 256, 0, st>>>(g.f0, Tmax * 64, 0.5f, 1.5f);
    glue_fill_f32_kernel<<<4096, 256, 0, st>>>(g.f1, Tmax * 64, -0.5f, 0.5f);
    g.dw = (float *)bk_dev_alloc((size_t)G_CC * G_KC * 4);
    glue_fill_f32_kernel<<<64, 256, 0, st>>>(g.dw, G_CC * G_KC, 0.0f, 0.0f);
    g.w = (bf16 *)bk_dev_alloc((size_t)G_CC * G_KC * 2);
    glue_fill_kernel<<<64, 256, 0, st>>>(g.w, G_CC * G_KC, 99);
    g.halo = (bf16 *)bk_dev_alloc((size_t)(G_KC - 1) * G_CC * 2);
    glue_fill_kernel<<<64, 256, 0, st>>>(g.halo, (G_KC - 1) * G_CC, 7);
    g.dhalo = (bf16 *)bk_dev_alloc((size_t)(G_KC - 1) * G_CC * 2);
    g.A_log = (float *)bk_dev_alloc(G_NV * 4);
    g.dt_bias = (float *)bk_dev_alloc(G_NV * 4);
    glue_fill_f32_kernel<<<1, 64, 0, st>>>(g.A_log, G_NV, -1.0f, 1.0f);
    glue_fill_f32_kernel<<<1, 64, 0, st>>>(g.dt_bias, G_NV, -1.0f, 1.0f);
    CUDA_LAUNCH_CHECK();
    int32_t *hpos = (int32_t *)bk_host_alloc((size_t)Tmax * 4);
    for (int64_t t = 0; t < Tmax; t++) hpos[t] = (int32_t)(t % 8192);
    g.doc_pos = (int32_t *)bk_upload(hpos, (size_t)Tmax * 4);
    CUDA_CHECK(cudaStreamSynchronize(st));

    printf("glue kernels at the 1B config's shapes (per call: median of 5 trials; bytes = the least a call moves; "
           "%% of %.1f TB/s)\n",
           GLUE_PEAK_GBS / 1000.0);
    const int64_t rows[] = {R, Tmax};
    double sum_us[2] = {0, 0};
    for (int ri = 0; ri < 2; ri++) {
        g.T = rows[ri];
        for (size_t k = 0; k < sizeof glue_cases / sizeof glue_cases[0]; k++) {
            const GlueCase *c = &glue_cases[k];
            const float us = glue_time(c, &g, ri == 0 ? 20 : 4);
            const double bytes = c->bytes_per_row * (double)g.T, gbs = bytes / (us * 1e-6) / 1e9;
            printf("glue %-26s T=%-7lld %9.1f us %9.1f MB %8.1f GB/s %6.1f%%\n", c->name, (long long)g.T, us,
                   bytes / 1e6, gbs, 100.0 * gbs / GLUE_PEAK_GBS);
            if (!c->alternative) sum_us[ri] += us;
        }
        printf("glue sum of the above at T=%lld (the fused GDN conv + split left out): %.1f us\n", (long long)g.T,
               sum_us[ri]);
    }
    g.T = G_KC - 1; /* the conv halo's gradient: the input norm of Kc-1 rows */
    const float f3 = glue_time(&glue_cases[2], &g, 50), b3 = glue_time(&glue_cases[3], &g, 50);
    printf("glue rmsnorm_forward H T=3 %.1f us, rmsnorm_backward H T=3 %.1f us\n", f3, b3);
    bk_dev_free_all();
}
