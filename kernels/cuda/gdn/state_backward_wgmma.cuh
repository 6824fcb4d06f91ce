/*
 * state_backward_wgmma.cuh — the backward (reverse) state pass of the chunked gated delta rule on wgmma
 * (Hopper, sm_90a), tune choice sbwd (cuda_gdn_tune.h). Not a standalone header: included by gdn/gdn.cu
 * after gdn/state_forward_wgmma.cuh (gdn_wg_off, the TMA store) and gdn/state_pass.cuh (GdnSeg, gdn_span,
 * gdn_span_out), with cuda_ptx.h's wgmma, TMA and mbarriers.
 *
 * The same pass as gdn_state_backward_kernel (per chunk, last to first: store dh = D at the chunk's exit,
 * dv2 = dv_loc + dec (K D), store dv2, D <- gam_L D + scale (Q gam)^T dO - W^T dv2, D <- 0 when the chunk
 * starts a document), the mirror of state_forward_wgmma.cuh: one warpgroup per 64 state columns,
 *   D        (DK x 64, fp32) in the wgmma accumulators across chunks: DK / 64 m64n64 tiles
 *   K D      m64n64k16 x DK / 16, twice (D split hi + lo bf16): A = K (K-major), B = D rows (N-major)
 *   Q^T dos  per state tile, m64n64k16 x 4: B = dos = scale gam_r dO_r, written over the dO tile in place
 *   W^T dv2  the same with A = W^T scaled by -1 in the instruction and B = dv2, written over the dv_loc
 *            tile in place (rows >= L: 0)
 * Tiles Q, K, W, dO, dv_loc by TMA (one mbarrier per stage), the gates by cp.async; dh out by a TMA store
 * from the hi block, dv2 by a TMA store from the dv_loc tile it replaced (by the threads for a partial
 * chunk).
 *
 * NWG warpgroups per block (tune choice sbcols = 64 NWG columns, cuda_gdn_tune.h): warpgroup i carries
 * the 64 columns at 64 i of the block's, its own chain with its own dO, dv_loc, hi and lo tiles; the Q,
 * K, W tiles and the gates are loaded once and read by both. Two chains on one SM hide each other's
 * per-chunk latency (one's products under the other's element-wise work) without a second copy of Q,
 * K, W, which a second block would need: 227 KB of shared memory at DK = 128, two stages, one block
 * per SM. The chunk loop meets at one block barrier per chunk (the stage's tiles in, the previous
 * stage free); inside a chunk each warpgroup syncs on its own named barrier. The per-column arithmetic
 * is NWG's alone, so both give the same bits. Two warpgroups win where one-warpgroup blocks would need a
 * second wave and lose where those fit in one (half the SMs idle); the automatic choice counts the blocks that
 * have work (gdn_wide_pick; with document segments, whose
 * non-empty count only the device knows, both widths are launched and the kernel's wide_need check lets
 * one run).
 *
 * Rows >= L of a chunk's tiles are the next tokens' (zeros past T): dos and dv2 are selected to 0 there;
 * the Q rows meet those zeros (q is finite: exact zeros); W rows may be unwritten workspace
 * (GDN_RANGE_BEFORE_FIRST_RESET), so a partial chunk's W rows >= L are zeroed in shared memory. Columns
 * >= dv (sg.M) carry M^T from the identity with dO = dv_loc = 0: the Q tile is loaded all the same, so
 * Q^T dos adds exact zeros and the product needs no branch (a branch there makes ptxas insert
 * warpgroup.arrive); nothing is stored per chunk for them.
 *
 * Automatic where the 64-column blocks number >= GDN_SBWD_BLOCKS (gdn.cu). Unlike the mma.sync pass: no
 * 16 / 32 column blocks, one chain per product; its bits differ from that pass (wgmma's accumulation
 * order) but are the same on every run and for every segmentation by documents.
 * Design: docs/design/gdn-kernels.md ("The state passes").
 */

/* shared memory of the pass, every wgmma / TMA tile on a 1024-byte boundary (the base is rounded up); per
 * stage Q, K, W, NWG dO and dv_loc tiles, the gates and the stage's mbarrier; then NWG hi and lo blocks.
 * DK = 128, 2 stages: 163 KB at NWG = 1, 227 KB (the device's limit per block) at NWG = 2 */
