/*
 * state_backward.cuh — the reverse state pass on mma.sync: from dS_final down the chunks, per chunk dh
 * at the exit boundary, dv2 = dv_loc + dec (K D), D <- gam_L D + scale (Q gam)^T dO - W^T dv2, cut at
 * document starts; transition columns carry M^T. Callers: gdn.cu's backward and dstate.
 */
#pragma once

/* ------------------------------------------------------------------------------------------------ */
/* the reverse state pass on mma.sync                                                                */

template <int DK, int BV, int NST> struct GdnStateBwdSmem {
    static constexpr int TK = GDN_C * (DK + 8) * 2, TB = GDN_C * (BV + 8) * 2;
    static constexpr int OQ = 0, OK = TK, OW = 2 * TK, OD = 3 * TK, OL = 3 * TK + TB, OG = 3 * TK + 2 * TB,
                         SB = OG + GDN_C * 4;
    unsigned char *st;
    bf16 *d_hi, *d_lo, *dv2n, *dos; /* dv2n: -dv2 */
    size_t bytes;
    __host__ __device__ explicit GdnStateBwdSmem(void *b) {
        GdnCarve c(b);
        st = c.take<unsigned char>((size_t)SB * NST);
        d_hi = c.take<bf16>(DK * (BV + 8));
        d_lo = c.take<bf16>(DK * (BV + 8));
        dv2n = c.take<bf16>(GDN_C * (BV + 8));
        dos = c.take<bf16>(GDN_C * (BV + 8));
        bytes = c.off;
    }
    GDN_DEV bf16 *q(int i) const { return (bf16 *)(st + i * SB + OQ); }
    GDN_DEV bf16 *k(int i) const { return (bf16 *)(st + i * SB + OK); }
    GDN_DEV bf16 *w(int i) const { return (bf16 *)(st + i * SB + OW); }
    GDN_DEV bf16 *dO(int i) const { return (bf16 *)(st + i * SB + OD); }
    GDN_DEV bf16 *dl(int i) const { return (bf16 *)(st + i * SB + OL); }
    GDN_DEV float *G(int i) const { return (float *)(st + i * SB + OG); }
};

/*
 * Grid (ncol / BV, nv, segments launched). D = dL/dS (DK x BV columns of head h) over segment
 * p = z + sg.pz0, from its last chunk down: D starts at the segment's entering gradient; per chunk it
 * is stored as dh at the chunk's exit boundary, dv2 = dv_loc + dec (K D), D <- gam_L D + scale (Q
 * gam)^T dO - W^T dv2, and cut to 0 when the chunk starts a document. Columns >= dv (sg.M) carry
 * M^T from the identity with dO = dv_loc = 0 (nothing stored per chunk).
 */
