/*
 * wy_backward.cuh — the gradients through the WY factors W = Tinv diag(beta gam) K, U = Tinv diag(beta) V:
 * dk, dv, dbeta, the dG terms and the reverse cumsum dg; dk's two WY terms stay in registers. Tinv is the
 * bf16 tile prep kept (a kept buffer with GDN_KEPT_TINV: 104 KB of shared memory) or, SOLVE, solved again
 * here (111 KB). 8 warps a block, each on 16 rows and one column half of every product (at most 128
 * registers), 2 blocks per SM either way, the same bits. Callers: gdn.cu's backward.
 */
#pragma once

#define GDN_WY_THREADS 256 /* wy_bwd's block: warp w on rows 16 (w & 3) .. + 15, column half w >> 2 */

/* ------------------------------------------------------------------------------------------------ */
/* wy_bwd helpers                                                                                     */

/* kkg_ij = (k_i.k_j) e^{G_i - G_j} for j < i < L, else 0 (fp32, stride GDN_LDF): gdn_build_A's A without beta_i.
 * Warp (rows r0, column half ch) of GDN_WY_THREADS; a tile wholly above the diagonal skips its product */
template <int DK> GDN_DEV void gdn_build_kkg(float *sKKG, const bf16 *sK, const float *sG, int L, int r0, int ch) {
    float acc[1][4][4];
    gdn_zero(acc);
    if (r0 + 16 > 32 * ch) gdn_warp_mma<1, 4, false, true, DK>(acc, sK, DK + 8, sK, DK + 8, r0, 32 * ch);
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = r0 + gdn_frag_row(e), j = 32 * ch + ni * 8 + gdn_frag_col(e);
            float kkg = 0.0f;
            if (j < i && i < L) kkg = acc[0][ni][e] * exp2f(sG[i] - sG[j]);
            sKKG[i * GDN_LDF + j] = kkg;
        }
}

/* the row dot products, one partial per column half (part[3][2][GDN_C]), summed in the last phase */
enum { GDN_WY_PART_KX = 0, GDN_WY_PART_VX = 1, GDN_WY_PART_DB = 2 };

template <int DK, int DV, bool SOLVE> struct GdnWySmem {
    bf16 *k, *v, *dw, *du, *tb, *dt, *m1, *cc;
    float *kkg, *T, *G, *beta, *part, *cpart, *tmp;
    size_t bytes;
    __host__ __device__ explicit GdnWySmem(void *b) {
        GdnCarve c(b);
        k = c.take<bf16>(GDN_C * (DK + 8));
        v = c.take<bf16>(GDN_C * (DV + 8));
        dw = c.take<bf16>(GDN_C * (DK + 8));
        du = c.take<bf16>(GDN_C * (DV + 8));
        tb = c.take<bf16>(GDN_C * GDN_LDP);
        tmp = (float *)tb; /* the solve's scratch (before tb holds Tinv) */
        T = SOLVE ? c.take<float>(GDN_C * GDN_LDF) : NULL;       /* the solve's fp32 Tinv */
        dt = SOLVE ? (bf16 *)T : c.take<bf16>(GDN_C * GDN_LDP); /* dT (SOLVE: over T, once Tinv is in tb) */
        m1 = dw;         /* once dW is dead (after dT) */
        cc = du;         /* once dU is dead */
        cpart = (float *)dt; /* E's column partials (4, GDN_C), once dT is dead (after M1) */
        kkg = c.take<float>(GDN_C * GDN_LDF);
        G = c.take<float>(GDN_C);
        beta = c.take<float>(GDN_C);
        part = c.take<float>(3 * 2 * GDN_C);
        bytes = c.off;
    }
};
static_assert(GDN_SOLVE_SCRATCH * 4 <= GDN_C * GDN_LDP * 2, "wy_bwd: the solve scratch must fit in tb");
static_assert(GDN_C * GDN_LDP * 2 <= GDN_C * GDN_LDF * 4, "wy_bwd: dt must fit in T");
static_assert(GDN_C * GDN_LDP * 2 <= GDN_C * (64 + 8) * 2, "wy_bwd: m1 and C must fit in dW and dU");

