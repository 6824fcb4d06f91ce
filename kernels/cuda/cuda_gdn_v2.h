/*
 * cuda_gdn_v2.h — the mma.sync state passes, prep, dqkwg and wy_bwd of the chunked gated delta rule.
 * Not a standalone header: included by kernels/cuda/cuda_gdn.cu after its device helpers
 * (gdn_load_rows, gdn_split2, GdnCarve, ...), whose header has the algebra and the buffer layouts.
 *
 * Segmented state passes (research/gdn_cp.md §3 "intracard CP", §8.2). The chunk range of a pass is
 * cut into nseg segments of consecutive chunks (segment p: chunks [lo + n p / nseg, lo + n (p+1) /
 * nseg), n chunks; a segment may be empty). Forward:
 *   phase A  segments 0 .. nseg-2 in parallel: segment 0 from S0 gives E_1 (the state entering
 *            segment 1); segment p >= 1 runs [S | M] from [0 | I] (the transition pass) and gives
 *            H_p, M_p with E_{p+1} = M_p E_p + H_p
 *   fold     E_{p+1} = M_p E_p + H_p for p = 1 .. nseg-2, in order (gdn_state_affine_kernel: fp32,
 *            fixed order; the same link the CP scan uses)
 *   phase C  every segment in parallel from its E_p: the plain pass (h, vn stored, S_final from the last)
 * Backward, the mirror image: phase A on segments nseg-1 .. 1 (segment nseg-1 from dS_final gives
 * Dx_{nseg-2}, the gradient leaving segment nseg-2 at its end; segment p runs [D | M_p^T] from
 * [0 | I] with dO = dv_loc = 0 in the M^T columns), fold Dx_{p-1} = M_p^T Dx_p + dH_p, phase C from
 * the Dx_p. A document start inside a segment zeroes its M (the pass zeroes every column at a
 * reset), so documents crossing segment edges need nothing special. With nseg fixed by the shape,
 * the result has the same bits on every run.
 *
 * Pipelined state passes: NST stages of cp.async tiles (2 or 3), so the next NST-1 chunks' tiles are
 * in flight while a chunk is computed; the per-chunk (t0, L, flags) is loaded one chunk before its
 * tiles are issued.
 *
 * Document segments (GDN v3, sg.cuts): the forward and backward passes cut the chunks at document
 * starts into segments that run side by side (no transition columns, no fold; gdn_doc_range). The
 * host does not know the documents (no round trip), so it launches a fixed number of segments and
 * gdn_index_cuts_kernel places the cuts on the device; with one document all but one are empty.
 *
 * Dual launch (switch dual, cuda_gdn.cu "GDN v3.1"): the host launches each state pass twice, in two
 * configurations (the automatic column block and document segments, and 32 columns in 8 document
 * segments); gdn_index_cuts_kernel writes which one the documents call for (sg.pick) and the blocks of
 * the other exit before their first load. Both give the same bits (document segments are exact).
 *
 * wy_bwd: dk's two WY terms (beta gam Tinv^T dW and C K + C^T K) stay in registers; the fp32 dk of
 * dqkwg is read once, all loads of a 64-column half issued before its use, and the reverse cumsum of dg
 * runs on two warps with shuffles instead of one thread.
 */

/* where a segmented state pass reads and writes its states (see the header of this file). "first"
 * is the segment the pass starts in (forward 0, backward nseg-1), "last" the one it ends in. */
struct GdnSeg {
    const float *in_edge;  /* state entering the first segment (NULL = 0) */
    const float *in_rest;  /* state entering segment p != first at in_rest + p ns (NULL = 0) */
    float *out_edge;       /* state leaving the last segment (NULL: not written) */
    float *out_begin;      /* state leaving the first segment when it is not the last (NULL: see out_rest) */
    float *out_rest;       /* state leaving segment p at out_rest + p ns (NULL: not written) */
    float *M;              /* transition columns leaving segment p at M + p nm (fwd M, bwd M^T); NULL: none */
    int nseg;              /* segments of the chunk range */
    int pz0;               /* segment of blockIdx.z == 0 */
    int m_skip;            /* segment whose transition columns are not run (-1: none) */
    const int32_t *cuts;   /* document segments (nseg + 1 chunk indices, gdn_index_cuts_kernel), or NULL */
    const int32_t *pick;   /* dual launch: the configuration the index chose on the device, or NULL */
    int pick_want;         /* this launch's configuration: its blocks exit at once when *pick differs */
};

/* Document segments (sg.cuts): segment p is chunks [cuts[p], cuts[p+1]); every cut but cuts[0] is a
 * chunk that starts a document (or the range's end), so no state crosses a cut: the segments run side
 * by side from 0 (segment 0 from the state entering the range), no transition columns, no fold, and
 * every chunk gets the same bits as in one pass. "last": the segment that ends the range (the last
 * non-empty one; segment 0 when all are empty) reads dS_final and writes S_final. */
GDN_DEV void gdn_doc_range(const GdnSeg &g, int p, int *lo, int *hi, bool *last) {
    const int e = g.cuts[g.nseg];
    *lo = g.cuts[p];
    *hi = g.cuts[p + 1];
    *last = *hi == e && (*lo < e || p == 0);
}

GDN_DEV void gdn_seg_range(int *lo, int *hi, int p, int nseg) {
    if (nseg > 1) {
        const int64_t n = *hi - *lo;
        const int a = *lo + (int)(n * p / nseg), b = *lo + (int)(n * (p + 1) / nseg);
        *lo = a;
        *hi = b;
    }
}

