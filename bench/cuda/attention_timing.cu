/*
 * attention_timing.cu — one-GPU timings of our block attention kernels (kernels/cuda/attention/) for
 * experiments: forward and backward of one call, the median of a few runs after a warm-up, inputs drawn
 * on the device in (-1, 1), one document, causal by position. Modes of `build/bench_kernels attn MODE`:
 *   all    32k at hd 128 (MHA, GQA 16/4, 16/2), hd 256 (16/2), hd 64; 128k at hd 128 (MHA, 16/4), hd 256
 *   32k    32k hd 128 MHA and GQA 16/2, hd 64 (seven runs each)
 *   hd256  32k hd 256 MHA and GQA 16/2
 *   128k   128k hd 128 MHA and GQA 16/2
 *   ring2  the calls of the cp 2 ring at 128k (hd 128, MHA and 16/2), one GPU standing in for both ranks:
 *          the ring's CP efficiency from the kernel calls alone, without communication
 *   dense  dense rectangles of the ring's sizes: a last partial wave of CTAs against whole waves
 * TFLOP/s count a causal call as half the square; the backward at 2.5x the forward's FLOPs.
 *
 * Caller: bench/cuda/bench_kernels.cu (main).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench_kernels.h"
#include "cuda_common.h"
#include "cuda_kernels.h"

static __global__ void attn_timing_fill_kernel(bf16 *x, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        x[i] = __float2bfloat16(((float)(h & 0xffff) + 0.5f) / 32768.0f - 1.0f); /* (-1, 1), never 0 */
    }
}

/* median of `reps` timed calls (after one warm-up) of the forward and of the backward of one call: Tq queries at
 * positions pos_q against Tk keys at pos_k (host arrays), causal by position, one document; *f, *b in ms */
static void attn_timing_call(float *f, float *b, int Tq, int Tk, const int32_t *pos_q, const int32_t *pos_k, int nh,
                         int nkv, int hd, int reps) {
    const int ldq = nh * hd, ldk = 2 * nkv * hd, ldo = nh * hd;
    bf16 *q = (bf16 *)bk_dev_alloc((size_t)Tq * ldq * 2), *kv = (bf16 *)bk_dev_alloc((size_t)Tk * ldk * 2);
    bf16 *out = (bf16 *)bk_dev_alloc((size_t)Tq * ldo * 2), *dout = (bf16 *)bk_dev_alloc((size_t)Tq * ldo * 2);
    float *lse = (float *)bk_dev_alloc((size_t)Tq * nh * 4);
    float *dq = (float *)bk_dev_alloc((size_t)Tq * ldq * 4), *dkv = (float *)bk_dev_alloc((size_t)Tk * ldk * 4);
    const int32_t *d_pq = (const int32_t *)bk_upload(pos_q, (size_t)Tq * 4);
    const int32_t *d_pk = (const int32_t *)bk_upload(pos_k, (size_t)Tk * 4);
    attn_timing_fill_kernel<<<1024, 256, 0, cuda_stream()>>>(q, (int64_t)Tq * ldq, 1);
    attn_timing_fill_kernel<<<1024, 256, 0, cuda_stream()>>>(kv, (int64_t)Tk * ldk, 2);
    attn_timing_fill_kernel<<<1024, 256, 0, cuda_stream()>>>(dout, (int64_t)Tq * ldo, 3);
    CUDA_CHECK(cudaMemsetAsync(dq, 0, (size_t)Tq * ldq * 4, cuda_stream()));
    CUDA_CHECK(cudaMemsetAsync(dkv, 0, (size_t)Tk * ldk * 4, cuda_stream()));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float ms[2][16]; /* fwd, bwd */
    if (reps > 16) reps = 16;
    for (int which = 0; which < 2; which++) {
        for (int it = -1; it < reps; it++) { /* it = -1: warm-up */
            CUDA_CHECK(cudaEventRecord(e0, cuda_stream()));
            if (which == 0) /* doc_pos = pos: one document starting at position 0 */
                cuda_attention_forward(out, lse, q, kv, kv + nkv * hd, d_pq, d_pq, d_pk, d_pk, NULL, Tq, Tk, nh, nkv,
                                       hd, ldq, ldk, ldo, 1);
            else
                cuda_attention_backward(dq, dkv, dkv + nkv * hd, dout, out, lse, q, kv, kv + nkv * hd, d_pq, d_pq,
                                        d_pk, d_pk, NULL, Tq, Tk, nh, nkv, hd, ldq, ldk, ldo, 1);
            CUDA_CHECK(cudaEventRecord(e1, cuda_stream()));
            CUDA_CHECK(cudaEventSynchronize(e1));
            if (it >= 0) CUDA_CHECK(cudaEventElapsedTime(&ms[which][it], e0, e1));
        }
    }
    *f = bk_median(ms[0], reps), *b = bk_median(ms[1], reps);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    bk_dev_free_all();
}

