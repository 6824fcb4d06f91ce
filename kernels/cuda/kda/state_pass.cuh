/*
 * state_pass.cuh — the two sequential passes of KDA over the chunks, one block per (column block of BV = 16 or 32
 * state columns, value head; kda.cu's kda_state_bv picks BV): the columns of the state are independent (vn = U - W S
 * and the update act on each column alone), so a head's dv columns run as dv / BV blocks side by side. Per chunk,
 * from the kept Tinv (prep.cuh) and the chunk's k, g, beta, each block forms W = Tinv diag(beta) (gam * K) itself
 * (all dk columns; recomputed by every column block rather than stored), dec * K and gam_{L-1}.
 *
 *   kda_state_fwd_kernel  S entering chunk 0 = S0 (or 0), reset to 0 at a document start;
 *                         U = Tinv diag(beta) V[:, cols], vn = U - W S, S = Diag(gam_{L-1}) S + (dec * K)^T vn.
 *                         Writes the state entering each non-reset chunk to hs (slot t0 / 64), vn to (T, nv, dv),
 *                         the final state to S_out. The transition (M_out) adds dk columns started from the
 *                         identity with U = 0: [S | M] carried together, cpu_kda_chunk_transition's way.
 *   kda_state_bwd_kernel  from the last chunk down, D = the gradient at the chunk's final state (dS_final for
 *                         the last): dvn_j = (dec_j * k_j)^T D + scale sum_{r >= j} QK_rj dO_r,
 *                         D_in = Diag(gam_{L-1}) D + scale sum_r (gam_r * q_r) dO_r^T - W^T dvn, D = 0 at a
 *                         document start. Writes D leaving each chunk a state leaves to dhs (slot t0 / 64), dvn
 *                         to (T, nv, dv), and the gradient entering chunk 0 to dS0.
 *
 * Every product is a warp GEMM on tensor cores (mma.cuh: the fp32 operands split hi + lo bf16, three-term
 * products into fp32 accumulators, ~2^-17 relative: the states stay within the fp32 kernels' bounds); the state
 * (or D) itself is fp32 in shared memory, split afresh each chunk; the exponentials and the elementwise decay of
 * the state are fp32 on CUDA cores, every exponent <= 0. Templates on DK = dk (64, 128). Shared memory (DK = 128):
 * the forward ~170 KB, the backward ~204 KB (the launch raises the block's limit; sm_90 allows 227 KB). Part of
 * kda.cu.
 */
#pragma once

/* the forward pass's shared memory (DK = dk, BV columns): the gate cumsum G and the fp32 state S (DK x BV) with
 * gam_{L-1};
 * bf16 hi / lo tiles, rows padded by 8: Tb = Tinv diag(beta) (64 x 64), X = gam * k then dec * k (64 x DK),
 * W (64 x DK), S (DK x BV), vn (64 x BV); v (64 x BV, bf16 as read). ~170 KB at DK = 128, BV = 32. */
template <int DK, int BV> struct KdaSfwdSmem {
    static constexpr int LDK = DK + 8, LDT = KDA_C + 8, LDB = BV + 8, LDS = BV + 1;
    float *G, *S, *GL;
    bf16 *tbh, *tbl, *xh, *xl, *wh, *wl, *sh, *sl, *v, *vnh, *vnl;
    size_t bytes;
    __host__ __device__ explicit KdaSfwdSmem(void *b) {
        KdaCarve c(b);
        G = c.take<float>((size_t)KDA_C * DK);
        S = c.take<float>((size_t)DK * LDS);
        GL = c.take<float>(DK);
        tbh = c.take<bf16>((size_t)KDA_C * LDT);
        tbl = c.take<bf16>((size_t)KDA_C * LDT);
        xh = c.take<bf16>((size_t)KDA_C * LDK);
        xl = c.take<bf16>((size_t)KDA_C * LDK);
        wh = c.take<bf16>((size_t)KDA_C * LDK);
        wl = c.take<bf16>((size_t)KDA_C * LDK);
        sh = c.take<bf16>((size_t)DK * LDB);
        sl = c.take<bf16>((size_t)DK * LDB);
        v = c.take<bf16>((size_t)KDA_C * LDB);
        vnh = c.take<bf16>((size_t)KDA_C * LDB);
        vnl = c.take<bf16>((size_t)KDA_C * LDB);
        bytes = c.off;
    }
};

