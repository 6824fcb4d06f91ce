/*
 * state_forward_regs.cuh — the forward state pass of the chunked gated delta rule on wgmma with the state in
 * registers as the A operand (Hopper, sm_90a), tune choice sfwd with state_fwd_wgmma_cols 64 or 128
 * (cuda_gdn_tune.h; automatic where the blocks with work exceed one per SM). Not a standalone header:
 * included by gdn/gdn.cu after gdn/state_forward_wgmma.cuh, whose tensor maps, swizzled offsets and wide pick it
 * shares (and state_pass.cuh's segment bookkeeping).
 *
 * The same pass as gdn_state_forward_wgmma_kernel (per chunk: store h, vn = U - W h, store vn, S = gam_L S +
 * K^T (dec * vn)), computed transposed, one warpgroup per 64 state columns, so that nothing on the chain
 * between two chunks goes through shared memory:
 *   state    S^T (64 columns x DK, fp32) in the warpgroup's wgmma accumulators (m64nDK)
 *   W h      v^T = S^T W^T: m64n64k16 x DK / 16, twice (the state split hi + lo bf16 as the other passes),
 *            A = S^T hi / lo from registers (the accumulator repacked: same fragment layout), B = W
 *            (tokens x DK, K-major, the TMA tile as it arrives)
 *   K^T vn   S^T = gam_L S^T + (dec vn)^T K: m64nDKk16 x 4, A = (dec vn)^T from registers (the v^T
 *            accumulator repacked), B = K (tokens x DK, N-major)
 * U^T comes from its TMA tile by ldmatrix.trans; h (bf16(S), the hi half) and vn go out by stmatrix.trans into
 * each warp's own staging block of 16 columns (32-byte swizzle) and one TMA store per warp: no barrier between
 * the warps of a warpgroup but the one per chunk that hands the stage's tiles back. Two warpgroups (NWG = 2)
 * share one block's W and K tiles, each with its own U tile. DK = 128, 2 stages: 108 KB at one warpgroup (two
 * blocks per SM), 148 KB at two.
 *
 * Thread (warp w, lane 4 g8 + t4) of warpgroup wg holds S^T element x (x < DK / 2) at state column
 * 16 w + g8 + 8 ((x >> 1) & 1) of the warpgroup's 64 and state row (key dim) 8 (x >> 2) + 2 t4 + (x & 1); v^T
 * and vn^T element x (x < 32) at the same column and token 8 (x >> 2) + 2 t4 + (x & 1) of the chunk.
 * Grid, segments, transition columns, document segments, the dual launch's pick and the cycle counters are
 * gdn_state_forward_wgmma_kernel's contract, unchanged. Each product sums the same terms in the same order as
 * that pass, so the bits are its bits (test_cuda checks it), the same on every run, for every width and for every
 * segmentation by documents. Design: docs/design/gdn-kernels.md ("The state passes").
 */

/* shared memory of the pass, every tile on a 1024-byte boundary (the base is rounded up): per stage W, K, NWG
 * U tiles (64 columns), the gates and the stage's mbarrier; then per warpgroup the four warps' h staging blocks
 * (DK rows of 16 columns) and vn staging blocks (64 rows of 16 columns) */
template <int DK, int NST, int NWG> struct GdnStateFwdSmemRg {
    static constexpr int TK = GDN_C * DK * 2, TU = GDN_C * 64 * 2;
    static constexpr int OW = 0, OK = TK, OU = 2 * TK, OG = 2 * TK + NWG * TU, OB = OG + GDN_C * 4,
                         SB = OG + 1024; /* one stage, bytes */
    static constexpr int HW = DK * 32, VW = GDN_C * 32; /* one warp's h, vn staging block */
    static constexpr int OH = NST * SB, OV = OH + 4 * HW, PW = 4 * HW + 4 * VW, BYTES = OH + NWG * PW + 1024;
    static_assert(SB % 1024 == 0 && PW % 1024 == 0, "state_fwd_rg: tiles on 1024-byte boundaries");
    unsigned char *b;
    GDN_DEV explicit GdnStateFwdSmemRg(unsigned char *base) : b(base) {}
    GDN_DEV unsigned char *w(int i) const { return b + i * SB + OW; }
    GDN_DEV unsigned char *k(int i) const { return b + i * SB + OK; }
    GDN_DEV unsigned char *u(int i, int g) const { return b + i * SB + OU + g * TU; }
    GDN_DEV float *G(int i) const { return (float *)(b + i * SB + OG); }
    GDN_DEV uint64_t *bar(int i) const { return (uint64_t *)(b + i * SB + OB); }
    GDN_DEV unsigned char *h(int g, int wp) const { return b + OH + g * PW + wp * HW; }
    GDN_DEV unsigned char *vn(int g, int wp) const { return b + OV + g * PW + wp * VW; }
};

