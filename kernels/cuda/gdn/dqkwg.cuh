/*
 * dqkwg.cuh — dq, dk (fp32 per value head), dw = -dv2 h^T and the dG terms of the outputs and states,
 * from the chunk states h, dh; split over the two halves of DK (2 blocks of 8 warps per SM). Callers:
 * gdn.cu's backward.
 */
#pragma once

#define GDN_DQKWG_THREADS 256 /* 8 warps: 16 per SM with two blocks (the kernel is latency-bound) */

/* ------------------------------------------------------------------------------------------------ */
/* dqkwg: dq, dk, dw and the dG terms (the algebra below) split over the two halves of DK          */
/*                                                                                                    */
/* Block (2 c + half, h) computes columns [half DK/2, half DK/2 + DK/2) of dq, dk, dw of chunk c: it   */
/* needs only that half of q, k (as columns) and of h, dh (as rows), so its tiles take 112 KB instead  */
/* of 165 and two blocks share an SM (one block's loads under the other's products). ds = dO vn^T is   */
/* computed by both halves (1 of the 6 products). dG comes out as two partials (the half's q.dq - k.dk */
/* over its columns, and on the last row its share of gam <h, dh> + sum k.dk_inter), dgp (half 0) and */
/* dgp2 (half 1), summed in that order by wy_bwd. The two halves of a chunk are neighbours in the grid */
/* (blockIdx.x = 2 c + half), so the tiles both read (dO, vn) come from L2 the second time.            */
/*                                                                                                    */
/* 8 warps (two blocks of 256 threads per SM, at most 128 registers a thread): warp w takes rows       */
/* 16 (w & 3) .. + 15 and the column half w >> 2 of every product's output (32 of ds's 64 columns;     */
/* DK/4 of the block's DK/2 columns of dq, dk, dw), each output element summed over k in the 4-warp    */
/* kernel's order (dq, dk, dw: the same bits). A warp whose ds tile lies wholly above the diagonal     */
/* (zeros) skips its product. The row dot products q.dq, k.dk, k.dk_inter come out as one partial per  */
/* column half (rowa, rowb, in ds's space once dk has read ds), added column half 0 + 1 in the last    */
/* phase, <h, dh> as 8 warp partials added in a fixed order: deterministic, dG's last bits moved.      */

template <int DK, int DV> struct GdnDqkwgSmem {
    static constexpr int KH = DK / 2;
    bf16 *q, *k, *vn, *dO, *dv2, *h, *dh, *ds;
    float *G, *red;
    float *rowa, *rowb; /* (2, GDN_C) each, [column half][row]: in ds's space (dead once dk has read it) */
    size_t bytes;
    __host__ __device__ explicit GdnDqkwgSmem(void *b) {
        GdnCarve c(b);
        q = c.take<bf16>(GDN_C * (KH + 8));
        k = c.take<bf16>(GDN_C * (KH + 8));
        vn = c.take<bf16>(GDN_C * (DV + 8));
        dO = c.take<bf16>(GDN_C * (DV + 8));
        dv2 = c.take<bf16>(GDN_C * (DV + 8));
        h = c.take<bf16>(KH * (DV + 8));
        dh = c.take<bf16>(KH * (DV + 8));
        ds = c.take<bf16>(GDN_C * GDN_LDP);
        G = c.take<float>(GDN_C);
        red = c.take<float>(GDN_DQKWG_THREADS / 32);
        rowa = (float *)ds;
        rowb = rowa + 2 * GDN_C;
        bytes = c.off;
    }
};

/*
 * Per (chunk, value head), with h the entering state and dh the gradient at the exit:
 *   ds  = scale (dO vn^T) Gam causal
 *   dq  = scale gam (dO h^T) + ds K,     dk = dec (vn dh^T) + ds^T Q,     dw = -dv2 h^T
 *   dG_r = q_r.dq_r - k_r.dk_r, the last row also gam_L <h, dh> + sum_j k_j.dk^inter_j
 */
