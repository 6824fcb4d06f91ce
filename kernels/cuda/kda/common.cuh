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
 */
#pragma once

#define KDA_C 64           /* chunk size (the cpu oracle's) */
#define KDA_THREADS 256    /* every kernel of kda/ except the index */
#define KDA_LDT (KDA_C + 1) /* row stride of the 64 x 64 fp32 tiles */
#define KDA_FULL 0xffffffffu
#define KDA_DEV __device__ __forceinline__

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

/* rows [0, 64) x width of a bf16 matrix (row r at src + r ld) into shared memory (row stride lds elements);
 * rows >= L read 0. 16-byte cp.async copies where src, ld, lds and width allow them (every row's copies 16-byte
 * aligned), else plain loads (the same bytes either way). Asynchronous: the caller runs kda_load_wait (kda_load_G
 * does) before the barrier after which the tile is read. All threads. */
KDA_DEV void kda_load_bf16(bf16 *s, int lds, const bf16 *src, int64_t ld, int width, int L) {
    if ((((uintptr_t)src | (uintptr_t)s) & 15) == 0 && ((ld | lds | width) & 7) == 0) {
        const int cpr = width / 8; /* copies per row */
        for (int i = threadIdx.x; i < KDA_C * cpr; i += KDA_THREADS) {
            const int r = i / cpr, c = (i % cpr) * 8;
            ptx_cp_async16(s + r * lds + c, r < L ? src + (int64_t)r * ld + c : src, r < L);
        }
        return;
    }
    for (int i = threadIdx.x; i < KDA_C * width; i += KDA_THREADS) {
        const int r = i / width, c = i % width;
        s[r * lds + c] = r < L ? src[(int64_t)r * ld + c] : __float2bfloat16(0.0f);
    }
}

/* the end of a chunk's asynchronous loads (kda_load_bf16's, kda_load_G's): this thread's copies have landed; a
 * barrier after it makes every thread's visible */
KDA_DEV void kda_load_wait(void) {
    ptx_cp_async_commit();
    ptx_cp_async_wait<0>();
}

/* rows [0, 64) x width of an fp32 matrix (row r at src + r ld) into shared memory (row stride lds); rows >= L
 * read 0 */
KDA_DEV void kda_load_f32(float *s, int lds, const float *src, int64_t ld, int width, int L) {
    for (int i = threadIdx.x; i < KDA_C * width; i += KDA_THREADS) {
        const int r = i / width, c = i % width;
        s[r * lds + c] = r < L ? src[(int64_t)r * ld + c] : 0.0f;
    }
}

/* the chunk's per-channel cumulative log gate: sG[r][a] = g_0[a] + ... + g_r[a] (summed in double, stored fp32),
 * rows >= L repeat row L - 1 (so every exponent formed from sG stays <= 0). g of value head h: row t at
 * g + (t nv + h) dk. The rows are loaded by every thread (16-byte cp.async copies where g and ldg allow, else
 * plain loads; in flight with the caller's kda_load_bf16 copies issued before, which this waits for too), then
 * threads a < dk sum one channel each, the column read into registers first (the loads issued together, not one
 * after each store). All threads; the caller synchronises before reading sG. */
KDA_DEV void kda_load_G(float *sG, int ldg, const float *g, int64_t t0, int L, int h, int nv, int dk) {
    if ((((uintptr_t)g | (uintptr_t)sG) & 15) == 0 && ((ldg | dk) & 3) == 0) {
        const int cpr = dk / 4;
        for (int i = threadIdx.x; i < KDA_C * cpr; i += KDA_THREADS) {
            const int r = i / cpr, a = (i % cpr) * 4;
            ptx_cp_async16(sG + r * ldg + a, r < L ? g + ((t0 + r) * nv + h) * (int64_t)dk + a : g, r < L);
        }
    } else {
        for (int i = threadIdx.x; i < KDA_C * dk; i += KDA_THREADS) {
            const int r = i / dk, a = i % dk;
            sG[r * ldg + a] = r < L ? g[((t0 + r) * nv + h) * (int64_t)dk + a] : 0.0f;
        }
    }
    kda_load_wait();
    __syncthreads();
    const int a = threadIdx.x;
    if (a >= dk) return;
    float x[KDA_C];
#pragma unroll
    for (int r = 0; r < KDA_C; r++) x[r] = sG[r * ldg + a];
    double acc = 0.0;
#pragma unroll
    for (int r = 0; r < KDA_C; r++) { /* rows >= L hold 0: the sum stays G_{L-1} */
        acc += (double)x[r];
        sG[r * ldg + a] = (float)acc;
    }
}

/* a 64 x 64 fp32 tile of a (T, nv, 64) buffer (tinv, qk): rows < L of the chunk, 0 below */
KDA_DEV void kda_load_tile(float *s, const float *src, int64_t t0, int L, int h, int nv) {
    for (int i = threadIdx.x; i < KDA_C * KDA_C; i += KDA_THREADS) {
        const int r = i / KDA_C, c = i % KDA_C;
        s[r * KDA_LDT + c] = r < L ? src[((t0 + r) * nv + h) * (int64_t)KDA_C + c] : 0.0f;
    }
}

/* sum over the 32 lanes, a fixed butterfly (the same bits every run) */
KDA_DEV float kda_warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(KDA_FULL, x, o);
    return x;
}