/* byte offset of element pair (r, 8 c), c in {0, 1}, in a staging block of 16 columns: rows of 32 bytes,
 * 32-byte swizzle (the 16-byte chunk index xor address bit 7: TMA's CU_TENSOR_MAP_SWIZZLE_32B) */
GDN_DEV uint32_t gdn_rg_off(int r, int c) { return r * 32 + ((c ^ (r >> 2)) & 1) * 16; }

/* two fp32 -> bf16x2 hi and the remainder lo (the split of gdn_split2, in registers) */
GDN_DEV void gdn_split_pack(uint32_t &hi, uint32_t &lo, float x0, float x1) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    hi = *(const uint32_t *)&h;
    lo = ptx_pack_bf16x2(x0 - hf.x, x1 - hf.y);
}

/* the 8 x 8 blocks of a warp's 16 columns of an accumulator (rows: this warp's 16 state columns, N: tokens
 * or key dims) stored transposed by stmatrix into its staging block: frag[kk] holds the A fragment of the
 * key / token block [16 kk, 16 kk + 16) */
template <int KS> GDN_DEV void gdn_rg_stage(uint32_t base, const uint32_t (&frag)[KS][4], int lane) {
    const int m = lane >> 3, r = lane & 7;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) ptx_stmatrix_x4_trans(base + gdn_rg_off(16 * kk + 8 * (m >> 1) + r, m & 1), frag[kk]);
}

/* a warp's 16 columns of an accumulator (frag as gdn_rg_stage) out through its staging block at base by one TMA
 * store at (c0, row()) of tm (row: a callable, evaluated by lane 0 only, after the staging); the staging block is
 * free once this thread's bulk groups but `keep` (0 or 1: one store issued since the last one from this block)
 * have read their sources */
template <int KS, class Row>
GDN_DEV void gdn_rg_store(const CUtensorMap *tm, int c0, Row row, uint32_t base, const uint32_t (&frag)[KS][4], int lane,
                          int keep) {
    if (lane == 0) {
        if (keep) ptx_bulk_wait_read<1>();
        else ptx_bulk_wait_read<0>();
    }
    __syncwarp();
    gdn_rg_stage<KS>(base, frag, lane);
    ptx_fence_proxy_async();
    __syncwarp();
    if (lane == 0) {
        ptx_tma_store_2d(tm, c0, row(), base);
        ptx_bulk_commit();
    }
}

/* The thread's (col, key) of transposed-state element x (x < DK / 2): column 16 w + g8 + 8 ((x >> 1) & 1) of the
 * warpgroup's 64, key dim 8 (x >> 2) + 2 t4 + (x & 1) */
GDN_DEV int gdn_rg_col(int x, int w, int g8) { return 16 * w + g8 + 8 * ((x >> 1) & 1); }
GDN_DEV int gdn_rg_key(int x, int t4) { return 8 * (x >> 2) + 2 * t4 + (x & 1); }

/* the carried (transposed) state at a span's start: columns col0 + .. of head h from S_in (nv, DK, dv), 0 where
 * S_in is NULL; transition columns (is_M: col0 >= dv) start from the identity */
template <int DK>
GDN_DEV void gdn_rg_state_start(float (&S)[DK / 2], const float *S_in, bool is_M, int h, int col0, int dv, int w, int g8,
                                int t4) {
#pragma unroll
    for (int x = 0; x < DK / 2; x++) {
        const int a = gdn_rg_key(x, t4), j = gdn_rg_col(x, w, g8);
        float v = 0.0f;
        if (is_M) v = (a == col0 - dv + j) ? 1.0f : 0.0f;
        else if (S_in) v = S_in[((int64_t)h * DK + a) * dv + col0 + j];
        S[x] = v;
    }
}