/* the forward and backward of a causal call over one document of T tokens */
static void attn_timing_causal(int T, int nh, int nkv, int hd, int reps) {
    int32_t *pos = (int32_t *)bk_host_alloc((size_t)T * 4);
    for (int i = 0; i < T; i++) pos[i] = i;
    float f, b;
    attn_timing_call(&f, &b, T, T, pos, pos, nh, nkv, hd, reps);
    const double fl = 4.0 * T * (double)T / 2 * hd * nh; /* causal counted as half */
    printf("timing T %d nh %d nkv %d hd %d causal, median of %d: fwd %.3f ms (%.0f TFLOP/s); bwd %.3f ms (%.0f "
           "TFLOP/s at 2.5x fwd flops)\n",
           T, nh, nkv, hd, reps, f, fl / f * 1e-9, b, 2.5 * fl / b * 1e-9);
}

/* The calls of the cp 2 ring at T tokens (lib/cp/cp_ring.c, one call per step: the box around the zigzag rule's
 * calls; one document) on this one GPU: rank r holds fragments r and 3 - r of T/4 tokens; step 0 is its own block
 * (causal by position), step 1 the dense rectangle against the other rank's rows: fragment 3 against 1 and 2 on
 * rank 0 (T/4 x T/2), fragments 1 and 2 against 0 on rank 1 (T/2 x T/4). With a wait at every step (the passed
 * K|V order) the ring's time is the slower rank's per step; with the kept K|V (cp 2's default) nothing waits
 * between a rank's steps and the slower rank's whole pass counts. Beside the one-GPU call, its CP efficiency
 * without communication: one GPU / (2 x the ring). */
static void attn_timing_ring2(int T, int nh, int nkv, int hd, int reps) {
    const int n = T / 4, R = 2 * n;
    int32_t *pos[2];
    for (int r = 0; r < 2; r++) {
        pos[r] = (int32_t *)bk_host_alloc((size_t)R * 4);
        for (int i = 0; i < n; i++) pos[r][i] = r * n + i, pos[r][n + i] = (3 - r) * n + i;
    }
    float one_f, one_b, f[2][2], b[2][2]; /* [step][rank] */
    int32_t *all = (int32_t *)bk_host_alloc((size_t)T * 4);
    for (int i = 0; i < T; i++) all[i] = i;
    attn_timing_call(&one_f, &one_b, T, T, all, all, nh, nkv, hd, reps);
    for (int r = 0; r < 2; r++) attn_timing_call(&f[0][r], &b[0][r], R, R, pos[r], pos[r], nh, nkv, hd, reps);
    attn_timing_call(&f[1][0], &b[1][0], n, R, pos[0] + n, pos[1], nh, nkv, hd, reps); /* fragment 3 x (1, 2) */
    attn_timing_call(&f[1][1], &b[1][1], R, n, pos[1], pos[0], nh, nkv, hd, reps);     /* (1, 2) x fragment 0 */
    const float rf = fmaxf(f[0][0], f[0][1]) + fmaxf(f[1][0], f[1][1]);
    const float rb = fmaxf(b[0][0], b[0][1]) + fmaxf(b[1][0], b[1][1]);
    /* at cp 2 with the kept K|V no step waits for the other rank's step: the slower rank's whole pass counts */
    const float rank_fb = fmaxf(f[0][0] + f[1][0] + b[0][0] + b[1][0], f[0][1] + f[1][1] + b[0][1] + b[1][1]);
    printf("ring2 T %d nh %d nkv %d hd %d, median of %d, ms fwd / bwd: one GPU %.3f / %.3f; own block rank 0 %.3f / "
           "%.3f, rank 1 %.3f / %.3f; rectangle rank 0 %.3f / %.3f, rank 1 %.3f / %.3f; ring %.3f / %.3f: efficiency "
           "fwd %.2f%%, bwd %.2f%%, f+b %.2f%% with a wait at every step, %.2f%% without (rectangle f+b over a "
           "quarter of one GPU's: %.2f%%)\n",
           T, nh, nkv, hd, reps, one_f, one_b, f[0][0], b[0][0], f[0][1], b[0][1], f[1][0], b[1][0], f[1][1], b[1][1],
           rf, rb, 100 * one_f / (2 * rf), 100 * one_b / (2 * rb), 100 * (one_f + one_b) / (2 * (rf + rb)),
           100 * (one_f + one_b) / (2 * rank_fb),
           100 * (fmaxf(f[1][0], f[1][1]) + fmaxf(b[1][0], b[1][1])) / ((one_f + one_b) / 4) - 100);
}

