/*
 * common.cuh — what every GDN kernel shares (kernels/cuda/gdn/): the chunk size and block shape, the
 * chunk-range and index-metadata enums, GdnCarve (shared-memory carving, the same code on host and
 * device) and the device helpers of the per-chunk kernels (tile loads, gate cumsums, A and its
 * triangular solve, the hi + lo bf16 split). Part of the one translation unit gdn.cu; not standalone.
 */
#pragma once

#define GDN_C 64          /* chunk size */
#define GDN_THREADS 128   /* the state passes: 4 warps (prep, dqkwg, wy_bwd, output, dv_local: 8) */
#define GDN_LDP (GDN_C + 8) /* row stride of the 64x64 bf16 tiles */
#define GDN_LDF (GDN_C + 1) /* row stride of the 64x64 fp32 tiles */
#define GDN_LOG2E 1.4426950408889634f
#define GDN_FULL 0xffffffffu

/* which chunks a per-chunk kernel visits */
enum { GDN_RANGE_ALL = 0, GDN_RANGE_FROM_LAST_RESET = 1, GDN_RANGE_BEFORE_FIRST_RESET = 2 };
/* meta (int32) written by the index kernels */
enum { GDN_META_NC = 0, GDN_META_FIRST_RESET = 1, GDN_META_LAST_RESET = 2, GDN_META_FIRST_TOK = 3,
       GDN_META_LAST_TOK = 4, GDN_META_N = 8 };

/* ------------------------------------------------------------------------------------------------ */
/* shared-memory carving, the same code on host (sizes) and device (pointers)                        */

struct GdnCarve {
    unsigned char *base;
    size_t off, align; /* every piece starts at a multiple of align (a power of 2, >= 16) */
    __host__ __device__ explicit GdnCarve(void *b, size_t a = 16) : base((unsigned char *)b), off(0), align(a) {}
    template <class X> __host__ __device__ X *take(size_t n) {
        X *r = (X *)(base + off);
        off += (n * sizeof(X) + align - 1) & ~(align - 1);
        return r;
    }
};

/* ------------------------------------------------------------------------------------------------ */
/* device helpers                                                                                     */

/* [lo, hi) of the chunks a kernel in `mode` visits */
GDN_DEV void gdn_chunk_range(const int32_t *meta, int mode, int *lo, int *hi) {
    *lo = 0;
    *hi = meta[GDN_META_NC];
    if (mode == GDN_RANGE_FROM_LAST_RESET) *lo = meta[GDN_META_LAST_RESET];
    else if (mode == GDN_RANGE_BEFORE_FIRST_RESET) *hi = meta[GDN_META_FIRST_RESET];
}

/* rows [0, ROWS) x WID bf16 of a strided global matrix into shared memory (row stride lds) with
 * cp.async by the block's NT threads; rows >= valid are zero-filled and not read. ROLLED: the loop is not
 * unrolled (unrolled inside a caller's chunk loop, its per-row offsets may be computed once before that loop and
 * held in registers across it: prep, at 64 registers, spilled so) */
template <int ROWS, int WID, int NT = GDN_THREADS, bool ROLLED = false>
GDN_DEV void gdn_load_rows(bf16 *s, int lds, const bf16 *gsrc, int64_t ldg, int valid) {
    constexpr int CPR = WID / 8;
    auto piece = [&](int i) {
        const int r = i / CPR, c = (i % CPR) * 8;
        const bool ok = r < valid;
        ptx_cp_async16(s + r * lds + c, ok ? gsrc + (int64_t)r * ldg + c : gsrc, ok);
    };
    if constexpr (ROLLED) {
#pragma unroll 1
        for (int i = threadIdx.x; i < ROWS * CPR; i += NT) piece(i);
    } else {
        for (int i = threadIdx.x; i < ROWS * CPR; i += NT) piece(i);
    }
}

/* the chunk's stored gate cumsum G2 (T,nv) rows into sG with cp.async; rows >= L read 0 */
GDN_DEV void gdn_load_G(float *sG, const float *G2, int64_t t0, int L, int h, int nv) {
    const int r = threadIdx.x;
    if (r < GDN_C) ptx_cp_async4(sG + r, r < L ? G2 + (t0 + r) * nv + h : G2, r < L);
}

/* gates of one chunk from g, beta: sG[r] = log2(e) sum_{i<=r} g_i (rows >= L repeat G[L-1]), sBeta[r] (0 for
 * rows >= L), by warp 0 (lane: rows lane and lane + 32, each half scanned across the lanes, the second then adding
 * the first's sum) and not synchronised with the other warps: the caller's barrier publishes them */
GDN_DEV void gdn_gates_cumsum(float *sG, float *sBeta, const float *g, const float *beta, int64_t t0, int L, int h,
                              int nv) {
    const int lane = threadIdx.x;
    if (lane >= 32) return;
    /* every load issued before the scans: one global latency */
    float x[2], b[2];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int r = lane + 32 * q;
        b[q] = r < L ? beta[(t0 + r) * nv + h] : 0.0f;
        x[q] = r < L ? g[(t0 + r) * nv + h] * GDN_LOG2E : 0.0f;
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float y0 = __shfl_up_sync(GDN_FULL, x[0], o), y1 = __shfl_up_sync(GDN_FULL, x[1], o);
        if (lane >= o) {
            x[0] += y0;
            x[1] += y1;
        }
    }
    sG[lane] = x[0];
    sBeta[lane] = b[0];
    sBeta[lane + 32] = b[1];
    __syncwarp();
    sG[lane + 32] = x[1] + sG[31];
}

