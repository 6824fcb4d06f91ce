/*
 * cuda_gdn_wg.h — the forward state pass of the chunked gated delta rule on wgmma (Hopper, sm_90a):
 * GDN v4.2, switch sfwd (cuda_gdn_tune.h, RS_GDN_SFWD). Not a standalone header: included by
 * kernels/cuda/cuda_gdn.cu after cuda_gdn_v2.h, whose segment bookkeeping (GdnSeg, gdn_doc_range,
 * gdn_seg_range, gdn_seg_in / out) it shares; cuda_gdn.cu's header has the algebra.
 *
 * The same pass as gdn_state_fwd_v2_kernel (per chunk: store h, vn = U - W h, store vn, S = gam_L S +
 * K^T (dec * vn)), with one warpgroup (128 threads) per 64 state columns and both products on wgmma:
 *   state    S (DK x 64, fp32) lives in the wgmma accumulators of the warpgroup across chunks: DK / 64
 *            m64n64 tiles (tile mt = state rows [64 mt, 64 mt + 64)), 32 registers each per thread
 *   W h      m64n64k16 x DK / 16, twice (the state operand split hi + lo bf16, as the v2 pass): A = W
 *            (tokens x DK, K-major), B = the state rows (DK x 64, N-major), both from shared memory;
 *            one fp32 accumulator takes both terms
 *   K^T vn   per state tile, m64n64k16 x 4: A = K^T (the K tile, M-major), B = dec * vn (64 tokens x
 *            64, N-major); the accumulator is the state itself (scaled by gam_L first)
 * Every wgmma operand tile is a 128-byte-swizzled block of 64 bf16 columns x rows (one 1024-byte
 * aligned block per 64 columns; byte (r, j) at r 128 + ((j / 8) ^ (r % 8)) 16 + (j % 8) 2), the
 * layouts and descriptors of the attention kernels (cuda_attention_wgmma.h): W, K, U arrive by
 * cp.async (16 bytes, the swizzle applied to the address), NST stages; the state hi / lo and dec * vn
 * are written from the accumulators by the threads that own them. The accumulator layout is the
 * mma.sync C fragment repeated (cuda_attention_wgmma.h), so U, the stored h and vn are addressed as in
 * the v2 pass.
 *
 * What the v2 pass has that this one does not: 16 / 32 column blocks (here 64 only), the bulk copies
 * (sfwd does not apply with bulk), the cycle counters. Segments, transition columns, document
 * segments and the dual launch are the v2 bookkeeping unchanged. The per-column arithmetic differs
 * from v2 (wgmma's accumulation order, both operand terms in one accumulator), so the bits differ
 * from the mma.sync pass, but are the same on every run and for every segmentation by documents.
 */

/* d (64 x 64) (+)= A (64 x 16) B (16 x 64) from shared-memory descriptors; TA / TB: operand stored
 * transposed (A M-major, B N-major); scale_d = 0 overwrites d */
template <int TA, int TB>
GDN_DEV void gdn_wgmma_n64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
}

/* byte offset of element (r, j), j < 64, in a 128-byte-swizzled block of 64 columns */
GDN_DEV uint32_t gdn_wg_off(int r, int j) { return r * 128 + ((((j >> 3) & 7) ^ (r & 7)) << 4) + (j & 7) * 2; }

/* rows [0, ROWS) x WID bf16 of a strided global matrix into WID / 64 swizzled blocks of ROWS x 64
 * (block b at s + b ROWS 128) with cp.async; rows >= valid are zero-filled and not read */
template <int ROWS, int WID>
GDN_DEV void gdn_wg_load_tile(unsigned char *s, const bf16 *gsrc, int64_t ldg, int valid) {
    constexpr int CPR = WID / 8;
    for (int i = threadIdx.x; i < ROWS * CPR; i += GDN_THREADS) {
        const int r = i / CPR, c = i % CPR;
        const bool ok = r < valid;
        gdn_cp_async16(s + (c >> 3) * (ROWS * 128) + gdn_wg_off(r, (c & 7) * 8), ok ? gsrc + (int64_t)r * ldg + c * 8 : gsrc,
                       ok);
    }
}

/* shared memory of the pass, every wgmma tile on a 1024-byte boundary (the base is rounded up) */
template <int DK, int NST> struct GdnStateFwdSmemWg {
    static constexpr int TK = GDN_C * DK * 2, TU = GDN_C * 64 * 2;
    static constexpr int OW = 0, OK = TK, OU = 2 * TK, OG = 2 * TK + TU, SB = OG + 1024; /* one stage, bytes */
    static constexpr int OHI = NST * SB, OLO = OHI + DK * 128, OVN = OLO + DK * 128, BYTES = OVN + TU + 1024;
    unsigned char *b;
    GDN_DEV explicit GdnStateFwdSmemWg(unsigned char *base) : b(base) {}
    GDN_DEV unsigned char *w(int i) const { return b + i * SB + OW; }
    GDN_DEV unsigned char *k(int i) const { return b + i * SB + OK; }
    GDN_DEV unsigned char *u(int i) const { return b + i * SB + OU; }
    GDN_DEV float *G(int i) const { return (float *)(b + i * SB + OG); }
    GDN_DEV unsigned char *hi() const { return b + OHI; }
    GDN_DEV unsigned char *lo() const { return b + OLO; }
    GDN_DEV unsigned char *vn() const { return b + OVN; }
};