template <int DK, int BV, int NST>
__global__ void __launch_bounds__(GDN_THREADS)
    gdn_state_backward_kernel(bf16 *dhs /* (ns,nv,DK,dv) or NULL */, bf16 *dv2 /* (T,nv,dv) or NULL */, GdnSeg sg,
                            const bf16 *q /* (T,ldq) */, const bf16 *k /* (T,ldq) */, const bf16 *W /* (T,nv,DK) */,
                            const bf16 *dvl /* (T,nv,dv) */, const bf16 *dout /* (T,ldo) */, const float *G2,
                            const int4 *info, const int32_t *meta, int mode, int64_t T, int nk, int nv, int dv,
                            int ldq, int ldo, float scale, long long *tp /* (GDN_TP_SLOTS) cycles, chunks, or NULL */) {
    constexpr int MTS = DK / 64, NTS = BV / 8, LDK = DK + 8, LDB = BV + 8;
    static_assert(NST >= 2, "state_bwd: two stages at least");
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnStateBwdSmem<DK, BV, NST> s(gdn_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5;
    const int col0 = blockIdx.x * BV, srow0 = w * (DK / 4);
    const bool is_M = col0 >= dv;
    const int p = (int)blockIdx.z + sg.pz0;
    if (is_M && p == sg.m_skip) return; /* the whole block */
    if (sg.pick && *sg.pick != sg.pick_want) return; /* dual launch: the other configuration runs */
    const int64_t ldw = (int64_t)nv * DK, ldx = (int64_t)nv * dv, ns = (T + GDN_C - 1) / GDN_C + 1;
    const int64_t nsz = (int64_t)nv * DK * dv, nmz = (int64_t)nv * DK * DK;
    const GdnSpan sp = gdn_span<true>(sg, meta, mode, p, is_M, nsz);
    const int lo = sp.lo, hi = sp.hi;
    const float *D_in = sp.in;

    float D[MTS][NTS][4];
#pragma unroll
    for (int mi = 0; mi < MTS; mi++)
#pragma unroll
        for (int ni = 0; ni < NTS; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int a = srow0 + mi * 16 + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                float x = 0.0f;
                if (is_M) x = (a == col0 - dv + j) ? 1.0f : 0.0f;
                else if (D_in) x = D_in[((int64_t)h * DK + a) * dv + col0 + j];
                D[mi][ni][e] = x;
            }

    auto issue = [&](int4 ci, int buf) {
        const int64_t t0 = ci.x;
        const int L = ci.y;
        if (!is_M) gdn_load_rows<GDN_C, DK>(s.q(buf), LDK, q + t0 * ldq + (int64_t)kh * DK, ldq, L);
        gdn_load_rows<GDN_C, DK>(s.k(buf), LDK, k + t0 * ldq + (int64_t)kh * DK, ldq, L);
        gdn_load_rows<GDN_C, DK>(s.w(buf), LDK, W + t0 * ldw + (int64_t)h * DK, ldw, L);
        if (!is_M) {
            gdn_load_rows<GDN_C, BV>(s.dO(buf), LDB, dout + t0 * ldo + (int64_t)h * dv + col0, ldo, L);
            gdn_load_rows<GDN_C, BV>(s.dl(buf), LDB, dvl + t0 * ldx + (int64_t)h * dv + col0, ldx, L);
        }
        gdn_load_G(s.G(buf), G2, t0, L, h, nv);
    };
    /* inf[i]: (t0, L, flags) of chunk c - i; chunk c's tiles are issued during chunk c + NST - 1 */
    const int4 none = make_int4(0, 1, 0, 0);
    int4 inf[NST];
#pragma unroll
    for (int i = 0; i < NST; i++) inf[i] = hi - 1 - i >= lo ? info[hi - 1 - i] : none;
#pragma unroll
    for (int i = 0; i < NST - 1; i++) {
        if (hi - 1 - i >= lo) {
            issue(inf[i], i);
        }
        ptx_cp_async_commit();
    }
    int buf = 0;
    const bool tp_on = tp && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0;
    long long tpa[GDN_TP_N] = {0, 0, 0, 0, 0, 0}, tp_last = tp_on ? clock64() : 0;
    for (int c = hi - 1; c >= lo; c--) {
        const int4 infN = c - NST >= lo ? info[c - NST] : none;
        ptx_cp_async_wait<NST - 2>();
        __syncthreads(); /* chunk c's tiles are in; every warp is done with chunk c+1 */
        GDN_TP(0);
        {
            const int nb = buf + NST - 1 >= NST ? buf - 1 : buf + NST - 1;
            if (c - (NST - 1) >= lo) {
                issue(inf[NST - 1], nb);
            }
        }
        ptx_cp_async_commit();
        GDN_TP(1);
        const int4 cur = inf[0];
        const int64_t t0 = cur.x, t1 = t0 + cur.y;
        const int L = cur.y;
        const bool reset = (cur.z & 1) != 0;
        const bool exit_carries = (cur.z & 2) != 0;
        bf16 *drow = (dhs && !is_M && exit_carries)
                         ? dhs + ((t1 == T ? ns - 1 : t1 / GDN_C) * nv + h) * (int64_t)DK * dv + col0
                         : NULL;
#pragma unroll
        for (int mi = 0; mi < MTS; mi++)
#pragma unroll
            for (int ni = 0; ni < NTS; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int a = srow0 + mi * 16 + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                    gdn_split2(s.d_hi + a * LDB + j, s.d_lo + a * LDB + j, D[mi][ni][e], D[mi][ni][e + 1]);
                    if (drow) gdn_store2(drow + (int64_t)a * dv + j, D[mi][ni][e], D[mi][ni][e + 1]);
                }
        const float *sG = s.G(buf);
        if (!is_M) /* dos = scale gam_r dO_r */
            for (int i = threadIdx.x; i < GDN_C * BV / 2; i += GDN_THREADS) {
                const int r = i / (BV / 2), j = (i % (BV / 2)) * 2;
                const float f = r < L ? scale * exp2f(sG[r]) : 0.0f;
                const float2 d = gdn_load2(s.dO(buf) + r * LDB + j);
                gdn_store2(s.dos + r * LDB + j, f * d.x, f * d.y);
            }
        __syncthreads();
        GDN_TP(2);
        const float gL = sG[L - 1];
        float acc[1][NTS][4];
        gdn_warp_mma_hilo<NTS, DK>(acc, s.k(buf), LDK, s.d_hi, s.d_lo, LDB, 16 * w);
        GDN_TP(3);
#pragma unroll
        for (int ni = 0; ni < NTS; ni++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const int r = 16 * w + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                const float dec = r < L ? exp2f(gL - sG[r]) : 0.0f;
                float2 l = make_float2(0.0f, 0.0f);
                if (!is_M) l = gdn_load2(s.dl(buf) + r * LDB + j);
                const __nv_bfloat162 x =
                    __floats2bfloat162_rn(l.x + dec * acc[0][ni][e], l.y + dec * acc[0][ni][e + 1]);
                if (dv2 && !is_M && r < L) *(__nv_bfloat162 *)(dv2 + (t0 + r) * ldx + (int64_t)h * dv + col0 + j) = x;
                *(__nv_bfloat162 *)(s.dv2n + r * LDB + j) = __hneg2(x);
            }
        __syncthreads();
        GDN_TP(4);
        const float gam = exp2f(gL);
#pragma unroll
        for (int mi = 0; mi < MTS; mi++)
#pragma unroll
            for (int ni = 0; ni < NTS; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) D[mi][ni][e] *= gam;
        if (!is_M) { /* the two products on two chains */
            float t2[MTS][NTS][4];
            gdn_zero(t2);
            gdn_warp_mma<MTS, NTS, true, false, GDN_C>(t2, s.w(buf), LDK, s.dv2n, LDB, srow0, 0);
            gdn_warp_mma<MTS, NTS, true, false, GDN_C>(D, s.q(buf), LDK, s.dos, LDB, srow0, 0);
#pragma unroll
            for (int mi = 0; mi < MTS; mi++)
#pragma unroll
                for (int ni = 0; ni < NTS; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) D[mi][ni][e] += t2[mi][ni][e];
        } else {
            gdn_warp_mma<MTS, NTS, true, false, GDN_C>(D, s.w(buf), LDK, s.dv2n, LDB, srow0, 0);
        }
        GDN_TP(5);
        if (reset) {
#pragma unroll
            for (int mi = 0; mi < MTS; mi++)
#pragma unroll
                for (int ni = 0; ni < NTS; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) D[mi][ni][e] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < NST - 1; i++) inf[i] = inf[i + 1];
        inf[NST - 1] = infN;
        buf = buf + 1 == NST ? 0 : buf + 1;
    }
    if (tp_on) gdn_tp_store(tp, tpa, hi - lo);
    float *Dd = gdn_span_out<true>(sg, p, sp.dlast, is_M, nsz, nmz);
    if (!Dd) return;
#pragma unroll
    for (int mi = 0; mi < MTS; mi++)
#pragma unroll
        for (int ni = 0; ni < NTS; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int a = srow0 + mi * 16 + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                if (is_M) Dd[((int64_t)h * DK + a) * DK + col0 - dv + j] = D[mi][ni][e];
                else Dd[((int64_t)h * DK + a) * dv + col0 + j] = D[mi][ni][e];
            }
}

