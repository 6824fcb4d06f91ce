/*
 * state_pass.cuh — the two sequential passes of KDA over the chunks, one block per (column block of BV = 16, 32 or
 * 64 state columns, value head; kda.cu's kda_state_bv picks BV): the columns of the state are independent (vn =
 * U - W S and the update act on each column alone), so a head's dv columns run as dv / BV blocks side by side.
 * Everything chunk-parallel is formed before the pass (wu.cuh: W, dec * K in bf16, U, gam_{L-1}; prep.cuh's
 * kda_qk_kernel<DK, true>: scale gam * q in bf16, P = scale QK^T dO), so per chunk a pass does only the products
 * with the carried state:
 *
 *   kda_state_fwd_kernel  S entering chunk 0 = S0 (or 0), reset to 0 at a document start;
 *                         vn = U - W S, S = Diag(gam_{L-1}) S + (dec * K)^T vn.
 *                         Writes the state entering each non-reset chunk to hs (slot t0 / 64) and vn to
 *                         (T, nv, dv), both in bf16 (the copies its own steps take), the final state (fp32) to
 *                         S_out. The
 *                         transition (M_out) adds dk columns started from the identity with U = 0: [S | M]
 *                         carried together, cpu_kda_chunk_transition's way.
 *   kda_state_bwd_kernel  from the last chunk down, D = the gradient at the chunk's final state (dS_final for
 *                         the last): dvn = (dec * K) D + P, P_j = scale sum_{r >= j} QK_rj dO_r,
 *                         D_in = Diag(gam_{L-1}) D + (scale gam * Q)^T dO - W^T dvn, D = 0 at a document start.
 *                         Writes D leaving each chunk a state leaves to dhs (slot t0 / 64) and dvn to (T, nv, dv),
 *                         both in bf16 (the copies its own steps take), and the gradient entering chunk 0 (fp32)
 *                         to dS0.
 *
 * Per chunk: two steps, each a warp GEMM on tensor cores (gdn_warp_mma, one MMA per product: the fp32 state or D and
 * vn or dvn rounded to bf16 afresh each chunk, the stored factors bf16 already, fp32 accumulation; common.cuh's
 * precision: the carried state itself stays fp32 in registers). The forward keeps the fp32 state
 * in registers and two buffers of factors: chunk c + 1's W, U, dec * K and gam_{L-1} land with cp.async while chunk c's
 * products run; two barriers a chunk (a third buffer, chunk c + 2's in flight too, was no
 * faster: docs/design/kda.md). The backward keeps D in registers too (the
 * same layout) and one buffer per step
 * (with the split operands two buffers needed ~236 KB at BV = 16; with bf16 ones ~125 KB would do, not yet tried):
 * the factors of one step are loaded while the other runs (dec * K
 * and P during D's update, W, gam * q and gam_{L-1} during dvn; dO through registers: its row stride need not be
 * 16-byte aligned), three barriers a chunk. Shared memory (DK = 128): the forward ~88 / 102 / 130 KB at BV = 16 / 32 /
 * 64, the backward ~69 / 80 / 105 KB (the launch raises the block's limit; sm_90 allows 227 KB). Templates on DK = dk
 * (64, 128) and BV. Part of kda.cu.
 */
#pragma once

/* the warp tiling of a 64-row x BV product (vn, dvn; and the DK = 64 state update): warp w rows [16 (w % 4), +16),
 * columns [(w / 4) BV / 2, +BV / 2) for BV >= 32; BV = 16: warps 0-3, all 16 columns */
template <int BV> struct KdaTile64 {
    static constexpr int NT = BV >= 32 ? BV / 16 : 2;
    static KDA_DEV bool job(int w) { return BV >= 32 || w < 4; }
    static KDA_DEV int n0(int w) { return BV >= 32 ? (w >> 2) * (BV / 2) : 0; }
};

/* the forward pass's shared memory (DK = dk, BV columns): two buffers (chunks c and c + 1) of the factors: U (64 x BV
 * fp32), gam_{L-1}, W and dec * K (bf16, 64 x DK, rows padded by 8); then the entering state S (DK x BV) and vn
 * (64 x BV), bf16, rows padded by 8. The fp32 state lives in registers. */
