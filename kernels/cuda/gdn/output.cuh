/*
 * output.cuh — the per-chunk outputs of the chunk states: o = scale (gam (Q h) + (Q K^T Gam causal) vn)
 * (gdn_output_kernel, the forward) and dv_loc = scale P^T dO (gdn_dvlocal_kernel, the backward and
 * dstate). One block of 8 warps per (chunk, value head), warp w on rows 16 (w & 3) .. + 15 and column half
 * w >> 2 of every product (2 blocks per SM for the output's 94 KB of shared memory, 3 for dv_local's 60). Q, K and
 * the gates load in their own cp.async group, so P = Q K^T Gam is built while the rest (vn and h, or dO) arrives
 * (measured against one group: docs/bench-log/2026-12-02-c). Part of gdn.cu.
 */
#pragma once

#define GDN_OUT_THREADS 256 /* output's and dv_local's block */

/* ------------------------------------------------------------------------------------------------ */
/* output and dv_local: per (chunk, value head, column block of BVO)                                  */

template <int DK, int BVO> struct GdnOutSmem {
    bf16 *q, *k, *x, *h, *p; /* x: vn (output) or dO (dv_local) */
    float *G;
    size_t bytes;
    __host__ __device__ GdnOutSmem(void *b, bool with_h) {
        GdnCarve c(b);
        q = c.take<bf16>(GDN_C * (DK + 8));
        k = c.take<bf16>(GDN_C * (DK + 8));
        x = c.take<bf16>(GDN_C * (BVO + 8));
        p = c.take<bf16>(GDN_C * GDN_LDP);
        G = c.take<float>(GDN_C);
        h = with_h ? c.take<bf16>(DK * (BVO + 8)) : NULL;
        bytes = c.off;
    }
};

/* sP = (Q K^T)_rj e^{G_r - G_j} for j <= r < L, else 0 (bf16, unscaled). All GDN_OUT_THREADS threads: warp
 * (rows r0, column half ch) its 16 x 32 tile; a tile wholly above the diagonal skips its product */
template <int DK>
GDN_DEV void gdn_build_P(bf16 *sP, const bf16 *sQ, const bf16 *sK, const float *sG, int L, int r0, int ch) {
    float acc[1][4][4];
    gdn_zero(acc);
    if (r0 + 16 > 32 * ch) gdn_warp_mma<1, 4, false, true, DK>(acc, sQ, DK + 8, sK, DK + 8, r0, 32 * ch);
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            const int r = r0 + gdn_frag_row(e), j = 32 * ch + ni * 8 + gdn_frag_col(e);
            const float p0 = (j <= r && r < L) ? acc[0][ni][e] * exp2f(sG[r] - sG[j]) : 0.0f;
            const float p1 = (j + 1 <= r && r < L) ? acc[0][ni][e + 1] * exp2f(sG[r] - sG[j + 1]) : 0.0f;
            gdn_store2(sP + r * GDN_LDP + j, p0, p1);
        }
}

/* the first of a chunk's two cp.async groups, committed: Q and K rows of key head kh, the gate cumsums of head h */
template <int DK, int BVO>
GDN_DEV void gdn_out_load_qkg(const GdnOutSmem<DK, BVO> &s, const bf16 *q, const bf16 *k, const float *G2, int64_t t0,
                              int L, int kh, int h, int nv, int ldq) {
    gdn_load_rows<GDN_C, DK, GDN_OUT_THREADS>(s.q, DK + 8, q + t0 * ldq + (int64_t)kh * DK, ldq, L);
    gdn_load_rows<GDN_C, DK, GDN_OUT_THREADS>(s.k, DK + 8, k + t0 * ldq + (int64_t)kh * DK, ldq, L);
    gdn_load_G(s.G, G2, t0, L, h, nv);
    ptx_cp_async_commit();
}

/* once the caller has committed the second group: P from the first while the second lands, then both in place */
template <int DK, int BVO> GDN_DEV void gdn_out_build_P(const GdnOutSmem<DK, BVO> &s, int L, int r0, int ch) {
    ptx_cp_async_wait<1>();
    __syncthreads();
    gdn_build_P<DK>(s.p, s.q, s.k, s.G, L, r0, ch);
    ptx_cp_async_wait<0>();
    __syncthreads();
}