/* ------------------------------------------------------------------------------------------------ */
/* wy_bwd in 104 KB of shared memory, or 111 with SOLVE (2 blocks of 8 warps per SM; the first form  */
/* took 157). A is not stored (A_ij = beta_i kkg_ij where needed, the fp32 value prep's gdn_build_A   */
/* gives, so the solve here gives prep's Tinv bit for bit); m1 lives in dW's tile and C in dU's once  */
/* they are dead; with SOLVE dt lives in the fp32 Tinv tile and the solve scratch in the bf16 one.    */
/* Every product's entry is one warp's mma over the same k order whichever warp owns it; the row dot  */
/* products are summed per column half, then the halves added. E = dA A is never stored: its row     */
/* sums are beta_i times dbeta's, its column sums come from the registers by warp shuffles, one      */
/* partial per row tile (cpart, in dT's space once it is dead). The last phase (dbeta, dG and dg's    */
/* reverse cumsum) is warp 0's alone, after the barrier that ends dA: no barrier of its own.          */

/*
 * Per (chunk, value head), dW = dw, dU = dv2:
 *   dXw = Tinv^T dW: dk += beta gam dXw, dbeta += gam k.dXw, dG += beta gam k.dXw
 *   dXu = Tinv^T dU: dv = beta dXu, dbeta += v.dXu
 *   dT = (dW K^T) diag(beta gam) + (dU V^T) diag(beta), strictly lower; dA = -(Tinv^T dT Tinv^T) strictly lower
 *   dk_i += sum_j C_ij k_j, dk_j += sum_i C_ij k_i (C = dA beta_i Gam), dbeta_i += sum_j dA_ij kkg_ij,
 *   dG_i += sum_j dA_ij A_ij, dG_j -= sum_i dA_ij A_ij
 * then dg = reverse cumsum over the chunk of (dG of dqkwg + these). dk accumulates in fp32 (dkv).
 */