/* A_ij = beta_i (k_i.k_j) e^{G_i - G_j} for j < i < L, else 0 (fp32, stride GDN_LDF), K K^T on the tensor cores.
 * Warp (rows r0, column half ch) of an 8-warp block its 16 x 32 tile; a tile wholly above the diagonal is left
 * unwritten (the solve reads only the entries below the diagonal) */
template <int DK>
GDN_DEV void gdn_build_A(float *sA, const bf16 *sK, const float *sG, const float *sBeta, int L, int r0, int ch) {
    if (r0 + 16 <= 32 * ch) return;
    float acc[1][4][4];
    gdn_zero(acc);
    gdn_warp_mma<1, 4, false, true, DK>(acc, sK, DK + 8, sK, DK + 8, r0, 32 * ch);
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = r0 + gdn_frag_row(e), j = 32 * ch + ni * 8 + gdn_frag_col(e);
            float kkg = 0.0f;
            if (j < i && i < L) kkg = acc[0][ni][e] * exp2f(sG[i] - sG[j]); /* exponent <= 0 */
            sA[i * GDN_LDF + j] = sBeta[i] * kkg;
        }
}

/* Tinv = (I + A)^-1 (unit lower triangular, fp32) into sT (stride GDN_LDF), blocked by 16:
 * the four diagonal blocks by forward substitution (thread = block, column: [i == c] - sum_{j<i}
 * A_ij T_jc), then the blocks below by distance d = i - j from the diagonal:
 * T_ij = -T_ii sum_{k=j}^{i-1} A_ik T_kj (sX: (3,16,17) scratch). A_ik is sA's entry, or with
 * SCALED sB[i] times it (wy_bwd's A = beta_i kkg_ij formed on the fly: the fp32 value gdn_build_A
 * stores, so both give the same Tinv). All NT threads of the block (128 or 256), the blocks below on the first NS
 * of them (128 or 256: each entry is one thread's sum in the same order either way; 128 load each sT entry once for
 * two rows); ends synchronised. */
#define GDN_SOLVE_SCRATCH (3 * 16 * 17)
template <bool SCALED, int NT = GDN_THREADS, int NS = NT>
GDN_DEV void gdn_solve_t(float *sT, float *sX, const float *sA, const float *sB) {
    static_assert(NT == 128 || NT == 256, "gdn_solve_t: the zero blocks split evenly over 128 or 256 threads");
    static_assert((NS == 128 || NS == 256) && NS <= NT, "gdn_solve_t: the distance blocks on 128 or 256 threads");
    const int tid = threadIdx.x;
    /* the 6 blocks above the diagonal are 0; every other entry is written below (no barrier: no one reads these
     * before the ones that end this function) */
#pragma unroll
    for (int m = 0; m < 6 * 256 / NT; m++) {
        const int e = tid + m * NT, b = e >> 8; /* block b: (0,1) (0,2) (0,3) (1,2) (1,3) (2,3) */
        const int bi = b < 3 ? 0 : b < 5 ? 1 : 2, bj = b < 3 ? b + 1 : b < 5 ? b - 1 : 3;
        sT[(16 * bi + ((e >> 4) & 15)) * GDN_LDF + 16 * bj + (e & 15)] = 0.0f;
    }
    if (tid < GDN_C) {
        const int o = 16 * (tid >> 4), c = tid & 15;
        float tc[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            float s = (i == c) ? 1.0f : 0.0f;
            const float bi = SCALED ? sB[o + i] : 1.0f;
#pragma unroll
            for (int j = 0; j < i; j++) {
                const float a = SCALED ? bi * sA[(o + i) * GDN_LDF + o + j] : sA[(o + i) * GDN_LDF + o + j];
                s = fmaf(-a, tc[j], s);
            }
            tc[i] = s;
            sT[(o + i) * GDN_LDF + o + c] = s;
        }
    }
    __syncthreads();
    /* the blocks below by distance d, unrolled, every loop with a constant trip count. Warp w owns columns
     * CPW w .. + CPW - 1 of every block: all that its sums read of sT below the diagonal blocks and of sX, it
     * wrote, so its stages need only warp barriers. A lane's entries are rows r0 + RS i of column cc in each of
     * the 4 - d blocks at distance d, each summed in order over k = 16 bj .. 16 bi - 1, the lane's independent
     * sums interleaved; the rows of a column share each load of its sT (then sX) entries */
    constexpr int CPW = 16 / (NS / 32), RS = 32 / CPW, RPT = 16 / RS; /* columns per warp, row step, rows */
    const int lane = tid & 31, cc = CPW * (tid >> 5) + lane % CPW, r0 = lane / CPW;
#pragma unroll
    for (int d = 1; d < 4 && tid < NS; d++) { /* on the first NS threads, whole warps */
        float xs[3][RPT];
#pragma unroll
        for (int blk = 0; blk < 4 - d; blk++) {
            const int bi = d + blk, bj = blk;
#pragma unroll
            for (int i = 0; i < RPT; i++) xs[blk][i] = 0.0f;
#pragma unroll
            for (int q = 0; q < d; q++) {
                const int kb = bj + q;
                const float *tk = sT + 16 * kb * GDN_LDF + 16 * bj + cc;
#pragma unroll
                for (int u = 0; u < 16; u++) {
                    const float tv = tk[u * GDN_LDF];
#pragma unroll
                    for (int i = 0; i < RPT; i++) {
                        const int r = 16 * bi + r0 + RS * i;
                        const float a = sA[r * GDN_LDF + 16 * kb + u];
                        xs[blk][i] = fmaf(SCALED ? sB[r] * a : a, tv, xs[blk][i]);
                    }
                }
            }
        }
#pragma unroll
        for (int blk = 0; blk < 4 - d; blk++)
#pragma unroll
            for (int i = 0; i < RPT; i++) sX[blk * 272 + (r0 + RS * i) * 17 + cc] = xs[blk][i];
        __syncwarp();
#pragma unroll
        for (int blk = 0; blk < 4 - d; blk++) {
            const int bi = d + blk;
            const float *xb = sX + blk * 272 + cc;
#pragma unroll
            for (int i = 0; i < RPT; i++) xs[blk][i] = 0.0f;
#pragma unroll
            for (int u = 0; u < 16; u++) {
                const float xv = xb[u * 17];
#pragma unroll
                for (int i = 0; i < RPT; i++)
                    xs[blk][i] = fmaf(sT[(16 * bi + r0 + RS * i) * GDN_LDF + 16 * bi + u], xv, xs[blk][i]);
            }
        }
#pragma unroll
        for (int blk = 0; blk < 4 - d; blk++)
#pragma unroll
            for (int i = 0; i < RPT; i++)
                sT[(16 * (d + blk) + r0 + RS * i) * GDN_LDF + 16 * blk + cc] = -xs[blk][i];
        __syncwarp();
    }
    __syncthreads();
}

