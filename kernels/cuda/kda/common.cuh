/*
 * common.cuh — what every Kimi Delta Attention kernel shares (kernels/cuda/kda/): the chunk size and block
 * shape, the shared-memory carving (the same code on host and device), the chunk of an index entry, and the
 * per-chunk loads (bf16 rows into shared memory, the per-channel gate cumsum). Part of the one translation unit
 * kda.cu; not standalone.
 *
 * Shapes every kernel takes: T tokens, nk key heads and nv value heads (nv a multiple of nk; value head h reads key
 * head h / (nv / nk)), dk = dv in {64, 128} (kda.cu refuses others); q, k (T, ldq) and v (T, ldv) bf16, g (T, nv, dk)
 * and beta (T, nv) fp32. Per-chunk kernels run one 256-thread block per (chunk, value head): blockIdx.y is the value
 * head, blockIdx.x strides over the chunks of the index (the count is on the device).
 *
 * Precision (GDN's kind, kernels/cuda/gdn/): the products run on tensor cores, cuda_gdn_mma.h's gdn_warp_mma
 * (mma.sync m16n8k16, bf16 operands from shared memory, fp32 accumulation), one MMA per product; an operand the
 * kernels form in fp32 (Tinv diag(beta), the decay-scaled keys and queries, W, dec * K, the state and its
 * gradient, vn, dvn, QK, dP, dT, M1, dA, dW) is rounded to bf16 once (2^-9 relative) where it enters a product
 * (vn, dvn, QK and the chunk states hs, dhs where they are stored; grad_dense's row dots S_a . D_a, the one reader
 * of hs, dhs that is no MMA, take the stored bf16 values with fp32 products and sum);
 * one exception, the decay-scaled rows of the gradients' pair sums (grads.cuh's kda_pair_rows: split hi + lo, two
 * MMAs; its comment says why).
 * fp32 stays where the algebra is ill-conditioned or a sum is long: the solve for Tinv (prep.cuh), the states
 * carried in fp32 registers across chunks, the gate cumsum G (summed in double), every exponent and the 16 x 16
 * diagonal blocks of the pair sums (CUDA cores), the row sums of dbeta and dL/dG. test_cuda_kda.cu bounds every
 * tensor at GDN's 1e-2.
 */
#pragma once

#define KDA_C 64           /* chunk size (the cpu oracle's) */
#define KDA_THREADS 256    /* every kernel of kda/ except the index */
#define KDA_LDT (KDA_C + 1) /* row stride of the 64 x 64 fp32 tiles */
#define KDA_FULL 0xffffffffu
#define KDA_DEV __device__ __forceinline__

/* launch bounds: __launch_bounds__(KDA_THREADS, n) promises n blocks per SM, which sets ptxas's register budget
 * (65536 / (256 n) a thread): 1 where the kernel's shared memory (or its grid: the state passes fill one wave) leaves
 * room for one block per SM anyway, so the registers cost no occupancy and ptxas need not spill or recompute to stay
 * within 128 (grad_wy and the state passes); 2 where two blocks fit (output, grad_dense, prep, qk and grad_qk,
 * with bf16 tiles and their smaller carvings): 128 registers; 3 for wu (66 KB at 128): 80 registers.
 * `-Xptxas -v` shows no spill in any of them. */

/* x0, x1 to dst[0], dst[1] in one 4-byte store (dst 4-byte aligned: an even column of an even-width row; an MMA
 * accumulator's elements e, e + 1 are such a pair) */
KDA_DEV void kda_st_bf16x2(bf16 *dst, bf16 x0, bf16 x1) {
    const bf16 pair[2] = {x0, x1};
    uint32_t u;
    memcpy(&u, pair, sizeof u);
    *(uint32_t *)dst = u;
}

/* shared-memory carving: the same offsets on host (sizes) and device (pointers), 16-byte aligned pieces */
struct KdaCarve {
    unsigned char *base;
    size_t off;
    __host__ __device__ explicit KdaCarve(void *b) : base((unsigned char *)b), off(0) {}
    template <class X> __host__ __device__ X *take(size_t n) {
        X *r = (X *)(base + off);
        off += (n * sizeof(X) + 15) & ~(size_t)15;
        return r;
    }
};

/* one chunk of the index: rows [t0, t0 + L); reset: its first token starts a document (the state entering it is
 * 0); leaves: a state leaves it (the call ends with it or the next chunk continues its document), so the
 * gradient arriving at its final state may be nonzero; slot: where its state (entering, when !reset) and its
 * state gradient (leaving, when leaves) live in the (ns, nv, dk, dv) buffers, t0 / 64 (unique among the chunks
 * that store one: kda.cu's header) */