struct KdaSfwdBuf {
    float *U, *GL;
    bf16 *w, *x;
};
template <int DK, int BV> struct KdaSfwdSmem {
    static constexpr int LDK = DK + 8, LDB = BV + 8, LDU = BV + 4;
    KdaSfwdBuf f0, f1; /* the buffers */
    bf16 *st, *vnb;
    size_t bytes;
    __host__ __device__ explicit KdaSfwdSmem(void *b) {
        KdaCarve c(b);
        for (KdaSfwdBuf *f : {&f0, &f1}) {
            f->U = c.take<float>((size_t)KDA_C * LDU);
            f->GL = c.take<float>(DK);
            f->w = c.take<bf16>((size_t)KDA_C * LDK);
            f->x = c.take<bf16>((size_t)KDA_C * LDK);
        }
        st = c.take<bf16>((size_t)DK * LDB);
        vnb = c.take<bf16>((size_t)KDA_C * LDB);
        bytes = c.off;
    }
    /* buffer b (a select, not an index: the pointers stay in registers) */
    __device__ KdaSfwdBuf buf(int b) const { return b ? f1 : f0; }
};

/* the forward's loads of chunk ch into buffer f (W, U, dec * K, gam_{L-1}; U zero for the transition's M columns),
 * cp.async, not committed */
template <int DK, int BV>
KDA_DEV void kda_sfwd_load(const KdaSfwdBuf &f, const KdaChunk &ch, const bf16 *wb, const bf16 *xb, const float *u,
                           const float *gl, int h, int nv, int dv, int col0, bool is_M) {
    kda_cp_rows<DK>(f.w, wb, ch.t0, ch.L, h, nv);
    kda_cp_f32<BV>(f.U, KdaSfwdSmem<DK, BV>::LDU, u, ch.t0, ch.L, h, nv, dv, col0, !is_M);
    kda_cp_rows<DK>(f.x, xb, ch.t0, ch.L, h, nv);
    if (threadIdx.x < DK / 4) {
        const bool ok = !ch.reset;
        ptx_cp_async16(f.GL + 4 * threadIdx.x, ok ? gl + (ch.slot * nv + h) * (int64_t)DK + 4 * threadIdx.x : gl,
                       ok);
    }
}

/* the elements of a thread's 16 x 8 NT accumulator fragment of a state (or D) block, rows m0 + gdn_frag_row(e),
 * columns n0 + 8 ni + gdn_frag_col(e): f(ni, e, row, column) for each, in a fixed order (both passes' loads, stores
 * and roundings of the carried fp32 state in registers) */
template <int NT, class F> KDA_DEV void kda_frag_each(int m0, int n0, F f) {
#pragma unroll
    for (int ni = 0; ni < NT; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) f(ni, e, m0 + gdn_frag_row(e), n0 + 8 * ni + gdn_frag_col(e));
}

/* the same by pairs: elements e and e + 1 (e = 0, 2) are columns cc and cc + 1 of row a */
template <int NT, class F> KDA_DEV void kda_frag_pairs(int m0, int n0, F f) {
#pragma unroll
    for (int ni = 0; ni < NT; ni++)
#pragma unroll
        for (int e = 0; e < 4; e += 2) f(ni, e, m0 + gdn_frag_row(e), n0 + 8 * ni + gdn_frag_col(e));
}

/* Tensor cores (gdn_warp_mma, bf16 operands). vn: KdaTile64<BV>; the state update: DK = 128: warp
 * w rows [16 w, +16) and all BV columns; DK = 64: KdaTile64<BV>. The fp32 state lives in the update's accumulator
 * layout (each element in one thread's registers; at DK = 64, BV = 16 warps 0-3 hold it all), so the update and
 * the entering state rounded to bf16 once, stored to hs and to the tile for the next chunk's vn, are that
 * thread's, in its epilogue. Per
 * chunk c: wait for its factors, barrier, issue chunk c + 1's into the other buffer, vn, barrier, the update and
 * the next chunk's entering state: two barriers, and the factors of a chunk land during the whole chunk before. */