/*
 * Grid (ncol / 64, nv, segments launched), 128 threads. Block (x, h, z) carries columns [64 x, 64 x +
 * 64) of head h's state over segment p = z + sg.pz0 of the chunks of `mode` (gdn_state_fwd_v2_kernel
 * has the same contract; ncol = dv, or dv + DK when sg.M). Thread (warp w, lane 4 g + t) holds, in
 * state tile mt, element 4 i + e at row 64 mt + 16 w + g + 8 (e / 2), column 8 i + 2 t + e % 2.
 */
template <int DK, int NST>
__global__ void __launch_bounds__(GDN_THREADS)
    gdn_state_fwd_wg_kernel(bf16 *hs /* (ns,nv,DK,dv) or NULL */, bf16 *vn /* (T,nv,dv) or NULL */, GdnSeg sg,
                            const bf16 *W /* (T,nv,DK) */, const bf16 *U /* (T,nv,dv) */,
                            const bf16 *k /* (T,ldq) */, const float *G2 /* (T,nv) */, const int4 *info,
                            const int32_t *meta, int mode, int nk, int nv, int dv, int ldq) {
    constexpr int BV = 64, MT = DK / 64, KS = DK / 16;
    static_assert(NST >= 2, "state_fwd_wg: two stages at least");
    extern __shared__ __align__(128) unsigned char gdn_wg_smem[]; /* the base is rounded up to 1024 */
    const uint32_t raw = gdn_smem_addr(gdn_wg_smem);
    const GdnStateFwdSmemWg<DK, NST> s(gdn_wg_smem + (((raw + 1023u) & ~1023u) - raw));
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g8 = lane >> 2, t4 = lane & 3;
    const int col0 = blockIdx.x * BV;
    const bool is_M = col0 >= dv;
    const int p = (int)blockIdx.z + sg.pz0;
    if (is_M && p == sg.m_skip) return; /* the whole block */
    if (sg.pick && *sg.pick != sg.pick_want) return; /* dual launch: the other configuration runs */
    const int64_t ldw = (int64_t)nv * DK, ldu = (int64_t)nv * dv;
    const int64_t nsz = (int64_t)nv * DK * dv, nmz = (int64_t)nv * DK * DK;
    int lo, hi;
    bool dlast = false;
    gdn_chunk_range(meta, mode, &lo, &hi);
    if (sg.cuts) gdn_doc_range(sg, p, &lo, &hi, &dlast);
    else gdn_seg_range(&lo, &hi, p, sg.nseg);
    const float *S_in = is_M ? NULL : sg.cuts ? (p == 0 ? sg.in_edge : NULL) : gdn_seg_in(sg, p, 0, nsz);

    float S[MT][32];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int x = 0; x < 32; x++) {
            const int a = 64 * mt + 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4 + (x & 1);
            float v = 0.0f;
            if (is_M) v = (a == col0 - dv + j) ? 1.0f : 0.0f;
            else if (S_in) v = S_in[((int64_t)h * DK + a) * dv + col0 + j];
            S[mt][x] = v;
        }

    auto issue = [&](int4 ci, int buf) {
        const int64_t t0 = ci.x;
        gdn_wg_load_tile<GDN_C, DK>(s.w(buf), W + t0 * ldw + (int64_t)h * DK, ldw, ci.y);
        gdn_wg_load_tile<GDN_C, DK>(s.k(buf), k + t0 * ldq + (int64_t)kh * DK, ldq, ci.y);
        if (!is_M) gdn_wg_load_tile<GDN_C, BV>(s.u(buf), U + t0 * ldu + (int64_t)h * dv + col0, ldu, ci.y);
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
        gdn_cp_async_commit();
    }
    const uint32_t a_hi = gdn_smem_addr(s.hi()), a_lo = gdn_smem_addr(s.lo()), a_vn = gdn_smem_addr(s.vn());
    int buf = 0;
    for (int c = lo; c < hi; c++) {
        const int4 infN = c + NST < hi ? info[c + NST] : none;
        gdn_cp_async_wait<NST - 2>();
        gdn_fence_async_smem(); /* this thread's cp.async tiles, seen by the wgmma (async proxy) */
        __syncthreads();        /* chunk c's tiles are in; chunk c-1's products are done */
        {
            const int nb = buf + NST - 1 >= NST ? buf - 1 : buf + NST - 1; /* the stage of chunk c-1 */
            if (c + NST - 1 < hi) issue(inf[NST - 1], nb);
        }
        gdn_cp_async_commit();
        const int4 cur = inf[0];
        const int64_t t0 = cur.x;
        const int L = cur.y;
        const bool reset = (cur.z & 1) != 0;
        bf16 *hrow = (hs && !is_M && !reset) ? hs + ((t0 / GDN_C) * nv + h) * (int64_t)DK * dv + col0 : NULL;
        /* the state operand: hi + lo bf16 into the swizzled blocks; h = bf16(S) stored */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int x = 0; x < 32; x += 2) {
                if (reset) S[mt][x] = S[mt][x + 1] = 0.0f;
                const int a = 64 * mt + 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4;
                const uint32_t o = gdn_wg_off(a, j);
                gdn_split2((bf16 *)(s.hi() + o), (bf16 *)(s.lo() + o), S[mt][x], S[mt][x + 1]);
                if (hrow) gdn_store2(hrow + (int64_t)a * dv + j, S[mt][x], S[mt][x + 1]);
            }
        gdn_fence_async_smem();
        __syncthreads();
        /* vacc = W (S_hi + S_lo): tokens x 64 */
        float vacc[32];
        const uint32_t a_w = gdn_smem_addr(s.w(buf)), a_k = gdn_smem_addr(s.k(buf));
        attn_wg_fence();
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            gdn_wgmma_n64<0, 1>(vacc, attn_gdesc(a_w + (kk >> 2) * (GDN_C * 128) + (kk & 3) * 32, 16, 1024),
                                attn_gdesc(a_hi + kk * 16 * 128, DK * 128, 1024), kk > 0);
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            gdn_wgmma_n64<0, 1>(vacc, attn_gdesc(a_w + (kk >> 2) * (GDN_C * 128) + (kk & 3) * 32, 16, 1024),
                                attn_gdesc(a_lo + kk * 16 * 128, DK * 128, 1024), 1);
        attn_wg_commit();
        attn_wg_wait<0>();
