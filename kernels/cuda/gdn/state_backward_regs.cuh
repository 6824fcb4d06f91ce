/*
 * state_backward_regs.cuh — the backward (reverse) state pass of the chunked gated delta rule on wgmma with
 * dL/dS in registers as the A operand (Hopper, sm_90a), tune choice sbwd (cuda_gdn_tune.h). Not a standalone
 * header: included by gdn/gdn.cu after gdn/state_pass.cuh (GdnSeg, gdn_span) and gdn/state_forward_regs.cuh
 * (the staging blocks and their stores, the state start, the wide pick), with cuda_ptx.h's wgmma, TMA and
 * mbarriers.
 *
 * The same pass as gdn_state_backward_kernel (per chunk, last to first: store dh = D at the chunk's exit,
 * dv2 = dv_loc + dec (K D), store dv2, D <- gam_L D + scale (Q gam)^T dO - W^T dv2, D <- 0 when the chunk starts
 * a document), computed transposed as state_forward_regs.cuh computes the forward, one warpgroup per 64 state
 * columns:
 *   D        D^T (64 columns x DK, fp32) in the warpgroup's wgmma accumulators (m64nDK)
 *   K D      acc^T = D^T K^T: m64n64k16 x DK / 16, twice (D split hi + lo bf16), A = D^T from registers,
 *            B = K (tokens x DK, K-major)
 *   Q^T dos  D^T += dos^T Q: m64nDKk16 x 4, A = dos^T = (scale gam_r dO_r)^T from the dO tile by
 *            ldmatrix.trans, B = Q (N-major)
 *   W^T dv2  D^T += (-dv2)^T W: the same with A = -dv2^T from registers (bf16 negation is exact: the products
 *            of W^T (-dv2)) and B = W (N-major)
 * Tiles Q, K, W, dO, dv_loc by TMA (one mbarrier per stage), the gates by cp.async. dh and dv2 go out through
 * each warp's staging blocks by TMA (state_forward_regs.cuh's layout); nothing on the chain between two chunks
 * goes through shared memory.
 *
 * NWG warpgroups per block (tune choice sbcols = 64 NWG columns): warpgroup i carries the 64 columns at 64 i of
 * the block's, its own chain with its own dO and dv_loc tiles; the Q, K, W tiles and the gates are loaded once
 * and read by both. Two chains on one SM hide each other's per-chunk latency without a second copy of Q, K, W.
 * The chunk loop meets at one block barrier per chunk (the stage's tiles in, the previous stage free). The
 * per-column arithmetic is NWG's alone, so both widths give the same bits. Two warpgroups win where
 * one-warpgroup blocks would need a second wave and lose where those fit in one; the automatic choice counts
 * the blocks that have work (gdn_wide_pick; with document segments, whose non-empty count only the device
 * knows, both widths are launched and the kernel's wide_need check lets one run).
 *
 * Rows >= L of a chunk's tiles are the next tokens' (zeros past T): dos and dv2 are selected to 0 there; the Q
 * rows meet those zeros (q is finite: exact zeros); W rows may be unwritten workspace
 * (GDN_RANGE_BEFORE_FIRST_RESET), so a partial chunk's W rows >= L are zeroed in shared memory. Columns >= dv
 * (sg.M) carry M^T from the identity with dO = dv_loc = 0: the Q tile is loaded all the same, so Q^T dos adds
 * exact zeros and the product needs no branch; nothing is stored per chunk for them.
 *
 * Automatic where the 64-column blocks number >= GDN_SBWD_BLOCKS (gdn_tune.cu). Its bits differ from the
 * mma.sync pass's (wgmma's accumulation order) but are the same on every run, for both widths and for every
 * segmentation by documents (test_cuda checks it). Design: docs/design/gdn-kernels.md ("The state passes").
 */

