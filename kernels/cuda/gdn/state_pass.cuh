/*
 * state_pass.cuh — the bookkeeping every state pass shares (mma.sync: state_forward.cuh,
 * state_backward.cuh; wgmma: state_forward_wgmma.cuh, state_forward_regs.cuh, state_backward_regs.cuh): GdnSeg,
 * where a pass reads and writes its states, its chunk span, and the per-phase cycle counters. Part of gdn.cu's
 * translation unit. Design: docs/design/gdn-kernels.md ("The state passes").
 *
 * Segmented passes: the chunk range is cut into nseg segments of consecutive chunks (segment p: chunks
 * [lo + n p / nseg, lo + n (p+1) / nseg), possibly empty). Forward: phase A runs segments 0 .. nseg-2 in
 * parallel, segment 0 from S0 (giving E_1), segment p >= 1 as the transition [S | M] from [0 | I] (giving
 * H_p, M_p); the fold E_{p+1} = M_p E_p + H_p runs in order (gdn_state_affine_kernel, fp32, fixed order,
 * the CP scan's link); phase C runs every segment from its E_p as the plain pass. The backward mirrors it
 * (phase A on segments nseg-1 .. 1, [D | M_p^T] from [0 | I] with dO = dv_loc = 0 in the M^T columns;
 * fold Dx_{p-1} = M_p^T Dx_p + dH_p). A document start inside a segment zeroes its M, so documents
 * crossing segment edges need nothing special; with nseg fixed by the shape the bits are the same on
 * every run.
 *
 * Pipelining: NST stages (2 or 3) of cp.async tiles; the per-chunk (t0, L, flags) loaded one chunk
 * before its tiles are issued. Document segments (sg.cuts): the passes cut the chunks at document starts
 * into segments run side by side (no transition columns, no fold; gdn_doc_range); the host launches a
 * fixed number and gdn_index_cuts_kernel places the cuts on the device. Dual launch (gdn.cu
 * GDN_DUAL_DEFAULT): each pass is launched in two configurations (the automatic one, and 32 columns in 8
 * document segments); gdn_index_cuts_kernel writes which one the documents call for (sg.pick) and the
 * other's blocks exit before their first load. Both give the same bits.
 *
 * wy_bwd: dk's two WY terms stay in registers; dqkwg's fp32 dk is read once, a 64-column half's loads
 * issued before their use, and dg's reverse cumsum runs on two warps with shuffles.
 */
#pragma once

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

/* The span of one block of a state pass (mma.sync and wgmma, forward and backward; REV: the backward, which
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

/* per-phase cycle counts of one state pass (tune.prof == 2): block (0,0,0), thread 0; GDN_TP_SLOTS per pass: the
 * GDN_TP_N phases, then the chunks that block walked (the divisor gdn_tp_print needs: which configuration of a dual
 * launch ran, and so a block's span, only the device knows) */
#define GDN_TP_N 6
#define GDN_TP_SLOTS (GDN_TP_N + 1)
/* a pass's counts into tp (GDN_TP_SLOTS): the phases' cycles, then the chunks walked */
GDN_DEV void gdn_tp_store(long long *tp, const long long (&tpa)[GDN_TP_N], int chunks) {
    for (int i = 0; i < GDN_TP_N; i++) tp[i] = tpa[i];
    tp[GDN_TP_N] = chunks;
}
#define GDN_TP(i)                                              \
    do {                                                       \
        if (tp_on) {                                           \
            const long long now_ = clock64();                  \
            tpa[i] += now_ - tp_last;                          \
            tp_last = now_;                                    \
        }                                                      \
    } while (0)