template <int DK, int BVO>
__global__ void __launch_bounds__(GDN_OUT_THREADS, 2)
    gdn_output_kernel(bf16 *o /* (T,ldo) */, const bf16 *q /* (T,ldq) */, const bf16 *k /* (T,ldq) */,
                      const bf16 *vn /* (T,nv,dv) */, const bf16 *hs /* (ns,nv,DK,dv) */, const float *G2,
                      const int32_t *doc_pos, const int32_t *starts, const int32_t *meta, int nk, int nv, int dv,
                      int ldq, int ldo, float scale) {
    constexpr int LDK = DK + 8, LDX = BVO + 8, NIW = BVO / 16; /* a warp's 8-column tiles: half of BVO */
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnOutSmem<DK, BVO> s(gdn_smem, true);
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5, col0 = blockIdx.z * BVO;
    const int r0 = 16 * (w & 3), ch = w >> 2, n0 = ch * (BVO / 2); /* this warp's rows and columns */
    const int64_t ldx = (int64_t)nv * dv;
    const int nc = meta[GDN_META_NC];
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const int64_t t0 = starts[c];
        const int L = starts[c + 1] - (int)t0;
        const bool reset = doc_pos[t0] == 0;
        __syncthreads();
        gdn_out_load_qkg(s, q, k, G2, t0, L, kh, h, nv, ldq);
        gdn_load_rows<GDN_C, BVO, GDN_OUT_THREADS>(s.x, LDX, vn + t0 * ldx + (int64_t)h * dv + col0, ldx, L);
        if (!reset)
            gdn_load_rows<DK, BVO, GDN_OUT_THREADS>(s.h, LDX, hs + ((t0 / GDN_C) * nv + h) * (int64_t)DK * dv + col0,
                                                    dv, DK);
        ptx_cp_async_commit();
        gdn_out_build_P(s, L, r0, ch);
        float acc[1][NIW][4];
        gdn_zero(acc);
        if (!reset) {
            gdn_warp_mma<1, NIW, false, false, DK>(acc, s.q, LDK, s.h, LDX, r0, n0);
#pragma unroll
            for (int ni = 0; ni < NIW; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = r0 + gdn_frag_row(e);
                    acc[0][ni][e] *= r < L ? exp2f(s.G[r]) : 0.0f;
                }
        }
        gdn_warp_mma<1, NIW, false, false, GDN_C>(acc, s.p, GDN_LDP, s.x, LDX, r0, n0);
#pragma unroll
        for (int ni = 0; ni < NIW; ni++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const int r = r0 + gdn_frag_row(e), j = n0 + ni * 8 + gdn_frag_col(e);
                if (r < L)
                    gdn_store2(o + (t0 + r) * ldo + (int64_t)h * dv + col0 + j, scale * acc[0][ni][e],
                               scale * acc[0][ni][e + 1]);
            }
    }
}

/* dv_loc rows j = scale sum_{r >= j} P_rj dO_r (bf16, (T,nv,dv)) over the chunks of `mode` */
template <int DK, int BVO>
__global__ void __launch_bounds__(GDN_OUT_THREADS, 3)
    gdn_dvlocal_kernel(bf16 *dvl /* (T,nv,dv) */, const bf16 *q, const bf16 *k, const bf16 *dout /* (T,ldo) */,
                       const float *G2, const int32_t *starts, const int32_t *meta, int mode, int nk, int nv, int dv,
                       int ldq, int ldo, float scale) {
    constexpr int LDX = BVO + 8, NIW = BVO / 16;
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnOutSmem<DK, BVO> s(gdn_smem, false);
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5, col0 = blockIdx.z * BVO;
    const int r0 = 16 * (w & 3), ch = w >> 2, n0 = ch * (BVO / 2);
    const int64_t ldx = (int64_t)nv * dv;
    int lo, hi;
    gdn_chunk_range(meta, mode, &lo, &hi);
    for (int c = lo + blockIdx.x; c < hi; c += gridDim.x) {
        const int64_t t0 = starts[c];
        const int L = starts[c + 1] - (int)t0;
        __syncthreads();
        gdn_out_load_qkg(s, q, k, G2, t0, L, kh, h, nv, ldq);
        gdn_load_rows<GDN_C, BVO, GDN_OUT_THREADS>(s.x, LDX, dout + t0 * ldo + (int64_t)h * dv + col0, ldo, L);
        ptx_cp_async_commit();
        gdn_out_build_P(s, L, r0, ch);
        float acc[1][NIW][4];
        gdn_zero(acc);
        gdn_warp_mma<1, NIW, true, false, GDN_C>(acc, s.p, GDN_LDP, s.x, LDX, r0, n0);
#pragma unroll
        for (int ni = 0; ni < NIW; ni++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const int r = r0 + gdn_frag_row(e), j = n0 + ni * 8 + gdn_frag_col(e);
                if (r < L)
                    gdn_store2(dvl + (t0 + r) * ldx + (int64_t)h * dv + col0 + j, scale * acc[0][ni][e],
                               scale * acc[0][ni][e + 1]);
            }
    }
}