/* the state leaving a span into Sd: (nv, DK, DK) transition columns, else (nv, DK, dv) */
template <int DK>
GDN_DEV void gdn_rg_state_out(float *Sd, const float (&S)[DK / 2], bool is_M, int h, int col0, int dv, int w, int g8,
                              int t4) {
#pragma unroll
    for (int x = 0; x < DK / 2; x++) {
        const int a = gdn_rg_key(x, t4), j = gdn_rg_col(x, w, g8);
        if (is_M) Sd[((int64_t)h * DK + a) * DK + col0 - dv + j] = S[x];
        else Sd[((int64_t)h * DK + a) * dv + col0 + j] = S[x];
    }
}

/* the first product of a chunk, acc (64 columns x 64 tokens) = (S_hi + S_lo)^T X^T from the state's split A
 * fragments ah, al and X, a tokens x DK tile at a_x (K-major B): 2 DK / 16 wgmma, committed, not waited for */
template <int DK>
GDN_DEV void gdn_rg_product_hilo(float (&acc)[32], const uint32_t (&ah)[DK / 16][4], const uint32_t (&al)[DK / 16][4],
                                 uint32_t a_x) {
    ptx_wg_fence();
#pragma unroll
    for (int kk = 0; kk < DK / 16; kk++)
        ptx_wgmma_rs_n64<0>(acc, ah[kk], ptx_gdesc(a_x + (kk >> 2) * (GDN_C * 128) + (kk & 3) * 32, 16, 1024), kk > 0);
#pragma unroll
    for (int kk = 0; kk < DK / 16; kk++)
        ptx_wgmma_rs_n64<0>(acc, al[kk], ptx_gdesc(a_x + (kk >> 2) * (GDN_C * 128) + (kk & 3) * 32, 16, 1024), 1);
    ptx_wg_commit();
}

/* S^T (64 columns x DK) += A X, A (64 columns x 64 tokens) as A fragments, X a tokens x DK tile at a_x (N-major
 * B): 4 wgmma, issued only (the caller fences before its first and commits after its last) */
template <int DK> GDN_DEV void gdn_rg_product_t(float (&S)[DK / 2], const uint32_t (&a)[4][4], uint32_t a_x) {
#pragma unroll
    for (int kk = 0; kk < GDN_C / 16; kk++) {
        const uint64_t db = ptx_gdesc(a_x + kk * 16 * 128, GDN_C * 128, 1024);
        if constexpr (DK == 64) ptx_wgmma_rs_n64<1>(S, a[kk], db);
        else ptx_wgmma_rs_n128<1>(S, a[kk], db);
    }
}