template <int DK, int BV>
__global__ void __launch_bounds__(KDA_THREADS, 1) kda_state_fwd_kernel(
    bf16 *hs /* (ns,nv,dk,dv) or NULL */, bf16 *vn /* (T,nv,dv) or NULL */, float *S_out /* (nv,dk,dv) or NULL */,
    float *M_out /* (nv,dk,dk): the transition's columns, or NULL */, const float *S0 /* (nv,dk,dv) or NULL */,
    const bf16 *wb /* (T,nv,dk) */, const bf16 *xb /* (T,nv,dk) */, const float *u /* (T,nv,dv) */,
    const float *gl /* (ns,nv,dk) */, const int32_t *starts, const int32_t *meta, const int32_t *doc_pos, int64_t T,
    int nv, int dv) {
    using Sm = KdaSfwdSmem<DK, BV>;
    using Tv = KdaTile64<BV>;
    constexpr int LDK = Sm::LDK, LDB = Sm::LDB, LDU = Sm::LDU;
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const Sm s(kda_smem);
    const int h = blockIdx.y, nc = meta[KDA_META_NC];
    const int col0 = blockIdx.x * BV, is_M = col0 >= dv; /* dv is a multiple of BV: a block is S or M */
    const int w = threadIdx.x >> 5, mt = w & 3;
    const bool vjob = Tv::job(w);
    const int vn0 = Tv::n0(w);
    constexpr int NTS = DK == 128 ? BV / 8 : Tv::NT;
    const int m0 = DK == 128 ? 16 * w : 16 * mt, n0 = DK == 128 ? 0 : Tv::n0(w);
    const bool sjob = DK == 128 || Tv::job(w);
    const size_t sn = (size_t)DK * dv;
    /* this thread's state elements (the update's accumulator layout; rows m0 + gdn_frag_row, columns n0 + 8 ni +
     * gdn_frag_col) */
    float S[NTS][4];
    kda_frag_each<NTS>(m0, n0, [&](int ni, int e, int a, int cc) {
        float x = 0.0f;
        if (sjob && is_M) x = a == col0 - dv + cc ? 1.0f : 0.0f;
        else if (sjob && S0) x = S0[h * sn + (size_t)a * dv + col0 + cc];
        S[ni][e] = x;
    });
    /* the state entering chunk k: 0 at a document start, else stored (S columns); in bf16 for the vn step */
    auto enter = [&](const KdaChunk &k) {
        if (!sjob) return;
        kda_frag_pairs<NTS>(m0, n0, [&](int ni, int e, int a, int cc) {
            if (k.reset) S[ni][e] = S[ni][e + 1] = 0.0f;
            const bf16 x0 = __float2bfloat16(S[ni][e]), x1 = __float2bfloat16(S[ni][e + 1]);
            if (!k.reset && hs && !is_M) kda_st_bf16x2(&hs[(k.slot * nv + h) * sn + (size_t)a * dv + col0 + cc], x0, x1);
            kda_st_bf16x2(&s.st[a * LDB + cc], x0, x1);
        });
    };
    KdaChunk ch = {}, nx = {};
    if (nc > 0) {
        ch = kda_chunk(starts, doc_pos, 0, T);
        kda_sfwd_load<DK, BV>(s.f0, ch, wb, xb, u, gl, h, nv, dv, col0, is_M);
        enter(ch);
    }
    ptx_cp_async_commit();
    if (nc > 1) nx = kda_chunk(starts, doc_pos, 1, T);
    for (int c = 0; c < nc; c++) {
        const int L = ch.L;
        const KdaSfwdBuf f = s.buf(c & 1), fn = s.buf(~c & 1);
        const int64_t t0 = ch.t0;
        const bool more = c + 1 < nc;
        ptx_cp_async_wait<0>(); /* chunk c's factors (this thread's copies) */
        __syncthreads();        /* everyone's; the entering state's bf16 copy; fn read (chunk c - 1) */
        if (more) kda_sfwd_load<DK, BV>(fn, nx, wb, xb, u, gl, h, nv, dv, col0, is_M);
        ptx_cp_async_commit();
        const KdaChunk nn = c + 2 < nc ? kda_chunk(starts, doc_pos, c + 2, T) : nx; /* used by the next chunk */
        /* vn = U - W S (rows >= L: 0) */
        if (vjob) {
            float ws[1][Tv::NT][4];
            gdn_zero(ws);
            gdn_warp_mma<1, Tv::NT, false, false, DK>(ws, f.w, LDK, s.st, LDB, 16 * mt, vn0);
#pragma unroll
            for (int ni = 0; ni < Tv::NT; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) { /* columns cc, cc + 1 */
                    const int r = 16 * mt + gdn_frag_row(e), cc = vn0 + 8 * ni + gdn_frag_col(e);
                    const bf16 x0 = __float2bfloat16(f.U[r * LDU + cc] - ws[0][ni][e]);
                    const bf16 x1 = __float2bfloat16(f.U[r * LDU + cc + 1] - ws[0][ni][e + 1]);
                    if (vn && !is_M && r < L) kda_st_bf16x2(&vn[((t0 + r) * nv + h) * (int64_t)dv + col0 + cc], x0, x1);
                    kda_st_bf16x2(&s.vnb[r * LDB + cc], x0, x1);
                }
        }
        __syncthreads(); /* vn in bf16; S's bf16 copy read */
        /* S = Diag(gam_{L-1}) S + (dec * K)^T vn (the carried term is 0 at a document start) */
        if (sjob) {
            float as[1][NTS][4];
            gdn_zero(as);
            gdn_warp_mma<1, NTS, true, false, KDA_C>(as, f.x, LDK, s.vnb, LDB, m0, n0);
#pragma unroll
            for (int ni = 0; ni < NTS; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int a = m0 + gdn_frag_row(e);
                    const float carried = ch.reset ? 0.0f : f.GL[a] * S[ni][e];
                    S[ni][e] = carried + as[0][ni][e];
                }
        }
        if (more) enter(nx);
        ch = nx;
        nx = nn;
    }
    ptx_cp_async_wait<0>();
    if (sjob)
        kda_frag_each<NTS>(m0, n0, [&](int ni, int e, int a, int cc) {
            if (is_M) {
                if (M_out) M_out[((size_t)h * DK + a) * DK + col0 - dv + cc] = S[ni][e];
            } else if (S_out) {
                S_out[h * sn + (size_t)a * dv + col0 + cc] = S[ni][e];
            }
        });
}