/* shared memory: per stage Q, K, W, NWG dO and dv_loc tiles, the gates and the stage's mbarrier; then per
 * warpgroup the four warps' dh and dv2 staging blocks. DK = 128, 2 stages: 155 KB at one warpgroup, 211 KB at
 * two */
template <int DK, int NST, int NWG> struct GdnStateBwdSmemRg {
    static constexpr int TK = GDN_C * DK * 2, TU = GDN_C * 64 * 2;
    static constexpr int OQ = 0, OK = TK, OW = 2 * TK, OD = 3 * TK, OL = 3 * TK + NWG * TU, OG = 3 * TK + 2 * NWG * TU,
                         OB = OG + GDN_C * 4, SB = OG + 1024; /* one stage, bytes */
    static constexpr int HW = DK * 32, VW = GDN_C * 32; /* one warp's dh, dv2 staging block */
    static constexpr int OH = NST * SB, OV = OH + 4 * HW, PW = 4 * HW + 4 * VW, BYTES = OH + NWG * PW + 1024;
    static_assert(SB % 1024 == 0 && PW % 1024 == 0, "state_bwd_rg: tiles on 1024-byte boundaries");
    unsigned char *b;
    GDN_DEV explicit GdnStateBwdSmemRg(unsigned char *base) : b(base) {}
    GDN_DEV unsigned char *q(int i) const { return b + i * SB + OQ; }
    GDN_DEV unsigned char *k(int i) const { return b + i * SB + OK; }
    GDN_DEV unsigned char *w(int i) const { return b + i * SB + OW; }
    GDN_DEV unsigned char *dO(int i, int g) const { return b + i * SB + OD + g * TU; }
    GDN_DEV unsigned char *dl(int i, int g) const { return b + i * SB + OL + g * TU; }
    GDN_DEV float *G(int i) const { return (float *)(b + i * SB + OG); }
    GDN_DEV uint64_t *bar(int i) const { return (uint64_t *)(b + i * SB + OB); }
    GDN_DEV unsigned char *h(int g, int wp) const { return b + OH + g * PW + wp * HW; }
    GDN_DEV unsigned char *vn(int g, int wp) const { return b + OV + g * PW + wp * VW; }
};

/* the tensor maps of one pass (gdn/gdn.cu gdn_wg_bwd_maps): Q, K, W, dO, dv_loc tiles in (64 x 64 boxes), dh
 * out (16 columns x DK rows, one warp's), dv2 out (16 x 64); rows past the end read as zeros */
struct GdnWgBwdMaps {
    CUtensorMap q, k, w, dO, dl, dh, dv2;
};

/* a 64-column tile (tokens x 64, 128-byte swizzle) read transposed for this warp's 16 columns: f[q] holds the
 * pairs of tokens 16 q .. 16 q + 15 in the A-fragment / accumulator layout (state_forward_regs.cuh) */
GDN_DEV void gdn_rg_load_t(uint32_t (&f)[4][4], const unsigned char *tile, int w, int lane) {
    const int m = lane >> 3, r = lane & 7;
#pragma unroll
    for (int q = 0; q < 4; q++) ptx_ldmatrix_x4_trans(f[q], tile + gdn_wg_off(16 * q + 8 * (m >> 1) + r, 16 * w + 8 * (m & 1)));
}

/*
 * Grid (ncol / (64 NWG), nv, segments launched), 128 NWG threads. Block (x, h, z) carries columns
 * [64 NWG x, 64 NWG (x + 1)) of dL/dS of head h over segment p = z + sg.pz0, from its last chunk down (the
 * contract of gdn_state_backward_kernel; ncol = dv, or dv + DK when sg.M: with NWG = 2 the state and
 * transition columns never share a block, ncol and dv multiples of 128). Warpgroup wg carries the block's
 * columns [64 wg, 64 wg + 64); its thread holds D^T element x at (gdn_rg_col, gdn_rg_key) of them
 * (state_forward_regs.cuh's layout).
 */
