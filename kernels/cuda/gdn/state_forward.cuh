/*
 * state_forward.cuh — the forward state pass on mma.sync: sequential over the chunks of a segment, it
 * stores the entering state h (bf16), vn = U - W S, and S <- gam_L S + K^T (dec vn); the state's MMA
 * operand split hi + lo bf16, NST stages of cp.async tiles ahead, 16 / 32 / 64 state columns per block.
 * Transition mode carries [S | M] from [0 | I]. Callers: gdn.cu's passes (forward, backward's recompute,
 * transition).
 */
#pragma once

/* ------------------------------------------------------------------------------------------------ */
/* the forward state pass on mma.sync                                                                */

template <int DK, int BV, int NST> struct GdnStateFwdSmem {
    static constexpr int OW = 0, OK = OW + GDN_C * (DK + 8) * 2, OU = OK + GDN_C * (DK + 8) * 2,
                         OG = OU + GDN_C * (BV + 8) * 2, SB = OG + GDN_C * 4; /* one stage, bytes */
    unsigned char *st;
    bf16 *s_hi, *s_lo, *vn;
    size_t bytes;
    __host__ __device__ explicit GdnStateFwdSmem(void *b) {
        GdnCarve c(b);
        st = c.take<unsigned char>((size_t)SB * NST);
        s_hi = c.take<bf16>(DK * (BV + 8));
        s_lo = c.take<bf16>(DK * (BV + 8));
        vn = c.take<bf16>(GDN_C * (BV + 8));
        bytes = c.off;
    }
    GDN_DEV bf16 *w(int i) const { return (bf16 *)(st + i * SB + OW); }
    GDN_DEV bf16 *k(int i) const { return (bf16 *)(st + i * SB + OK); }
    GDN_DEV bf16 *u(int i) const { return (bf16 *)(st + i * SB + OU); }
    GDN_DEV float *G(int i) const { return (float *)(st + i * SB + OG); }
};

/*
 * Grid (ncol / BV, nv, segments launched). Block (x, h, z) carries columns [x BV, x BV + BV) of head
 * h's state over segment p = z + sg.pz0 of the chunks of `mode`. ncol = dv, or dv + DK when sg.M:
 * columns >= dv are M, started from the identity with U = 0. Warp w holds state rows
 * [w DK/4, (w+1) DK/4).
 */