/* the backward pass's shared memory (DK = dk, BV columns): P (64 x BV fp32), gam_{L-1}; bf16 tiles, rows padded
 * by 8: dec * K, W, Q = scale gam * q (64 x DK each), D (DK x BV), dvn and dO (64 x BV). The fp32 gradient D lives
 * in registers. */
template <int DK, int BV> struct KdaSbwdSmem {
    static constexpr int LDK = DK + 8, LDB = BV + 8, LDU = BV + 4;
    float *P, *GL;
    bf16 *x, *w, *q, *d, *dout, *dvnb;
    size_t bytes;
    __host__ __device__ explicit KdaSbwdSmem(void *b) {
        KdaCarve c(b);
        P = c.take<float>((size_t)KDA_C * LDU);
        GL = c.take<float>(DK);
        x = c.take<bf16>((size_t)KDA_C * LDK);
        w = c.take<bf16>((size_t)KDA_C * LDK);
        q = c.take<bf16>((size_t)KDA_C * LDK);
        d = c.take<bf16>((size_t)DK * LDB);
        dout = c.take<bf16>((size_t)KDA_C * LDB);
        dvnb = c.take<bf16>((size_t)KDA_C * LDB);
        bytes = c.off;
    }
};

/* dO of a chunk through registers (its row stride has no alignment): thread t holds elements t + 256 j of the
 * 64 x BV tile */
template <int BV> struct KdaDoutRegs {
    static constexpr int N = KDA_C * BV / KDA_THREADS;
    bf16 x[N];
    KDA_DEV void load(const bf16 *dout, const KdaChunk &ch, int64_t ldo, int64_t col) {
#pragma unroll
        for (int j = 0; j < N; j++) {
            const int i = threadIdx.x + KDA_THREADS * j, r = i / BV, cc = i % BV;
            x[j] = r < ch.L ? dout[(ch.t0 + r) * ldo + col + cc] : __float2bfloat16(0.0f);
        }
    }
    KDA_DEV void store(bf16 *s, int lds) const {
#pragma unroll
        for (int j = 0; j < N; j++) {
            const int i = threadIdx.x + KDA_THREADS * j;
            s[(i / BV) * lds + i % BV] = x[j];
        }
    }
};

/* the backward's loads of chunk ch: group A (dec * K, P: the dvn step), group B (W, scale gam * q, gam_{L-1}: D's
 * update; dO beside it through registers) */
