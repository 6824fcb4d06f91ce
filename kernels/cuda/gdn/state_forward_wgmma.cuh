/*
 * state_forward_wgmma.cuh — the forward state pass of the chunked gated delta rule on wgmma in 32-column blocks
 * (Hopper, sm_90a), tune choice sfwd (cuda_gdn_tune.h), and what the wgmma state passes share: the swizzled
 * block offsets, the wide pick, the tensor maps of the forward. Not a standalone header: included by gdn/gdn.cu
 * after gdn/state_pass.cuh, whose segment bookkeeping (GdnSeg, gdn_span, gdn_span_out) it shares.
 *
 * The same pass as gdn_state_forward_kernel (per chunk: store h, vn = U - W h, store vn, S = gam_L S +
 * K^T (dec * vn)), with one warpgroup (128 threads) per 32 state columns and both products on wgmma:
 *   state    S (DK x 32, fp32) lives in the warpgroup's wgmma accumulators across chunks: DK / 64 tiles
 *            (tile mt = state rows [64 mt, 64 mt + 64))
 *   W h      m64n32k16 x DK / 16, twice (the state operand split hi + lo bf16, as the mma.sync pass):
 *            A = W (tokens x DK, K-major), B = the state rows (DK x 32, N-major); one accumulator
 *   K^T vn   per state tile, m64n32k16 x 4: A = K^T (M-major), B = dec * vn (N-major); the accumulator
 *            is the state itself (scaled by gam_L first)
 * Operand tiles are swizzled blocks (cuda_ptx.h's layouts, as the attention kernels): W and K 64 columns
 * wide with the 128-byte swizzle, the 32-column blocks in rows of 64 bytes with the 64-byte swizzle
 * (gdn_wg_off32); W, K, U arrive by TMA, the gates by cp.async, NST stages; the state hi / lo and dec * vn
 * are written from the accumulators by the threads that own them. The accumulator layout is the mma.sync C
 * fragment repeated, so U, the stored h and vn are addressed as in the mma.sync pass.
 *
 * About 100 KB of shared memory at DK = 128, so two blocks, two independent chunk chains, share an SM and hide
 * each other's per-chunk latency, at twice the W and K traffic per state column: the automatic choice where
 * few blocks have work (64 heads, one document). Where many have work, the pass with the state in registers
 * (state_forward_regs.cuh, 64 columns) runs instead; it gives these bits. (16-column blocks exist on mma.sync
 * only. Blocks of 64 columns and of four warpgroups of 32 ran here until 2026-12-02 and gave the same bits;
 * no automatic choice picked them any more.) Segments, transition columns, document segments, the dual launch
 * and the cycle counters (GDN_TP, `ringscan bench gdn --profile 2`) are state_pass.cuh's, unchanged. The bits
 * differ from the mma.sync pass (wgmma's accumulation order) but are the same on every run and for every
 * segmentation by documents. Design: docs/design/gdn-kernels.md ("The state passes").
 */

/* Both forms of a wgmma state pass launched (wide_need > 0: document segments, whose non-empty count only
 * the device knows): true where this block's form is not the device's pick, which is the wide one (WIDE: the
 * 128-column blocks, or the forward pass with the state in registers) where the 64-column blocks of the
 * non-empty segments exceed wide_need (gdn_wide_need), else the other. BC: the block's columns (gridDim.x BC
 * of the launch's). */
template <int BC, bool WIDE> GDN_DEV bool gdn_wide_skip(const GdnSeg &sg, int nv, int64_t wide_need) {
    int used = 0;
    for (int i = 0; i < sg.nseg; i++) used += sg.cuts[i + 1] > sg.cuts[i] ? 1 : 0;
    return ((int64_t)used * nv * gridDim.x * BC / 64 > wide_need) != WIDE;
}

enum { GDN_WG_BV = 32 }; /* state columns per block of this pass (its kernel, its shared memory, its launch) */

/* byte offset of element (r, j), j < 64, in a 128-byte-swizzled block of 64 columns */
GDN_DEV uint32_t gdn_wg_off(int r, int j) { return r * 128 + ((((j >> 3) & 7) ^ (r & 7)) << 4) + (j & 7) * 2; }