struct KdaChunk {
    int64_t t0;
    int L, reset, leaves;
    int64_t slot;
};

KDA_DEV KdaChunk kda_chunk(const int32_t *starts, const int32_t *doc_pos, int c, int64_t T) {
    KdaChunk k;
    k.t0 = starts[c];
    const int64_t t1 = starts[c + 1];
    k.L = (int)(t1 - k.t0);
    k.reset = doc_pos[k.t0] == 0;
    k.leaves = t1 == T || doc_pos[t1] != 0;
    k.slot = k.t0 / KDA_C;
    return k;
}

/* x = hi + lo, both bf16 (~16 significant bits together): the one operand kept split, grads.cuh's kda_pair_rows'
 * scaled rows (its comment says why) */
KDA_DEV void kda_split(float x, bf16 *hi, bf16 *lo) {
    const bf16 h = __float2bfloat16(x);
    *hi = h;
    *lo = __float2bfloat16(x - __bfloat162float(h));
}

/* the 16-byte loads from global memory a thread keeps in flight together (kda_load_bf16, kda_load_rows_f32): each
 * batch issued before any of it is stored, so a tile costs one memory latency per batch, not one per element.
 * (A wider batch, 16 float4 a thread, served grad_dense and output while they ran one block per SM; with bf16
 * tiles two of their blocks share an SM and hide each other's latency. grad_wy and grad_qk, near 255 registers,
 * ran slower with it.) */
#define KDA_BATCH 4

/* rows [0, 64) x width of a bf16 matrix (row r at src + r ld) into shared memory (row stride lds elements);
 * rows >= L read 0. Where src and ld allow 16-byte loads (every row 16-byte aligned): with lds a multiple of 8,
 * 16-byte cp.async copies (asynchronous: the caller runs kda_load_wait, or kda_load_G which does, before the
 * barrier after which the tile is read); with lds even, 16-byte loads into registers, KDA_BATCH per thread in
 * flight together, stored as 4-byte words. Else plain loads. The same bytes every way. All threads. */
