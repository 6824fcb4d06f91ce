/*
 * state_forward_wgmma.cuh — the forward state pass of the chunked gated delta rule on wgmma (Hopper,
 * sm_90a), tune choice sfwd (cuda_gdn_tune.h). Not a standalone header: included by gdn/gdn.cu after
 * gdn/state_pass.cuh, whose segment bookkeeping (GdnSeg, gdn_span, gdn_span_out) it shares.
 *
 * The same pass as gdn_state_forward_kernel (per chunk: store h, vn = U - W h, store vn, S = gam_L S +
 * K^T (dec * vn)), with one warpgroup (128 threads) per 64 or 32 state columns and both products on wgmma:
 *   state    S (DK x BV, fp32) lives in the warpgroup's wgmma accumulators across chunks: DK / 64 tiles
 *            (tile mt = state rows [64 mt, 64 mt + 64))
 *   W h      m64nBVk16 x DK / 16, twice (the state operand split hi + lo bf16, as the mma.sync pass):
 *            A = W (tokens x DK, K-major), B = the state rows (DK x BV, N-major); one accumulator
 *   K^T vn   per state tile, m64nBVk16 x 4: A = K^T (M-major), B = dec * vn (N-major); the accumulator
 *            is the state itself (scaled by gam_L first)
 * Operand tiles are swizzled blocks (cuda_ptx.h's layouts, as the attention kernels): 64 columns with the
 * 128-byte swizzle, or for BV = 32 rows of 64 bytes with the 64-byte swizzle (gdn_wg_off_b); W, K, U arrive
 * by TMA, the gates by cp.async, NST stages; the state hi / lo and dec * vn are written from the
 * accumulators by the threads that own them. The accumulator layout is the mma.sync C fragment repeated,
 * so U, the stored h and vn are addressed as in the mma.sync pass.
 *
 * 32-column blocks (sfbv = 32, the automatic choice where few blocks have work): half the accumulator
 * registers and about 100 KB of shared memory, so two blocks, two independent chunk chains, share an SM and
 * hide each other's per-chunk latency, at twice the W and K traffic per state column. 16-column blocks exist
 * on mma.sync only. Four warpgroups of 32 columns (NWG = 4, sfbv = 128, automatic where many blocks have
 * work): four chains in one block that read the same W and K tiles, each with its own U, hi, lo and vn tiles
 * (195 KB at DK = 128), as state_backward_wgmma.cuh's two warpgroups: one block barrier per chunk, each
 * warpgroup's own named barrier inside it; the bits of the 32-column blocks. (Two warpgroups of 64 columns ran
 * as fast where a segment held two documents, and 11% slower where each had its own: bench-log 2026-12-01-d.)
 * Segments, transition columns, document segments, the dual launch and the cycle counters (GDN_TP,
 * `ringscan bench gdn --profile 2`) are state_pass.cuh's, unchanged. The bits differ from the mma.sync
 * pass (wgmma's accumulation order) but are the same on every run and for every segmentation by documents.
 * Design: docs/design/gdn-kernels.md ("The state passes").
 */

/* d (64 x BV) (+)= A (64 x 16) B (16 x BV), BV = 64 or 32 (d: BV / 2 registers per thread), from
 * shared-memory descriptors (cuda_ptx.h ptx_wgmma_ss_n64 / _n32; TA / TB: operand stored
 * transposed, A M-major, B N-major); scale_d = 0 overwrites d */
template <int TA, int TB, int NA>
GDN_DEV void gdn_wgmma_nb(float (&d)[NA], uint64_t da, uint64_t db, int scale_d) {
    static_assert(NA == 32 || NA == 16, "gdn_wgmma_nb: 64 or 32 columns");
    if constexpr (NA == 32) ptx_wgmma_ss_n64<TA, TB>(d, da, db, scale_d);
    else ptx_wgmma_ss_n32<TA, TB>(d, da, db, scale_d);
}

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

