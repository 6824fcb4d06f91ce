/*
 * prep.cuh — the per-chunk WY factors: G (cumsum of g, log2 units), A = strictly lower (beta K K^T) Gam,
 * Tinv = (I + A)^-1 (fp32, 16 x 16 blocks), W = Tinv diag(beta gam) K, U = Tinv diag(beta) V (Tinv split
 * hi + lo bf16), stored bf16, G2 (T,nv) and, asked, Tinv itself in bf16 (what wy_bwd multiplies by, so it
 * does not solve again). One block of 8 warps per (chunk, value head): warp w on rows 16 (w & 3) .. + 15 and column
 * half w >> 2 of A (the tiles above the diagonal skipped), on two row blocks and a column quarter of W and U (the
 * zero blocks of the triangular Tinv skipped); each entry is one warp's mma over the same k order, the same bits as
 * 4 warps. 55 KB of shared memory and at most 64 registers (4 blocks per SM). Callers: gdn.cu's forward, backward
 * (unless the forward kept W, U), transition, dstate.
 */
#pragma once

/* ------------------------------------------------------------------------------------------------ */
/* prep helpers (gdn_prep_kernel below: G, A, Tinv, W, U per chunk and value head)                    */

#define GDN_PREP_THREADS 256 /* prep's block: 8 warps (their shares: gdn_build_A, gdn_tri_product_store) */

/* out rows r < L (row stride ldo) = (Thi + Tlo) X for X (64 x N, smem, stride ldx); bf16 out. Tinv is lower
 * triangular: rows 16 rb .. + 15 of Thi and Tlo are 0 from column 16 (rb + 1) on, so their sums stop there (the
 * terms left out are exact zeros: each entry the same sum, one warp's, over the same k order). Warp w on row blocks
 * w & 1 and 3 - (w & 1) (5 steps of k either way) and column quarter w >> 1 */
template <int N>
GDN_DEV void gdn_tri_product_store(bf16 *out, int64_t ldo, const bf16 *Thi, const bf16 *Tlo, const bf16 *X, int ldx,
                                   int L) {
    constexpr int NIW = N / 32; /* the warp's 8-column tiles */
    const int w = threadIdx.x >> 5, n0 = (w >> 1) * (N / 4);
#pragma unroll 1
    for (int b = 0; b < 2; b++) {
        const int r0 = 16 * (b ? 3 - (w & 1) : w & 1);
        float acc[1][NIW][4];
        gdn_zero(acc);
#pragma unroll 1
        for (int k0 = 0; k0 <= r0; k0 += 16)
            gdn_warp_mma<1, NIW, false, false, 16>(acc, Thi + k0, GDN_LDP, X + k0 * ldx, ldx, r0, n0);
#pragma unroll 1
        for (int k0 = 0; k0 <= r0; k0 += 16)
            gdn_warp_mma<1, NIW, false, false, 16>(acc, Tlo + k0, GDN_LDP, X + k0 * ldx, ldx, r0, n0);
#pragma unroll
        for (int ni = 0; ni < NIW; ni++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const int r = r0 + gdn_frag_row(e), col = n0 + ni * 8 + gdn_frag_col(e);
                if (r < L) gdn_store2(out + r * ldo + col, acc[0][ni][e], acc[0][ni][e + 1]);
            }
    }
}

/* the factor split of Tinv diag(beta gam) (WF: W's factor) or Tinv diag(beta): thi + tlo (bf16, stride GDN_LDP)
 * from T (fp32, stride GDN_LDF). All NT threads, each on one column pair (its two factors read once) */
template <bool WF, int NT>
GDN_DEV void gdn_prep_split(bf16 *thi, bf16 *tlo, const float *T, const float *sBeta, const float *sG) {
    static_assert(NT % (GDN_C / 2) == 0, "gdn_prep_split: a thread keeps one column pair");
    const int j = (threadIdx.x % (GDN_C / 2)) * 2;
    float f0 = sBeta[j], f1 = sBeta[j + 1];
    if (WF) {
        f0 *= exp2f(sG[j]);
        f1 *= exp2f(sG[j + 1]);
    }
#pragma unroll 2
    for (int r = threadIdx.x / (GDN_C / 2); r < GDN_C; r += NT / (GDN_C / 2))
        gdn_split2(thi + r * GDN_LDP + j, tlo + r * GDN_LDP + j, T[r * GDN_LDF + j] * f0, T[r * GDN_LDF + j + 1] * f1);
}

/* ------------------------------------------------------------------------------------------------ */
/* prep: G, A, Tinv, W, U per (chunk, value head) in 55 KB of shared memory (4 blocks per SM; the     */
/* 74 KB form ran 3): A lives where the bf16 Tinv factors go once the solve is done, one pair of      */
/* factor tiles serves W, then U, and V is loaded over K once W's product is done (its rows fetched   */
/* into L2 at the chunk's start, its load under U's factor split; the other blocks hide the rest)     */