template <int DK, int DV>
__global__ void __launch_bounds__(GDN_DQKWG_THREADS, 2)
    gdn_dqkwg_kernel(float *dqv /* (T,nv,DK) */, bf16 *dq_out /* (T,ldq) when nv == nk, else NULL */,
                        float *dkv /* (T,nv,DK) */, bf16 *dw /* (T,nv,DK) */, float *dgp /* (T,nv) half 0 */,
                        float *dgp2 /* (T,nv) half 1 */, const bf16 *q, const bf16 *k,
                        const bf16 *vn /* (T,nv,DV) */, const bf16 *dout /* (T,ldo) */, const bf16 *dv2 /* (T,nv,DV) */,
                        const bf16 *hs /* (ns,nv,DK,DV) */, const bf16 *dhs /* (ns,nv,DK,DV) */, const float *G2,
                        const int32_t *doc_pos, const int32_t *starts, const int32_t *meta, int64_t T, int nk, int nv,
                        int ldq, int ldo, float scale) {
    constexpr int NT = GDN_DQKWG_THREADS, KH = DK / 2, LDH = KH + 8, LDV = DV + 8, NTQ = KH / 16;
    static_assert(NT == 256 && NTQ % 2 == 0, "dqkwg: 8 warps (4 row tiles x 2 column halves), even tiles of 8");
    static_assert(sizeof(bf16) * GDN_C * GDN_LDP >= 4 * GDN_C * sizeof(float), "dqkwg: rowa, rowb fit ds's space");
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnDqkwgSmem<DK, DV> s(gdn_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int half = blockIdx.x & 1, cb = half * KH; /* this block's DK columns start at cb */
    const int m0 = 16 * (w & 3), wh = w >> 2, n0 = wh * (KH / 2); /* first row, column half, first column */
    const int64_t ldk = (int64_t)nv * DK, ldx = (int64_t)nv * DV, ns = (T + GDN_C - 1) / GDN_C + 1;
    const int nc = meta[GDN_META_NC];
    float *dgo = half ? dgp2 : dgp;
    for (int c = blockIdx.x >> 1; c < nc; c += gridDim.x >> 1) {
        const int64_t t0 = starts[c];
        const int L = starts[c + 1] - (int)t0;
        const int64_t t1 = t0 + L;
        const bool reset = doc_pos[t0] == 0;
        const bool exit_carries = t1 == T || doc_pos[t1] != 0;
        const int64_t slot_out = t1 == T ? ns - 1 : t1 / GDN_C;
        __syncthreads();
        /* three groups: what ds needs first, then what dq and dk need (landing under the ds product), dv2
         * (dw alone reads it) last, landing under dq and dk */
        gdn_load_rows<GDN_C, DV, NT>(s.dO, LDV, dout + t0 * ldo + (int64_t)h * DV, ldo, L);
        gdn_load_rows<GDN_C, DV, NT>(s.vn, LDV, vn + t0 * ldx + (int64_t)h * DV, ldx, L);
        gdn_load_G(s.G, G2, t0, L, h, nv);
        ptx_cp_async_commit();
        gdn_load_rows<GDN_C, KH, NT>(s.q, LDH, q + t0 * ldq + (int64_t)kh * DK + cb, ldq, L);
        gdn_load_rows<GDN_C, KH, NT>(s.k, LDH, k + t0 * ldq + (int64_t)kh * DK + cb, ldq, L);
        gdn_load_rows<KH, DV, NT>(s.h, LDV, hs + ((t0 / GDN_C) * nv + h) * (int64_t)DK * DV + (int64_t)cb * DV, DV,
                              reset ? 0 : KH);
        gdn_load_rows<KH, DV, NT>(s.dh, LDV, dhs + (slot_out * nv + h) * (int64_t)DK * DV + (int64_t)cb * DV, DV,
                              exit_carries ? KH : 0);
        ptx_cp_async_commit();
        gdn_load_rows<GDN_C, DV, NT>(s.dv2, LDV, dv2 + t0 * ldx + (int64_t)h * DV, ldx, L);
        ptx_cp_async_commit();
        ptx_cp_async_wait<2>();
        __syncthreads();
        /* ds (columns 32 wh .. + 31; a tile wholly above the diagonal, j > r everywhere, is zeros: no product) */
        {
            const int j0 = wh * (GDN_C / 2);
            float acc[1][4][4];
            gdn_zero(acc);
            if (j0 <= m0 + 15) gdn_warp_mma<1, 4, false, true, DV>(acc, s.dO, LDV, s.vn, LDV, m0, j0);
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int r = m0 + gdn_frag_row(e), j = j0 + ni * 8 + gdn_frag_col(e);
                    const float d0 = (j <= r && r < L) ? scale * acc[0][ni][e] * exp2f(s.G[r] - s.G[j]) : 0.0f;
                    const float d1 =
                        (j + 1 <= r && r < L) ? scale * acc[0][ni][e + 1] * exp2f(s.G[r] - s.G[j + 1]) : 0.0f;
                    gdn_store2(s.ds + r * GDN_LDP + j, d0, d1);
                }
        }
        ptx_cp_async_wait<1>();
        __syncthreads();
        /* this half's share of <h, dh> (zero unless both exist), fixed order: a partial per warp */
        {
            float hd = 0.0f;
            if (!reset && exit_carries) { /* 8 pairs' loads issued together, the same order */
#pragma unroll 8
                for (int i = threadIdx.x; i < KH * DV / 2; i += NT) {
                    const int a = i / (DV / 2), b = (i % (DV / 2)) * 2;
                    const float2 x = gdn_load2(s.h + a * LDV + b), y = gdn_load2(s.dh + a * LDV + b);
                    hd = fmaf(x.x, y.x, hd);
                    hd = fmaf(x.y, y.y, hd);
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) hd += __shfl_xor_sync(GDN_FULL, hd, o);
            if (lane == 0) s.red[w] = hd;
        }
        float qdq[2] = {0.0f, 0.0f}, kdk[2] = {0.0f, 0.0f}, kdi[2] = {0.0f, 0.0f};
        /* dq (the warp's columns n0 .. + KH/2 - 1 of this half's) */
        {
            float acc[1][NTQ][4];
            gdn_zero(acc);
            if (!reset) {
                gdn_warp_mma<1, NTQ, false, true, DV>(acc, s.dO, LDV, s.h, LDV, m0, n0);
#pragma unroll
                for (int ni = 0; ni < NTQ; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = m0 + gdn_frag_row(e);
                        acc[0][ni][e] *= r < L ? scale * exp2f(s.G[r]) : 0.0f;
                    }
            }
            gdn_warp_mma<1, NTQ, false, false, GDN_C>(acc, s.ds, GDN_LDP, s.k, LDH, m0, n0);
#pragma unroll
            for (int ni = 0; ni < NTQ; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int r = m0 + gdn_frag_row(e), col = n0 + ni * 8 + gdn_frag_col(e);
                    const float2 qq = gdn_load2(s.q + r * LDH + col);
                    qdq[e >> 1] += qq.x * acc[0][ni][e] + qq.y * acc[0][ni][e + 1];
                    if (r < L && dq_out) /* one value head per key head: the final dq */
                        gdn_store2(dq_out + (t0 + r) * ldq + (int64_t)h * DK + cb + col, acc[0][ni][e],
                                   acc[0][ni][e + 1]);
                    else if (r < L)
                        *(float2 *)(dqv + (t0 + r) * ldk + (int64_t)h * DK + cb + col) =
                            make_float2(acc[0][ni][e], acc[0][ni][e + 1]);
                }
        }
        /* dk (the warp's columns of this half's) */
        {
            float acc[1][NTQ][4];
            gdn_zero(acc);
            if (exit_carries) {
                gdn_warp_mma<1, NTQ, false, true, DV>(acc, s.vn, LDV, s.dh, LDV, m0, n0);
                const float gL = s.G[L - 1];
#pragma unroll
                for (int ni = 0; ni < NTQ; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        const int r = m0 + gdn_frag_row(e), col = n0 + ni * 8 + gdn_frag_col(e);
                        const float dec = r < L ? exp2f(gL - s.G[r]) : 0.0f;
                        acc[0][ni][e] *= dec;
                        acc[0][ni][e + 1] *= dec;
                        const float2 kk = gdn_load2(s.k + r * LDH + col);
                        kdi[e >> 1] += kk.x * acc[0][ni][e] + kk.y * acc[0][ni][e + 1];
                    }
            }
            gdn_warp_mma<1, NTQ, true, false, GDN_C>(acc, s.ds, GDN_LDP, s.q, LDH, m0, n0);
#pragma unroll
            for (int ni = 0; ni < NTQ; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int r = m0 + gdn_frag_row(e), col = n0 + ni * 8 + gdn_frag_col(e);
                    const float2 kk = gdn_load2(s.k + r * LDH + col);
                    kdk[e >> 1] += kk.x * acc[0][ni][e] + kk.y * acc[0][ni][e + 1];
                    if (r < L)
                        *(float2 *)(dkv + (t0 + r) * ldk + (int64_t)h * DK + cb + col) =
                            make_float2(acc[0][ni][e], acc[0][ni][e + 1]);
                }
        }
        ptx_cp_async_wait<0>(); /* dv2 */
        __syncthreads();
        /* dw = -dv2 h^T (the warp's columns of this half's) */
        {
            float acc[1][NTQ][4];
            gdn_zero(acc);
            if (!reset) gdn_warp_mma<1, NTQ, false, true, DV>(acc, s.dv2, LDV, s.h, LDV, m0, n0);
#pragma unroll
            for (int ni = 0; ni < NTQ; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int r = m0 + gdn_frag_row(e), col = n0 + ni * 8 + gdn_frag_col(e);
                    if (r < L)
                        gdn_store2(dw + (t0 + r) * ldk + (int64_t)h * DK + cb + col, -acc[0][ni][e],
                                   -acc[0][ni][e + 1]);
                }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            qdq[i] = gdn_quad_sum(qdq[i]);
            kdk[i] = gdn_quad_sum(kdk[i]);
            kdi[i] = gdn_quad_sum(kdi[i]);
        }
        if ((lane & 3) == 0) { /* ds is dead (dk read it before the last barrier): rowa, rowb take its space */
            const int r = wh * GDN_C + m0 + (lane >> 2); /* (column half, row) */
            s.rowa[r] = qdq[0] - kdk[0];
            s.rowa[r + 8] = qdq[1] - kdk[1];
            s.rowb[r] = kdi[0];
            s.rowb[r + 8] = kdi[1];
        }
        __syncthreads();
        const int r = threadIdx.x;
        if (r < L) {
            float d = s.rowa[r] + s.rowa[GDN_C + r];
            if (r == L - 1) {
                /* rows 0..L-1 in order, each column half 0 + 1; the loads issued together (rows past L add +0,
                 * which leaves the sum's bits alone: a sum started at +0 is never -0) */
                float sk = 0.0f;
#pragma unroll
                for (int j = 0; j < GDN_C; j++) {
                    const float x = s.rowb[j] + s.rowb[GDN_C + j];
                    sk += j < L ? x : 0.0f;
                }
                const float hdh = ((s.red[0] + s.red[1]) + (s.red[2] + s.red[3])) +
                                  ((s.red[4] + s.red[5]) + (s.red[6] + s.red[7]));
                d += exp2f(s.G[L - 1]) * hdh + sk;
            }
            dgo[(t0 + r) * nv + h] = d;
        }
    }
}