/* byte offset of element (r, j), j < 64, in a 128-byte-swizzled block of 64 columns */
GDN_DEV uint32_t gdn_wg_off(int r, int j) { return r * 128 + ((((j >> 3) & 7) ^ (r & 7)) << 4) + (j & 7) * 2; }

/* byte offset of element (r, j), j < BV, in a block of BV columns: BV = 64 as gdn_wg_off; BV = 32: rows
 * of 64 bytes, 64-byte swizzle (the 16-byte chunk index, bits 4-5, xor the address bits 7-8; blocks on
 * 512-byte boundaries), the layout of TMA's CU_TENSOR_MAP_SWIZZLE_64B and of wgmma's 64-byte swizzle */
template <int BV> GDN_DEV uint32_t gdn_wg_off_b(int r, int j) {
    static_assert(BV == 64 || BV == 32, "gdn_wg_off_b: 64 or 32 columns");
    if constexpr (BV == 64) return gdn_wg_off(r, j);
    else return r * 64 + ((((j >> 3) & 3) ^ ((r >> 1) & 3)) << 4) + (j & 7) * 2;
}

/* descriptor of an N-major (transposed) B operand of BV columns from a block of gdn_wg_off_b rows,
 * starting at row saddr's: BV = 64: 128-byte swizzle, 8-row groups 1024 bytes apart; BV = 32: 64-byte
 * swizzle (layout type 2), 8-row groups 512 bytes apart. lbo: the next BV-column block (never reached:
 * N = BV is one swizzle atom wide). */
template <int BV> GDN_DEV uint64_t gdn_wg_bdesc(uint32_t saddr, uint32_t lbo) {
    if constexpr (BV == 64) return ptx_gdesc(saddr, lbo, 1024);
    else return (ptx_gdesc(saddr, lbo, 512) & ~(3ull << 62)) | (2ull << 62);
}

/* shared memory of the pass, every wgmma / TMA tile on a 1024-byte boundary (the base is rounded up);
 * BV state columns per warpgroup (64, or 32), NWG warpgroups: per stage W, K, NWG U tiles, the gates and the
 * stage's mbarrier; then per warpgroup hi, lo, vn and vno. DK = 128, 2 stages: 99 KB at 32 columns (two
 * blocks per SM), 131 KB at 64, 195 KB at four warpgroups of 32 */
template <int DK, int NST, int BV = 64, int NWG = 1> struct GdnStateFwdSmemWg {
    static constexpr int TK = GDN_C * DK * 2, TU = GDN_C * BV * 2, TS = DK * BV * 2;
    static constexpr int OW = 0, OK = TK, OU = 2 * TK, OG = 2 * TK + NWG * TU, OB = OG + GDN_C * 4,
                         SB = OG + 1024; /* one stage, bytes */
    static constexpr int OHI = NST * SB, OLO = OHI + TS, OVN = OLO + TS, OVO = OVN + TU, PW = 2 * TS + 2 * TU,
                         BYTES = OHI + NWG * PW + 1024; /* PW: one warpgroup's blocks */
    static_assert(TU % 1024 == 0 && TS % 1024 == 0, "state_fwd_wg: tiles on 1024-byte boundaries");
    unsigned char *b;
    GDN_DEV explicit GdnStateFwdSmemWg(unsigned char *base) : b(base) {}
    GDN_DEV unsigned char *w(int i) const { return b + i * SB + OW; }
    GDN_DEV unsigned char *k(int i) const { return b + i * SB + OK; }
    GDN_DEV unsigned char *u(int i, int g) const { return b + i * SB + OU + g * TU; }
    GDN_DEV float *G(int i) const { return (float *)(b + i * SB + OG); }
    GDN_DEV uint64_t *bar(int i) const { return (uint64_t *)(b + i * SB + OB); }
    GDN_DEV unsigned char *hi(int g) const { return b + OHI + g * PW; }  /* state hi = bf16(S): the operand, the h store */
    GDN_DEV unsigned char *lo(int g) const { return b + OLO + g * PW; }  /* state lo = bf16(S - hi) */
    GDN_DEV unsigned char *vn(int g) const { return b + OVN + g * PW; }  /* dec * vn, the operand of K^T vn */
    GDN_DEV unsigned char *vno(int g) const { return b + OVO + g * PW; } /* vn, the source of its TMA store */
};