/* byte offset of element (r, j), j < 32, in a block of 32 columns: rows of 64 bytes, 64-byte swizzle (the
 * 16-byte chunk index, bits 4-5, xor the address bits 7-8; blocks on 512-byte boundaries), the layout of TMA's
 * CU_TENSOR_MAP_SWIZZLE_64B and of wgmma's 64-byte swizzle */
GDN_DEV uint32_t gdn_wg_off32(int r, int j) { return r * 64 + ((((j >> 3) & 3) ^ ((r >> 1) & 3)) << 4) + (j & 7) * 2; }

/* descriptor of an N-major (transposed) B operand of 32 columns from a block of gdn_wg_off32 rows, starting at
 * row saddr's: 64-byte swizzle (layout type 2), 8-row groups 512 bytes apart. lbo: the next 32-column block
 * (never reached: N = 32 is one swizzle atom wide). */
GDN_DEV uint64_t gdn_wg_bdesc32(uint32_t saddr, uint32_t lbo) {
    return (ptx_gdesc(saddr, lbo, 512) & ~(3ull << 62)) | (2ull << 62);
}

/* shared memory of the pass, every wgmma / TMA tile on a 1024-byte boundary (the base is rounded up): per
 * stage W, K, U tiles, the gates and the stage's mbarrier; then hi, lo, vn and vno. DK = 128, 2 stages: 99 KB
 * (two blocks per SM) */
template <int DK, int NST> struct GdnStateFwdSmemWg {
    static constexpr int BV = GDN_WG_BV;
    static constexpr int TK = GDN_C * DK * 2, TU = GDN_C * BV * 2, TS = DK * BV * 2;
    static constexpr int OW = 0, OK = TK, OU = 2 * TK, OG = 2 * TK + TU, OB = OG + GDN_C * 4,
                         SB = OG + 1024; /* one stage, bytes */
    static constexpr int OHI = NST * SB, OLO = OHI + TS, OVN = OLO + TS, OVO = OVN + TU,
                         BYTES = OVO + TU + 1024;
    static_assert(TU % 1024 == 0 && TS % 1024 == 0, "state_fwd_wg: tiles on 1024-byte boundaries");
    unsigned char *b;
    GDN_DEV explicit GdnStateFwdSmemWg(unsigned char *base) : b(base) {}
    GDN_DEV unsigned char *w(int i) const { return b + i * SB + OW; }
    GDN_DEV unsigned char *k(int i) const { return b + i * SB + OK; }
    GDN_DEV unsigned char *u(int i) const { return b + i * SB + OU; }
    GDN_DEV float *G(int i) const { return (float *)(b + i * SB + OG); }
    GDN_DEV uint64_t *bar(int i) const { return (uint64_t *)(b + i * SB + OB); }
    GDN_DEV unsigned char *hi() const { return b + OHI; }  /* state hi = bf16(S): the operand, the h store */
    GDN_DEV unsigned char *lo() const { return b + OLO; }  /* state lo = bf16(S - hi) */
    GDN_DEV unsigned char *vn() const { return b + OVN; }  /* dec * vn, the operand of K^T vn */
    GDN_DEV unsigned char *vno() const { return b + OVO; } /* vn, the source of its TMA store */
};

/* the tensor maps of a forward pass (gdn/gdn.cu gdn_wg_maps): W, K tiles in (64 columns x 64 rows boxes,
 * 128-byte swizzle), U in (the pass's columns x 64 rows), h out (the store's columns x DK rows), vn out (the
 * store's x 64): this pass's 32-column blocks (gdn_wg_off32), or state_forward_regs.cuh's 64-column U and
 * 16-column stores; rows past the end read as zeros */
struct GdnWgMaps {
    CUtensorMap w, k, u, h, vn;
};