template <int DK, int BV>
KDA_DEV void kda_sbwd_load_a(const KdaSbwdSmem<DK, BV> &s, const KdaChunk &ch, const bf16 *xb, const float *p, int h,
                             int nv, int dv, int col0) {
    kda_cp_rows<DK>(s.x, xb, ch.t0, ch.L, h, nv);
    kda_cp_f32<BV>(s.P, KdaSbwdSmem<DK, BV>::LDU, p, ch.t0, ch.L, h, nv, dv, col0, true);
}
template <int DK, int BV>
KDA_DEV void kda_sbwd_load_b(const KdaSbwdSmem<DK, BV> &s, const KdaChunk &ch, const bf16 *wb, const bf16 *gq,
                             const float *gl, int h, int nv) {
    kda_cp_rows<DK>(s.w, wb, ch.t0, ch.L, h, nv);
    kda_cp_rows<DK>(s.q, gq, ch.t0, ch.L, h, nv);
    if (threadIdx.x < DK / 4) {
        const bool ok = !ch.reset;
        ptx_cp_async16(s.GL + 4 * threadIdx.x, ok ? gl + (ch.slot * nv + h) * (int64_t)DK + 4 * threadIdx.x : gl, ok);
    }
}

/* Tensor cores as the forward (the same warp tiling: dvn as vn, D as S; D in registers in the update's accumulator
 * layout, the gradient leaving a chunk rounded to bf16 once, stored to dhs and to the tile for the dvn step, in the
 * update's epilogue). Per
 * chunk: wait for group A (dec * K, P), barrier, dvn, wait for group B (W, gam * q, gam_{L-1}; dO stored), barrier,
 * issue the next chunk's group A (and dO into registers), D's update and the next chunk's leaving gradient,
 * barrier, issue its group B (and store dO): three barriers. */