/* the tensor maps of one pass (gdn/gdn.cu gdn_wg_maps): W, K tiles in (64 columns x 64 rows boxes,
 * 128-byte swizzle), U in (BV columns x 64 rows), h out (BV columns x DK rows), vn out (BV x 64), those in
 * the BV-column layout of gdn_wg_off_b; rows past the end read as zeros */
struct GdnWgMaps {
    CUtensorMap w, k, u, h, vn;
};

/*
 * Grid (ncol / BV, nv, segments launched), 128 threads. Block (x, h, z) carries columns [BV x, BV x +
 * BV) of head h's state over segment p = z + sg.pz0 of the chunks of `mode` (gdn_state_forward_kernel
 * has the same contract; ncol = dv, or dv + DK when sg.M). Thread (warp w, lane 4 g + t) holds, in
 * state tile mt, element 4 i + e (i < BV / 8) at row 64 mt + 16 w + g + 8 (e / 2), column 8 i + 2 t + e % 2.
 * BV = 64: m64n64k16, 128-byte swizzled state / U / vn blocks; BV = 32: m64n32k16, 64-byte
 * swizzled ones (gdn_wg_off_b), half the registers and about 100 KB of shared memory, so two blocks (two
 * independent chunk chains) per SM; W and K tiles are the same in both.
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

template <int DK, int NST, int BV, int NWG>
__global__ void __launch_bounds__(GDN_THREADS * NWG)
    gdn_state_forward_wgmma_kernel(bf16 *hs /* (ns,nv,DK,dv) or NULL */, bf16 *vn /* (T,nv,dv) or NULL */, GdnSeg sg,
                            const __grid_constant__ GdnWgMaps tm, const float *G2 /* (T,nv) */, const int4 *info,
                            const int32_t *meta, int mode, int nk, int nv, int dv,
                            long long *tp /* (GDN_TP_SLOTS) cycles, chunks, or NULL */,
                            int wide_need /* > 0: run only if this NWG is the device's pick (gdn_wide_skip) */) {
    constexpr int MT = DK / 64, KS = DK / 16, NA = BV / 2; /* NA: accumulator registers per state tile */
    static_assert(NST >= 2, "state_fwd_wg: two stages at least");
    static_assert(NWG == 1 || NWG * BV == 128, "state_fwd_wg: one warpgroup, or warpgroups of 128 columns in all");
    extern __shared__ __align__(128) unsigned char gdn_wg_smem[]; /* the base is rounded up to 1024 */
    const uint32_t raw = ptx_smem_addr(gdn_wg_smem);
    const GdnStateFwdSmemWg<DK, NST, BV, NWG> s(gdn_wg_smem + (((raw + 1023u) & ~1023u) - raw));
    const int h = blockIdx.y, kh = h / (nv / nk), wg = threadIdx.x >> 7, w = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
    const bool leader = (threadIdx.x & 127) == 0; /* the warpgroup's: its TMA stores */
    const int colb = blockIdx.x * BV * NWG, col0 = colb + BV * wg;
    const bool is_M = colb >= dv; /* the whole block (dv a multiple of BV NWG) */
    const int p = (int)blockIdx.z + sg.pz0;
    if (is_M && p == sg.m_skip) return; /* the whole block */
    if (sg.pick && *sg.pick != sg.pick_want) return; /* dual launch: the other configuration runs */
    if (wide_need > 0 && gdn_wide_skip<NWG * BV, (NWG > 1)>(sg, nv, wide_need)) return; /* the other width runs */
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
    const unsigned tx = 2 * GDN_C * DK * 2 + (is_M ? 0 : NWG * GDN_C * BV * 2); /* bytes of one stage's tiles */
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
            if (!is_M)
#pragma unroll
                for (int g = 0; g < NWG; g++)
                    ptx_tma_load_2d(ptx_smem_addr(s.u(buf, g)), &tm.u, h * dv + colb + BV * g, t0, bar);
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
    const uint32_t a_hi = ptx_smem_addr(s.hi(wg)), a_lo = ptx_smem_addr(s.lo(wg)), a_vn = ptx_smem_addr(s.vn(wg));
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
                const uint32_t o = gdn_wg_off_b<BV>(a, j);
                gdn_split2((bf16 *)(s.hi(wg) + o), (bf16 *)(s.lo(wg) + o), S[mt][x], S[mt][x + 1]);
            }
        ptx_fence_proxy_async();
        ptx_bar_sync(1 + wg, GDN_THREADS); /* this warpgroup's hi, lo written */
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
            gdn_wgmma_nb<0, 1>(vacc, ptx_gdesc(a_w + (kk >> 2) * (GDN_C * 128) + (kk & 3) * 32, 16, 1024),
                               gdn_wg_bdesc<BV>(a_hi + kk * 16 * (2 * BV), DK * 2 * BV), kk > 0);
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            gdn_wgmma_nb<0, 1>(vacc, ptx_gdesc(a_w + (kk >> 2) * (GDN_C * 128) + (kk & 3) * 32, 16, 1024),
                               gdn_wg_bdesc<BV>(a_lo + kk * 16 * (2 * BV), DK * 2 * BV), 1);
        ptx_wg_commit();
        ptx_wg_wait<0>();