template <int DK, int DV, bool SOLVE>
__global__ void __launch_bounds__(GDN_WY_THREADS, 2)
    gdn_wy_backward_kernel(float *dkv /* (T,nv,DK) += */, bf16 *dk_out /* (T,ldq) when nv == nk, else NULL */,
                         bf16 *dv_out /* (T,ldv) */, float *dg_out /* (T,nv) */, float *dbeta_out /* (T,nv) */,
                         const bf16 *dw /* (T,nv,DK) */, const bf16 *dv2 /* (T,nv,DV) */,
                         const float *dgp /* (T,nv) */, const float *dgp2 /* (T,nv) second partial, or NULL */,
                         const bf16 *k /* (T,ldq) */, const bf16 *v /* (T,ldv) */,
                         const bf16 *Tinv /* (T,nv,64) prep's kept rows; unread with SOLVE */, const float *G2,
                         const float *beta, const int32_t *starts, const int32_t *meta, int nk,
                         int nv, int ldq, int ldv) {
    constexpr int LDK = DK + 8, LDV = DV + 8, NT = GDN_WY_THREADS;
    constexpr int KS = DK / 64, VS = DV / 64; /* 32-column steps of a warp's half of DK, of DV */
    extern __shared__ __align__(16) unsigned char gdn_smem[];
    GdnWySmem<DK, DV, SOLVE> s(gdn_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = 16 * (w & 3), ch = w >> 2; /* this warp's rows r0 .. r0 + 15 and column half */
    const bool upper = r0 + 16 <= 32 * ch;    /* its 16 x 32 tile of a 64 x 64 product is above the diagonal */
    const int rA = r0 + (lane >> 2);          /* this lane's accumulator rows: rA, rA + 8 */
    float *part = s.part + ch * GDN_C;        /* this half's row partials: part[GDN_WY_PART_* * 2 GDN_C + row] */
    const int64_t ldk = (int64_t)nv * DK, ldx = (int64_t)nv * DV;
    const int nc = meta[GDN_META_NC];
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const int64_t t0 = starts[c];
        const int L = starts[c + 1] - (int)t0;
        __syncthreads();
        /* two groups: K, G and the kept Tinv (all that K K^T and the solve read), then V, dW, dU, landing under
         * them. The kept Tinv's rows from L on load as 0 (the solve's are the identity's): they multiply only
         * rows of dW, dU and dT that are 0 there, so the products are the same */
        gdn_load_rows<GDN_C, DK, NT>(s.k, LDK, k + t0 * ldq + (int64_t)kh * DK, ldq, L);
        gdn_load_G(s.G, G2, t0, L, h, nv);
        if (!SOLVE)
            gdn_load_rows<GDN_C, GDN_C, NT>(s.tb, GDN_LDP, Tinv + (t0 * nv + h) * GDN_C, (int64_t)nv * GDN_C, L);
        ptx_cp_async_commit();
        gdn_load_rows<GDN_C, DV, NT>(s.v, LDV, v + t0 * ldv + (int64_t)h * DV, ldv, L);
        gdn_load_rows<GDN_C, DK, NT>(s.dw, LDK, dw + t0 * ldk + (int64_t)h * DK, ldk, L);
        gdn_load_rows<GDN_C, DV, NT>(s.du, LDV, dv2 + t0 * ldx + (int64_t)h * DV, ldx, L);
        ptx_cp_async_commit();
        float dgp_r[2] = {0.0f, 0.0f}; /* warp 0: dqkwg's dG of rows lane and 32 + lane, read early */
        if (threadIdx.x < 32) {
            for (int hh = 0; hh < 2; hh++) {
                const int r = threadIdx.x + 32 * hh;
                if (r < L) dgp_r[hh] = dgp2 ? dgp[(t0 + r) * nv + h] + dgp2[(t0 + r) * nv + h] : dgp[(t0 + r) * nv + h];
            }
        }
        if (threadIdx.x < GDN_C) s.beta[threadIdx.x] = (int)threadIdx.x < L ? beta[(t0 + threadIdx.x) * nv + h] : 0.0f;
        ptx_cp_async_wait<1>();
        __syncthreads();
        gdn_build_kkg<DK>(s.kkg, s.k, s.G, L, r0, ch);
        if (SOLVE) {
            __syncthreads();
            gdn_solve_t<true, NT>(s.T, s.tmp, s.kkg, s.beta); /* A = beta_i kkg_ij on the fly */
            for (int i = threadIdx.x; i < GDN_C * GDN_C / 2; i += NT) {
                const int r = i / (GDN_C / 2), j = (i % (GDN_C / 2)) * 2;
                gdn_store2(s.tb + r * GDN_LDP + j, s.T[r * GDN_LDF + j], s.T[r * GDN_LDF + j + 1]);
            }
        }
        ptx_cp_async_wait<0>(); /* V, dW, dU */
        __syncthreads();
        float dkr[KS][1][4][4]; /* dk of this warp's rows and columns 32 (KS ch + ks) .., both WY terms */
        /* dXw = Tinv^T dW: dk = beta gam dXw (rows < L). It runs after dXu where DV < DK, after dT otherwise (dW is
         * read before M1 takes its tile either way): the place where the 8 instances spill least */
        const auto dxw = [&] {
            float kx[2] = {0.0f, 0.0f};
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                const int c0 = 32 * (KS * ch + ks);
                float acc[1][4][4];
                gdn_zero(acc);
                gdn_warp_mma<1, 4, true, false, GDN_C>(acc, s.tb, GDN_LDP, s.dw, LDK, r0, c0);
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        const int j = r0 + gdn_frag_row(e), col = c0 + ni * 8 + gdn_frag_col(e);
                        const float2 kk = gdn_load2(s.k + j * LDK + col);
                        kx[e >> 1] += kk.x * acc[0][ni][e] + kk.y * acc[0][ni][e + 1];
                        const float bg = j < L ? s.beta[j] * exp2f(s.G[j]) : 0.0f;
                        dkr[ks][0][ni][e] = bg * acc[0][ni][e];
                        dkr[ks][0][ni][e + 1] = bg * acc[0][ni][e + 1];
                    }
            }
            kx[0] = gdn_quad_sum(kx[0]);
            kx[1] = gdn_quad_sum(kx[1]);
            if ((lane & 3) == 0) {
                part[GDN_WY_PART_KX * 2 * GDN_C + rA] = kx[0];
                part[GDN_WY_PART_KX * 2 * GDN_C + rA + 8] = kx[1];
            }
        };
        /* dXu = Tinv^T dU -> dv */
        {
            float vx[2] = {0.0f, 0.0f};
#pragma unroll 1
            for (int vs = 0; vs < VS; vs++) {
                const int n0 = 32 * (VS * ch + vs);
                float acc[1][4][4];
                gdn_zero(acc);
                gdn_warp_mma<1, 4, true, false, GDN_C>(acc, s.tb, GDN_LDP, s.du, LDV, r0, n0);
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e += 2) {
                        const int j = r0 + gdn_frag_row(e), col = n0 + ni * 8 + gdn_frag_col(e);
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
                part[GDN_WY_PART_VX * 2 * GDN_C + rA] = vx[0];
                part[GDN_WY_PART_VX * 2 * GDN_C + rA + 8] = vx[1];
            }
        }
        if constexpr (DV < DK) dxw();
        /* dkv's rows (read by the last phase) into L2 now, a few phases ahead: its loads then wait on L2,
         * not DRAM, and the lines stay resident for a few microseconds only */
        gdn_prefetch_rows_l2<float, DK, NT, true>(dkv + t0 * ldk + (int64_t)h * DK, ldk, L);
        /* dT (this warp's 16 x 32 tile) */
        {
            float a1[1][4][4], a2[1][4][4];
            gdn_zero(a1);
            gdn_zero(a2);
            if (!upper) {
                gdn_warp_mma<1, 4, false, true, DK>(a1, s.dw, LDK, s.k, LDK, r0, 32 * ch);
                gdn_warp_mma<1, 4, false, true, DV>(a2, s.du, LDV, s.v, LDV, r0, 32 * ch);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int i = r0 + gdn_frag_row(e), j = 32 * ch + ni * 8 + gdn_frag_col(e);
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
        if constexpr (DV >= DK) dxw();
        __syncthreads();
        /* M1 = Tinv^T dT */
        {
            float acc[1][4][4];
            gdn_zero(acc);
            gdn_warp_mma<1, 4, true, false, GDN_C>(acc, s.tb, GDN_LDP, s.dt, GDN_LDP, r0, 32 * ch);
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int i = r0 + gdn_frag_row(e), j = 32 * ch + ni * 8 + gdn_frag_col(e);
                    gdn_store2(s.m1 + i * GDN_LDP + j, acc[0][ni][e], acc[0][ni][e + 1]);
                }
        }
        __syncthreads();
        /* dA = -(M1 Tinv^T), strictly lower: C, dbeta's sum_j dA_ij kkg_ij and E = dA A's column sums (its row sums
         * are beta_i times dbeta's, so E is never stored). Per 8-column tile: the lane's two rows added, then the 8
         * row groups of the warp (lane bit 2 splits the tile's column pair, bits 3 and 4 add), one partial per row
         * tile and column into cpart (dT's space) */
        {
            float acc[1][4][4];
            gdn_zero(acc);
            if (!upper) gdn_warp_mma<1, 4, false, true, GDN_C>(acc, s.m1, GDN_LDP, s.tb, GDN_LDP, r0, 32 * ch);
            float db[2] = {0.0f, 0.0f};
            const bool b2 = lane & 4;
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                float ec[2]; /* E of columns 32 ch + 8 ni + 2 (lane & 3) + u, rows rA + rA + 8 */
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int i = r0 + gdn_frag_row(e), j = 32 * ch + ni * 8 + gdn_frag_col(e);
                    float cv[2];
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const int jj = j + u;
                        const bool in = jj < i && i < L;
                        const float da = in ? -acc[0][ni][e + u] : 0.0f;
                        cv[u] = in ? da * s.beta[i] * exp2f(s.G[i] - s.G[jj]) : 0.0f;
                        const float kg = s.kkg[i * GDN_LDF + jj];
                        db[e >> 1] += da * kg;
                        const float ev = da * (s.beta[i] * kg);
                        ec[u] = e ? ec[u] + ev : ev;
                    }
                    gdn_store2(s.cc + i * GDN_LDP + j, cv[0], cv[1]);
                }
                const float keep = b2 ? ec[1] : ec[0], give = b2 ? ec[0] : ec[1];
                float y = keep + __shfl_xor_sync(GDN_FULL, give, 4);
                y += __shfl_xor_sync(GDN_FULL, y, 8);
                y += __shfl_xor_sync(GDN_FULL, y, 16);
                if (lane < 8) s.cpart[(w & 3) * GDN_C + 32 * ch + 8 * ni + 2 * (lane & 3) + (lane >> 2)] = y;
            }
            db[0] = gdn_quad_sum(db[0]);
            db[1] = gdn_quad_sum(db[1]);
            if ((lane & 3) == 0) {
                part[GDN_WY_PART_DB * 2 * GDN_C + rA] = db[0];
                part[GDN_WY_PART_DB * 2 * GDN_C + rA + 8] = db[1];
            }
        }
        __syncthreads();
        /* dk = dk of dqkwg + (the dXw term + C K + C^T K): every load of a step issued first */
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const int c0 = 32 * (KS * ch + ks);
            float2 old[4][2];
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int j = r0 + gdn_frag_row(e), col = c0 + ni * 8 + gdn_frag_col(e);
                    old[ni][e >> 1] = j < L ? *(const float2 *)(dkv + (t0 + j) * ldk + (int64_t)h * DK + col)
                                            : make_float2(0.0f, 0.0f);
                }
            gdn_warp_mma<1, 4, false, false, GDN_C>(dkr[ks], s.cc, GDN_LDP, s.k, LDK, r0, c0);
            gdn_warp_mma<1, 4, true, false, GDN_C>(dkr[ks], s.cc, GDN_LDP, s.k, LDK, r0, c0);
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int j = r0 + gdn_frag_row(e), col = c0 + ni * 8 + gdn_frag_col(e);
                    if (j < L) {
                        const float2 o = old[ni][e >> 1];
                        const float x0 = o.x + dkr[ks][0][ni][e], x1 = o.y + dkr[ks][0][ni][e + 1];
                        if (dk_out) gdn_store2(dk_out + (t0 + j) * ldq + (int64_t)h * DK + col, x0, x1); /* final dk */
                        else *(float2 *)(dkv + (t0 + j) * ldk + (int64_t)h * DK + col) = make_float2(x0, x1);
                    }
                }
        }
        /* dbeta, dG (the WY terms, E's row sums minus its column sums, dqkwg's) and dg = its reverse cumsum inside
         * the chunk, on warp 0 alone (no barrier): lane l takes rows l and 32 + l, each half scanned in the warp,
         * then rows 0..31 add the sum of rows 32..63 */
        if (w == 0) {
            float x[2];
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = lane + 32 * hh;
                const float *p = s.part + r, *cp = s.cpart + r;
                const float kx = p[0] + p[GDN_C], vx = p[2 * GDN_C] + p[3 * GDN_C], db = p[4 * GDN_C] + p[5 * GDN_C];
                const float cs = (cp[0] + cp[GDN_C]) + (cp[2 * GDN_C] + cp[3 * GDN_C]);
                const float gm = r < L ? exp2f(s.G[r]) : 0.0f;
                x[hh] = r < L ? dgp_r[hh] + s.beta[r] * gm * kx + (s.beta[r] * db - cs) : 0.0f;
                if (r < L) dbeta_out[(t0 + r) * nv + h] = gm * kx + vx + db;
            }
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const float y = __shfl_down_sync(GDN_FULL, x[hh], o);
                    if (lane + o < 32) x[hh] += y;
                }
            }
            x[0] += __shfl_sync(GDN_FULL, x[1], 0);
#pragma unroll
            for (int hh = 0; hh < 2; hh++)
                if (lane + 32 * hh < L) dg_out[(t0 + lane + 32 * hh) * nv + h] = x[hh];
        }
    }
}