template <int DK, int NST, int NWG> struct GdnStateBwdSmemWg {
    static constexpr int TK = GDN_C * DK * 2, TU = GDN_C * 64 * 2;
    static constexpr int OQ = 0, OK = TK, OW = 2 * TK, OD = 3 * TK, OL = 3 * TK + NWG * TU, OG = 3 * TK + 2 * NWG * TU,
                         OB = OG + GDN_C * 4, SB = OG + 1024; /* one stage, bytes */
    static constexpr int OHI = NST * SB, OLO = OHI + NWG * DK * 128, BYTES = OLO + NWG * DK * 128 + 1024;
    unsigned char *b;
    GDN_DEV explicit GdnStateBwdSmemWg(unsigned char *base) : b(base) {}
    GDN_DEV unsigned char *q(int i) const { return b + i * SB + OQ; }
    GDN_DEV unsigned char *k(int i) const { return b + i * SB + OK; }
    GDN_DEV unsigned char *w(int i) const { return b + i * SB + OW; }
    GDN_DEV unsigned char *dO(int i, int g) const { return b + i * SB + OD + g * TU; } /* dO in, dos after */
    GDN_DEV unsigned char *dl(int i, int g) const { return b + i * SB + OL + g * TU; } /* dv_loc in, dv2 after */
    GDN_DEV float *G(int i) const { return (float *)(b + i * SB + OG); }
    GDN_DEV uint64_t *bar(int i) const { return (uint64_t *)(b + i * SB + OB); }
    GDN_DEV unsigned char *hi(int g) const { return b + OHI + g * DK * 128; } /* bf16(D): the operand, the dh store */
    GDN_DEV unsigned char *lo(int g) const { return b + OLO + g * DK * 128; } /* bf16(D - hi) */
};

/* the tensor maps of one pass (gdn/gdn.cu gdn_wg_bwd_maps): Q, K, W, dO, dv_loc tiles in (64 x 64
 * boxes), dh out (64 columns x DK rows), dv2 out (64 x 64); rows past the end read as zeros */
struct GdnWgBwdMaps {
    CUtensorMap q, k, w, dO, dl, dh, dv2;
};

/*
 * Grid (ncol / (64 NWG), nv, segments launched), 128 NWG threads. Block (x, h, z) carries columns
 * [64 NWG x, 64 NWG (x + 1)) of dL/dS of head h over segment p = z + sg.pz0, from its last chunk down (the
 * contract of gdn_state_backward_kernel; ncol = dv, or dv + DK when sg.M: with NWG = 2 the state and
 * transition columns never share a block, ncol and dv multiples of 128). Warpgroup wg carries the block's
 * columns [64 wg, 64 wg + 64); its thread (warp w, lane 4 g + t) holds, in state tile mt, element 4 i + e
 * at row 64 mt + 16 w + g + 8 (e / 2), column 8 i + 2 t + e % 2 of them.
 */