/*
 * Grid (ncol / 32, nv, segments launched), 128 threads. Block (x, h, z) carries columns [32 x, 32 x + 32) of
 * head h's state over segment p = z + sg.pz0 of the chunks of `mode` (gdn_state_forward_kernel has the same
 * contract; ncol = dv, or dv + DK when sg.M). Thread (warp w, lane 4 g + t) holds, in state tile mt, element
 * 4 i + e (i < 4) at row 64 mt + 16 w + g + 8 (e / 2), column 8 i + 2 t + e % 2.
 * Tiles in by TMA (thread 0; one mbarrier per stage, the gates by cp.async): the rows of a chunk past
 * its L are the next tokens' (zeros past T). The W and U rows only reach vn rows >= L, which are
 * dropped and replaced by 0 in dec * vn (a selection, so even a non-finite row cannot leak); the K
 * rows meet those zeros, so they add exact zeros as long as k is finite (the inputs are), and the
 * result is that of zero-filled rows.
 * h out by one TMA store per chunk from the hi block (bf16(S), what the mma.sync pass stores), vn out by one
 * TMA store of a full chunk (L = 64), by the threads otherwise.
 */
/* The carried state's fp32 wgmma accumulators at a segment's start (both state passes): row a = 64 mt +
 * 16 w + g8 (+8), column col0 + j of head h from S_in (nv, DK, dv), zero where S_in is NULL; a transition
 * column block (is_M: col0 >= dv) starts from the identity on its columns. */
template <int DK, int MT, int NA>
__device__ __forceinline__ void gdn_wg_state_start(float (&S)[MT][NA], const float *S_in /* (nv,DK,dv) or NULL */,
                                                   bool is_M, int h, int col0, int dv, int w, int g8, int t4) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int x = 0; x < NA; x++) {
            const int a = 64 * mt + 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4 + (x & 1);
            float v = 0.0f;
            if (is_M) v = (a == col0 - dv + j) ? 1.0f : 0.0f;
            else if (S_in) v = S_in[((int64_t)h * DK + a) * dv + col0 + j];
            S[mt][x] = v;
        }
}