template <int DK, int NST, int NWG>
__global__ void __launch_bounds__(GDN_THREADS * NWG, 1)
    gdn_state_backward_regs_kernel(bf16 *dhs /* (ns,nv,DK,dv) or NULL */, bf16 *dv2 /* (T,nv,dv) or NULL */, GdnSeg sg,
                                   const __grid_constant__ GdnWgBwdMaps tm, const float *G2 /* (T,nv) */,
                                   const int4 *info, const int32_t *meta, int mode, int64_t T, int nk, int nv, int dv,
                                   float scale, long long *tp /* (GDN_TP_SLOTS) cycles, chunks, or NULL */,
                                   int wide_need /* > 0: run only if this NWG is the device's pick (gdn_wide_skip) */) {
    constexpr int NS = DK / 2, KS = DK / 16, NT = GDN_THREADS * NWG;
    static_assert(NST >= 2, "state_bwd_rg: two stages at least");
    static_assert(DK == 64 || DK == 128, "state_bwd_rg: dim_k 64 or 128");
    extern __shared__ __align__(128) unsigned char gdn_rg_smem[]; /* the base is rounded up to 1024 */
    const uint32_t raw = ptx_smem_addr(gdn_rg_smem);
    const GdnStateBwdSmemRg<DK, NST, NWG> s(gdn_rg_smem + (((raw + 1023u) & ~1023u) - raw));
    const int h = blockIdx.y, kh = h / (nv / nk), wg = threadIdx.x >> 7, w = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
    const int colb = blockIdx.x * 64 * NWG, col0 = colb + 64 * wg;
    const bool is_M = colb >= dv; /* the whole block (dv a multiple of 64 NWG) */
    const int p = (int)blockIdx.z + sg.pz0;
    if (is_M && p == sg.m_skip) return; /* the whole block */
    if (sg.pick && *sg.pick != sg.pick_want) return; /* dual launch: the other configuration runs */
    if (wide_need > 0 && gdn_wide_skip<64 * NWG, (NWG > 1)>(sg, nv, wide_need)) return; /* the other width runs */
    const int64_t ldx = (int64_t)nv * dv, ns = (T + GDN_C - 1) / GDN_C + 1;
    const int64_t nsz = (int64_t)nv * DK * dv, nmz = (int64_t)nv * DK * DK;
    const GdnSpan sp = gdn_span<true>(sg, meta, mode, p, is_M, nsz);
    const int lo = sp.lo, hi = sp.hi;

    float D[NS]; /* D^T, element x at (gdn_rg_col, gdn_rg_key) */
    gdn_rg_state_start<DK>(D, sp.in, is_M, h, col0, dv, w, g8, t4);

    if (threadIdx.x == 0) {
        for (int i = 0; i < NST; i++) ptx_mbar_init(ptx_smem_addr(s.bar(i)), 1);
        ptx_mbar_init_fence();
    }
    __syncthreads();
    /* bytes of one stage's tiles: Q, K, W (and dO, dv_loc for the state columns) */
    const unsigned tx = 3 * GDN_C * DK * 2 + (is_M ? 0 : NWG * 2 * GDN_C * 64 * 2);
    auto issue = [&](int4 ci, int buf) {
        const int t0 = ci.x;
        if (threadIdx.x == 0) {
            const uint32_t bar = ptx_smem_addr(s.bar(buf));
            ptx_mbar_arrive_tx(bar, tx);
#pragma unroll
            for (int b = 0; b < DK / 64; b++) {
                ptx_tma_load_2d(ptx_smem_addr(s.k(buf)) + b * (GDN_C * 128), &tm.k, kh * DK + 64 * b, t0, bar);
                ptx_tma_load_2d(ptx_smem_addr(s.w(buf)) + b * (GDN_C * 128), &tm.w, h * DK + 64 * b, t0, bar);
                ptx_tma_load_2d(ptx_smem_addr(s.q(buf)) + b * (GDN_C * 128), &tm.q, kh * DK + 64 * b, t0, bar);
            }
            if (!is_M)
#pragma unroll
                for (int g = 0; g < NWG; g++) {
                    ptx_tma_load_2d(ptx_smem_addr(s.dO(buf, g)), &tm.dO, h * dv + colb + 64 * g, t0, bar);
                    ptx_tma_load_2d(ptx_smem_addr(s.dl(buf, g)), &tm.dl, h * dv + colb + 64 * g, t0, bar);
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
    const uint32_t a_hs = ptx_smem_addr(s.h(wg, w)), a_vs = ptx_smem_addr(s.vn(wg, w));
    int buf = 0;
    unsigned ph = 0; /* parity of each stage's next phase */
    const bool tp_on = tp && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0;
    long long tpa[GDN_TP_N] = {0, 0, 0, 0, 0, 0}, tp_last = tp_on ? clock64() : 0;
    for (int c = hi - 1; c >= lo; c--) {
        const int4 infN = c - NST >= lo ? info[c - NST] : none;
        const int4 cur = inf[0];
        const int64_t t0 = cur.x, t1 = t0 + cur.y;
        const int L = cur.y;
        ptx_cp_async_wait<NST - 2>();
        ptx_mbar_wait(ptx_smem_addr(s.bar(buf)), (ph >> buf) & 1u);
        ph ^= 1u << buf;
        if (L < GDN_C) { /* a partial chunk: W rows >= L to 0 (they may be unwritten workspace) */
            for (int i = threadIdx.x; i < (DK / 64) * GDN_C * 8; i += NT) {
                const int b = i / (GDN_C * 8), r = (i / 8) % GDN_C, u = i % 8;
                if (r >= L) *(uint4 *)(s.w(buf) + b * (GDN_C * 128) + r * 128 + u * 16) = make_uint4(0, 0, 0, 0);
            }
            ptx_fence_proxy_async();
        }
        __syncthreads(); /* chunk c's tiles are in (W's tail zeroed); chunk c+1's products are done with theirs */
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
        /* D^T hi + lo as A fragments */
        uint32_t ah[KS][4], al[KS][4];
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int e = 0; e < 4; e++) gdn_split_pack(ah[kk][e], al[kk][e], D[8 * kk + 2 * e], D[8 * kk + 2 * e + 1]);
        GDN_TP(2);
        /* acc^T = (D_hi + D_lo)^T K^T: state columns x tokens */
        float acc[32];
        const uint32_t a_k = ptx_smem_addr(s.k(buf)), a_w = ptx_smem_addr(s.w(buf)), a_q = ptx_smem_addr(s.q(buf));
        gdn_rg_product_hilo<DK>(acc, ah, al, a_k);
        /* while the product runs: dh out, dos^T and dv_loc^T in, the decays */
        if (dst) /* the last chunk's dh and dv2 stores read */
            gdn_rg_store<KS>(&tm.dh, col0 + 16 * w, [&] { return (int)(((t1 == T ? ns - 1 : t1 / GDN_C) * nv + h) * DK); },
                             a_hs, ah, lane, 0);
        uint32_t fo[4][4] = {}, fl[4][4] = {}; /* dO^T, dv_loc^T pairs: f[i / 2][2 (i & 1) + half] */
        if (!is_M) {
            gdn_rg_load_t(fo, s.dO(buf, wg), w, lane);
            gdn_rg_load_t(fl, s.dl(buf, wg), w, lane);
        }
        const float gL = sG[L - 1];
        /* dos^T = scale gam_r dO_r (rows >= L, and every row of M^T columns: 0 by selection) */
        uint32_t ad[4][4];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int r = 8 * i + 2 * t4;
            const bool on0 = !is_M && r < L, on1 = !is_M && r + 1 < L;
            const float f0 = on0 ? scale * exp2f(sG[r]) : 0.0f, f1 = on1 ? scale * exp2f(sG[r + 1]) : 0.0f;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float2 d = __bfloat1622float2(*(const __nv_bfloat162 *)&fo[i >> 1][2 * (i & 1) + hf]);
                ad[i >> 1][2 * (i & 1) + hf] = ptx_pack_bf16x2(on0 ? f0 * d.x : 0.0f, on1 ? f1 * d.y : 0.0f);
            }
        }
        ptx_wg_wait<0>();
#pragma unroll
        for (int x = 0; x < 32; x++) ptx_reg_fence(acc[x]);
        GDN_TP(3);
        /* dv2^T = bf16(dv_loc^T + dec acc^T) (rows >= L: 0 by selection): out, and -dv2^T as A fragments */
        const bool vst = dv2 && !is_M, vfull = vst && L == GDN_C;
        uint32_t vo[4][4], av[4][4];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int r = 8 * i + 2 * t4;
            const float d0 = r < L ? exp2f(gL - sG[r]) : 0.0f, d1 = r + 1 < L ? exp2f(gL - sG[r + 1]) : 0.0f;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int x = 4 * i + 2 * hf;
                const float2 l = __bfloat1622float2(*(const __nv_bfloat162 *)&fl[i >> 1][2 * (i & 1) + hf]);
                __nv_bfloat162 v2 = __floats2bfloat162_rn(l.x + d0 * acc[x], l.y + d1 * acc[x + 1]);
                if (vst && !vfull) {
                    const int j = col0 + gdn_rg_col(x, w, g8);
                    if (r < L) dv2[(t0 + r) * ldx + (int64_t)h * dv + j] = v2.x;
                    if (r + 1 < L) dv2[(t0 + r + 1) * ldx + (int64_t)h * dv + j] = v2.y;
                }
                if (r >= L) v2.x = __float2bfloat16_rn(0.0f);
                if (r + 1 >= L) v2.y = __float2bfloat16_rn(0.0f);
                vo[i >> 1][2 * (i & 1) + hf] = *(const uint32_t *)&v2;
                av[i >> 1][2 * (i & 1) + hf] = *(const uint32_t *)&v2 ^ 0x80008000u; /* -dv2: the sign bits */
            }
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int e = 0; e < 4; e++) ptx_reg_fence(ad[kk][e]), ptx_reg_fence(av[kk][e]);
        const float gam = exp2f(gL);