template <int DK, int NST, int NWG>
__global__ void __launch_bounds__(GDN_THREADS * NWG, 1)
    gdn_state_backward_wgmma_kernel(bf16 *dhs /* (ns,nv,DK,dv) or NULL */, bf16 *dv2 /* (T,nv,dv) or NULL */, GdnSeg sg,
                            const __grid_constant__ GdnWgBwdMaps tm, const float *G2 /* (T,nv) */,
                            const int4 *info, const int32_t *meta, int mode, int64_t T, int nk, int nv, int dv,
                            float scale, long long *tp /* (GDN_TP_SLOTS) cycles, chunks, or NULL */,
                            int wide_need /* > 0: run only if this NWG is the device's pick (gdn_wide_skip) */) {
    constexpr int BV = 64, MT = DK / 64, KS = DK / 16, NT = GDN_THREADS * NWG;
    static_assert(NST >= 2, "state_bwd_wg: two stages at least");
    static_assert(NWG == 1 || NWG == 2, "state_bwd_wg: one or two warpgroups");
    extern __shared__ __align__(128) unsigned char gdn_wg_smem[]; /* the base is rounded up to 1024 */
    const uint32_t raw = ptx_smem_addr(gdn_wg_smem);
    const GdnStateBwdSmemWg<DK, NST, NWG> s(gdn_wg_smem + (((raw + 1023u) & ~1023u) - raw));
    const int h = blockIdx.y, kh = h / (nv / nk), wg = threadIdx.x >> 7, w = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
    const bool leader = (threadIdx.x & 127) == 0; /* the warpgroup's: its TMA stores */
    const int colb = blockIdx.x * BV * NWG, col0 = colb + BV * wg;
    const bool is_M = colb >= dv; /* the whole block (dv a multiple of 64 NWG) */
    const int p = (int)blockIdx.z + sg.pz0;
    if (is_M && p == sg.m_skip) return; /* the whole block */
    if (sg.pick && *sg.pick != sg.pick_want) return; /* dual launch: the other configuration runs */
    if (wide_need > 0 && gdn_wide_skip<NWG * BV, (NWG > 1)>(sg, nv, wide_need)) return; /* the other width runs */
    const int64_t ldx = (int64_t)nv * dv, ns = (T + GDN_C - 1) / GDN_C + 1;
    const int64_t nsz = (int64_t)nv * DK * dv, nmz = (int64_t)nv * DK * DK;
    const GdnSpan sp = gdn_span<true>(sg, meta, mode, p, is_M, nsz);
    const int lo = sp.lo, hi = sp.hi;
    const float *D_in = sp.in;

    float D[MT][32];
    gdn_wg_state_start<DK, MT>(D, D_in, is_M, h, col0, dv, w, g8, t4);

    if (threadIdx.x == 0) {
        for (int i = 0; i < NST; i++) ptx_mbar_init(ptx_smem_addr(s.bar(i)), 1);
        ptx_mbar_init_fence();
    }
    __syncthreads();
    /* bytes of one stage's tiles: Q, K, W (and dO, dv_loc for the state columns) */
    const unsigned tx = 3 * GDN_C * DK * 2 + (is_M ? 0 : NWG * 2 * GDN_C * BV * 2);
    auto issue = [&](int4 ci, int buf) {
        const int t0 = ci.x;
        if (threadIdx.x == 0) {
            const uint32_t bar = ptx_smem_addr(s.bar(buf));
            ptx_mbar_arrive_tx(bar, tx);
#pragma unroll
            for (int b = 0; b < MT; b++) {
                ptx_tma_load_2d(ptx_smem_addr(s.k(buf)) + b * (GDN_C * 128), &tm.k, kh * DK + 64 * b, t0, bar);
                ptx_tma_load_2d(ptx_smem_addr(s.w(buf)) + b * (GDN_C * 128), &tm.w, h * DK + 64 * b, t0, bar);
                ptx_tma_load_2d(ptx_smem_addr(s.q(buf)) + b * (GDN_C * 128), &tm.q, kh * DK + 64 * b, t0, bar);
            }
            if (!is_M)
#pragma unroll
                for (int g = 0; g < NWG; g++) {
                    ptx_tma_load_2d(ptx_smem_addr(s.dO(buf, g)), &tm.dO, h * dv + colb + BV * g, t0, bar);
                    ptx_tma_load_2d(ptx_smem_addr(s.dl(buf, g)), &tm.dl, h * dv + colb + BV * g, t0, bar);
                }
        }
        gdn_load_G(s.G(buf), G2, t0, ci.y, h, nv);
    };
    /* inf[i]: (t0, L, flags) of chunk c - i; chunk c's tiles are issued during chunk c + NST - 1 */
    const int4 none = make_int4(0, 1, 0, 0);
    int4 inf[NST];
#pragma unroll
    for (int i = 0; i < NST; i++) inf[i] = hi - 1 - i >= lo ? info[hi - 1 - i] : none;
#pragma unroll
    for (int i = 0; i < NST - 1; i++) {
        if (hi - 1 - i >= lo) issue(inf[i], i);
        ptx_cp_async_commit();
    }
    const uint32_t a_hi = ptx_smem_addr(s.hi(wg)), a_lo = ptx_smem_addr(s.lo(wg));
    int buf = 0;
    unsigned ph = 0; /* parity of each stage's next phase */
    const bool tp_on = tp && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0;
    long long tpa[GDN_TP_N] = {0, 0, 0, 0, 0, 0}, tp_last = tp_on ? clock64() : 0;
    for (int c = hi - 1; c >= lo; c--) {
        const int4 infN = c - NST >= lo ? info[c - NST] : none;
        const int4 cur = inf[0];
        const int64_t t0 = cur.x, t1 = t0 + cur.y;
        const int L = cur.y;
        if (leader) ptx_bulk_wait_read<0>(); /* chunk c+1's dh and dv2 stores have read hi and its tiles */
        ptx_cp_async_wait<NST - 2>();
        ptx_mbar_wait(ptx_smem_addr(s.bar(buf)), (ph >> buf) & 1u);
        ph ^= 1u << buf;
        if (L < GDN_C) { /* a partial chunk: W rows >= L to 0 (they may be unwritten workspace) */
            for (int i = threadIdx.x; i < MT * GDN_C * 8; i += NT) {
                const int b = i / (GDN_C * 8), r = (i / 8) % GDN_C, u = i % 8;
                if (r >= L) *(uint4 *)(s.w(buf) + b * (GDN_C * 128) + r * 128 + u * 16) = make_uint4(0, 0, 0, 0);
            }
            ptx_fence_proxy_async();
        }
        __syncthreads(); /* chunk c's tiles are in (W's tail zeroed); chunk c+1's products and stores are done
                            with their tiles */
        GDN_TP(0);
        {
            const int nb = buf + NST - 1 >= NST ? buf - 1 : buf + NST - 1; /* the stage of chunk c+1 */
            if (c - (NST - 1) >= lo) issue(inf[NST - 1], nb);
        }
        ptx_cp_async_commit();
        GDN_TP(1);
        const bool reset = (cur.z & 1) != 0;
        const bool exit_carries = (cur.z & 2) != 0;
        const bool dst = dhs && !is_M && exit_carries;
        const float *sG = s.G(buf);
        /* D hi + lo bf16 into the swizzled blocks (hi = dh, stored below) */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int x = 0; x < 32; x += 2) {
                const int a = 64 * mt + 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4;
                const uint32_t o = gdn_wg_off(a, j);
                gdn_split2((bf16 *)(s.hi(wg) + o), (bf16 *)(s.lo(wg) + o), D[mt][x], D[mt][x + 1]);
            }
        /* dos = scale gam_r dO_r over the dO tile (rows >= L, and every row of M^T columns: 0 by selection) */
#pragma unroll
        for (int x = 0; x < 32; x += 2) {
            const int r = 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4;
            bf16 *po = (bf16 *)(s.dO(buf, wg) + gdn_wg_off(r, j));
            const bool on = !is_M && r < L;
            float2 d = make_float2(0.0f, 0.0f);
            if (on) d = gdn_load2(po);
            const float f = on ? scale * exp2f(sG[r]) : 0.0f;
            gdn_store2(po, on ? f * d.x : 0.0f, on ? f * d.y : 0.0f);
        }
        ptx_fence_proxy_async();
        ptx_bar_sync(1 + wg, GDN_THREADS); /* this warpgroup's hi, lo, dos written */
        if (leader && dst) {
            ptx_tma_store_2d(&tm.dh, col0, (int)(((t1 == T ? ns - 1 : t1 / GDN_C) * nv + h) * DK), a_hi);
            ptx_bulk_commit();
        }
        GDN_TP(2);
        /* acc = K (D_hi + D_lo): tokens x 64 */
        float acc[32];
        const uint32_t a_k = ptx_smem_addr(s.k(buf)), a_w = ptx_smem_addr(s.w(buf)), a_q = ptx_smem_addr(s.q(buf));
        ptx_wg_fence();
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            ptx_wgmma_ss_n64<0, 1>(acc, ptx_gdesc(a_k + (kk >> 2) * (GDN_C * 128) + (kk & 3) * 32, 16, 1024),
                                ptx_gdesc(a_hi + kk * 16 * 128, DK * 128, 1024), kk > 0);
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            ptx_wgmma_ss_n64<0, 1>(acc, ptx_gdesc(a_k + (kk >> 2) * (GDN_C * 128) + (kk & 3) * 32, 16, 1024),
                                ptx_gdesc(a_lo + kk * 16 * 128, DK * 128, 1024), 1);
        ptx_wg_commit();
        ptx_wg_wait<0>();
#pragma unroll
        for (int x = 0; x < 32; x++) ptx_reg_fence(acc[x]);
        GDN_TP(3);
        /* dv2 = bf16(dv_loc + dec acc) over the dv_loc tile (rows >= L: 0 by selection), stored from there by
         * TMA when the chunk is full, by the threads otherwise */
        const float gL = sG[L - 1];
        const bool vst = dv2 && !is_M, vfull = vst && L == GDN_C;
#pragma unroll
        for (int x = 0; x < 32; x += 2) {
            const int r = 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4;
            bf16 *pl = (bf16 *)(s.dl(buf, wg) + gdn_wg_off(r, j));
            float2 l = make_float2(0.0f, 0.0f);
            if (!is_M) l = gdn_load2(pl);
            const float dec = r < L ? exp2f(gL - sG[r]) : 0.0f;
            const __nv_bfloat162 v2 = __floats2bfloat162_rn(l.x + dec * acc[x], l.y + dec * acc[x + 1]);
            if (vst && !vfull && r < L) *(__nv_bfloat162 *)(dv2 + (t0 + r) * ldx + (int64_t)h * dv + col0 + j) = v2;
            *(__nv_bfloat162 *)pl = r < L ? v2 : __floats2bfloat162_rn(0.0f, 0.0f);
        }
        const float gam = exp2f(gL);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int x = 0; x < 32; x++) D[mt][x] *= gam;
        ptx_fence_proxy_async();
        ptx_bar_sync(1 + wg, GDN_THREADS); /* this warpgroup's dv2 written */
        if (leader && vfull) {
            ptx_tma_store_2d(&tm.dv2, h * dv + col0, (int)t0, ptx_smem_addr(s.dl(buf, wg)));
            ptx_bulk_commit();
        }
        GDN_TP(4);
        /* D += Q^T dos - W^T dv2, per state tile (W scaled by -1 in the instruction: the products of W^T
         * (-dv2), exactly) */
        const uint32_t a_dos = ptx_smem_addr(s.dO(buf, wg)), a_dv = ptx_smem_addr(s.dl(buf, wg));
        ptx_wg_fence();
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int kk = 0; kk < GDN_C / 16; kk++)
                ptx_wgmma_ss_n64<1, 1>(D[mt], ptx_gdesc(a_q + mt * (GDN_C * 128) + kk * 16 * 128, GDN_C * 128, 1024),
                                    ptx_gdesc(a_dos + kk * 16 * 128, GDN_C * 128, 1024), 1);