template <int DK, int BV>
__global__ void __launch_bounds__(KDA_THREADS, 1) kda_state_bwd_kernel(
    bf16 *dhs /* (ns,nv,dk,dv) or NULL */, bf16 *dvn /* (T,nv,dv) or NULL */, float *dS0 /* (nv,dk,dv) or NULL */,
    const float *dS_final /* (nv,dk,dv) or NULL */, const bf16 *wb /* (T,nv,dk) */, const bf16 *xb /* (T,nv,dk) */,
    const bf16 *gq /* (T,nv,dk) */, const float *p /* (T,nv,dv) */, const float *gl /* (ns,nv,dk) */,
    const bf16 *dout /* (T,ldo) */, const int32_t *starts, const int32_t *meta, const int32_t *doc_pos, int64_t T,
    int nv, int dv, int ldo) {
    using Sm = KdaSbwdSmem<DK, BV>;
    using Tv = KdaTile64<BV>;
    constexpr int LDK = Sm::LDK, LDB = Sm::LDB, LDU = Sm::LDU;
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const Sm s(kda_smem);
    const int h = blockIdx.y, nc = meta[KDA_META_NC];
    const int col0 = blockIdx.x * BV;
    const int w = threadIdx.x >> 5, mt = w & 3;
    const bool vjob = Tv::job(w);
    const int vn0 = Tv::n0(w);
    constexpr int NTS = DK == 128 ? BV / 8 : Tv::NT;
    const int m0 = DK == 128 ? 16 * w : 16 * mt, n0 = DK == 128 ? 0 : Tv::n0(w);
    const bool sjob = DK == 128 || Tv::job(w);
    const size_t sn = (size_t)DK * dv;
    const int64_t dcol = (int64_t)h * dv + col0;
    /* this thread's elements of D (rows m0 + gdn_frag_row, columns n0 + 8 ni + gdn_frag_col) */
    float D[NTS][4];
    kda_frag_each<NTS>(m0, n0, [&](int ni, int e, int a, int cc) {
        D[ni][e] = sjob && dS_final ? dS_final[h * sn + (size_t)a * dv + col0 + cc] : 0.0f;
    });
    /* the gradient leaving chunk k: stored where a state leaves it; in bf16 for the dvn step */
    auto leave = [&](const KdaChunk &k) {
        if (!sjob) return;
        kda_frag_pairs<NTS>(m0, n0, [&](int ni, int e, int a, int cc) {
            const bf16 x0 = __float2bfloat16(D[ni][e]), x1 = __float2bfloat16(D[ni][e + 1]);
            if (dhs && k.leaves) kda_st_bf16x2(&dhs[(k.slot * nv + h) * sn + (size_t)a * dv + col0 + cc], x0, x1);
            kda_st_bf16x2(&s.d[a * LDB + cc], x0, x1);
        });
    };
    KdaDoutRegs<BV> dor;
    KdaChunk ch = {};
    if (nc > 0) {
        ch = kda_chunk(starts, doc_pos, nc - 1, T);
        kda_sbwd_load_a<DK, BV>(s, ch, xb, p, h, nv, dv, col0);
        ptx_cp_async_commit();
        kda_sbwd_load_b<DK, BV>(s, ch, wb, gq, gl, h, nv);
        ptx_cp_async_commit();
        dor.load(dout, ch, ldo, dcol);
        dor.store(s.dout, LDB);
        leave(ch);
    }
    for (int c = nc - 1; c >= 0; c--) {
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        const bool more = c > 0;
        const KdaChunk nx = more ? kda_chunk(starts, doc_pos, c - 1, T) : ch;
        ptx_cp_async_wait<1>(); /* group A of this chunk */
        __syncthreads();        /* everyone's; D's bf16 copy and dO */
        /* dvn_j = (dec_j * k_j)^T D + P_j (rows >= L: 0) */
        if (vjob) {
            float ad[1][Tv::NT][4];
            gdn_zero(ad);
            gdn_warp_mma<1, Tv::NT, false, false, DK>(ad, s.x, LDK, s.d, LDB, 16 * mt, vn0);
#pragma unroll
            for (int ni = 0; ni < Tv::NT; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) { /* columns cc, cc + 1 */
                    const int j = 16 * mt + gdn_frag_row(e), cc = vn0 + 8 * ni + gdn_frag_col(e);
                    const bf16 x0 = __float2bfloat16(ad[0][ni][e] + s.P[j * LDU + cc]);
                    const bf16 x1 = __float2bfloat16(ad[0][ni][e + 1] + s.P[j * LDU + cc + 1]);
                    if (dvn && j < L) kda_st_bf16x2(&dvn[((t0 + j) * nv + h) * (int64_t)dv + col0 + cc], x0, x1);
                    kda_st_bf16x2(&s.dvnb[j * LDB + cc], x0, x1);
                }
        }
        ptx_cp_async_wait<0>(); /* group B of this chunk */
        __syncthreads(); /* dec * K, P and D's copy read: the next chunk's come in during D's update; B and dvn */
        if (more) {
            kda_sbwd_load_a<DK, BV>(s, nx, xb, p, h, nv, dv, col0);
            dor.load(dout, nx, ldo, dcol);
        }
        ptx_cp_async_commit();
        /* D_in = Diag(gam_{L-1}) D + (scale gam * Q)^T dO - W^T dvn; 0 at a document start (the two products in
         * their own accumulators: two independent MMA chains) */
        if (sjob) {
            float aq[1][NTS][4], awd[1][NTS][4];
            gdn_zero(aq);
            gdn_zero(awd);
            gdn_warp_mma<1, NTS, true, false, KDA_C>(aq, s.q, LDK, s.dout, LDB, m0, n0);
            gdn_warp_mma<1, NTS, true, false, KDA_C>(awd, s.w, LDK, s.dvnb, LDB, m0, n0);
            kda_frag_each<NTS>(m0, n0, [&](int ni, int e, int a, int) {
                const float x = s.GL[a] * D[ni][e] + (aq[0][ni][e] - awd[0][ni][e]);
                D[ni][e] = ch.reset ? 0.0f : x;
            });
        }
        if (more) leave(nx);
        __syncthreads(); /* W, gam * q, dO and gam_{L-1} are read */
        if (more) {
            kda_sbwd_load_b<DK, BV>(s, nx, wb, gq, gl, h, nv);
            dor.store(s.dout, LDB);
        }
        ptx_cp_async_commit();
        ch = nx;
    }
    ptx_cp_async_wait<0>();
    if (dS0 && sjob)
        kda_frag_each<NTS>(m0, n0,
                           [&](int ni, int e, int a, int cc) { dS0[h * sn + (size_t)a * dv + col0 + cc] = D[ni][e]; });
}