#pragma unroll
        for (int x = 0; x < NS; x++) D[x] *= gam;
        GDN_TP(4);
        /* D^T += dos^T Q + (-dv2)^T W */
        ptx_wg_fence();
        gdn_rg_product_t<DK>(D, ad, a_q);
        gdn_rg_product_t<DK>(D, av, a_w);
        ptx_wg_commit();
        /* overlapping the products: dv2 out (the last chunk's dv2 store read; this chunk's dh store may not be) */
        if (vfull) gdn_rg_store<4>(&tm.dv2, h * dv + col0 + 16 * w, [&] { return (int)t0; }, a_vs, vo, lane, dst);
        ptx_wg_wait<0>();
#pragma unroll
        for (int x = 0; x < NS; x++) ptx_reg_fence(D[x]);
        GDN_TP(5);
        if (reset)
#pragma unroll
            for (int x = 0; x < NS; x++) D[x] = 0.0f;
#pragma unroll
        for (int i = 0; i < NST - 1; i++) inf[i] = inf[i + 1];
        inf[NST - 1] = infN;
        buf = buf + 1 == NST ? 0 : buf + 1;
    }
    if (lane == 0) ptx_bulk_wait<0>(); /* the last stores complete */
    if (tp_on) gdn_tp_store(tp, tpa, hi - lo);
    float *Dd = gdn_span_out<true>(sg, p, sp.dlast, is_M, nsz, nmz);
    if (Dd) gdn_rg_state_out<DK>(Dd, D, is_M, h, col0, dv, w, g8, t4);
}