/* dense rectangles (every key before every query, one document) of Tq x Tk at sizes around the cp 2 ring's, the
 * time per query-key pair: whether a launch's last partial wave (1 CTA per SM; the forward has nh x Tq/128 CTAs,
 * the backward nh x Tk/128) shows */
static void attn_timing_dense(int Tq, int Tk, int nh, int nkv, int hd, int reps) {
    int32_t *pq = (int32_t *)bk_host_alloc((size_t)Tq * 4), *pk = (int32_t *)bk_host_alloc((size_t)Tk * 4);
    for (int i = 0; i < Tk; i++) pk[i] = i;
    for (int i = 0; i < Tq; i++) pq[i] = Tk + i;
    float f, b;
    attn_timing_call(&f, &b, Tq, Tk, pq, pk, nh, nkv, hd, reps);
    const double pairs = (double)Tq * Tk;
    printf("dense Tq %d Tk %d nh %d nkv %d hd %d, median of %d: fwd %.3f ms (%d CTAs, %.3f ps per pair); bwd %.3f ms "
           "(%d CTAs, %.3f ps per pair)\n", Tq, Tk, nh, nkv, hd, reps, f, nh * ((Tq + 127) / 128), f / pairs * 1e9, b,
           nh * ((Tk + 127) / 128), b / pairs * 1e9);
}

int bk_attention_timing(const char *mode) {
    if (!strcmp(mode, "32k")) { /* 32k hd 128 and 64, seven runs each */
        attn_timing_causal(32768, 16, 16, 128, 7);
        attn_timing_causal(32768, 16, 2, 128, 7);
        attn_timing_causal(32768, 16, 16, 64, 7);
    } else if (!strcmp(mode, "128k")) { /* 128k hd 128: MHA and GQA 16/2, three runs each */
        attn_timing_causal(131072, 16, 16, 128, 3);
        attn_timing_causal(131072, 16, 2, 128, 3);
    } else if (!strcmp(mode, "ring2")) { /* the cp 2 ring's calls at 128k, hd 128, MHA and GQA 16/2, 5 runs */
        attn_timing_ring2(131072, 16, 16, 128, 5);
        attn_timing_ring2(131072, 16, 2, 128, 5);
    } else if (!strcmp(mode, "dense")) { /* dense rectangles: 31.03 against whole waves on 132 SMs */
        const int sizes[][2] = {{32768, 65536}, {33792, 65536}, {32768, 67584}, {65536, 32768}, {65536, 33792},
                                {32768, 65536}, {65536, 32768}};
        for (int i = 0; i < 7; i++) attn_timing_dense(sizes[i][0], sizes[i][1], 16, 2, 128, 5);
    } else if (!strcmp(mode, "hd256")) { /* hd 256 only: 32k MHA and GQA 16/2, three runs each */
        attn_timing_causal(32768, 16, 16, 256, 3);
        attn_timing_causal(32768, 16, 2, 256, 3);
    } else if (!strcmp(mode, "all")) {
        attn_timing_causal(32768, 16, 16, 128, 5);
        attn_timing_causal(32768, 16, 4, 128, 5);
        attn_timing_causal(32768, 16, 2, 128, 5);
        attn_timing_causal(32768, 16, 2, 256, 5);
        attn_timing_causal(32768, 16, 16, 64, 5);
        attn_timing_causal(131072, 16, 16, 128, 3);
        attn_timing_causal(131072, 16, 4, 128, 3);
        attn_timing_causal(131072, 16, 2, 256, 3);
    } else {
        return 1;
    }
    return 0;
}