/* Tensor cores (mma.cuh: split operands, three-term products). Per chunk, 8 warps: warp w owns rows
 * [16 (w % 4), +16) of W (half w / 4 of its DK columns), of U = Tb V and of vn (columns [16 (w / 4), +16): with
 * BV = 16 warps 0-3 alone), and of the state update rows [16 w, +16) and all BV columns (DK = 128), or rows
 * [16 (w % 4), +16) and columns [16 (w / 4), +16) (DK = 64; BV = 16: warps 0-3). */
template <int DK, int BV>
__global__ void __launch_bounds__(KDA_THREADS) kda_state_fwd_kernel(
    float *hs /* (ns,nv,dk,dv) or NULL */, float *vn /* (T,nv,dv) or NULL */, float *S_out /* (nv,dk,dv) or NULL */,
    float *M_out /* (nv,dk,dk): the transition's columns, or NULL */, const float *S0 /* (nv,dk,dv) or NULL */,
    const bf16 *k, const bf16 *v, const float *g, const float *beta, const float *tinv /* (T,nv,64) */,
    const int32_t *starts, const int32_t *meta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dv, int ldq,
    int ldv) {
    using Sm = KdaSfwdSmem<DK, BV>;
    constexpr int LDK = Sm::LDK, LDT = Sm::LDT, LDB = Sm::LDB, LDS = Sm::LDS;
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const Sm s(kda_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC];
    const int col0 = blockIdx.x * BV, is_M = col0 >= dv; /* dv is a multiple of 32: a block is S or M */
    const int w = threadIdx.x >> 5, mt = w & 3, half = w >> 2;
    const bool vjob = w < 4 * (BV / 16); /* vn's 16 x 16 tiles: warp w has rows 16 (w % 4), cols 16 (w / 4) */
    /* the state's tiles: DK = 128: warp w rows 16 w, all BV columns; DK = 64: rows 16 (w % 4), cols 16 (w / 4) */
    constexpr int NTS = DK == 128 ? BV / 8 : 2;
    const int m0 = DK == 128 ? 16 * w : 16 * mt, n0 = DK == 128 ? 0 : 16 * half;
    const bool sjob = DK == 128 || w < 4 * (BV / 16);
    const size_t sn = (size_t)DK * dv;
    for (int i = threadIdx.x; i < DK * BV; i += KDA_THREADS) {
        const int a = i / BV, cc = i % BV;
        float x = 0.0f;
        if (is_M) x = a == col0 - dv + cc ? 1.0f : 0.0f;
        else if (S0) x = S0[h * sn + (size_t)a * dv + col0 + cc];
        s.S[a * LDS + cc] = x;
    }
    __syncthreads();
    for (int c = 0; c < nc; c++) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        /* the entering state: stored, split */
        for (int i = threadIdx.x; i < DK * BV; i += KDA_THREADS) {
            const int a = i / BV, cc = i % BV;
            float x = s.S[a * LDS + cc];
            if (ch.reset) s.S[a * LDS + cc] = x = 0.0f;
            else if (hs && !is_M) hs[(ch.slot * nv + h) * sn + (size_t)a * dv + col0 + cc] = x;
            kda_split(x, &s.sh[a * LDB + cc], &s.sl[a * LDB + cc]);
        }
        for (int i = threadIdx.x; i < KDA_C * BV; i += KDA_THREADS) {
            const int r = i / BV, cc = i % BV;
            s.v[r * LDB + cc] =
                !is_M && r < L ? v[(t0 + r) * ldv + (int64_t)h * dv + col0 + cc] : __float2bfloat16(0.0f);
        }
        for (int i = threadIdx.x; i < KDA_C * KDA_C; i += KDA_THREADS) {
            const int r = i / KDA_C, j = i % KDA_C;
            const float x =
                r < L && j <= r ? tinv[((t0 + r) * nv + h) * (int64_t)KDA_C + j] * beta[(t0 + j) * nv + h] : 0.0f;
            kda_split(x, &s.tbh[r * LDT + j], &s.tbl[r * LDT + j]);
        }
        kda_load_G(s.G, DK, g, t0, L, h, nv, DK);
        __syncthreads();
        /* X = gam * k (rows >= L: 0), gam_{L-1} */
        for (int i = threadIdx.x; i < KDA_C * DK; i += KDA_THREADS) {
            const int r = i / DK, a = i % DK;
            const float kv = r < L ? __bfloat162float(k[(t0 + r) * ldq + (int64_t)kh * DK + a]) : 0.0f;
            kda_split(expf(s.G[i]) * kv, &s.xh[r * LDK + a], &s.xl[r * LDK + a]);
            if (r == 0) s.GL[a] = expf(s.G[(L - 1) * DK + a]);
        }
        __syncthreads();
        /* W = Tb X, U = Tb V */
        float aw[1][DK / 16][4], au[1][2][4];
        gdn_zero(aw);
        gdn_zero(au);
        kda_mma3<1, DK / 16, false, KDA_C>(aw, s.tbh, s.tbl, LDT, s.xh, s.xl, LDK, 16 * mt, half * (DK / 2));
        if (vjob) kda_mma2<1, 2, false, KDA_C>(au, s.tbh, s.tbl, LDT, s.v, LDB, 16 * mt, 16 * half);
        __syncthreads(); /* X is read: it becomes dec * k */
#pragma unroll
        for (int ni = 0; ni < DK / 16; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 16 * mt + gdn_frag_row(e), a = half * (DK / 2) + 8 * ni + gdn_frag_col(e);
                kda_split(aw[0][ni][e], &s.wh[r * LDK + a], &s.wl[r * LDK + a]);
            }
        for (int i = threadIdx.x; i < KDA_C * DK; i += KDA_THREADS) {
            const int r = i / DK, a = i % DK;
            const float kv = r < L ? __bfloat162float(k[(t0 + r) * ldq + (int64_t)kh * DK + a]) : 0.0f;
            kda_split(expf(s.G[(L - 1) * DK + a] - s.G[i]) * kv, &s.xh[r * LDK + a], &s.xl[r * LDK + a]);
        }
        __syncthreads();
        /* vn = U - W S (rows >= L: 0) */
        if (vjob) {
            float ws[1][2][4];
            gdn_zero(ws);
            kda_mma3<1, 2, false, DK>(ws, s.wh, s.wl, LDK, s.sh, s.sl, LDB, 16 * mt, 16 * half);
#pragma unroll
            for (int ni = 0; ni < 2; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = 16 * mt + gdn_frag_row(e), cc = 16 * half + 8 * ni + gdn_frag_col(e);
                    const float x = au[0][ni][e] - ws[0][ni][e];
                    if (vn && !is_M && r < L) vn[((t0 + r) * nv + h) * (int64_t)dv + col0 + cc] = x;
                    kda_split(x, &s.vnh[r * LDB + cc], &s.vnl[r * LDB + cc]);
                }
        }
        __syncthreads();
        /* S = Diag(gam_{L-1}) S + (dec * K)^T vn */
        if (sjob) {
            float as[1][NTS][4];
            gdn_zero(as);
            kda_mma3<1, NTS, true, KDA_C>(as, s.xh, s.xl, LDK, s.vnh, s.vnl, LDB, m0, n0);
#pragma unroll
            for (int ni = 0; ni < NTS; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int a = m0 + gdn_frag_row(e), cc = n0 + 8 * ni + gdn_frag_col(e);
                    s.S[a * LDS + cc] = s.GL[a] * s.S[a * LDS + cc] + as[0][ni][e];
                }
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < DK * BV; i += KDA_THREADS) {
        const int a = i / BV, cc = i % BV;
        if (is_M) {
            if (M_out) M_out[((size_t)h * DK + a) * DK + col0 - dv + cc] = s.S[a * LDS + cc];
        } else if (S_out) {
            S_out[h * sn + (size_t)a * dv + col0 + cc] = s.S[a * LDS + cc];
        }
    }
}