KDA_DEV void kda_load_bf16(bf16 *s, int lds, const bf16 *src, int64_t ld, int width, int L) {
    const bool src16 = (((uintptr_t)src | (uintptr_t)s) & 15) == 0 && ((ld | width) & 7) == 0;
    const int cpr = width / 8, n = KDA_C * cpr; /* 16-byte pieces per row, in all */
    if (src16 && (lds & 7) == 0) {
        for (int i = threadIdx.x; i < n; i += KDA_THREADS) {
            const int r = i / cpr, c = (i % cpr) * 8;
            ptx_cp_async16(s + r * lds + c, r < L ? src + (int64_t)r * ld + c : src, r < L);
        }
        return;
    }
    if (src16 && (lds & 1) == 0) {
        for (int i0 = threadIdx.x; i0 < n; i0 += KDA_BATCH * KDA_THREADS) {
            uint4 v[KDA_BATCH];
#pragma unroll
            for (int u = 0; u < KDA_BATCH; u++) {
                const int i = i0 + u * KDA_THREADS, r = i / cpr, c = (i % cpr) * 8;
                v[u] = make_uint4(0u, 0u, 0u, 0u);
                if (i < n && r < L) v[u] = *(const uint4 *)(src + (int64_t)r * ld + c);
            }
#pragma unroll
            for (int u = 0; u < KDA_BATCH; u++) {
                const int i = i0 + u * KDA_THREADS, r = i / cpr, c = (i % cpr) * 8;
                if (i < n) {
                    uint32_t *d = (uint32_t *)(s + r * lds + c);
                    d[0] = v[u].x;
                    d[1] = v[u].y;
                    d[2] = v[u].z;
                    d[3] = v[u].w;
                }
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < KDA_C * width; i += KDA_THREADS) {
        const int r = i / width, c = i % width;
        s[r * lds + c] = r < L ? src[(int64_t)r * ld + c] : __float2bfloat16(0.0f);
    }
}

/* rows [0, R) x width of an fp32 matrix (row r at src + r ld; rows >= L, or all when src is NULL, read 0) into
 * shared memory: rounded once to bf16 (an operand of the tensor-core products) into b (row stride lds) when f is
 * NULL, else fp32 into f (row stride lds). 16-byte loads, NB per thread in flight together, where src and ld
 * allow; else plain loads.
 * The same values every way. All threads; the caller synchronises. */
template <int NB = KDA_BATCH>
KDA_DEV void kda_load_rows_f32(bf16 *b, float *f, int lds, const float *src, int64_t ld, int R, int width,
                               int L) {
    const int cpr = width / 4, n = R * cpr;
    if (((uintptr_t)src & 15) == 0 && ((ld | width) & 3) == 0) {
        for (int i0 = threadIdx.x; i0 < n; i0 += NB * KDA_THREADS) {
            float4 v[NB];
#pragma unroll
            for (int u = 0; u < NB; u++) {
                const int i = i0 + u * KDA_THREADS, r = i / cpr, c = (i % cpr) * 4;
                v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (src && i < n && r < L) v[u] = *(const float4 *)(src + (int64_t)r * ld + c);
            }
#pragma unroll
            for (int u = 0; u < NB; u++) {
                const int i = i0 + u * KDA_THREADS, r = i / cpr, c = (i % cpr) * 4;
                if (i < n) {
                    const float x[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if (f) f[r * lds + c + e] = x[e];
                        else b[r * lds + c + e] = __float2bfloat16(x[e]);
                    }
                }
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < R * width; i += KDA_THREADS) {
        const int r = i / width, c = i % width;
        const float x = src && r < L ? src[(int64_t)r * ld + c] : 0.0f;
        if (f) f[r * lds + c] = x;
        else b[r * lds + c] = __float2bfloat16(x);
    }
}

/* the end of a chunk's asynchronous loads (kda_load_bf16's, kda_load_G's): this thread's copies have landed; a
 * barrier after it makes every thread's visible */
KDA_DEV void kda_load_wait(void) {
    ptx_cp_async_commit();
    ptx_cp_async_wait<0>();
}

/* the chunk's per-channel cumulative log gate: sG[r][a] = g_0[a] + ... + g_r[a] (summed in double, stored fp32),
 * rows >= L repeat row L - 1 (so every exponent formed from sG stays <= 0). g of value head h: row t at
 * g + (t nv + h) dk; the channels [c0, c0 + w) into sG's columns [0, w). kda_load_G_start loads the rows (16-byte
 * cp.async copies where g and ldg allow, in flight with
 * the caller's kda_load_bf16 copies; else kda_load_rows_f32), kda_load_G_sum waits for them (and for the caller's
 * copies issued before), then threads a < w sum one channel each, the column read into registers first (the loads
 * issued together, not one after each store). A caller may issue other loads between the two (they land while
 * g does). kda_load_G: both, all dk channels. All threads; the caller synchronises before reading sG. */
KDA_DEV void kda_load_G_start(float *sG, int ldg, const float *g, int64_t t0, int L, int h, int nv, int dk, int c0,
                              int w) {
    const float *gc = g + c0;
    if ((((uintptr_t)gc | (uintptr_t)sG) & 15) == 0 && ((ldg | dk | w) & 3) == 0) {
        const int cpr = w / 4;
        for (int i = threadIdx.x; i < KDA_C * cpr; i += KDA_THREADS) {
            const int r = i / cpr, a = (i % cpr) * 4;
            ptx_cp_async16(sG + r * ldg + a, r < L ? gc + ((t0 + r) * nv + h) * (int64_t)dk + a : gc, r < L);
        }
    } else {
        kda_load_rows_f32(NULL, sG, ldg, gc + (t0 * nv + h) * (int64_t)dk, (int64_t)nv * dk, KDA_C, w, L);
    }
}
template <int NB = KDA_C / 2> KDA_DEV void kda_load_G_sum(float *sG, int ldg, int w) {
    static_assert(KDA_C % NB == 0, "kda_load_G_sum: whole batches");
    constexpr int UNROLL = NB == KDA_C / 2 ? 2 : 1;
    kda_load_wait();
    __syncthreads();
    const int a = threadIdx.x;
    if (a >= w) return;
    double acc = 0.0;
    /* batches of NB loads (32: 32 registers, not 64); NB < 32 (wu, at 80 registers) one batch after the other,
     * the loop not unrolled (unrolled, ptxas hoists every batch's loads); the same adds in the same order */
#pragma unroll(UNROLL)
    for (int r0 = 0; r0 < KDA_C; r0 += NB) {
        float x[NB];
#pragma unroll
        for (int r = 0; r < NB; r++) x[r] = sG[(r0 + r) * ldg + a];
#pragma unroll
        for (int r = 0; r < NB; r++) { /* rows >= L hold 0: the sum stays G_{L-1} */
            acc += (double)x[r];
            sG[(r0 + r) * ldg + a] = (float)acc;
        }
    }
}
KDA_DEV void kda_load_G(float *sG, int ldg, const float *g, int64_t t0, int L, int h, int nv, int dk) {
    kda_load_G_start(sG, ldg, g, t0, L, h, nv, dk, 0, dk);
    kda_load_G_sum(sG, ldg, dk);
}

/* sum over the 32 lanes, a fixed butterfly (the same bits every run) */
KDA_DEV float kda_warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(KDA_FULL, x, o);
    return x;
}