template <int DK, int BV, int NST>
__global__ void __launch_bounds__(GDN_THREADS)
    gdn_state_forward_kernel(bf16 *hs /* (ns,nv,DK,dv) or NULL */, bf16 *vn /* (T,nv,dv) or NULL */, GdnSeg sg,
                            const bf16 *W /* (T,nv,DK) */, const bf16 *U /* (T,nv,dv) */,
                            const bf16 *k /* (T,ldq) */, const float *G2 /* (T,nv) */, const int4 *info,
                            const int32_t *meta, int mode, int nk, int nv, int dv, int ldq,
                            long long *tp /* (GDN_TP_SLOTS) cycles, chunks, or NULL */) {
    constexpr int MTS = DK / 64, NTS = BV / 8, LDK = DK + 8, LDB = BV + 8;
    static_assert(NST >= 2, "state_fwd: two stages at least");
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnStateFwdSmem<DK, BV, NST> s(gdn_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5;
    const int col0 = blockIdx.x * BV, srow0 = w * (DK / 4);
    const bool is_M = col0 >= dv;
    const int p = (int)blockIdx.z + sg.pz0;
    if (is_M && p == sg.m_skip) return; /* the whole block */
    if (sg.pick && *sg.pick != sg.pick_want) return; /* dual launch: the other configuration runs */
    const int64_t ldw = (int64_t)nv * DK, ldu = (int64_t)nv * dv;
    const int64_t nsz = (int64_t)nv * DK * dv, nmz = (int64_t)nv * DK * DK;
    const GdnSpan sp = gdn_span<false>(sg, meta, mode, p, is_M, nsz);
    const int lo = sp.lo, hi = sp.hi;
    const float *S_in = sp.in;

    float S[MTS][NTS][4];
#pragma unroll
    for (int mi = 0; mi < MTS; mi++)
#pragma unroll
        for (int ni = 0; ni < NTS; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int a = srow0 + mi * 16 + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                float x = 0.0f;
                if (is_M) x = (a == col0 - dv + j) ? 1.0f : 0.0f;
                else if (S_in) x = S_in[((int64_t)h * DK + a) * dv + col0 + j];
                S[mi][ni][e] = x;
            }

    auto issue = [&](int4 ci, int buf) {
        const int64_t t0 = ci.x;
        gdn_load_rows<GDN_C, DK>(s.w(buf), LDK, W + t0 * ldw + (int64_t)h * DK, ldw, ci.y);
        gdn_load_rows<GDN_C, DK>(s.k(buf), LDK, k + t0 * ldq + (int64_t)kh * DK, ldq, ci.y);
        if (!is_M) gdn_load_rows<GDN_C, BV>(s.u(buf), LDB, U + t0 * ldu + (int64_t)h * dv + col0, ldu, ci.y);
        gdn_load_G(s.G(buf), G2, t0, ci.y, h, nv);
    };
    /* inf[i]: (t0, L, flags) of chunk c + i; chunk c's tiles are issued during chunk c - NST + 1 */
    const int4 none = make_int4(0, 1, 0, 0);
    int4 inf[NST];
#pragma unroll
    for (int i = 0; i < NST; i++) inf[i] = lo + i < hi ? info[lo + i] : none;
#pragma unroll
    for (int i = 0; i < NST - 1; i++) {
        if (lo + i < hi) {
            issue(inf[i], i);
        }
        ptx_cp_async_commit();
    }
    int buf = 0;
    const bool tp_on = tp && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0;
    long long tpa[GDN_TP_N] = {0, 0, 0, 0, 0, 0}, tp_last = tp_on ? clock64() : 0;
    for (int c = lo; c < hi; c++) {
        const int4 infN = c + NST < hi ? info[c + NST] : none;
        ptx_cp_async_wait<NST - 2>();
        __syncthreads(); /* chunk c's tiles are in; every warp is done with chunk c-1 */
        GDN_TP(0);
        {
            const int nb = buf + NST - 1 >= NST ? buf - 1 : buf + NST - 1; /* the stage of chunk c-1 */
            if (c + NST - 1 < hi) {
                issue(inf[NST - 1], nb);
            }
        }
        ptx_cp_async_commit();
        GDN_TP(1);
        const int4 cur = inf[0];
        const int64_t t0 = cur.x;
        const int L = cur.y;
        const bool reset = (cur.z & 1) != 0;
        bf16 *hrow = (hs && !is_M && !reset) ? hs + ((t0 / GDN_C) * nv + h) * (int64_t)DK * dv + col0 : NULL;
#pragma unroll
        for (int mi = 0; mi < MTS; mi++)
#pragma unroll
            for (int ni = 0; ni < NTS; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    if (reset) S[mi][ni][e] = S[mi][ni][e + 1] = 0.0f;
                    const int a = srow0 + mi * 16 + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                    gdn_split2(s.s_hi + a * LDB + j, s.s_lo + a * LDB + j, S[mi][ni][e], S[mi][ni][e + 1]);
                    if (hrow) gdn_store2(hrow + (int64_t)a * dv + j, S[mi][ni][e], S[mi][ni][e + 1]);
                }
        __syncthreads();
        GDN_TP(2);
        const float *sG = s.G(buf);
        const float gL = sG[L - 1];
        float acc[1][NTS][4];
        gdn_warp_mma_hilo<NTS, DK>(acc, s.w(buf), LDK, s.s_hi, s.s_lo, LDB, 16 * w);
        GDN_TP(3);
#pragma unroll
        for (int ni = 0; ni < NTS; ni++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const int r = 16 * w + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                float2 u = make_float2(0.0f, 0.0f);
                if (!is_M) u = gdn_load2(s.u(buf) + r * LDB + j);
                const float x0 = u.x - acc[0][ni][e], x1 = u.y - acc[0][ni][e + 1];
                if (vn && !is_M && r < L) gdn_store2(vn + (t0 + r) * ldu + (int64_t)h * dv + col0 + j, x0, x1);
                const float dec = r < L ? exp2f(gL - sG[r]) : 0.0f;
                gdn_store2(s.vn + r * LDB + j, x0 * dec, x1 * dec);
            }
        __syncthreads();
        GDN_TP(4);
        const float gam = exp2f(gL);
#pragma unroll
        for (int mi = 0; mi < MTS; mi++)
#pragma unroll
            for (int ni = 0; ni < NTS; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[mi][ni][e] *= gam;
        { /* two k halves, two chains */
            float t2[MTS][NTS][4];
            gdn_zero(t2);
            gdn_warp_mma<MTS, NTS, true, false, GDN_C / 2>(t2, s.k(buf) + (GDN_C / 2) * LDK, LDK,
                                                           s.vn + (GDN_C / 2) * LDB, LDB, srow0, 0);
            gdn_warp_mma<MTS, NTS, true, false, GDN_C / 2>(S, s.k(buf), LDK, s.vn, LDB, srow0, 0);
#pragma unroll
            for (int mi = 0; mi < MTS; mi++)
#pragma unroll
                for (int ni = 0; ni < NTS; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) S[mi][ni][e] += t2[mi][ni][e];
        }
        GDN_TP(5);
#pragma unroll
        for (int i = 0; i < NST - 1; i++) inf[i] = inf[i + 1];
        inf[NST - 1] = infN;
        buf = buf + 1 == NST ? 0 : buf + 1;
    }
    if (tp_on) gdn_tp_store(tp, tpa, hi - lo);
    float *Sd = gdn_span_out<false>(sg, p, sp.dlast, is_M, nsz, nmz);
    if (!Sd) return;
#pragma unroll
    for (int mi = 0; mi < MTS; mi++)
#pragma unroll
        for (int ni = 0; ni < NTS; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int a = srow0 + mi * 16 + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                if (is_M) Sd[((int64_t)h * DK + a) * DK + col0 - dv + j] = S[mi][ni][e];
                else Sd[((int64_t)h * DK + a) * dv + col0 + j] = S[mi][ni][e];
            }
}