#pragma unroll
        for (int x = 0; x < 32; x++) attn_reg_fence(vacc[x]);
        /* vn = U - W S: stored, and dec * vn into the swizzled block */
        const float *sG = s.G(buf);
        const float gL = sG[L - 1];
        const unsigned char *su = s.u(buf);
#pragma unroll
        for (int x = 0; x < 32; x += 2) {
            const int r = 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4;
            const uint32_t o = gdn_wg_off(r, j);
            float2 u = make_float2(0.0f, 0.0f);
            if (!is_M) u = gdn_load2((const bf16 *)(su + o));
            const float x0 = u.x - vacc[x], x1 = u.y - vacc[x + 1];
            if (vn && !is_M && r < L) gdn_store2(vn + (t0 + r) * ldu + (int64_t)h * dv + col0 + j, x0, x1);
            const float dec = r < L ? exp2f(gL - sG[r]) : 0.0f;
            gdn_store2((bf16 *)(s.vn() + o), x0 * dec, x1 * dec);
        }
        const float gam = exp2f(gL);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int x = 0; x < 32; x++) S[mt][x] *= gam;
        gdn_fence_async_smem();
        __syncthreads();
        /* S += K^T (dec * vn), per state tile */
        attn_wg_fence();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < GDN_C / 16; kk++)
                gdn_wgmma_n64<1, 1>(S[mt], attn_gdesc(a_k + mt * (GDN_C * 128) + kk * 16 * 128, GDN_C * 128, 1024),
                                    attn_gdesc(a_vn + kk * 16 * 128, GDN_C * 128, 1024), 1);
        attn_wg_commit();
        attn_wg_wait<0>();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int x = 0; x < 32; x++) attn_reg_fence(S[mt][x]);
#pragma unroll
        for (int i = 0; i < NST - 1; i++) inf[i] = inf[i + 1];
        inf[NST - 1] = infN;
        buf = buf + 1 == NST ? 0 : buf + 1;
    }
    float *Sd = is_M ? sg.M + p * nmz : sg.cuts ? (dlast ? sg.out_edge : NULL) : gdn_seg_out(sg, p, 0, sg.nseg - 1, nsz);
    if (!Sd) return;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int x = 0; x < 32; x++) {
            const int a = 64 * mt + 16 * w + g8 + 8 * ((x & 3) >> 1), j = 8 * (x >> 2) + 2 * t4 + (x & 1);
            if (is_M) Sd[((int64_t)h * DK + a) * DK + col0 - dv + j] = S[mt][x];
            else Sd[((int64_t)h * DK + a) * dv + col0 + j] = S[mt][x];
        }
}