/* the backward pass's shared memory (DK = dk, BV columns): G, the fp32 gradient D (DK x BV) and gam_{L-1}; bf16
 * hi / lo tiles, rows padded by 8: Tb = Tinv diag(beta) then scale QK (64 x 64), X = gam * k then dec * k, W,
 * Q = scale gam * q (64 x DK each), D (DK x BV), dvn (64 x BV); dO (64 x BV, bf16 as read). ~204 KB at DK = 128,
 * BV = 32. */
template <int DK, int BV> struct KdaSbwdSmem {
    static constexpr int LDK = DK + 8, LDT = KDA_C + 8, LDB = BV + 8, LDS = BV + 1;
    float *G, *D, *GL;
    bf16 *tbh, *tbl, *xh, *xl, *wh, *wl, *qh, *ql, *dh, *dl, *dout, *dvnh, *dvnl;
    size_t bytes;
    __host__ __device__ explicit KdaSbwdSmem(void *b) {
        KdaCarve c(b);
        G = c.take<float>((size_t)KDA_C * DK);
        D = c.take<float>((size_t)DK * LDS);
        GL = c.take<float>(DK);
        tbh = c.take<bf16>((size_t)KDA_C * LDT);
        tbl = c.take<bf16>((size_t)KDA_C * LDT);
        xh = c.take<bf16>((size_t)KDA_C * LDK);
        xl = c.take<bf16>((size_t)KDA_C * LDK);
        wh = c.take<bf16>((size_t)KDA_C * LDK);
        wl = c.take<bf16>((size_t)KDA_C * LDK);
        qh = c.take<bf16>((size_t)KDA_C * LDK);
        ql = c.take<bf16>((size_t)KDA_C * LDK);
        dh = c.take<bf16>((size_t)DK * LDB);
        dl = c.take<bf16>((size_t)DK * LDB);
        dout = c.take<bf16>((size_t)KDA_C * LDB);
        dvnh = c.take<bf16>((size_t)KDA_C * LDB);
        dvnl = c.take<bf16>((size_t)KDA_C * LDB);
        bytes = c.off;
    }
};