GDN_DEV const float *gdn_seg_in(const GdnSeg &g, int p, int first, int64_t ns) {
    if (p == first) return g.in_edge;
    return g.in_rest ? g.in_rest + p * ns : NULL;
}

GDN_DEV float *gdn_seg_out(const GdnSeg &g, int p, int first, int last, int64_t ns) {
    if (p == last && g.out_edge) return g.out_edge;
    if (p == first && p != last && g.out_begin) return g.out_begin;
    return g.out_rest ? g.out_rest + p * ns : NULL;
}

/* The span of one block of a state pass (v2 and wgmma, forward and backward; REV: the backward, which
 * starts in segment nseg - 1 and walks its chunks last to first): chunks [lo, hi) of `mode`
 * (gdn_chunk_range), cut to document segment p (sg.cuts, gdn_doc_range; dlast: p ends the range) or to
 * segment p of sg.nseg (gdn_seg_range); in: the state (forward) or dL/dS (backward) entering it, (nv,
 * DK, dv) fp32, NULL = 0 (transition columns, is_M, start from the identity instead). nsz = nv DK dv. */
struct GdnSpan {
    int lo, hi;
    bool dlast;
    const float *in;
};
template <bool REV>
GDN_DEV GdnSpan gdn_span(const GdnSeg &sg, const int32_t *meta, int mode, int p, bool is_M, int64_t nsz) {
    GdnSpan r;
    r.dlast = false;
    gdn_chunk_range(meta, mode, &r.lo, &r.hi);
    if (sg.cuts) gdn_doc_range(sg, p, &r.lo, &r.hi, &r.dlast);
    else gdn_seg_range(&r.lo, &r.hi, p, sg.nseg);
    const bool at_in = REV ? r.dlast : p == 0; /* the document segment that reads the range's edge state */
    r.in = is_M ? NULL : sg.cuts ? (at_in ? sg.in_edge : NULL) : gdn_seg_in(sg, p, REV ? sg.nseg - 1 : 0, nsz);
    return r;
}

/* where the block of gdn_span writes the state (or dL/dS) leaving its span, NULL: nowhere: the
 * transition columns at sg.M + p nm (nm = nv DK DK), the range's edge from the document segment that
 * ends it (forward: dlast, backward: p == 0), else gdn_seg_out */
template <bool REV>
GDN_DEV float *gdn_span_out(const GdnSeg &sg, int p, bool dlast, bool is_M, int64_t nsz, int64_t nmz) {
    if (is_M) return sg.M + p * nmz;
    if (sg.cuts) return (REV ? p == 0 : dlast) ? sg.out_edge : NULL;
    return REV ? gdn_seg_out(sg, p, sg.nseg - 1, 0, nsz) : gdn_seg_out(sg, p, 0, sg.nseg - 1, nsz);
}

/* acc = A (Bhi + Blo) for one warp: rows [m0, m0 + 16) x NT * 8 columns, A row-major (rows m, cols k),
 * Bhi / Blo row-major (rows k, cols n), k in [0, KD). One A fragment per k step serves both B terms;
 * four accumulator sets (hi / lo x even / odd k step) make the dependent MMA chain KD / 32 long
 * instead of KD / 16 per term; they are summed in a fixed order at the end. */