template <int NT = GDN_THREADS, int NS = NT> GDN_DEV void gdn_solve(float *sT, float *sX, const float *sA) {
    gdn_solve_t<false, NT, NS>(sT, sX, sA, NULL);
}

/* rows [0, valid) x WID elements X of a strided global matrix (row stride ldg) fetched into L2 ahead of their
 * loads: prefetch.global.L2 for each 128-byte line a row touches, a line a thread. ALIGNED: the rows start
 * 128-byte aligned and hold whole lines; else a row may touch one line more than its bytes fill, the first
 * prefetched at the row's own start. Nothing is read into registers, no value changes. All NT threads.
 * ROLLED: as gdn_load_rows'. */
template <class X, int WID, int NT, bool ALIGNED, bool ROLLED = false>
GDN_DEV void gdn_prefetch_rows_l2(const X *gsrc, int64_t ldg, int valid) {
    constexpr int BYTES = WID * (int)sizeof(X);
    static_assert(!ALIGNED || BYTES % 128 == 0, "gdn_prefetch_rows_l2: aligned rows of whole 128-byte lines");
    constexpr int LPR = BYTES / 128 + (ALIGNED ? 0 : 1); /* lines a row may touch */
    auto line = [&](int i) {
        const char *row = (const char *)(gsrc + (int64_t)(i / LPR) * ldg);
        const int j = i % LPR;
        const char *at = ALIGNED ? row + j * 128 : j ? row - ((uintptr_t)row & 127) + j * 128 : row;
        if (ALIGNED || at < row + BYTES) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(at));
    };
    if constexpr (ROLLED) {
#pragma unroll 1
        for (int i = threadIdx.x; i < valid * LPR; i += NT) line(i);
    } else {
        for (int i = threadIdx.x; i < valid * LPR; i += NT) line(i);
    }
}

/* a[b] for b in {0, 1} without indexing a local array at run time (which would put it on the stack) */
template <class X> GDN_DEV X *gdn_pick(X *const (&a)[2], int b) { return b ? a[1] : a[0]; }

GDN_DEV void gdn_split2(bf16 *hi, bf16 *lo, float x0, float x1) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    *(__nv_bfloat162 *)hi = h;
    *(__nv_bfloat162 *)lo = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
}

GDN_DEV void gdn_store2(bf16 *p, float x0, float x1) { *(__nv_bfloat162 *)p = __floats2bfloat162_rn(x0, x1); }

GDN_DEV float2 gdn_load2(const bf16 *p) { return __bfloat1622float2(*(const __nv_bfloat162 *)p); }

/* sum over the 4 lanes of a quad (the threads that share an accumulator row) */
GDN_DEV float gdn_quad_sum(float x) {
    x += __shfl_xor_sync(GDN_FULL, x, 1);
    x += __shfl_xor_sync(GDN_FULL, x, 2);
    return x;
}