#pragma unroll
            for (int kk = 0; kk < GDN_C / 16; kk++)
                ptx_wgmma_ss_n64<1, 1, -1>(D[mt],
                                          ptx_gdesc(a_w + mt * (GDN_C * 128) + kk * 16 * 128, GDN_C * 128, 1024),
                                          ptx_gdesc(a_dv + kk * 16 * 128, GDN_C * 128, 1024), 1);
        }
        ptx_wg_commit();
        ptx_wg_wait<0>();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int x = 0; x < 32; x++) ptx_reg_fence(D[mt][x]);
        GDN_TP(5);
        if (reset)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int x = 0; x < 32; x++) D[mt][x] = 0.0f;
#pragma unroll
        for (int i = 0; i < NST - 1; i++) inf[i] = inf[i + 1];
        inf[NST - 1] = infN;
        buf = buf + 1 == NST ? 0 : buf + 1;
    }
    if (leader) ptx_bulk_wait<0>(); /* the last stores complete */
    if (tp_on) gdn_tp_store(tp, tpa, hi - lo);
    float *Dd = gdn_span_out<true>(sg, p, sp.dlast, is_M, nsz, nmz);
    if (!Dd) return;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int x = 0; x < 32; x++) {
            const int a = 64 * mt + 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4 + (x & 1);
            if (is_M) Dd[((int64_t)h * DK + a) * DK + col0 - dv + j] = D[mt][x];
            else Dd[((int64_t)h * DK + a) * dv + col0 + j] = D[mt][x];
        }
}
