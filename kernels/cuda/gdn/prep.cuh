/*
 * prep.cuh — the per-chunk WY factors: G (cumsum of g, log2 units), A = strictly lower (beta K K^T) Gam,
 * Tinv = (I + A)^-1 (fp32, 16 x 16 blocks), W = Tinv diag(beta gam) K, U = Tinv diag(beta) V (Tinv split
 * hi + lo bf16), stored bf16, G2 (T,nv) and, asked, Tinv itself in bf16 (what wy_bwd multiplies by, so it
 * does not solve again). One block per (chunk, value head), 55 KB of shared memory and 128 registers
 * (4 blocks per SM). Callers: gdn.cu's forward, backward (unless the forward kept W, U), transition, dstate.
 */
#pragma once

/* ------------------------------------------------------------------------------------------------ */
/* prep helpers (gdn_prep_kernel in gdn/state_pass.cuh: G, A, Tinv, W, U per chunk and value head)      */

/* out rows r < L (row stride ldo) = (Thi + Tlo) X for X (64 x N, smem, stride ldx); bf16 out */
template <int N>
GDN_DEV void gdn_tri_product_store(bf16 *out, int64_t ldo, const bf16 *Thi, const bf16 *Tlo, const bf16 *X, int ldx,
                                   int L) {
    const int w = threadIdx.x >> 5;
#pragma unroll 1
    for (int n0 = 0; n0 < N; n0 += 64) {
        float acc[1][8][4];
        gdn_zero(acc);
        gdn_warp_mma<1, 8, false, false, GDN_C>(acc, Thi, GDN_LDP, X, ldx, 16 * w, n0);
        gdn_warp_mma<1, 8, false, false, GDN_C>(acc, Tlo, GDN_LDP, X, ldx, 16 * w, n0);
#pragma unroll
        for (int ni = 0; ni < 8; ni++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const int r = 16 * w + gdn_frag_row(e), col = n0 + ni * 8 + gdn_frag_col(e);
                if (r < L) gdn_store2(out + r * ldo + col, acc[0][ni][e], acc[0][ni][e + 1]);
            }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* prep: G, A, Tinv, W, U per (chunk, value head) in 55 KB of shared memory (4 blocks per SM; the     */
/* 74 KB form ran 3): A lives where the bf16 Tinv factors go once the solve is done, one pair of      */
/* factor tiles serves W, then U, and V is loaded over K once W's product is done (its load runs      */
/* under U's factor split; the fourth block hides the rest)                                           */

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
__global__ void __launch_bounds__(GDN_THREADS, 4)
    gdn_prep_kernel(bf16 *W /* (T,nv,DK) */, bf16 *U /* (T,nv,DV) or NULL */, float *G2 /* (T,nv) */,
                       bf16 *Tinv /* (T,nv,64) row r of its chunk's Tinv at token t0 + r, or NULL */,
                       const bf16 *k /* (T,ldq) nk heads */, const bf16 *v /* (T,ldv) nv heads, or NULL */,
                       const float *g /* (T,nv) */, const float *beta /* (T,nv) */, const int32_t *starts,
                       const int32_t *meta, int mode, int nk, int nv, int ldq, int ldv) {
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnPrepSmem<DK, DV> s(gdn_smem);
    const int h = blockIdx.y, kh = h / (nv / nk);
    int lo, hi;
    gdn_chunk_range(meta, mode, &lo, &hi);
    for (int c = lo + blockIdx.x; c < hi; c += gridDim.x) {
        const int64_t t0 = starts[c];
        const int L = starts[c + 1] - (int)t0;
        __syncthreads(); /* the previous chunk is done with shared memory */
        gdn_load_rows<GDN_C, DK>(s.k, DK + 8, k + t0 * ldq + (int64_t)kh * DK, ldq, L);
        ptx_cp_async_commit();
        gdn_gates_cumsum(s.G, s.beta, s.tmp, g, beta, t0, L, h, nv);
        ptx_cp_async_wait<0>();
        __syncthreads();
        gdn_build_A<DK>(s.A, s.k, s.G, s.beta, L);
        __syncthreads();
        gdn_solve(s.T, s.tmp, s.A); /* ends synchronised: A is dead */
        if (Tinv) /* bf16 for wy_bwd, rows < L (its rows from L on multiply only zero rows there), 16 bytes a store */
            for (int i = threadIdx.x; i < L * (GDN_C / 8); i += GDN_THREADS) {
                const int r = i / (GDN_C / 8), j = (i % (GDN_C / 8)) * 8;
                __align__(16) __nv_bfloat162 x[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    x[u] = __floats2bfloat162_rn(s.T[r * GDN_LDF + j + 2 * u], s.T[r * GDN_LDF + j + 2 * u + 1]);
                *(uint4 *)(Tinv + ((t0 + r) * nv + h) * GDN_C + j) = *(const uint4 *)x;
            }
        /* W = (Tinv diag(beta gam)) K, then U = (Tinv diag(beta)) V, the factor split hi + lo bf16 */
#pragma unroll 1
        for (int pass = 0; pass < (U ? 2 : 1); pass++) {
            if (pass == 1) { /* W's product is done with k (the barrier ending pass 0): V over it */
                gdn_load_rows<GDN_C, DV>(s.v, DV + 8, v + t0 * ldv + (int64_t)h * DV, ldv, L);
                ptx_cp_async_commit();
            }
            for (int i = threadIdx.x; i < GDN_C * GDN_C / 2; i += GDN_THREADS) {
                const int r = i / (GDN_C / 2), j = (i % (GDN_C / 2)) * 2;
                const float t0v = s.T[r * GDN_LDF + j], t1v = s.T[r * GDN_LDF + j + 1];
                float f0 = s.beta[j], f1 = s.beta[j + 1];
                if (pass == 0) {
                    f0 *= exp2f(s.G[j]);
                    f1 *= exp2f(s.G[j + 1]);
                }
                gdn_split2(s.t_hi + r * GDN_LDP + j, s.t_lo + r * GDN_LDP + j, t0v * f0, t1v * f1);
            }
            if (pass == 1) ptx_cp_async_wait<0>();
            __syncthreads();
            if (pass == 0)
                gdn_tri_product_store<DK>(W + (t0 * nv + h) * DK, (int64_t)nv * DK, s.t_hi, s.t_lo, s.k, DK + 8, L);
            else
                gdn_tri_product_store<DV>(U + (t0 * nv + h) * DV, (int64_t)nv * DV, s.t_hi, s.t_lo, s.v, DV + 8, L);
            __syncthreads(); /* the factor tiles are read before the next pass writes them */
        }
        if ((int)threadIdx.x < L) G2[(t0 + threadIdx.x) * nv + h] = s.G[threadIdx.x];
    }
}