template <int NT, int KD>
GDN_DEV void gdn_warp_mma_hilo(float (&acc)[1][NT][4], const bf16 *sA, int lda, const bf16 *sBh, const bf16 *sBl,
                               int ldb, int m0) {
    const int lane = threadIdx.x & 31, r8 = lane & 7, i1 = (lane >> 3) & 1, i2 = lane >> 4;
    float c[4][NT][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) c[i][ni][e] = 0.0f;
#pragma unroll
    for (int k0 = 0; k0 < KD; k0 += 16) {
        const int sx = (k0 >> 4) & 1;
        uint32_t a[4];
        ptx_ldmatrix_x4(a, sA + (m0 + r8 + i1 * 8) * lda + k0 + i2 * 8);
#pragma unroll
        for (int nj = 0; nj < NT; nj += 2) {
            uint32_t bh[4], bl[4];
            ptx_ldmatrix_x4_trans(bh, sBh + (k0 + r8 + i1 * 8) * ldb + nj * 8 + i2 * 8);
            ptx_ldmatrix_x4_trans(bl, sBl + (k0 + r8 + i1 * 8) * ldb + nj * 8 + i2 * 8);
            ptx_mma_bf16_16816(c[sx][nj], a, bh[0], bh[1]);
            ptx_mma_bf16_16816(c[sx][nj + 1], a, bh[2], bh[3]);
            ptx_mma_bf16_16816(c[2 + sx][nj], a, bl[0], bl[1]);
            ptx_mma_bf16_16816(c[2 + sx][nj + 1], a, bl[2], bl[3]);
        }
    }
#pragma unroll
    for (int ni = 0; ni < NT; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[0][ni][e] = (c[0][ni][e] + c[1][ni][e]) + (c[2][ni][e] + c[3][ni][e]);
}

/* per-phase cycle counts of one state pass (tune.prof == 2): block (0,0,0), thread 0 */
#define GDN_TP_N 6
#define GDN_TP(i)                                              \
    do {                                                       \
        if (tp_on) {                                           \
            const long long now_ = clock64();                  \
            tpa[i] += now_ - tp_last;                          \
            tp_last = now_;                                    \
        }                                                      \
    } while (0)

/* ------------------------------------------------------------------------------------------------ */
/* state_fwd v2                                                                                       */

template <int DK, int BV, int NST> struct GdnStateFwdSmemV2 {
    static constexpr int OW = 0, OK = OW + GDN_C * (DK + 8) * 2, OU = OK + GDN_C * (DK + 8) * 2,
                         OG = OU + GDN_C * (BV + 8) * 2, SB = OG + GDN_C * 4; /* one stage, bytes */
    unsigned char *st;
    bf16 *s_hi, *s_lo, *vn;
    size_t bytes;
    __host__ __device__ explicit GdnStateFwdSmemV2(void *b) {
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
    gdn_state_fwd_v2_kernel(bf16 *hs /* (ns,nv,DK,dv) or NULL */, bf16 *vn /* (T,nv,dv) or NULL */, GdnSeg sg,
                            const bf16 *W /* (T,nv,DK) */, const bf16 *U /* (T,nv,dv) */,
                            const bf16 *k /* (T,ldq) */, const float *G2 /* (T,nv) */, const int4 *info,
                            const int32_t *meta, int mode, int nk, int nv, int dv, int ldq,
                            long long *tp /* (GDN_TP_N) cycles, or NULL */) {
    constexpr int MTS = DK / 64, NTS = BV / 8, LDK = DK + 8, LDB = BV + 8;
    static_assert(NST >= 2, "state_fwd_v2: two stages at least");
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnStateFwdSmemV2<DK, BV, NST> s(gdn_smem);
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
    if (tp_on)
        for (int i = 0; i < GDN_TP_N; i++) tp[i] = tpa[i];
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

/* ------------------------------------------------------------------------------------------------ */
/* state_bwd v2                                                                                       */

template <int DK, int BV, int NST> struct GdnStateBwdSmemV2 {
    static constexpr int TK = GDN_C * (DK + 8) * 2, TB = GDN_C * (BV + 8) * 2;
    static constexpr int OQ = 0, OK = TK, OW = 2 * TK, OD = 3 * TK, OL = 3 * TK + TB, OG = 3 * TK + 2 * TB,
                         SB = OG + GDN_C * 4;
    unsigned char *st;
    bf16 *d_hi, *d_lo, *dv2n, *dos; /* dv2n: -dv2 */
    size_t bytes;
    __host__ __device__ explicit GdnStateBwdSmemV2(void *b) {
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
    gdn_state_bwd_v2_kernel(bf16 *dhs /* (ns,nv,DK,dv) or NULL */, bf16 *dv2 /* (T,nv,dv) or NULL */, GdnSeg sg,
                            const bf16 *q /* (T,ldq) */, const bf16 *k /* (T,ldq) */, const bf16 *W /* (T,nv,DK) */,
                            const bf16 *dvl /* (T,nv,dv) */, const bf16 *dout /* (T,ldo) */, const float *G2,
                            const int4 *info, const int32_t *meta, int mode, int64_t T, int nk, int nv, int dv,
                            int ldq, int ldo, float scale, long long *tp /* (GDN_TP_N) cycles, or NULL */) {
    constexpr int MTS = DK / 64, NTS = BV / 8, LDK = DK + 8, LDB = BV + 8;
    static_assert(NST >= 2, "state_bwd_v2: two stages at least");
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnStateBwdSmemV2<DK, BV, NST> s(gdn_smem);
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
    if (tp_on)
        for (int i = 0; i < GDN_TP_N; i++) tp[i] = tpa[i];
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

/* ------------------------------------------------------------------------------------------------ */
/* wy_bwd v3 helpers                                                                                  */

/* kkg_ij = (k_i.k_j) e^{G_i - G_j} for j < i < L, else 0 (fp32, stride GDN_LDF): gdn_build_A's kkg */
template <int DK> GDN_DEV void gdn_build_kkg(float *sKKG, const bf16 *sK, const float *sG, int L) {
    const int w = threadIdx.x >> 5;
    float acc[1][8][4];
    gdn_zero(acc);
    gdn_warp_mma<1, 8, false, true, DK>(acc, sK, DK + 8, sK, DK + 8, 16 * w, 0);
#pragma unroll
    for (int ni = 0; ni < 8; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = 16 * w + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
            float kkg = 0.0f;
            if (j < i && i < L) kkg = acc[0][ni][e] * exp2f(sG[i] - sG[j]);
            sKKG[i * GDN_LDF + j] = kkg;
        }
}

/* gdn_solve with A_ij = beta_i kkg_ij formed on the fly (the value gdn_build_A stores) */
GDN_DEV void gdn_solve_scaled(float *sT, float *sX, const float *sK, const float *sB) {
    const int tid = threadIdx.x;
    for (int i = tid; i < GDN_C * GDN_C; i += GDN_THREADS) sT[(i / GDN_C) * GDN_LDF + i % GDN_C] = 0.0f;
    __syncthreads();
    if (tid < GDN_C) {
        const int o = 16 * (tid >> 4), c = tid & 15;
        float tc[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            float s = (i == c) ? 1.0f : 0.0f;
            const float bi = sB[o + i];
#pragma unroll
            for (int j = 0; j < i; j++) s = fmaf(-(bi * sK[(o + i) * GDN_LDF + o + j]), tc[j], s);
            tc[i] = s;
            sT[(o + i) * GDN_LDF + o + c] = s;
        }
    }
    __syncthreads();
#pragma unroll 1
    for (int d = 1; d < 4; d++) {
        const int n = (4 - d) * 256;
        for (int e = tid; e < n; e += GDN_THREADS) {
            const int bi = d + (e >> 8), bj = bi - d, r = (e >> 4) & 15, cc = e & 15;
            const float *arow = sK + (16 * bi + r) * GDN_LDF;
            const float brow = sB[16 * bi + r];
            float x = 0.0f;
            for (int k = 16 * bj; k < 16 * bi; k++) x = fmaf(brow * arow[k], sT[k * GDN_LDF + 16 * bj + cc], x);
            sX[(e >> 8) * 272 + r * 17 + cc] = x;
        }
        __syncthreads();
        for (int e = tid; e < n; e += GDN_THREADS) {
            const int bi = d + (e >> 8), bj = bi - d, r = (e >> 4) & 15, cc = e & 15;
            const float *trow = sT + (16 * bi + r) * GDN_LDF + 16 * bi, *xb = sX + (e >> 8) * 272;
            float t = 0.0f;
#pragma unroll
            for (int m = 0; m < 16; m++) t = fmaf(trow[m], xb[m * 17 + cc], t);
            sT[(16 * bi + r) * GDN_LDF + 16 * bj + cc] = -t;
        }
        __syncthreads();
    }
}

template <int DK, int DV> struct GdnWySmemV3 {
    bf16 *k, *v, *dw, *du, *tb, *dt, *m1, *cc;
    float *kkg, *T, *G, *beta, *dbeta, *dG, *tmp;
    size_t bytes;
    __host__ __device__ explicit GdnWySmemV3(void *b) {
        GdnCarve c(b);
        k = c.take<bf16>(GDN_C * (DK + 8));
        v = c.take<bf16>(GDN_C * (DV + 8));
        dw = c.take<bf16>(GDN_C * (DK + 8));
        du = c.take<bf16>(GDN_C * (DV + 8));
        tb = c.take<bf16>(GDN_C * GDN_LDP);
        tmp = (float *)tb; /* the solve's scratch (before tb exists) and the row sums (after tb is dead) */
        T = c.take<float>(GDN_C * GDN_LDF);
        dt = (bf16 *)T;  /* dT once Tinv is in tb */
        m1 = dw;         /* once dW is dead (after dT) */
        cc = du;         /* once dU is dead */
        kkg = c.take<float>(GDN_C * GDN_LDF);
        G = c.take<float>(GDN_C);
        beta = c.take<float>(GDN_C);
        dbeta = c.take<float>(GDN_C);
        dG = c.take<float>(GDN_C);
        bytes = c.off;
    }
};
static_assert(GDN_SOLVE_SCRATCH * 4 <= GDN_C * GDN_LDP * 2, "wy v3: the solve scratch must fit in tb");
static_assert(GDN_C * GDN_LDP * 2 <= GDN_C * GDN_LDF * 4, "wy v3: dt must fit in T");
static_assert(GDN_C * GDN_LDP * 2 <= GDN_C * (64 + 8) * 2, "wy v3: m1 and C must fit in dW and dU");

/* ------------------------------------------------------------------------------------------------ */
/* wy_bwd v3: wy_bwd v2 in 110 KB of shared memory instead of 157 (2 blocks per SM). A is not      */
/* stored (A_ij = beta_i kkg_ij is recomputed, the same fp32 value); dt lives in the fp32 Tinv tile, */
/* m1 in dW's and C in dU's once they are dead, the solve scratch in the bf16 Tinv tile: every      */
/* product and rounding is v2's, so the results are bitwise v2's                                    */

/*
 * Per (chunk, value head), dW = dw, dU = dv2:
 *   dXw = Tinv^T dW: dk += beta gam dXw, dbeta += gam k.dXw, dG += beta gam k.dXw
 *   dXu = Tinv^T dU: dv = beta dXu, dbeta += v.dXu
 *   dT = (dW K^T) diag(beta gam) + (dU V^T) diag(beta), strictly lower; dA = -(Tinv^T dT Tinv^T) strictly lower
 *   dk_i += sum_j C_ij k_j, dk_j += sum_i C_ij k_i (C = dA beta_i Gam), dbeta_i += sum_j dA_ij kkg_ij,
 *   dG_i += sum_j dA_ij A_ij, dG_j -= sum_i dA_ij A_ij
 * then dg = reverse cumsum over the chunk of (dG of dqkwg + these). dk accumulates in fp32 (dkv).
 */
template <int DK, int DV>
__global__ void __launch_bounds__(GDN_THREADS, 2)
    gdn_wy_bwd_v3_kernel(float *dkv /* (T,nv,DK) += */, bf16 *dk_out /* (T,ldq) when nv == nk, else NULL */,
                         bf16 *dv_out /* (T,ldv) */, float *dg_out /* (T,nv) */, float *dbeta_out /* (T,nv) */,
                         const bf16 *dw /* (T,nv,DK) */, const bf16 *dv2 /* (T,nv,DV) */,
                         const float *dgp /* (T,nv) */, const float *dgp2 /* (T,nv) second partial, or NULL */,
                         const bf16 *k /* (T,ldq) */, const bf16 *v /* (T,ldv) */,
                         const float *G2, const float *beta, const int32_t *starts, const int32_t *meta, int nk,
                         int nv, int ldq, int ldv) {
    constexpr int LDK = DK + 8, LDV = DV + 8, NB = DK / 64;
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnWySmemV3<DK, DV> s(gdn_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t ldk = (int64_t)nv * DK, ldx = (int64_t)nv * DV;
    const int nc = meta[GDN_META_NC];
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const int64_t t0 = starts[c];
        const int L = starts[c + 1] - (int)t0;
        __syncthreads();
        gdn_load_rows<GDN_C, DK>(s.k, LDK, k + t0 * ldq + (int64_t)kh * DK, ldq, L);
        gdn_load_rows<GDN_C, DV>(s.v, LDV, v + t0 * ldv + (int64_t)h * DV, ldv, L);
        gdn_load_rows<GDN_C, DK>(s.dw, LDK, dw + t0 * ldk + (int64_t)h * DK, ldk, L);
        gdn_load_rows<GDN_C, DV>(s.du, LDV, dv2 + t0 * ldx + (int64_t)h * DV, ldx, L);
        gdn_load_G(s.G, G2, t0, L, h, nv);
        ptx_cp_async_commit();
        float dgp_r = 0.0f; /* row threadIdx.x's dG of dqkwg, read early */
        if (threadIdx.x < GDN_C) {
            const int r = threadIdx.x;
            s.beta[r] = r < L ? beta[(t0 + r) * nv + h] : 0.0f;
            s.dbeta[r] = 0.0f;
            s.dG[r] = 0.0f;
            if (r < L) dgp_r = dgp2 ? dgp[(t0 + r) * nv + h] + dgp2[(t0 + r) * nv + h] : dgp[(t0 + r) * nv + h];
        }
        ptx_cp_async_wait<0>();
        __syncthreads();
        gdn_build_kkg<DK>(s.kkg, s.k, s.G, L);
        __syncthreads();
        gdn_solve_scaled(s.T, s.tmp, s.kkg, s.beta);
        for (int i = threadIdx.x; i < GDN_C * GDN_C / 2; i += GDN_THREADS) {
            const int r = i / (GDN_C / 2), j = (i % (GDN_C / 2)) * 2;
            gdn_store2(s.tb + r * GDN_LDP + j, s.T[r * GDN_LDF + j], s.T[r * GDN_LDF + j + 1]);
        }
        __syncthreads();
        const int rA = 16 * w + (lane >> 2); /* this lane's accumulator rows: rA, rA + 8 */
        float dkr[NB][1][8][4];              /* dk of this warp's rows, both WY terms */
        /* dXw = Tinv^T dW: dk = beta gam dXw (rows < L) */
        {
            float kx[2] = {0.0f, 0.0f};
#pragma unroll
            for (int nb = 0; nb < NB; nb++) {
                float acc[1][8][4];
                gdn_zero(acc);
                gdn_warp_mma<1, 8, true, false, GDN_C>(acc, s.tb, GDN_LDP, s.dw, LDK, 16 * w, 64 * nb);
#pragma unroll
                for (int ni = 0; ni < 8; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        const int j = 16 * w + gdn_frag_row(e), col = 64 * nb + ni * 8 + gdn_frag_col(e);
                        const float2 kk = gdn_load2(s.k + j * LDK + col);
                        kx[e >> 1] += kk.x * acc[0][ni][e] + kk.y * acc[0][ni][e + 1];
                        const float bg = j < L ? s.beta[j] * exp2f(s.G[j]) : 0.0f;
                        dkr[nb][0][ni][e] = bg * acc[0][ni][e];
                        dkr[nb][0][ni][e + 1] = bg * acc[0][ni][e + 1];
                    }
            }
            kx[0] = gdn_quad_sum(kx[0]);
            kx[1] = gdn_quad_sum(kx[1]);
            if ((lane & 3) == 0)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int j = rA + 8 * i;
                    const float gm = j < L ? exp2f(s.G[j]) : 0.0f;
                    s.dbeta[j] += gm * kx[i];
                    s.dG[j] += s.beta[j] * gm * kx[i];
                }
        }
        /* dXu = Tinv^T dU -> dv */
        {
            float vx[2] = {0.0f, 0.0f};
#pragma unroll 1
            for (int n0 = 0; n0 < DV; n0 += 64) {
                float acc[1][8][4];
                gdn_zero(acc);
                gdn_warp_mma<1, 8, true, false, GDN_C>(acc, s.tb, GDN_LDP, s.du, LDV, 16 * w, n0);
#pragma unroll
                for (int ni = 0; ni < 8; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        const int j = 16 * w + gdn_frag_row(e), col = n0 + ni * 8 + gdn_frag_col(e);
                        const float2 vv = gdn_load2(s.v + j * LDV + col);
                        vx[e >> 1] += vv.x * acc[0][ni][e] + vv.y * acc[0][ni][e + 1];
                        if (j < L)
                            gdn_store2(dv_out + (t0 + j) * ldv + (int64_t)h * DV + col, s.beta[j] * acc[0][ni][e],
                                       s.beta[j] * acc[0][ni][e + 1]);
                    }
            }
            vx[0] = gdn_quad_sum(vx[0]);
            vx[1] = gdn_quad_sum(vx[1]);
            if ((lane & 3) == 0) {
                s.dbeta[rA] += vx[0];
                s.dbeta[rA + 8] += vx[1];
            }
        }
        /* dT */
        {
            float a1[1][8][4], a2[1][8][4];
            gdn_zero(a1);
            gdn_zero(a2);
            gdn_warp_mma<1, 8, false, true, DK>(a1, s.dw, LDK, s.k, LDK, 16 * w, 0);
            gdn_warp_mma<1, 8, false, true, DV>(a2, s.du, LDV, s.v, LDV, 16 * w, 0);
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int i = 16 * w + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                    float x[2];
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const int jj = j + u;
                        x[u] = (jj < i && i < L) ? s.beta[jj] * (exp2f(s.G[jj]) * a1[0][ni][e + u] + a2[0][ni][e + u])
                                                 : 0.0f;
                    }
                    gdn_store2(s.dt + i * GDN_LDP + j, x[0], x[1]);
                }
        }
        __syncthreads();
        /* M1 = Tinv^T dT */
        {
            float acc[1][8][4];
            gdn_zero(acc);
            gdn_warp_mma<1, 8, true, false, GDN_C>(acc, s.tb, GDN_LDP, s.dt, GDN_LDP, 16 * w, 0);
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int i = 16 * w + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                    gdn_store2(s.m1 + i * GDN_LDP + j, acc[0][ni][e], acc[0][ni][e + 1]);
                }
        }
        __syncthreads();
        /* dA = -(M1 Tinv^T), strictly lower: C, E = dA A (in place of A), dbeta */
        {
            float acc[1][8][4];
            gdn_zero(acc);
            gdn_warp_mma<1, 8, false, true, GDN_C>(acc, s.m1, GDN_LDP, s.tb, GDN_LDP, 16 * w, 0);
            float db[2] = {0.0f, 0.0f};
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int i = 16 * w + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                    float cv[2];
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const int jj = j + u;
                        const bool in = jj < i && i < L;
                        const float da = in ? -acc[0][ni][e + u] : 0.0f;
                        cv[u] = in ? da * s.beta[i] * exp2f(s.G[i] - s.G[jj]) : 0.0f;
                        const float kg = s.kkg[i * GDN_LDF + jj];
                        db[e >> 1] += da * kg;
                        s.kkg[i * GDN_LDF + jj] = da * (s.beta[i] * kg); /* E = dA A */
                    }
                    gdn_store2(s.cc + i * GDN_LDP + j, cv[0], cv[1]);
                }
            db[0] = gdn_quad_sum(db[0]);
            db[1] = gdn_quad_sum(db[1]);
            if ((lane & 3) == 0) {
                s.dbeta[rA] += db[0];
                s.dbeta[rA + 8] += db[1];
            }
        }
        __syncthreads();
        /* dk = dk of dqkwg + (the dXw term + C K + C^T K): every load of a half issued first */
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            float2 old[8][2];
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int j = 16 * w + gdn_frag_row(e), col = 64 * nb + ni * 8 + gdn_frag_col(e);
                    old[ni][e >> 1] = j < L ? *(const float2 *)(dkv + (t0 + j) * ldk + (int64_t)h * DK + col)
                                            : make_float2(0.0f, 0.0f);
                }
            gdn_warp_mma<1, 8, false, false, GDN_C>(dkr[nb], s.cc, GDN_LDP, s.k, LDK, 16 * w, 64 * nb);
            gdn_warp_mma<1, 8, true, false, GDN_C>(dkr[nb], s.cc, GDN_LDP, s.k, LDK, 16 * w, 64 * nb);
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int j = 16 * w + gdn_frag_row(e), col = 64 * nb + ni * 8 + gdn_frag_col(e);
                    if (j < L) {
                        const float2 o = old[ni][e >> 1];
                        const float x0 = o.x + dkr[nb][0][ni][e], x1 = o.y + dkr[nb][0][ni][e + 1];
                        if (dk_out) gdn_store2(dk_out + (t0 + j) * ldq + (int64_t)h * DK + col, x0, x1); /* final dk */
                        else *(float2 *)(dkv + (t0 + j) * ldk + (int64_t)h * DK + col) = make_float2(x0, x1);
                    }
                }
        }
        /* dG of the A entries: row sums minus column sums of E */
        if (threadIdx.x < GDN_C) {
            const int r = threadIdx.x;
            float rs = 0.0f, cs = 0.0f;
            for (int j = 0; j < GDN_C; j++) {
                rs += s.kkg[r * GDN_LDF + j];
                cs += s.kkg[j * GDN_LDF + r];
            }
            s.tmp[r] = r < L ? dgp_r + s.dG[r] + (rs - cs) : 0.0f;
        }
        __syncthreads();
        /* dg = reverse cumsum inside the chunk: rows 0..63 on warps 0 and 1 */
        {
            float x = 0.0f;
            if (threadIdx.x < GDN_C) {
                x = s.tmp[threadIdx.x];
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const float y = __shfl_down_sync(GDN_FULL, x, o);
                    if (lane + o < 32) x += y;
                }
                if (threadIdx.x == 32) s.dG[0] = x; /* the sum of rows 32..63 */
            }
            __syncthreads();
            if (threadIdx.x < 32) x += s.dG[0];
            if ((int)threadIdx.x < L) {
                dg_out[(t0 + threadIdx.x) * nv + h] = x;
                dbeta_out[(t0 + threadIdx.x) * nv + h] = s.dbeta[threadIdx.x];
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* prep v2: G, A, Tinv, W, U per (chunk, value head) in 74 KB of shared memory (3 blocks per          */
/* SM instead of 2): A lives where the bf16 Tinv factors go once the solve is done, and one pair of    */
/* factor tiles serves W, then U                                                                      */

template <int DK, int DV> struct GdnPrepSmemV2 {
    bf16 *k, *v, *t_hi, *t_lo;
    float *A, *T, *G, *beta, *tmp;
    size_t bytes;
    __host__ __device__ explicit GdnPrepSmemV2(void *b) {
        GdnCarve c(b);
        k = c.take<bf16>(GDN_C * (DK + 8));
        v = c.take<bf16>(GDN_C * (DV + 8));
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
static_assert(GDN_C * GDN_LDF * 4 <= 2 * GDN_C * GDN_LDP * 2, "prep v2: A must fit in the factor tiles");

template <int DK, int DV>
__global__ void __launch_bounds__(GDN_THREADS)
    gdn_prep_v2_kernel(bf16 *W /* (T,nv,DK) */, bf16 *U /* (T,nv,DV) or NULL */, float *G2 /* (T,nv) */,
                       const bf16 *k /* (T,ldq) nk heads */, const bf16 *v /* (T,ldv) nv heads, or NULL */,
                       const float *g /* (T,nv) */, const float *beta /* (T,nv) */, const int32_t *starts,
                       const int32_t *meta, int mode, int nk, int nv, int ldq, int ldv) {
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnPrepSmemV2<DK, DV> s(gdn_smem);
    const int h = blockIdx.y, kh = h / (nv / nk);
    int lo, hi;
    gdn_chunk_range(meta, mode, &lo, &hi);
    for (int c = lo + blockIdx.x; c < hi; c += gridDim.x) {
        const int64_t t0 = starts[c];
        const int L = starts[c + 1] - (int)t0;
        __syncthreads(); /* the previous chunk is done with shared memory */
        gdn_load_rows<GDN_C, DK>(s.k, DK + 8, k + t0 * ldq + (int64_t)kh * DK, ldq, L);
        if (U) gdn_load_rows<GDN_C, DV>(s.v, DV + 8, v + t0 * ldv + (int64_t)h * DV, ldv, L);
        ptx_cp_async_commit();
        gdn_gates_cumsum(s.G, s.beta, s.tmp, g, beta, t0, L, h, nv);
        ptx_cp_async_wait<0>();
        __syncthreads();
        gdn_build_A<DK>(s.A, NULL, s.k, s.G, s.beta, L);
        __syncthreads();
        gdn_solve(s.T, s.tmp, s.A); /* ends synchronised: A is dead */
        /* W = (Tinv diag(beta gam)) K, then U = (Tinv diag(beta)) V, the factor split hi + lo bf16 */
#pragma unroll 1
        for (int pass = 0; pass < (U ? 2 : 1); pass++) {
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

/* ------------------------------------------------------------------------------------------------ */
/* dqkwg v2: dq, dk, dw and the dG terms (the algebra below) split over the two halves of DK          */
/*                                                                                                    */
/* Block (2 c + half, h) computes columns [half DK/2, half DK/2 + DK/2) of dq, dk, dw of chunk c: it   */
/* needs only that half of q, k (as columns) and of h, dh (as rows), so its tiles take 112 KB instead  */
/* of 165 and two blocks share an SM (one block's loads under the other's products). ds = dO vn^T is   */
/* computed by both halves (1 of the 6 products). dG comes out as two partials (the half's q.dq - k.dk */
/* over its columns, and on the last row its share of gam <h, dh> + sum k.dk_inter), dgp (half 0) and */
/* dgp2 (half 1), summed in that order by wy_bwd. The two halves of a chunk are neighbours in the grid */
/* (blockIdx.x = 2 c + half), so the tiles both read (dO, vn) come from L2 the second time.            */

template <int DK, int DV> struct GdnDqkwgSmemV2 {
    static constexpr int KH = DK / 2;
    bf16 *q, *k, *vn, *dO, *dv2, *h, *dh, *ds;
    float *G, *rowa, *rowb, *red;
    size_t bytes;
    __host__ __device__ explicit GdnDqkwgSmemV2(void *b) {
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
        rowa = c.take<float>(GDN_C);
        rowb = c.take<float>(GDN_C);
        red = c.take<float>(GDN_THREADS / 32);
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
__global__ void __launch_bounds__(GDN_THREADS, 2)
    gdn_dqkwg_v2_kernel(float *dqv /* (T,nv,DK) */, bf16 *dq_out /* (T,ldq) when nv == nk, else NULL */,
                        float *dkv /* (T,nv,DK) */, bf16 *dw /* (T,nv,DK) */, float *dgp /* (T,nv) half 0 */,
                        float *dgp2 /* (T,nv) half 1 */, const bf16 *q, const bf16 *k,
                        const bf16 *vn /* (T,nv,DV) */, const bf16 *dout /* (T,ldo) */, const bf16 *dv2 /* (T,nv,DV) */,
                        const bf16 *hs /* (ns,nv,DK,DV) */, const bf16 *dhs /* (ns,nv,DK,DV) */, const float *G2,
                        const int32_t *doc_pos, const int32_t *starts, const int32_t *meta, int64_t T, int nk, int nv,
                        int ldq, int ldo, float scale) {
    constexpr int KH = DK / 2, LDH = KH + 8, LDV = DV + 8, NTH = KH / 8;
    static_assert(NTH % 2 == 0, "dqkwg v2: an even number of 8-column tiles per half");
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnDqkwgSmemV2<DK, DV> s(gdn_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int half = blockIdx.x & 1, cb = half * KH; /* this block's DK columns start at cb */
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
        /* two groups: what ds needs first, the rest under the ds product */
        gdn_load_rows<GDN_C, DV>(s.dO, LDV, dout + t0 * ldo + (int64_t)h * DV, ldo, L);
        gdn_load_rows<GDN_C, DV>(s.vn, LDV, vn + t0 * ldx + (int64_t)h * DV, ldx, L);
        gdn_load_G(s.G, G2, t0, L, h, nv);
        ptx_cp_async_commit();
        gdn_load_rows<GDN_C, KH>(s.q, LDH, q + t0 * ldq + (int64_t)kh * DK + cb, ldq, L);
        gdn_load_rows<GDN_C, KH>(s.k, LDH, k + t0 * ldq + (int64_t)kh * DK + cb, ldq, L);
        gdn_load_rows<GDN_C, DV>(s.dv2, LDV, dv2 + t0 * ldx + (int64_t)h * DV, ldx, L);
        gdn_load_rows<KH, DV>(s.h, LDV, hs + ((t0 / GDN_C) * nv + h) * (int64_t)DK * DV + (int64_t)cb * DV, DV,
                              reset ? 0 : KH);
        gdn_load_rows<KH, DV>(s.dh, LDV, dhs + (slot_out * nv + h) * (int64_t)DK * DV + (int64_t)cb * DV, DV,
                              exit_carries ? KH : 0);
        ptx_cp_async_commit();
        ptx_cp_async_wait<1>();
        __syncthreads();
        /* ds */
        {
            float acc[1][8][4];
            gdn_zero(acc);
            gdn_warp_mma<1, 8, false, true, DV>(acc, s.dO, LDV, s.vn, LDV, 16 * w, 0);
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int r = 16 * w + gdn_frag_row(e), j = ni * 8 + gdn_frag_col(e);
                    const float d0 = (j <= r && r < L) ? scale * acc[0][ni][e] * exp2f(s.G[r] - s.G[j]) : 0.0f;
                    const float d1 =
                        (j + 1 <= r && r < L) ? scale * acc[0][ni][e + 1] * exp2f(s.G[r] - s.G[j + 1]) : 0.0f;
                    gdn_store2(s.ds + r * GDN_LDP + j, d0, d1);
                }
        }
        ptx_cp_async_wait<0>();
        __syncthreads();
        /* this half's share of <h, dh> (zero unless both exist), fixed order */
        {
            float hd = 0.0f;
            if (!reset && exit_carries)
                for (int i = threadIdx.x; i < KH * DV / 2; i += GDN_THREADS) {
                    const int a = i / (DV / 2), b = (i % (DV / 2)) * 2;
                    const float2 x = gdn_load2(s.h + a * LDV + b), y = gdn_load2(s.dh + a * LDV + b);
                    hd = fmaf(x.x, y.x, hd);
                    hd = fmaf(x.y, y.y, hd);
                }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) hd += __shfl_xor_sync(GDN_FULL, hd, o);
            if (lane == 0) s.red[w] = hd;
        }
        float qdq[2] = {0.0f, 0.0f}, kdk[2] = {0.0f, 0.0f}, kdi[2] = {0.0f, 0.0f};
        /* dq (this half's columns) */
        {
            float acc[1][NTH][4];
            gdn_zero(acc);
            if (!reset) {
                gdn_warp_mma<1, NTH, false, true, DV>(acc, s.dO, LDV, s.h, LDV, 16 * w, 0);
#pragma unroll
                for (int ni = 0; ni < NTH; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = 16 * w + gdn_frag_row(e);
                        acc[0][ni][e] *= r < L ? scale * exp2f(s.G[r]) : 0.0f;
                    }
            }
            gdn_warp_mma<1, NTH, false, false, GDN_C>(acc, s.ds, GDN_LDP, s.k, LDH, 16 * w, 0);
#pragma unroll
            for (int ni = 0; ni < NTH; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int r = 16 * w + gdn_frag_row(e), col = ni * 8 + gdn_frag_col(e);
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
        /* dk (this half's columns) */
        {
            float acc[1][NTH][4];
            gdn_zero(acc);
            if (exit_carries) {
                gdn_warp_mma<1, NTH, false, true, DV>(acc, s.vn, LDV, s.dh, LDV, 16 * w, 0);
                const float gL = s.G[L - 1];
#pragma unroll
                for (int ni = 0; ni < NTH; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        const int r = 16 * w + gdn_frag_row(e), col = ni * 8 + gdn_frag_col(e);
                        const float dec = r < L ? exp2f(gL - s.G[r]) : 0.0f;
                        acc[0][ni][e] *= dec;
                        acc[0][ni][e + 1] *= dec;
                        const float2 kk = gdn_load2(s.k + r * LDH + col);
                        kdi[e >> 1] += kk.x * acc[0][ni][e] + kk.y * acc[0][ni][e + 1];
                    }
            }
            gdn_warp_mma<1, NTH, true, false, GDN_C>(acc, s.ds, GDN_LDP, s.q, LDH, 16 * w, 0);
#pragma unroll
            for (int ni = 0; ni < NTH; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int r = 16 * w + gdn_frag_row(e), col = ni * 8 + gdn_frag_col(e);
                    const float2 kk = gdn_load2(s.k + r * LDH + col);
                    kdk[e >> 1] += kk.x * acc[0][ni][e] + kk.y * acc[0][ni][e + 1];
                    if (r < L)
                        *(float2 *)(dkv + (t0 + r) * ldk + (int64_t)h * DK + cb + col) =
                            make_float2(acc[0][ni][e], acc[0][ni][e + 1]);
                }
        }
        /* dw = -dv2 h^T (this half's columns) */
        {
            float acc[1][NTH][4];
            gdn_zero(acc);
            if (!reset) gdn_warp_mma<1, NTH, false, true, DV>(acc, s.dv2, LDV, s.h, LDV, 16 * w, 0);
#pragma unroll
            for (int ni = 0; ni < NTH; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int r = 16 * w + gdn_frag_row(e), col = ni * 8 + gdn_frag_col(e);
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
        if ((lane & 3) == 0) {
            const int r = 16 * w + (lane >> 2);
            s.rowa[r] = qdq[0] - kdk[0];
            s.rowa[r + 8] = qdq[1] - kdk[1];
            s.rowb[r] = kdi[0];
            s.rowb[r + 8] = kdi[1];
        }
        __syncthreads();
        const int r = threadIdx.x;
        if (r < L) {
            float d = s.rowa[r];
            if (r == L - 1) {
                float sk = 0.0f;
                for (int j = 0; j < L; j++) sk += s.rowb[j];
                const float hdh = (s.red[0] + s.red[1]) + (s.red[2] + s.red[3]);
                d += exp2f(s.G[L - 1]) * hdh + sk;
            }
            dgo[(t0 + r) * nv + h] = d;
        }
    }
}