#pragma unroll
        for (int x = 0; x < NA; x++) ptx_reg_fence(vacc[x]);
        GDN_TP(3);
        /* vn = U - W S: into vno (stored by TMA when the chunk is full) or stored here; dec * vn into vn */
        const float *sG = s.G(buf);
        const float gL = sG[L - 1];
        const unsigned char *su = s.u(buf, wg);
        const bool vst = vn && !is_M, vfull = vst && L == GDN_C;
#pragma unroll
        for (int x = 0; x < NA; x += 2) {
            const int r = 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4;
            const uint32_t o = gdn_wg_off_b<BV>(r, j);
            float2 u = make_float2(0.0f, 0.0f);
            if (!is_M) u = gdn_load2((const bf16 *)(su + o));
            const float x0 = u.x - vacc[x], x1 = u.y - vacc[x + 1];
            if (vfull) gdn_store2((bf16 *)(s.vno(wg) + o), x0, x1);
            else if (vst && r < L) gdn_store2(vn + (t0 + r) * ldu + (int64_t)h * dv + col0 + j, x0, x1);
            /* rows >= L: 0 by selection (their W / U rows are another chunk's, or anything in a range's
             * workspace, so never multiplied) */
            const float dec = r < L ? exp2f(gL - sG[r]) : 0.0f;
            gdn_store2((bf16 *)(s.vn(wg) + o), r < L ? x0 * dec : 0.0f, r < L ? x1 * dec : 0.0f);
        }
        const float gam = exp2f(gL);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int x = 0; x < NA; x++) S[mt][x] *= gam;
        ptx_fence_proxy_async();
        ptx_bar_sync(1 + wg, GDN_THREADS); /* this warpgroup's vn, dec * vn written */
        if (leader && vfull) {
            ptx_tma_store_2d(&tm.vn, h * dv + col0, (int)t0, ptx_smem_addr(s.vno(wg)));
            ptx_bulk_commit();
        }
        GDN_TP(4);
        /* S += K^T (dec * vn), per state tile */
        ptx_wg_fence();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < GDN_C / 16; kk++)
                gdn_wgmma_nb<1, 1>(S[mt], ptx_gdesc(a_k + mt * (GDN_C * 128) + kk * 16 * 128, GDN_C * 128, 1024),
                                   gdn_wg_bdesc<BV>(a_vn + kk * 16 * (2 * BV), GDN_C * 2 * BV), 1);
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