template <int DK, int NST, int NWG>
__global__ void __launch_bounds__(GDN_THREADS * NWG, 3 - NWG)
    gdn_state_forward_regs_kernel(bf16 *hs /* (ns,nv,DK,dv) or NULL */, bf16 *vn /* (T,nv,dv) or NULL */, GdnSeg sg,
                                  const __grid_constant__ GdnWgMaps tm, const float *G2 /* (T,nv) */, const int4 *info,
                                  const int32_t *meta, int mode, int nk, int nv, int dv,
                                  long long *tp /* (GDN_TP_SLOTS) cycles, chunks, or NULL */,
                                  int wide_need /* > 0: run only if the wide form is the device's pick (gdn_wide_skip) */) {
    constexpr int NS = DK / 2, KS = DK / 16; /* S^T registers per thread, key-dim k steps */
    static_assert(NST >= 2, "state_fwd_rg: two stages at least");
    static_assert(DK == 64 || DK == 128, "state_fwd_rg: dim_k 64 or 128");
    extern __shared__ __align__(128) unsigned char gdn_rg_smem[]; /* the base is rounded up to 1024 */
    const uint32_t raw = ptx_smem_addr(gdn_rg_smem);
    const GdnStateFwdSmemRg<DK, NST, NWG> s(gdn_rg_smem + (((raw + 1023u) & ~1023u) - raw));
    const int h = blockIdx.y, kh = h / (nv / nk), wg = threadIdx.x >> 7, w = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
    const int colb = blockIdx.x * 64 * NWG, col0 = colb + 64 * wg;
    const bool is_M = colb >= dv; /* the whole block (dv a multiple of 64 NWG) */
    const int p = (int)blockIdx.z + sg.pz0;
    if (is_M && p == sg.m_skip) return; /* the whole block */
    if (sg.pick && *sg.pick != sg.pick_want) return; /* dual launch: the other configuration runs */
    if (wide_need > 0 && gdn_wide_skip<64 * NWG, true>(sg, nv, wide_need)) return; /* the 32-column pass runs */
    const int64_t ldu = (int64_t)nv * dv;
    const int64_t nsz = (int64_t)nv * DK * dv, nmz = (int64_t)nv * DK * DK;
    const GdnSpan sp = gdn_span<false>(sg, meta, mode, p, is_M, nsz);
    const int lo = sp.lo, hi = sp.hi;

    float S[NS]; /* S^T, element x at (gdn_rg_col, gdn_rg_key) */
    gdn_rg_state_start<DK>(S, sp.in, is_M, h, col0, dv, w, g8, t4);

    if (threadIdx.x == 0) {
        for (int i = 0; i < NST; i++) ptx_mbar_init(ptx_smem_addr(s.bar(i)), 1);
        ptx_mbar_init_fence();
    }
    __syncthreads();
    const unsigned tx = 2 * GDN_C * DK * 2 + (is_M ? 0 : NWG * GDN_C * 64 * 2); /* bytes of one stage's tiles */
    auto issue = [&](int4 ci, int buf) {
        const int t0 = ci.x;
        if (threadIdx.x == 0) {
            const uint32_t bar = ptx_smem_addr(s.bar(buf));
            ptx_mbar_arrive_tx(bar, tx);
#pragma unroll
            for (int b = 0; b < DK / 64; b++) {
                ptx_tma_load_2d(ptx_smem_addr(s.w(buf)) + b * (GDN_C * 128), &tm.w, h * DK + 64 * b, t0, bar);
                ptx_tma_load_2d(ptx_smem_addr(s.k(buf)) + b * (GDN_C * 128), &tm.k, kh * DK + 64 * b, t0, bar);
            }
            if (!is_M)
#pragma unroll
                for (int g = 0; g < NWG; g++)
                    ptx_tma_load_2d(ptx_smem_addr(s.u(buf, g)), &tm.u, h * dv + colb + 64 * g, t0, bar);
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
    const uint32_t a_hs = ptx_smem_addr(s.h(wg, w)), a_vs = ptx_smem_addr(s.vn(wg, w));
    int buf = 0;
    unsigned ph = 0; /* parity of each stage's next phase */
    const bool tp_on = tp && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0;
    long long tpa[GDN_TP_N] = {0, 0, 0, 0, 0, 0}, tp_last = tp_on ? clock64() : 0;
    for (int c = lo; c < hi; c++) {
        const int4 infN = c + NST < hi ? info[c + NST] : none;
        ptx_cp_async_wait<NST - 2>();
        ptx_mbar_wait(ptx_smem_addr(s.bar(buf)), (ph >> buf) & 1u);
        ph ^= 1u << buf;
        __syncthreads(); /* chunk c's tiles are in; chunk c-1's products are done with their tiles */
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
        /* the state operand: S^T hi + lo as A fragments */
        uint32_t ah[KS][4], al[KS][4];
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (reset) S[8 * kk + 2 * e] = S[8 * kk + 2 * e + 1] = 0.0f;
                gdn_split_pack(ah[kk][e], al[kk][e], S[8 * kk + 2 * e], S[8 * kk + 2 * e + 1]);
            }
        GDN_TP(2);
        /* v^T = (S_hi + S_lo)^T W^T: state columns x tokens */
        float v[32];
        const uint32_t a_w = ptx_smem_addr(s.w(buf)), a_k = ptx_smem_addr(s.k(buf));
        gdn_rg_product_hilo<DK>(v, ah, al, a_w);
        /* while the products run: h out (this warp's 16 columns; the last chunk's h and vn stores read), U^T and
         * the decays in */
        if (hst)
            gdn_rg_store<KS>(&tm.h, col0 + 16 * w, [&] { return (int)(((t0 / GDN_C) * nv + h) * DK); }, a_hs, ah, lane, 0);
        uint32_t uf[4][4] = {}; /* U^T as v^T's pairs: uf[i / 2][2 (i & 1) + half] */
        if (!is_M) {
            const unsigned char *su = s.u(buf, wg);
            const int m = lane >> 3, r = lane & 7;
#pragma unroll
            for (int q = 0; q < 4; q++) /* token blocks 2q, 2q + 1 */
                ptx_ldmatrix_x4_trans(uf[q], su + gdn_wg_off(16 * q + 8 * (m >> 1) + r, 16 * w + 8 * (m & 1)));
        }
        const float *sG = s.G(buf);
        const float gL = sG[L - 1];
        float dec[16]; /* tokens 8 i + 2 t4 + e: dec[2 i + e] */
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int r = 8 * i + 2 * t4 + e;
                dec[2 * i + e] = r < L ? exp2f(gL - sG[r]) : 0.0f;
            }
        ptx_wg_wait<0>();
#pragma unroll
        for (int x = 0; x < 32; x++) ptx_reg_fence(v[x]);
        GDN_TP(3);
        /* vn^T = U^T - v^T: out (staged when the chunk is full, else stored here); (dec vn)^T as A fragments */
        const bool vst = vn && !is_M, vfull = vst && L == GDN_C;
        uint32_t vo[4][4], av[4][4];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int x = 4 * i + 2 * hf, r = 8 * i + 2 * t4;
                const float2 u = __bfloat1622float2(*(const __nv_bfloat162 *)&uf[i >> 1][2 * (i & 1) + hf]);
                const float x0 = u.x - v[x], x1 = u.y - v[x + 1];
                vo[i >> 1][2 * (i & 1) + hf] = ptx_pack_bf16x2(x0, x1);
                if (vst && !vfull) {
                    const int j = col0 + gdn_rg_col(x, w, g8);
                    if (r < L) vn[(t0 + r) * ldu + (int64_t)h * dv + j] = __float2bfloat16_rn(x0);
                    if (r + 1 < L) vn[(t0 + r + 1) * ldu + (int64_t)h * dv + j] = __float2bfloat16_rn(x1);
                }
                /* rows >= L: 0 by selection (their W / U rows are another chunk's, or anything in a range's
                 * workspace, so never multiplied) */
                av[i >> 1][2 * (i & 1) + hf] =
                    ptx_pack_bf16x2(r < L ? x0 * dec[2 * i] : 0.0f, r + 1 < L ? x1 * dec[2 * i + 1] : 0.0f);
            }
        const float gam = exp2f(gL);
#pragma unroll
        for (int x = 0; x < NS; x++) S[x] *= gam;
        GDN_TP(4);
        /* S^T += (dec vn)^T K */
        ptx_wg_fence();
        gdn_rg_product_t<DK>(S, av, a_k);
        ptx_wg_commit();
        /* overlapping the product: vn out (the last chunk's vn store read; this chunk's h store may not be) */
        if (vfull) gdn_rg_store<4>(&tm.vn, h * dv + col0 + 16 * w, [&] { return (int)t0; }, a_vs, vo, lane, hst);
        ptx_wg_wait<0>();
#pragma unroll
        for (int x = 0; x < NS; x++) ptx_reg_fence(S[x]);
        GDN_TP(5);
#pragma unroll
        for (int i = 0; i < NST - 1; i++) inf[i] = inf[i + 1];
        inf[NST - 1] = infN;
        buf = buf + 1 == NST ? 0 : buf + 1;
    }
    if (lane == 0) ptx_bulk_wait<0>(); /* the last stores complete */
    if (tp_on) gdn_tp_store(tp, tpa, hi - lo);
    float *Sd = gdn_span_out<false>(sg, p, sp.dlast, is_M, nsz, nmz);
    if (Sd) gdn_rg_state_out<DK>(Sd, S, is_M, h, col0, dv, w, g8, t4);
}