/* Tensor cores as the forward (the same warp tiling: dvn as vn, D as S). */
template <int DK, int BV>
__global__ void __launch_bounds__(KDA_THREADS) kda_state_bwd_kernel(
    float *dhs /* (ns,nv,dk,dv) or NULL */, float *dvn /* (T,nv,dv) or NULL */, float *dS0 /* (nv,dk,dv) or NULL */,
    const float *dS_final /* (nv,dk,dv) or NULL */, const bf16 *q, const bf16 *k, const float *g, const float *beta,
    const float *tinv /* (T,nv,64) */, const float *qk /* (T,nv,64) */, const bf16 *dout /* (T,ldo) */,
    const int32_t *starts, const int32_t *meta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dv, int ldq,
    int ldo, float scale) {
    using Sm = KdaSbwdSmem<DK, BV>;
    constexpr int LDK = Sm::LDK, LDT = Sm::LDT, LDB = Sm::LDB, LDS = Sm::LDS;
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const Sm s(kda_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC];
    const int col0 = blockIdx.x * BV;
    const int w = threadIdx.x >> 5, mt = w & 3, half = w >> 2;
    const bool vjob = w < 4 * (BV / 16); /* dvn's 16 x 16 tiles: warp w has rows 16 (w % 4), cols 16 (w / 4) */
    /* D's tiles: DK = 128: warp w rows 16 w, all BV columns; DK = 64: rows 16 (w % 4), cols 16 (w / 4) */
    constexpr int NTS = DK == 128 ? BV / 8 : 2;
    const int m0 = DK == 128 ? 16 * w : 16 * mt, n0 = DK == 128 ? 0 : 16 * half;
    const bool sjob = DK == 128 || w < 4 * (BV / 16);
    const size_t sn = (size_t)DK * dv;
    for (int i = threadIdx.x; i < DK * BV; i += KDA_THREADS) {
        const int a = i / BV, cc = i % BV;
        s.D[a * LDS + cc] = dS_final ? dS_final[h * sn + (size_t)a * dv + col0 + cc] : 0.0f;
    }
    __syncthreads();
    for (int c = nc - 1; c >= 0; c--) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        /* the gradient leaving the chunk: stored, split */
        for (int i = threadIdx.x; i < DK * BV; i += KDA_THREADS) {
            const int a = i / BV, cc = i % BV;
            const float x = s.D[a * LDS + cc];
            if (dhs && ch.leaves) dhs[(ch.slot * nv + h) * sn + (size_t)a * dv + col0 + cc] = x;
            kda_split(x, &s.dh[a * LDB + cc], &s.dl[a * LDB + cc]);
        }
        for (int i = threadIdx.x; i < KDA_C * BV; i += KDA_THREADS) {
            const int r = i / BV, cc = i % BV;
            s.dout[r * LDB + cc] = r < L ? dout[(t0 + r) * ldo + (int64_t)h * dv + col0 + cc] : __float2bfloat16(0.0f);
        }
        for (int i = threadIdx.x; i < KDA_C * KDA_C; i += KDA_THREADS) {
            const int r = i / KDA_C, j = i % KDA_C;
            const float x =
                r < L && j <= r ? tinv[((t0 + r) * nv + h) * (int64_t)KDA_C + j] * beta[(t0 + j) * nv + h] : 0.0f;
            kda_split(x, &s.tbh[r * LDT + j], &s.tbl[r * LDT + j]);
        }
        kda_load_G(s.G, DK, g, t0, L, h, nv, DK);
        __syncthreads();
        /* X = gam * k, Q = scale gam * q (rows >= L: 0), gam_{L-1} */
        for (int i = threadIdx.x; i < KDA_C * DK; i += KDA_THREADS) {
            const int r = i / DK, a = i % DK;
            const int64_t at = (t0 + r) * ldq + (int64_t)kh * DK + a;
            const float kv = r < L ? __bfloat162float(k[at]) : 0.0f, qv = r < L ? __bfloat162float(q[at]) : 0.0f;
            const float gam = expf(s.G[i]);
            kda_split(gam * kv, &s.xh[r * LDK + a], &s.xl[r * LDK + a]);
            kda_split(scale * gam * qv, &s.qh[r * LDK + a], &s.ql[r * LDK + a]);
            if (r == 0) s.GL[a] = expf(s.G[(L - 1) * DK + a]);
        }
        __syncthreads();
        /* W = Tb X */
        float aw[1][DK / 16][4];
        gdn_zero(aw);
        kda_mma3<1, DK / 16, false, KDA_C>(aw, s.tbh, s.tbl, LDT, s.xh, s.xl, LDK, 16 * mt, half * (DK / 2));
        __syncthreads(); /* Tb and X are read: they become scale QK and dec * k */
#pragma unroll
        for (int ni = 0; ni < DK / 16; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 16 * mt + gdn_frag_row(e), a = half * (DK / 2) + 8 * ni + gdn_frag_col(e);
                kda_split(aw[0][ni][e], &s.wh[r * LDK + a], &s.wl[r * LDK + a]);
            }
        for (int i = threadIdx.x; i < KDA_C * DK; i += KDA_THREADS) {
            const int r = i / DK, a = i % DK;
            const float kv = r < L ? __bfloat162float(k[(t0 + r) * ldq + (int64_t)kh * DK + a]) : 0.0f;
            kda_split(expf(s.G[(L - 1) * DK + a] - s.G[i]) * kv, &s.xh[r * LDK + a], &s.xl[r * LDK + a]);
        }
        for (int i = threadIdx.x; i < KDA_C * KDA_C; i += KDA_THREADS) {
            const int r = i / KDA_C, j = i % KDA_C;
            const float x = r < L && j <= r ? scale * qk[((t0 + r) * nv + h) * (int64_t)KDA_C + j] : 0.0f;
            kda_split(x, &s.tbh[r * LDT + j], &s.tbl[r * LDT + j]);
        }
        __syncthreads();
        /* dvn_j = (dec_j * k_j)^T D + sum_{r >= j} scale QK_rj dO_r (rows >= L: 0) */
        if (vjob) {
            float ad[1][2][4];
            gdn_zero(ad);
            kda_mma3<1, 2, false, DK>(ad, s.xh, s.xl, LDK, s.dh, s.dl, LDB, 16 * mt, 16 * half);
            kda_mma2<1, 2, true, KDA_C>(ad, s.tbh, s.tbl, LDT, s.dout, LDB, 16 * mt, 16 * half);
#pragma unroll
            for (int ni = 0; ni < 2; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = 16 * mt + gdn_frag_row(e), cc = 16 * half + 8 * ni + gdn_frag_col(e);
                    const float x = ad[0][ni][e];
                    if (dvn && j < L) dvn[((t0 + j) * nv + h) * (int64_t)dv + col0 + cc] = x;
                    kda_split(x, &s.dvnh[j * LDB + cc], &s.dvnl[j * LDB + cc]);
                }
        }
        __syncthreads();
        /* D_in = Diag(gam_{L-1}) D + (scale gam * Q)^T dO - W^T dvn; 0 at a document start */
        if (sjob) {
            float aq[1][NTS][4], awd[1][NTS][4];
            gdn_zero(aq);
            gdn_zero(awd);
            kda_mma2<1, NTS, true, KDA_C>(aq, s.qh, s.ql, LDK, s.dout, LDB, m0, n0);
            kda_mma3<1, NTS, true, KDA_C>(awd, s.wh, s.wl, LDK, s.dvnh, s.dvnl, LDB, m0, n0);
#pragma unroll
            for (int ni = 0; ni < NTS; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int a = m0 + gdn_frag_row(e), cc = n0 + 8 * ni + gdn_frag_col(e);
                    const float x = s.GL[a] * s.D[a * LDS + cc] + (aq[0][ni][e] - awd[0][ni][e]);
                    s.D[a * LDS + cc] = ch.reset ? 0.0f : x;
                }
        }
        __syncthreads();
    }
    if (dS0)
        for (int i = threadIdx.x; i < DK * BV; i += KDA_THREADS) {
            const int a = i / BV, cc = i % BV;
            dS0[h * sn + (size_t)a * dv + col0 + cc] = s.D[a * LDS + cc];
        }
}