template <int DK, int NST>
__global__ void __launch_bounds__(GDN_THREADS)
    gdn_state_forward_wgmma_kernel(bf16 *hs /* (ns,nv,DK,dv) or NULL */, bf16 *vn /* (T,nv,dv) or NULL */, GdnSeg sg,
                            const __grid_constant__ GdnWgMaps tm, const float *G2 /* (T,nv) */, const int4 *info,
                            const int32_t *meta, int mode, int nk, int nv, int dv,
                            long long *tp /* (GDN_TP_SLOTS) cycles, chunks, or NULL */,
                            int wide_need /* > 0: run only if the narrow form is the device's pick (gdn_wide_skip) */) {
    /* NA: accumulator registers per state tile */
    constexpr int BV = GDN_WG_BV, MT = DK / 64, KS = DK / 16, NA = BV / 2;
    static_assert(NST >= 2, "state_fwd_wg: two stages at least");
    extern __shared__ __align__(128) unsigned char gdn_wg_smem[]; /* the base is rounded up to 1024 */
    const uint32_t raw = ptx_smem_addr(gdn_wg_smem);
    const GdnStateFwdSmemWg<DK, NST> s(gdn_wg_smem + (((raw + 1023u) & ~1023u) - raw));
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
    const bool leader = threadIdx.x == 0; /* its TMA stores */
    const int col0 = blockIdx.x * BV;
    const bool is_M = col0 >= dv; /* the whole block (dv a multiple of 32) */
    const int p = (int)blockIdx.z + sg.pz0;
    if (is_M && p == sg.m_skip) return; /* the whole block */
    if (sg.pick && *sg.pick != sg.pick_want) return; /* dual launch: the other configuration runs */
    if (wide_need > 0 && gdn_wide_skip<BV, false>(sg, nv, wide_need)) return; /* the wide form runs */
    const int64_t ldu = (int64_t)nv * dv;
    const int64_t nsz = (int64_t)nv * DK * dv, nmz = (int64_t)nv * DK * DK;
    const GdnSpan sp = gdn_span<false>(sg, meta, mode, p, is_M, nsz);
    const int lo = sp.lo, hi = sp.hi;
    const float *S_in = sp.in;

    float S[MT][NA];
    gdn_wg_state_start<DK, MT>(S, S_in, is_M, h, col0, dv, w, g8, t4);

    if (threadIdx.x == 0) {
        for (int i = 0; i < NST; i++) ptx_mbar_init(ptx_smem_addr(s.bar(i)), 1);
        ptx_mbar_init_fence();
    }
    __syncthreads();
    const unsigned tx = 2 * GDN_C * DK * 2 + (is_M ? 0 : GDN_C * BV * 2); /* bytes of one stage's tiles */
    auto issue = [&](int4 ci, int buf) {
        const int t0 = ci.x;
        if (threadIdx.x == 0) {
            const uint32_t bar = ptx_smem_addr(s.bar(buf));
            ptx_mbar_arrive_tx(bar, tx);
#pragma unroll
            for (int b = 0; b < MT; b++) {
                ptx_tma_load_2d(ptx_smem_addr(s.w(buf)) + b * (GDN_C * 128), &tm.w, h * DK + 64 * b, t0, bar);
                ptx_tma_load_2d(ptx_smem_addr(s.k(buf)) + b * (GDN_C * 128), &tm.k, kh * DK + 64 * b, t0, bar);
            }
            if (!is_M) ptx_tma_load_2d(ptx_smem_addr(s.u(buf)), &tm.u, h * dv + col0, t0, bar);
        }
        gdn_load_G(s.G(buf), G2, t0, ci.y, h, nv);
    };
    /* inf[i]: (t0, L, flags) of chunk c + i; chunk c's tiles are issued during chunk c - NST + 1 */
    const int4 none = make_int4(0, 1, 0, 0);
    int4 inf[NST];
#pragma unroll
    for (int i = 0; i < NST; i++) inf[i] = lo + i < hi ? info[lo + i] : none;
#pragma unroll
    for (int i = 0; i < NST - 1; i++) {
        if (lo + i < hi) issue(inf[i], i);
        ptx_cp_async_commit();
    }
    const uint32_t a_hi = ptx_smem_addr(s.hi()), a_lo = ptx_smem_addr(s.lo()), a_vn = ptx_smem_addr(s.vn());
    int buf = 0;
    unsigned ph = 0; /* parity of each stage's next phase */
    const bool tp_on = tp && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0;
    long long tpa[GDN_TP_N] = {0, 0, 0, 0, 0, 0}, tp_last = tp_on ? clock64() : 0;
    for (int c = lo; c < hi; c++) {
        const int4 infN = c + NST < hi ? info[c + NST] : none;
        if (leader) ptx_bulk_wait_read<0>(); /* chunk c-1's h and vn stores have read hi, vno */
        ptx_cp_async_wait<NST - 2>();
        ptx_mbar_wait(ptx_smem_addr(s.bar(buf)), (ph >> buf) & 1u);
        ph ^= 1u << buf;
        __syncthreads(); /* chunk c's tiles are in; chunk c-1's products and stores are done with their tiles */
        GDN_TP(0);
        {
            const int nb = buf + NST - 1 >= NST ? buf - 1 : buf + NST - 1; /* the stage of chunk c-1 */
            if (c + NST - 1 < hi) issue(inf[NST - 1], nb);
        }
        ptx_cp_async_commit();
        GDN_TP(1);
        const int4 cur = inf[0];
        const int64_t t0 = cur.x;
        const int L = cur.y;
        const bool reset = (cur.z & 1) != 0;
        const bool hst = hs && !is_M && !reset;
        /* the state operand: hi + lo bf16 into the swizzled blocks (hi = h, stored below) */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int x = 0; x < NA; x += 2) {
                if (reset) S[mt][x] = S[mt][x + 1] = 0.0f;
                const int a = 64 * mt + 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4;
                const uint32_t o = gdn_wg_off32(a, j);
                gdn_split2((bf16 *)(s.hi() + o), (bf16 *)(s.lo() + o), S[mt][x], S[mt][x + 1]);
            }
        ptx_fence_proxy_async();
        __syncthreads(); /* hi, lo written */
        if (leader && hst) {
            ptx_tma_store_2d(&tm.h, col0, (int)(((t0 / GDN_C) * nv + h) * DK), a_hi);
            ptx_bulk_commit();
        }
        GDN_TP(2);
        /* vacc = W (S_hi + S_lo): tokens x BV */
        float vacc[NA];
        const uint32_t a_w = ptx_smem_addr(s.w(buf)), a_k = ptx_smem_addr(s.k(buf));
        ptx_wg_fence();
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            ptx_wgmma_ss_n32<0, 1>(vacc, ptx_gdesc(a_w + (kk >> 2) * (GDN_C * 128) + (kk & 3) * 32, 16, 1024),
                                   gdn_wg_bdesc32(a_hi + kk * 16 * (2 * BV), DK * 2 * BV), kk > 0);
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            ptx_wgmma_ss_n32<0, 1>(vacc, ptx_gdesc(a_w + (kk >> 2) * (GDN_C * 128) + (kk & 3) * 32, 16, 1024),
                                   gdn_wg_bdesc32(a_lo + kk * 16 * (2 * BV), DK * 2 * BV), 1);
        ptx_wg_commit();
        ptx_wg_wait<0>();
#pragma unroll
        for (int x = 0; x < NA; x++) ptx_reg_fence(vacc[x]);
        GDN_TP(3);
        /* vn = U - W S: into vno (stored by TMA when the chunk is full) or stored here; dec * vn into vn */
        const float *sG = s.G(buf);
        const float gL = sG[L - 1];
        const unsigned char *su = s.u(buf);
        const bool vst = vn && !is_M, vfull = vst && L == GDN_C;
#pragma unroll
        for (int x = 0; x < NA; x += 2) {
            const int r = 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4;
            const uint32_t o = gdn_wg_off32(r, j);
            float2 u = make_float2(0.0f, 0.0f);
            if (!is_M) u = gdn_load2((const bf16 *)(su + o));
            const float x0 = u.x - vacc[x], x1 = u.y - vacc[x + 1];
            if (vfull) gdn_store2((bf16 *)(s.vno() + o), x0, x1);
            else if (vst && r < L) gdn_store2(vn + (t0 + r) * ldu + (int64_t)h * dv + col0 + j, x0, x1);
            /* rows >= L: 0 by selection (their W / U rows are another chunk's, or anything in a range's
             * workspace, so never multiplied) */
            const float dec = r < L ? exp2f(gL - sG[r]) : 0.0f;
            gdn_store2((bf16 *)(s.vn() + o), r < L ? x0 * dec : 0.0f, r < L ? x1 * dec : 0.0f);
        }
        const float gam = exp2f(gL);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int x = 0; x < NA; x++) S[mt][x] *= gam;
        ptx_fence_proxy_async();
        __syncthreads(); /* vn, dec * vn written */
        if (leader && vfull) {
            ptx_tma_store_2d(&tm.vn, h * dv + col0, (int)t0, ptx_smem_addr(s.vno()));
            ptx_bulk_commit();
        }
        GDN_TP(4);
        /* S += K^T (dec * vn), per state tile */
        ptx_wg_fence();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < GDN_C / 16; kk++)
                ptx_wgmma_ss_n32<1, 1>(S[mt], ptx_gdesc(a_k + mt * (GDN_C * 128) + kk * 16 * 128, GDN_C * 128, 1024),
                                       gdn_wg_bdesc32(a_vn + kk * 16 * (2 * BV), GDN_C * 2 * BV), 1);
        ptx_wg_commit();
        ptx_wg_wait<0>();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int x = 0; x < NA; x++) ptx_reg_fence(S[mt][x]);
        GDN_TP(5);
#pragma unroll
        for (int i = 0; i < NST - 1; i++) inf[i] = inf[i + 1];
        inf[NST - 1] = infN;
        buf = buf + 1 == NST ? 0 : buf + 1;
    }
    if (leader) ptx_bulk_wait<0>(); /* the last stores complete */
    if (tp_on) gdn_tp_store(tp, tpa, hi - lo);
    float *Sd = gdn_span_out<false>(sg, p, sp.dlast, is_M, nsz, nmz);
    if (!Sd) return;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int x = 0; x < NA; x++) {
            const int a = 64 * mt + 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4 + (x & 1);
            if (is_M) Sd[((int64_t)h * DK + a) * DK + col0 - dv + j] = S[mt][x];
            else Sd[((int64_t)h * DK + a) * dv + col0 + j] = S[mt][x];
        }
}