template <int DK, int DV> struct GdnPrepSmem {
    bf16 *k, *v, *t_hi, *t_lo; /* v over k */
    float *A, *T, *G, *beta, *tmp;
    size_t bytes;
    __host__ __device__ explicit GdnPrepSmem(void *b) {
        GdnCarve c(b);
        k = c.take<bf16>(GDN_C * ((DK > DV ? DK : DV) + 8));
        v = k; /* once W's product has read k */
        t_hi = c.take<bf16>(GDN_C * GDN_LDP);
        t_lo = c.take<bf16>(GDN_C * GDN_LDP);
        A = (float *)t_hi; /* 64 x 65 fp32 fits in the two factor tiles (2 x 64 x 72 bf16) */
        T = c.take<float>(GDN_C * GDN_LDF);
        G = c.take<float>(GDN_C);
        beta = c.take<float>(GDN_C);
        tmp = c.take<float>(GDN_SOLVE_SCRATCH);
        bytes = c.off;
    }
};
static_assert(GDN_C * GDN_LDF * 4 <= 2 * GDN_C * GDN_LDP * 2, "prep: A must fit in the factor tiles");

template <int DK, int DV>
__global__ void __launch_bounds__(GDN_PREP_THREADS, 4)
    gdn_prep_kernel(bf16 *W /* (T,nv,DK) */, bf16 *U /* (T,nv,DV) or NULL */, float *G2 /* (T,nv) */,
                       bf16 *Tinv /* (T,nv,64) row r of its chunk's Tinv at token t0 + r, or NULL */,
                       const bf16 *k /* (T,ldq) nk heads */, const bf16 *v /* (T,ldv) nv heads, or NULL */,
                       const float *g /* (T,nv) */, const float *beta /* (T,nv) */, const int32_t *starts,
                       const int32_t *meta, int mode, int nk, int nv, int ldq, int ldv) {
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnPrepSmem<DK, DV> s(gdn_smem);
    constexpr int NT = GDN_PREP_THREADS;
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5;
    const int r0 = 16 * (w & 3), ch = w >> 2; /* this warp's rows r0 .. r0 + 15 and column half */
    int lo, hi;
    gdn_chunk_range(meta, mode, &lo, &hi);
    for (int c = lo + blockIdx.x; c < hi; c += gridDim.x) {
        const int64_t t0 = starts[c];
        const int L = starts[c + 1] - (int)t0;
        __syncthreads(); /* the previous chunk is done with shared memory */
        gdn_load_rows<GDN_C, DK, NT, true>(s.k, DK + 8, k + t0 * ldq + (int64_t)kh * DK, ldq, L);
        ptx_cp_async_commit();
        if (U) /* V's rows into L2 now: its cp.async (over K, once W's product is done) then waits on L2, not DRAM */
            gdn_prefetch_rows_l2<bf16, DV, NT, false, true>(v + t0 * ldv + (int64_t)h * DV, ldv, L);
        gdn_gates_cumsum(s.G, s.beta, g, beta, t0, L, h, nv);
        ptx_cp_async_wait<0>();
        __syncthreads(); /* K and the gates */
        gdn_build_A<DK>(s.A, s.k, s.G, s.beta, L, r0, ch);
        if ((int)threadIdx.x < L) G2[(t0 + threadIdx.x) * nv + h] = s.G[threadIdx.x];
        __syncthreads();
        gdn_solve<NT, 128>(s.T, s.tmp, s.A); /* the blocks below on 4 warps; ends synchronised: A is dead */
        if (Tinv) { /* bf16 for wy_bwd, rows < L (its rows from L on multiply only zero rows there), 16 bytes a store */
#pragma unroll 1
            for (int i = threadIdx.x; i < L * (GDN_C / 8); i += NT) {
                const int r = i / (GDN_C / 8), j = (i % (GDN_C / 8)) * 8;
                __align__(16) __nv_bfloat162 x[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    x[u] = __floats2bfloat162_rn(s.T[r * GDN_LDF + j + 2 * u], s.T[r * GDN_LDF + j + 2 * u + 1]);
                *(uint4 *)(Tinv + ((t0 + r) * nv + h) * GDN_C + j) = *(const uint4 *)x;
            }
        }
        /* W = (Tinv diag(beta gam)) K, then U = (Tinv diag(beta)) V, the factor split hi + lo bf16 */
        gdn_prep_split<true, NT>(s.t_hi, s.t_lo, s.T, s.beta, s.G);
        __syncthreads();
        gdn_tri_product_store<DK>(W + (t0 * nv + h) * DK, (int64_t)nv * DK, s.t_hi, s.t_lo, s.k, DK + 8, L);
        if (!U) continue;
        __syncthreads(); /* W's product is done with k and the factor tiles: V over k, U's factors over W's */
        gdn_load_rows<GDN_C, DV, NT, true>(s.v, DV + 8, v + t0 * ldv + (int64_t)h * DV, ldv, L);
        ptx_cp_async_commit();
        gdn_prep_split<false, NT>(s.t_hi, s.t_lo, s.T, s.beta, s.G);
        ptx_cp_async_wait<0>();
        __syncthreads();
        gdn_tri_product_store<DV>(U + (t0 * nv + h) * DV, (int64_t)nv * DV, s.t_hi, s.t_lo, s.v, DV + 8, L);
    }
}

