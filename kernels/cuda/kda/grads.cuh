/*
 * grads.cuh — KDA's per-chunk gradients after the two state passes, one block per (chunk, value head) (grad_wy_pairs
 * and grad_qk: two, one per half of the key channels), in four kernels (their shared memory apart would not fit one
 * block), then the sum over the value heads of a key head:
 *
 *   kda_grad_dense_kernel  the products of the entering state S and the leaving gradient D, on tensor cores
 *                       (bf16 operands): dW = -dvn S^T (bf16: grad_wy takes it only as an operand) and dO S^T
 *                       (S_a . dO_r), written to the rows of the chunk in dg's and dqv's storage, which the next two
 *                       kernels read (into shared memory) before they write there; vn D^T (D_a . vn_r) and the
 *                       row dots S_a . D_a into the state passes' buffers (free by then), for grad_qk.
 *   kda_grad_wy_kernel  the WY side's products: dW (grad_dense's), dXw = Tinv^T dW, dXu = Tinv^T dvn, dT
 *                       (strictly lower) = dW Xw^T + dvn Xu^T, dA = -(Tinv^T dT Tinv^T) strictly lower; dv (final),
 *                       dbeta's dXu part; dA and dXw to global memory for
 *   kda_grad_wy_pairs_kernel  the WY side per key channel (two blocks per (chunk, value head), each half of the
 *                       channels), through Xw = beta gam * K and A_ij = beta_i sum_c k_i k_j E_ij: the WY and A parts
 *                       of dk (into dkv) and of dL/dG (into dg, before the in-chunk reverse sum), dbeta's partial
 *                       sums (kda_dbeta_sum_kernel adds them to the dXu part, in a fixed order).
 *   kda_grad_qk_kernel  the output side, two blocks per (chunk, value head), each half of the key channels
 *                       (dP, a sum over dv, formed by both): dP_rj = dO_r . vn_j,
 *                       dq = scale gam (S dO) + scale sum_j dP_rj E_rj k_j,
 *                       dk += dec (D vn) + scale sum_r dP_rj E_rj q_r, every e^{+-G} factor's share of dL/dG
 *                       (the read gam_r q_r, the QK pairs, dec, the carried gam_{L-1}), added to the WY part,
 *                       and dg = the reverse sum of dL/dG inside the chunk.
 *   kda_group_reduce_kernel  dq, dk (bf16) = the sum over the value heads of each key head of dqv, dkv, in head
 *                       order.
 *
 * On tensor cores (gdn_warp_mma, every operand rounded to bf16 once, fp32 accumulation: common.cuh's precision):
 * dP = dO vn^T, dT, dXu, M1, dA, dXw, and the pair
 * terms across 16-row sub-chunks (kda_pair_rows, prep.cuh's scheme: Z_r = sum_j P_rj x_j E_rj with a reference row
 * between the two, every exponent <= 0) for the QK pairs of dq and dk and the A pairs of dk and dL/dG; the diagonal
 * 16 x 16 blocks of those pairs fp32, one thread per (sub-chunk, channel) (kda_diag_rows: each decay the running
 * product of the one-step factors e^{G_m - G_m-1} <= 1 outward from the row).
 * Row sums (dbeta) are per-warp butterflies, then the warps in index order, then the halves: fp32, a fixed order,
 * no atomics. vn, dvn, hs and dhs arrive in bf16 (rounded once by the state passes that store them); grad_dense's
 * row dots S_a . D_a, the one reader that is not a product on tensor cores, take those bf16 values with fp32
 * products and sum (the kind of every MMA here).
 * docs/design/kda.md has the algebra. Part of kda.cu.
 */
#pragma once

/* kda_grad_dense_kernel's shared memory (DK = dk = dv): S (DK x DK), dvn and dO (64 x DK), bf16, rows padded by
 * 8: 68 KB at 128 (three blocks fit an SM; the launch bounds' 128 registers allow two) */
template <int DK> struct KdaGdSmem {
    static constexpr int LDK = DK + 8;
    bf16 *st, *dvb, *dout;
    size_t bytes;
    __host__ __device__ explicit KdaGdSmem(void *b) {
        KdaCarve c(b);
        st = c.take<bf16>((size_t)DK * LDK);
        dvb = c.take<bf16>((size_t)KDA_C * LDK);
        dout = c.take<bf16>((size_t)KDA_C * LDK);
        bytes = c.off;
    }
};

/* The products of the chunk's entering state S and of the gradient D leaving it that the gradients need, on tensor
 * cores (bf16 operands), per (chunk, value head): dW = -dvn S^T (grad_wy's operand, rounded to bf16 as stored: a
 * (T, nv, dk) bf16 array at the start of dg's storage) into dW and S dO^T's transpose dO S^T
 * (grad_qk's S_a . dO_r) into sdo, rows < L of the chunk, 0 at a document start; where a state leaves the chunk,
 * vn D^T (grad_qk's D_a . vn_r) into dvd (rows < L) and, where S is not 0 either, the row dots S_a . D_a into sd at
 * the chunk's slot (hs's and dhs's bf16 values, fp32 products and sum, a warp per row, lanes over the columns,
 * kda_warp_sum). Warp w: rows
 * [16 (w % 4), +16), columns half w / 4; D and vn take S's and dvn's tiles after the first products. */
template <int DK>
__global__ void __launch_bounds__(KDA_THREADS, 2) kda_grad_dense_kernel(
    bf16 *dW /* (T,nv,dk) */, float *sdo /* (T,nv,dk) */, float *dvd /* (T,nv,dk) */, float *sd /* (ns,nv,dk) */,
    const bf16 *hs /* (ns,nv,dk,dv) */, const bf16 *dhs /* (ns,nv,dk,dv) */, const bf16 *vn /* (T,nv,dv) */,
    const bf16 *dvn /* (T,nv,dv) */, const bf16 *dout /* (T,ldo) */, const int32_t *starts, const int32_t *meta,
    const int32_t *doc_pos, int64_t T, int nv, int ldo) {
    using Sm = KdaGdSmem<DK>;
    constexpr int LDK = Sm::LDK, DV = DK;
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const Sm s(kda_smem);
    const int h = blockIdx.y, nc = meta[KDA_META_NC];
    const int w = threadIdx.x >> 5, mt = w & 3, half = w >> 2, lane = threadIdx.x & 31;
    const int m0 = 16 * mt, n0 = half * (DK / 2);
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        const bf16 *S = ch.reset ? NULL : hs + (ch.slot * nv + h) * (size_t)DK * DV;
        const bf16 *D = ch.leaves ? dhs + (ch.slot * nv + h) * (size_t)DK * DV : NULL;
        if (!S) { /* S = 0 */
            for (int i = threadIdx.x; i < L * DK; i += KDA_THREADS) {
                const int64_t at = ((t0 + i / DK) * nv + h) * (int64_t)DK + i % DK;
                dW[at] = __float2bfloat16(0.0f);
                sdo[at] = 0.0f;
            }
        } else {
            kda_load_bf16(s.dout, LDK, dout + t0 * ldo + (int64_t)h * DV, ldo, DV, L);
            kda_cp_rows<DV>(s.dvb, dvn, t0, L, h, nv);
            kda_cp_state<DK, DV>(s.st, S);
            kda_load_wait();
            __syncthreads();
            { /* dW (bf16), then dO S^T: one accumulator at a time (128 registers a thread) */
                float acc[1][DK / 16][4];
                gdn_zero(acc);
                gdn_warp_mma<1, DK / 16, false, true, DV>(acc, s.dvb, LDK, s.st, LDK, m0, n0);
#pragma unroll
                for (int ni = 0; ni < DK / 16; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = m0 + gdn_frag_row(e), a = n0 + 8 * ni + gdn_frag_col(e);
                        if (r < L) dW[((t0 + r) * nv + h) * (int64_t)DK + a] = __float2bfloat16(-acc[0][ni][e]);
                    }
            }
            {
                float acc[1][DK / 16][4];
                gdn_zero(acc);
                gdn_warp_mma<1, DK / 16, false, true, DV>(acc, s.dout, LDK, s.st, LDK, m0, n0);
#pragma unroll
                for (int ni = 0; ni < DK / 16; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = m0 + gdn_frag_row(e), a = n0 + 8 * ni + gdn_frag_col(e);
                        if (r < L) sdo[((t0 + r) * nv + h) * (int64_t)DK + a] = acc[0][ni][e];
                    }
            }
        }
        if (D) {
            if (S) /* S_a . D_a: warp w rows a = w, w + 8, ..., four rows' loads in flight together */
#pragma unroll 1
                for (int a0 = w; a0 < DK; a0 += 4 * (KDA_THREADS / 32)) {
                    float sv[4][DV / 32], dv[4][DV / 32];
#pragma unroll
                    for (int b = 0; b < 4; b++)
#pragma unroll
                        for (int m = 0; m < DV / 32; m++) {
                            const size_t at = (size_t)(a0 + b * (KDA_THREADS / 32)) * DV + lane + 32 * m;
                            sv[b][m] = __bfloat162float(S[at]);
                            dv[b][m] = __bfloat162float(D[at]);
                        }
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        float x = 0.0f;
#pragma unroll
                        for (int m = 0; m < DV / 32; m++) x += sv[b][m] * dv[b][m];
                        x = kda_warp_sum(x);
                        if (lane == 0) sd[(ch.slot * nv + h) * (int64_t)DK + a0 + b * (KDA_THREADS / 32)] = x;
                    }
                }
            __syncthreads(); /* S's and dvn's tiles are read */
            kda_cp_rows<DV>(s.dvb, vn, t0, L, h, nv);
            kda_cp_state<DK, DV>(s.st, D);
            kda_load_wait();
            __syncthreads();
            float ad[1][DK / 16][4];
            gdn_zero(ad);
            gdn_warp_mma<1, DK / 16, false, true, DV>(ad, s.dvb, LDK, s.st, LDK, m0, n0);
#pragma unroll
            for (int ni = 0; ni < DK / 16; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = m0 + gdn_frag_row(e), a = n0 + 8 * ni + gdn_frag_col(e);
                    if (r < L) dvd[((t0 + r) * nv + h) * (int64_t)DK + a] = ad[0][ni][e];
                }
        }
        __syncthreads();
    }
}

/* the per-(r, a) loops of grad_wy and grad_qk (thread t: elements t + u KDA_THREADS, u < 64 w / KDA_THREADS, of
 * the 64 x w tile of channels [c0, c0 + w): row p / w, channel c0 + p % w) that add to a (T, nv, dk) buffer's chunk
 * rows (an earlier kernel's
 * or loop's part of the gradient) read them KDA_PF at a time, software-pipelined: the first batch issued before the
 * pair products that precede the loop, each next one while the loop works through the current, so the loads'
 * latency passes under work instead of stalling the loop (each batch's loads issued together). kda_prefetch:
 * elements u0 + u (u < N: KDA_PF in grad_wy, half that in grad_qk, which must fit 128 registers) into x[u]; rows >= L
 * (and past the tile) read 0 with no load. */
#define KDA_PF 8
template <int N>
KDA_DEV void kda_prefetch(float (&x)[N], const float *src, int64_t t0, int L, int h, int nv, int dk, int c0, int w,
                          int u0) {
#pragma unroll
    for (int u = 0; u < N; u++) {
        const int p = threadIdx.x + (u0 + u) * KDA_THREADS, r = p / w, a = c0 + p % w;
        x[u] = r < L ? src[((t0 + r) * nv + h) * (size_t)dk + a] : 0.0f;
    }
}
static_assert((KDA_C * 32) % (KDA_PF * KDA_THREADS) == 0, "kda_prefetch: whole batches at w = 32, 64 and 128");

/* the pair sums of the gradients across sub-chunks, on tensor cores (prep.cuh's scheme): with P (64 x 64, bf16 at
 * pb, row stride KDA_LDP; P_rj = 0 unless j <= r < L) and x (bf16 rows, stride ldx; rows >= L zero)
 *   EARLIER: out_r[a] = sum_{j < 16 (r / 16)} P_rj x_j[a] E_rj[a]       (the pairs with r the later row)
 *   LATER:   out_r[a] = sum_{i >= 16 (r / 16 + 1)} P_ir x_i[a] E_ir[a]  (r the earlier row)
 * (x_j scaled by xs_j where xs is not NULL); the pairs inside a 16-row sub-chunk (the diagonal blocks) left to the
 * caller (fp32). Sub-chunk b of r, ref the
 * row 16 b (EARLIER) or 16 b + 15 (LATER): E = e^{G_r - G_ref} e^{G_ref - G_j} (EARLIER), e^{G_i - G_ref}
 * e^{G_ref - G_r} (LATER), every exponent <= 0; the x rows scaled by their factor, split hi + lo bf16 (common.cuh's
 * kda_split) into oh / ol (48 rows, stride DK + 8), one 16 x DK product per sub-chunk, two MMAs (P ol, then P oh:
 * warps over 16-column strips, 16-row k steps in order), the r factor applied to the result. The scaled rows stay
 * split, unlike every other operand: each pair (r, j) enters dL/dG twice with opposite signs (through dq_r's X and
 * dk_j's Y, from rows scaled from two references), and their cancellation in the model's dA_log = sum dg g lost
 * ~1e-2 with one bf16 rounding (cuda_kda_dg_reduction); P itself in bf16 keeps it. out: row stride ldo, every row
 * < 64 written. All threads; ends synchronised. */
#define KDA_LDP (KDA_C + 8) /* row stride of the bf16 64 x 64 pair tiles */

/* the 16 x 16 diagonal blocks of a 64 x 64 pair tile kept in fp32 (grad_wy_pairs' dA, grad_qk's dP: what the
 * diagonal loops read): entry (r, j), r and j in one sub-chunk, at kda_diag(r, j) of a (4, 16, KDA_LDD) array */
#define KDA_LDD 17
KDA_DEV int kda_diag(int r, int j) { return (r >> 4) * 16 * KDA_LDD + (r & 15) * KDA_LDD + (j & 15); }
template <int DK, bool LATER>
KDA_DEV void kda_pair_rows(float *out, int ldo, const bf16 *pb, const bf16 *x, int ldx, const float *xs, const float *G,
                           int ldg, bf16 *oh, bf16 *ol) {
    constexpr int LDK = DK + 8;
    const int w = threadIdx.x >> 5;
    for (int s = 0; s < 3; s++) {
        const int b = LATER ? s : s + 1, ref = LATER ? 16 * b + 15 : 16 * b, nrow = LATER ? 48 - 16 * b : 16 * b;
        const int x0 = LATER ? 16 * (b + 1) : 0; /* the first x row of the product */
        for (int i = threadIdx.x; i < nrow * DK; i += KDA_THREADS) {
            const int q = i / DK, c = i % DK, j = x0 + q;
            const float e = LATER ? G[j * ldg + c] - G[ref * ldg + c] : G[ref * ldg + c] - G[j * ldg + c];
            const float xj = xs ? __bfloat162float(x[j * ldx + c]) * xs[j] : __bfloat162float(x[j * ldx + c]);
            kda_split(xj * expf(e), &oh[q * LDK + c], &ol[q * LDK + c]);
        }
        __syncthreads();
        if (w < DK / 16) {
            const int n0 = 16 * w;
            float acc[1][2][4];
            gdn_zero(acc);
#pragma unroll 1 /* not unrolled: the unrolled loop spilled grad_qk at dk 64 (8 B); the same MMA order either way */
            for (int kk = 0; kk < nrow / 16; kk++) {
                const bf16 *pk = LATER ? pb + (x0 + 16 * kk) * KDA_LDP : pb + 16 * kk; /* LATER: A = P^T */
                gdn_warp_mma<1, 2, LATER, false, 16>(acc, pk, KDA_LDP, ol + 16 * kk * LDK, LDK, 16 * b, n0);
                gdn_warp_mma<1, 2, LATER, false, 16>(acc, pk, KDA_LDP, oh + 16 * kk * LDK, LDK, 16 * b, n0);
            }
#pragma unroll
            for (int ni = 0; ni < 2; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = 16 * b + gdn_frag_row(e), a = n0 + 8 * ni + gdn_frag_col(e);
                    const float f = LATER ? G[ref * ldg + a] - G[r * ldg + a] : G[r * ldg + a] - G[ref * ldg + a];
                    out[r * ldo + a] = expf(f) * acc[0][ni][e];
                }
        }
        __syncthreads();
    }
    /* the sub-chunk without pairs of this kind: rows [0, 16) (EARLIER) or [48, 64) (LATER) */
    for (int i = threadIdx.x; i < 16 * DK; i += KDA_THREADS) out[((LATER ? 48 : 0) + i / DK) * ldo + i % DK] = 0.0f;
    __syncthreads();
}

/* the pairs inside the 16-row sub-chunks (the diagonal blocks kda_pair_rows leaves), fp32, added to out (row stride
 * ldo, W channels): with Pd the diagonal blocks (kda_diag) and x (bf16 rows, stride ldx; scaled by xs_j where xs is
 * not NULL)
 *   EARLIER: out_r[a] += sum_{16 (r / 16) <= j < r} P_rj x_j[a] E_rj[a]
 *   LATER:   out_r[a] += sum_{r < i < 16 (r / 16 + 1)} P_ir x_i[a] E_ir[a]
 * for rows r < L. Thread (sub-chunk b, channel a) takes the 16 rows of its block: the 15 one-step factors
 * e^{G_m - G_{m-1}} (each <= 1) once into registers, then every E of the block as their running product outward
 * from r (E_r,r-1 = e_r, E_r,r-2 = e_r e_{r-1}, ...): 15 exponentials per block and channel, not one per pair (120),
 * every factor and product <= 1 as the single exponential's; the sum over the pairs nearest first. Threads past
 * 4 W idle. All threads; the caller synchronises. */
template <int W, bool LATER>
KDA_DEV void kda_diag_rows(float *out, int ldo, const float *Pd, const bf16 *x, int ldx, const float *xs,
                           const float *G, int ldg, int L) {
    const int b = threadIdx.x / W, a = threadIdx.x % W, r0 = 16 * b;
    if (b >= 4 || r0 >= L) return;
    float e[16]; /* e[m] = e^{G_{r0+m} - G_{r0+m-1}} (m >= 1) */
#pragma unroll
    for (int m = 0; m < 16; m++) e[m] = m ? expf(G[(r0 + m) * ldg + a] - G[(r0 + m - 1) * ldg + a]) : 1.0f;
    /* row m's x at channel a, scaled (read where used: registers for the factors only) */
    auto xv = [&](int m) {
        const float v = __bfloat162float(x[(r0 + m) * ldx + a]);
        return xs ? v * xs[r0 + m] : v;
    };
#pragma unroll
    for (int m = 0; m < 16; m++) {
        if (r0 + m >= L) break;
        float acc = 0.0f, E = 1.0f;
        if (!LATER) {
#pragma unroll
            for (int j = m - 1; j >= 0; j--) { /* E = E_{r, r0 + j} */
                E *= e[j + 1];
                acc += Pd[kda_diag(r0 + m, r0 + j)] * xv(j) * E;
            }
        } else {
#pragma unroll
            for (int i = m + 1; i < 16; i++) { /* E = E_{r0 + i, r}; rows >= L: P and x 0 */
                E *= e[i];
                acc += Pd[kda_diag(r0 + i, r0 + m)] * xv(i) * E;
            }
        }
        out[(r0 + m) * ldo + a] += acc;
    }
}

/* kda_grad_wy_kernel's shared memory (DK = dk = dv; 112640 bytes at 128: two blocks per SM): v, dW, gam k (k
 * loaded there, scaled in place) and dvn (bf16, DK + 8), Tinv (bf16, KDA_LDP), beta, the dbeta partial sums of dXu,
 * G (fp32, DK + 1: only for gam k); the bf16 64 x 64 operand of the products (dT, M1, then dA, KDA_LDP) over gam k,
 * dT formed from the product's registers (no fp32 tile) */
template <int DK> struct KdaGwySmem {
    static constexpr int LDK = DK + 8, LDF = DK + 1;
    bf16 *v, *dw, *t, *gk, *dvb, *pb;
    float *G, *beta, *red;
    size_t bytes;
    __host__ __device__ explicit KdaGwySmem(void *b) {
        KdaCarve c(b);
        v = c.take<bf16>((size_t)KDA_C * LDK);
        G = c.take<float>((size_t)KDA_C * LDF);
        dw = c.take<bf16>((size_t)KDA_C * LDK);
        t = c.take<bf16>((size_t)KDA_C * KDA_LDP);
        beta = c.take<float>(KDA_C);
        red = c.take<float>((size_t)KDA_C * 2); /* (64 rows, 2 column halves) */
        gk = c.take<bf16>((size_t)KDA_C * LDK);
        dvb = c.take<bf16>((size_t)KDA_C * LDK);
        pb = gk; /* from dT on: gam k is read */
        static_assert(KDA_C * KDA_LDP <= KDA_C * (DK + 8), "grad_wy: the pair operand within gam k's tile");
        bytes = c.off;
    }
};

/* Per (chunk, value head), the WY side's dense part. On tensor cores (bf16 operands, one MMA per product): dT (dW,
 * gam k, dvn, v), dXu = Tinv^T dvn, M1 = Tinv^T dT, dA = -(M1 Tinv^T), dXw = Tinv^T dW (Tinv lower triangular and dT
 * strictly lower, rows >= L zero: the full products are the masked sums), warp w rows [16 (w % 4), +16) and half
 * w / 4 of the columns. Writes dv (final), dbeta's dXu part (v_r . dXu_r: kda_grad_wy_pairs_kernel's partial sums
 * and kda_dbeta_sum_kernel add the rest), dA (fp32, strictly lower) into da and dXw into dkv's rows of the chunk,
 * for kda_grad_wy_pairs_kernel. */
template <int DK>
__global__ void __launch_bounds__(KDA_THREADS, 2) kda_grad_wy_kernel(
    bf16 *dv_out /* (T,ldv) */, float *dbeta /* (T,nv): the dXu part */, float *dkv /* (T,nv,dk): dXw out */,
    float *da /* (T,nv,64): dA out */, const bf16 *dW /* (T,nv,dk): grad_dense's */, const bf16 *k, const bf16 *v,
    const float *g, const float *beta, const float *tinv /* (T,nv,64) */, const bf16 *dvn /* (T,nv,dv) */,
    const int32_t *starts, const int32_t *meta, const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldv) {
    using Sm = KdaGwySmem<DK>;
    constexpr int dk = DK, dv = DK, LDK = Sm::LDK, ldg = Sm::LDF;
    constexpr int NB = KDA_BATCH;
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const Sm s(kda_smem);
    float *sG = s.G, *sBeta = s.beta, *sRed = s.red;
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, mt = w & 3, half = w >> 2;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        kda_load_bf16(s.gk, LDK, k + t0 * ldq + (int64_t)kh * dk, ldq, dk, L); /* k, scaled in place below */
        kda_load_bf16(s.v, LDK, v + t0 * ldv + (int64_t)h * dv, ldv, dv, L);
        kda_load_G_start(sG, ldg, g, t0, L, h, nv, dk, 0, dk); /* g lands while the tiles below load */
        /* Tinv in bf16 (rows >= L: 0) */
        kda_load_rows_f32<NB>(s.t, NULL, KDA_LDP, tinv + (t0 * nv + h) * (int64_t)KDA_C, (int64_t)nv * KDA_C, KDA_C,
                              KDA_C, L);
        if (threadIdx.x < KDA_C) sBeta[threadIdx.x] = threadIdx.x < L ? beta[(t0 + threadIdx.x) * nv + h] : 0.0f;
        /* dW_r[a] = -(S_a . dvn_r): kda_grad_dense_kernel's, bf16 in dg's storage (read before
         * kda_grad_wy_pairs_kernel writes there); dvn; both bf16 as stored */
        kda_load_bf16(s.dw, LDK, dW + (t0 * nv + h) * (int64_t)dk, (int64_t)nv * dk, dk, L);
        kda_load_bf16(s.dvb, LDK, dvn + (t0 * nv + h) * (int64_t)dv, (int64_t)nv * dv, dv, L);
        kda_load_G_sum(sG, ldg, dk);
        __syncthreads(); /* sG */
        for (int p = threadIdx.x; p < KDA_C * dk; p += KDA_THREADS) { /* gam k over k (rows >= L: 0) */
            const int r = p / dk, a = p % dk;
            s.gk[r * LDK + a] = __float2bfloat16(__bfloat162float(s.gk[r * LDK + a]) * expf(sG[r * ldg + a]));
        }
        __syncthreads();
        /* dT_ij = beta_j (dW_i . (gam_j * k_j) + dvn_i . v_j) for j < i < L (warp w: rows 16 (w % 4), columns
         * 32 (w / 4)), in bf16 over gam k once every warp has read it (the fp32 values rounded once, as an operand) */
        {
            const int m0 = 16 * (w & 3), n0 = 32 * (w >> 2);
            float acc[1][4][4];
            gdn_zero(acc);
            gdn_warp_mma<1, 4, false, true, DK>(acc, s.dw, LDK, s.gk, LDK, m0, n0);
            gdn_warp_mma<1, 4, false, true, DK>(acc, s.dvb, LDK, s.v, LDK, m0, n0);
            __syncthreads(); /* gam k is read */
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = m0 + gdn_frag_row(e), j = n0 + 8 * ni + gdn_frag_col(e);
                    s.pb[i * KDA_LDP + j] = __float2bfloat16(j < i && i < L ? sBeta[j] * acc[0][ni][e] : 0.0f);
                }
        }
        /* dXu = Tinv^T dvn: dv_r = beta_r dXu_r, dbeta_r gets v_r . dXu_r (sRed, one entry per half of the columns:
         * the fragments' products, then the four lanes of a row by a fixed butterfly) */
        {
            float acc[1][DK / 16][4];
            gdn_zero(acc);
            gdn_warp_mma<1, DK / 16, true, false, KDA_C>(acc, s.t, KDA_LDP, s.dvb, LDK, 16 * mt, half * (dv / 2));
            float part[2] = {0.0f, 0.0f};
#pragma unroll
            for (int ni = 0; ni < DK / 16; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = 16 * mt + gdn_frag_row(e), cc = half * (dv / 2) + 8 * ni + gdn_frag_col(e);
                    const float xu = acc[0][ni][e];
                    if (r < L) dv_out[(t0 + r) * ldv + (int64_t)h * dv + cc] = __float2bfloat16_rn(sBeta[r] * xu);
                    part[e >> 1] += __bfloat162float(s.v[r * LDK + cc]) * xu;
                }
#pragma unroll
            for (int u = 0; u < 2; u++) {
                part[u] += __shfl_xor_sync(KDA_FULL, part[u], 1);
                part[u] += __shfl_xor_sync(KDA_FULL, part[u], 2);
                if ((lane & 3) == 0) sRed[(16 * mt + (lane >> 2) + 8 * u) * 2 + half] = part[u];
            }
        }
        __syncthreads();
        /* M1 = Tinv^T dT (64 x 64: warp w columns [32 (w / 4), +32)), in bf16 over dT's */
        {
            float acc[1][4][4];
            gdn_zero(acc);
            gdn_warp_mma<1, 4, true, false, KDA_C>(acc, s.t, KDA_LDP, s.pb, KDA_LDP, 16 * mt, 32 * half);
            __syncthreads();
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = 16 * mt + gdn_frag_row(e), b = 32 * half + 8 * ni + gdn_frag_col(e);
                    s.pb[i * KDA_LDP + b] = __float2bfloat16(acc[0][ni][e]);
                }
        }
        __syncthreads();
        /* dA = -(M1 Tinv^T), strictly lower, into da; dXw = Tinv^T dW into dkv (rows < L) */
        {
            float aa[1][4][4], ax[1][DK / 16][4];
            gdn_zero(aa);
            gdn_zero(ax);
            gdn_warp_mma<1, 4, false, true, KDA_C>(aa, s.pb, KDA_LDP, s.t, KDA_LDP, 16 * mt, 32 * half);
            gdn_warp_mma<1, DK / 16, true, false, KDA_C>(ax, s.t, KDA_LDP, s.dw, LDK, 16 * mt, half * (dk / 2));
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = 16 * mt + gdn_frag_row(e), j = 32 * half + 8 * ni + gdn_frag_col(e);
                    if (i < L) da[((t0 + i) * nv + h) * (int64_t)KDA_C + j] = j < i ? -aa[0][ni][e] : 0.0f;
                }
#pragma unroll
            for (int ni = 0; ni < DK / 16; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = 16 * mt + gdn_frag_row(e), a = half * (dk / 2) + 8 * ni + gdn_frag_col(e);
                    if (r < L) dkv[((t0 + r) * nv + h) * (int64_t)dk + a] = ax[0][ni][e];
                }
        }
        if (threadIdx.x < L) dbeta[(t0 + threadIdx.x) * nv + h] = sRed[threadIdx.x * 2] + sRed[threadIdx.x * 2 + 1];
        __syncthreads();
    }
}

/* kda_grad_wy_pairs_kernel's shared memory (DK = dk; the block's W = DK / 2 key channels; ~87 KB at 128, two blocks
 * per SM): k (bf16, W + 2), G (fp32, W + 1), beta, dA's 16 x 16 diagonal blocks (fp32, kda_diag) and all of dA in
 * bf16 (KDA_LDP), dXw then dk's part (fp32, W + 1), a pair-sum result Z (fp32, W + 1), the scaled rows of
 * kda_pair_rows (hi / lo, 48 rows, W + 8), dbeta's partial sums (64 rows, W / 32 column blocks) */
template <int DK> struct KdaGwpSmem {
    static constexpr int W = DK / 2, LDB = W + 2, LDF = W + 1, LDO = W + 8;
    bf16 *k, *pb, *oh, *ol;
    float *G, *beta, *dAd, *xw, *Z, *red;
    size_t bytes;
    __host__ __device__ explicit KdaGwpSmem(void *b) {
        KdaCarve c(b);
        k = c.take<bf16>((size_t)KDA_C * LDB);
        G = c.take<float>((size_t)KDA_C * LDF);
        beta = c.take<float>(KDA_C);
        dAd = c.take<float>((size_t)4 * 16 * KDA_LDD);
        pb = c.take<bf16>((size_t)KDA_C * KDA_LDP);
        xw = c.take<float>((size_t)KDA_C * LDF);
        Z = c.take<float>((size_t)KDA_C * LDF);
        oh = c.take<bf16>((size_t)48 * LDO);
        ol = c.take<bf16>((size_t)48 * LDO);
        red = c.take<float>((size_t)KDA_C * (W / 32));
        bytes = c.off;
    }
};

/* Per (chunk, value head, half z of the key channels: c0 = z DK / 2, W = DK / 2 of them; rows and columns below
 * local to the block's channels), the WY side's per-channel part, from kda_grad_wy_kernel's dA (da) and dXw (dkv):
 * the A pairs of dk and dL/dG (Zt: r the later row, Zp: the earlier) across sub-chunks by kda_pair_rows, the
 * diagonal blocks fp32 per (r, a); writes the WY + A parts of dk (dkv) and of dL/dG (dg, over grad_dense's dW, read
 * by kda_grad_wy_kernel before) and dbeta's partial sum over the block's channels (dbp[t][z]: sum_a gx k_r +
 * sum_a k_r Zt; kda_dbeta_sum_kernel adds them). Two blocks per SM (~87 KB at 128, launch bounds 2). */
template <int DK>
__global__ void __launch_bounds__(KDA_THREADS, 2) kda_grad_wy_pairs_kernel(
    float *dbp /* (T,nv,2) */, float *dkv /* (T,nv,dk): dXw in, the WY + A part out */,
    float *dG /* (T,nv,dk): the WY + A part of dL/dG out */, const float *da /* (T,nv,64) */, const bf16 *k,
    const float *g, const float *beta, const int32_t *starts, const int32_t *meta, const int32_t *doc_pos, int64_t T,
    int nk, int nv, int ldq) {
    using Sm = KdaGwpSmem<DK>;
    constexpr int dk = DK, W = Sm::W, ldk = Sm::LDB, ldg = Sm::LDF;
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const Sm s(kda_smem);
    bf16 *sK = s.k;
    float *sG = s.G, *sBeta = s.beta, *sRed = s.red;
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC], z = blockIdx.z, c0 = z * W;
    const int lane = threadIdx.x & 31;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        const int64_t rows = (t0 * nv + h) * (int64_t)dk + c0; /* the block's channels of the chunk's first row */
        kda_load_bf16(sK, ldk, k + t0 * ldq + (int64_t)kh * dk + c0, ldq, W, L);
        kda_load_G_start(sG, ldg, g, t0, L, h, nv, dk, c0, W);
        if (threadIdx.x < KDA_C) sBeta[threadIdx.x] = threadIdx.x < L ? beta[(t0 + threadIdx.x) * nv + h] : 0.0f;
        kda_load_rows_f32(NULL, s.xw, ldg, dkv + rows, (int64_t)nv * dk, KDA_C, W, L); /* dXw */
        for (int p = threadIdx.x; p < KDA_C * KDA_C; p += KDA_THREADS) { /* dA (rows >= L: 0) */
            const int i = p / KDA_C, j = p % KDA_C;
            const float x = i < L ? da[((t0 + i) * nv + h) * (int64_t)KDA_C + j] : 0.0f;
            s.pb[i * KDA_LDP + j] = __float2bfloat16(x);
            if ((i >> 4) == (j >> 4)) s.dAd[kda_diag(i, j)] = x;
        }
        kda_load_G_sum(sG, ldg, W);
        __syncthreads();
        /* Zt_r = sum_{j < r} dA_rj E_rj k_j: the sub-chunk products, then per (r, a) (lanes over a) the diagonal
         * block, with dXw_r gx = gam_r dXw_r: dk_r = beta_r gx + beta_r Zt, dL/dG_r = beta_r gx k_r + beta_r k_r Zt
         * (Zp's terms added below); dbeta_r gets sum_a gx k_r + sum_a k_r Zt */
        kda_pair_rows<W, false>(s.Z, ldg, s.pb, sK, ldk, NULL, sG, ldg, s.oh, s.ol);
        kda_diag_rows<W, false>(s.Z, ldg, s.dAd, sK, ldk, NULL, sG, ldg, L);
        __syncthreads();
        for (int p = threadIdx.x; p < KDA_C * W; p += KDA_THREADS) {
            const int r = p / W, a = p % W; /* a warp shares r (W is a multiple of 32) */
            if (r >= L) continue;
            const float xw = s.xw[r * ldg + a];
            const float Gr = sG[r * ldg + a], kr = __bfloat162float(sK[r * ldk + a]), br = sBeta[r];
            const float gx = expf(Gr) * xw;
            const float zt = s.Z[r * ldg + a];
            s.xw[r * ldg + a] = br * gx + br * zt; /* dk's part so far, over dXw_r[a] (read above, this thread's) */
            dG[rows + (size_t)r * nv * dk + a] = br * gx * kr + br * kr * zt;
            const float rb = kda_warp_sum(gx * kr) + kda_warp_sum(kr * zt);
            if (lane == 0) sRed[r * (W / 32) + a / 32] = rb;
        }
        __syncthreads();
        /* Zp_r = sum_{i > r} dA_ir beta_i E_ir k_i: dk_r += Zp, dL/dG_r -= k_r Zp (dL/dG's part so far read back
         * before the pair products, dk's from shared memory) */
        constexpr int PF = KDA_PF / 2; /* 128 registers (two blocks per SM) */
        float pg[PF];
        kda_prefetch(pg, dG, t0, L, h, nv, dk, c0, W, 0);
        kda_pair_rows<W, true>(s.Z, ldg, s.pb, sK, ldk, sBeta, sG, ldg, s.oh, s.ol);
        kda_diag_rows<W, true>(s.Z, ldg, s.dAd, sK, ldk, sBeta, sG, ldg, L);
        __syncthreads();
#pragma unroll 1
        for (int u0 = 0; u0 < KDA_C * W / KDA_THREADS; u0 += PF) {
            float pn[PF]; /* the next batch (past the tile: 0, no load), in flight during this one */
            kda_prefetch(pn, dG, t0, L, h, nv, dk, c0, W, u0 + PF);
#pragma unroll
            for (int u = 0; u < PF; u++) {
                const int p = threadIdx.x + (u0 + u) * KDA_THREADS, r = p / W, a = p % W;
                if (r >= L) continue;
                const float kr = __bfloat162float(sK[r * ldk + a]);
                const float zp = s.Z[r * ldg + a];
                const size_t at = rows + (size_t)r * nv * dk + a;
                dkv[at] = s.xw[r * ldg + a] + zp;
                dG[at] = pg[u] - kr * zp;
            }
#pragma unroll
            for (int u = 0; u < PF; u++) pg[u] = pn[u];
        }
        if (threadIdx.x < L) {
            const int r = threadIdx.x;
            float sb = 0.0f;
            for (int b = 0; b < W / 32; b++) sb += sRed[r * (W / 32) + b];
            dbp[((t0 + r) * nv + h) * 2 + z] = sb;
        }
        __syncthreads();
    }
}

/* dbeta (T, nv) += dbp[., 0] + dbp[., 1]: kda_grad_wy_kernel's dXu part, then the two halves' partial sums of
 * kda_grad_wy_pairs_kernel, in that order */
__global__ void kda_dbeta_sum_kernel(float *dbeta /* (T,nv) */, const float *dbp /* (T,nv,2) */, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dbeta[i] = dbeta[i] + (dbp[2 * i] + dbp[2 * i + 1]);
}

/* dq or dk of a key head with one value head (nv = nk): kda_group_reduce_kernel's sum of one term, 0 + x (-0 to +0,
 * as the sum), rounded to bf16, so grad_qk writes it in place of the fp32 partial and the group sum is not run */
KDA_DEV bf16 kda_group_bf16(float x) {
    return __float2bfloat16_rn(__fadd_rn(0.0f, x)); /* +0 + x is not x at -0: not folded */
}

/* kda_grad_qk_kernel's shared memory (DK = dk = dv; the block's W = DK / 2 key channels; 115200 bytes at 128, two
 * blocks per SM): q, k (bf16, W channels, stride W + 2), G (fp32, W + 1); a region that holds dO and vn (bf16, all
 * dv columns, DK + 8), then a pair-sum result X (fp32, W + 1) and the scaled rows of kda_pair_rows (hi / lo, 48
 * rows, W + 8); the 16 x 16 diagonal blocks of dP (fp32, kda_diag) and all of dP in bf16 (KDA_LDP); D vn
 * (grad_dense's) and dL/dG (fp32, W + 1) */
template <int DK> struct KdaGqkSmem {
    static constexpr int W = DK / 2, LDK = DK + 8, LDB = W + 2, LDF = W + 1, LDO = W + 8;
    bf16 *q, *k, *vnb, *dout, *oh, *ol, *pb;
    float *G, *X, *dPd, *DV, *DG;
    size_t bytes;
    __host__ __device__ explicit KdaGqkSmem(void *b) {
        KdaCarve c(b);
        q = c.take<bf16>((size_t)KDA_C * LDB);
        k = c.take<bf16>((size_t)KDA_C * LDB);
        G = c.take<float>((size_t)KDA_C * LDF);
        const size_t r = c.off; /* dO and vn; after dP: X, then the scaled rows */
        dout = c.take<bf16>((size_t)KDA_C * LDK);
        vnb = c.take<bf16>((size_t)KDA_C * LDK);
        const size_t end = c.off;
        c.off = r;
        X = c.take<float>((size_t)KDA_C * LDF);
        oh = c.take<bf16>((size_t)48 * LDO);
        ol = c.take<bf16>((size_t)48 * LDO);
        if (c.off < end) c.off = end;
        dPd = c.take<float>((size_t)4 * 16 * KDA_LDD);
        pb = c.take<bf16>((size_t)KDA_C * KDA_LDP);
        DV = c.take<float>((size_t)KDA_C * LDF);
        DG = c.take<float>((size_t)KDA_C * LDF);
        bytes = c.off;
    }
};

/* Per (chunk, value head, half z of the key channels: c0 = z DK / 2, W = DK / 2 of them; every row and column below
 * local to the block's channels). dP_rj = dO_r . vn_j (tensor cores: dO and vn bf16, all dv columns, in both blocks
 * of a chunk: 64 x 64 x dv, the same bits in each); D vn and S_a . D_a read from grad_dense's buffers; the QK pairs
 * of dq (X: r the later row) and of dk (Y: r the earlier) across sub-chunks by kda_pair_rows, the diagonal blocks
 * fp32 per (r, a); then dq, dk, dL/dG and dg. Every channel's arithmetic is that of one block over all channels (the
 * pair products' column strips and k order, the loops' orders): the split changes no bit. 8 warps, two blocks per
 * SM (115200 bytes of shared memory at 128, launch bounds 2: 128 registers), so one block's loads, barriers and
 * diagonal loops overlap the other's. */
template <int DK>
__global__ void __launch_bounds__(KDA_THREADS, 2) kda_grad_qk_kernel(
    float *dqv /* (T,nv,dk) */, float *dkv /* (T,nv,dk): the WY part in, the whole per-head dk out */,
    bf16 *dq /* (T,ldq), or NULL */, bf16 *dk_out /* (T,ldq), or NULL */,
    float *dg /* (T,nv,dk): the WY part of dL/dG in, dg out */, const bf16 *q, const bf16 *k, const float *g,
    const bf16 *dout /* (T,ldo) */, const bf16 *vn /* (T,nv,dv) */,
    const float *dvd /* (T,nv,dk): grad_dense's D_a . vn_r */,
    const float *sd /* (ns,nv,dk): grad_dense's S_a . D_a */, const int32_t *starts, const int32_t *meta,
    const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldo, float scale) {
    using Sm = KdaGqkSmem<DK>;
    constexpr int dk = DK, dv = DK, W = Sm::W, LDK = Sm::LDK, ldk = Sm::LDB, ldg = Sm::LDF, ldf = Sm::LDF;
    constexpr int PF = KDA_PF / 2; /* half grad_wy's batch: 128 registers (two blocks per SM) */
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const Sm s(kda_smem);
    bf16 *sQ = s.q, *sK = s.k;
    float *sG = s.G, *sDPd = s.dPd, *sDV = s.DV, *sDG = s.DG, *sX = s.X;
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC], c0 = blockIdx.z * W;
    const int w = threadIdx.x >> 5;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        const int64_t rows = (t0 * nv + h) * (int64_t)dk + c0; /* the block's channels of the chunk's first row */
        kda_load_bf16(sQ, ldk, q + t0 * ldq + (int64_t)kh * dk + c0, ldq, W, L);
        kda_load_bf16(sK, ldk, k + t0 * ldq + (int64_t)kh * dk + c0, ldq, W, L);
        kda_load_bf16(s.dout, LDK, dout + t0 * ldo + (int64_t)h * dv, ldo, dv, L);
        kda_load_G_start(sG, ldg, g, t0, L, h, nv, dk, c0, W); /* g lands while the tiles below load */
        const bool S = !ch.reset, D = ch.leaves;
        /* sDG[r][a] = S_a . dO_r (a temporary: kda_grad_dense_kernel's, in dqv's rows of the chunk, read before
         * they are written below), sDV[r][a] = D_a . vn_r (grad_dense's); vn in bf16 */
        kda_load_rows_f32(NULL, sDG, ldg, dqv + rows, (int64_t)nv * dk, KDA_C, W, L);
        kda_load_rows_f32(NULL, sDV, ldg, D ? dvd + rows : NULL, (int64_t)nv * dk, KDA_C, W, L);
        kda_cp_rows<DK>(s.vnb, vn, t0, L, h, nv);
        kda_load_G_sum(sG, ldg, W);
        __syncthreads();
        /* dP = dO vn^T (warp w: rows 16 (w % 4), columns 32 (w / 4)), kept for j <= r < L: bf16, and the diagonal
         * blocks fp32 */
        {
            const int m0 = 16 * (w & 3), n0 = 32 * (w >> 2);
            float acc[1][4][4];
            gdn_zero(acc);
            gdn_warp_mma<1, 4, false, true, DK>(acc, s.dout, LDK, s.vnb, LDK, m0, n0);
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = m0 + gdn_frag_row(e), j = n0 + 8 * ni + gdn_frag_col(e);
                    const float x = j <= r && r < L ? acc[0][ni][e] : 0.0f;
                    if ((r >> 4) == (j >> 4)) sDPd[kda_diag(r, j)] = x;
                    s.pb[r * KDA_LDP + j] = __float2bfloat16(x);
                }
        }
        __syncthreads(); /* dO and vn are read: X and the scaled rows over them */
        /* X: the QK pairs of dq across sub-chunks; the WY part of dL/dG read meanwhile */
        float pg[PF];
        kda_prefetch(pg, dg, t0, L, h, nv, dk, c0, W, 0);
        kda_pair_rows<W, false>(sX, ldf, s.pb, sK, ldk, NULL, sG, ldg, s.oh, s.ol);
        kda_diag_rows<W, false>(sX, ldf, sDPd, sK, ldk, NULL, sG, ldg, L);
        __syncthreads();
        /* per (r, a), lanes over a: dq_r = scale gam_r (S dO_r) + sum_{j <= r} scale dP_rj k_j E_rj; the dq share of
         * dL/dG into sDG */
#pragma unroll 1
        for (int u0 = 0; u0 < KDA_C * W / KDA_THREADS; u0 += PF) {
            float pn[PF]; /* the next batch (past the tile: 0, no load), in flight during this one */
            kda_prefetch(pn, dg, t0, L, h, nv, dk, c0, W, u0 + PF);
#pragma unroll
            for (int u = 0; u < PF; u++) {
                const int p = threadIdx.x + (u0 + u) * KDA_THREADS, r = p / W, a = p % W;
                if (r >= L) continue;
                const float Gr = sG[r * ldg + a], qr = __bfloat162float(sQ[r * ldk + a]),
                            kr = __bfloat162float(sK[r * ldk + a]);
                const float gam = expf(Gr), sdiag = scale * sDPd[kda_diag(r, r)];
                const float t1 = scale * gam * sDG[r * ldg + a];
                const float X = scale * sX[r * ldf + a];
                const float dqx = t1 + X + sdiag * kr;
                if (dq) dq[(t0 + r) * ldq + (int64_t)kh * dk + c0 + a] = kda_group_bf16(dqx);
                else dqv[rows + (size_t)r * nv * dk + a] = dqx;
                sDG[r * ldg + a] = pg[u] + qr * t1 + qr * X;
            }
#pragma unroll
            for (int u = 0; u < PF; u++) pg[u] = pn[u];
        }
        __syncthreads();
        /* Y: the QK pairs of dk across sub-chunks; the WY part of dk read meanwhile */
        float pk[PF];
        kda_prefetch(pk, dkv, t0, L, h, nv, dk, c0, W, 0);
        kda_pair_rows<W, true>(sX, ldf, s.pb, sQ, ldk, NULL, sG, ldg, s.oh, s.ol);
        kda_diag_rows<W, true>(sX, ldf, sDPd, sQ, ldk, NULL, sG, ldg, L);
        __syncthreads();
        /* per (r, a): dk_r = dec_r (D vn_r) + sum_{i >= r} scale dP_ir q_i E_ir (+ the WY part); its dL/dG share */
#pragma unroll 1
        for (int u0 = 0; u0 < KDA_C * W / KDA_THREADS; u0 += PF) {
            float pn[PF]; /* the next batch (past the tile: 0, no load), in flight during this one */
            kda_prefetch(pn, dkv, t0, L, h, nv, dk, c0, W, u0 + PF);
#pragma unroll
            for (int u = 0; u < PF; u++) {
                const int p = threadIdx.x + (u0 + u) * KDA_THREADS, r = p / W, a = p % W;
                if (r >= L) continue;
                const float Gr = sG[r * ldg + a], qr = __bfloat162float(sQ[r * ldk + a]),
                            kr = __bfloat162float(sK[r * ldk + a]);
                const float dec = expf(sG[(L - 1) * ldg + a] - Gr), sdiag = scale * sDPd[kda_diag(r, r)];
                const float Y = scale * sX[r * ldf + a], dvv = sDV[r * ldg + a], kdd = kr * dec * dvv;
                const float dkx = dec * dvv + sdiag * qr + Y + pk[u];
                if (dk_out) dk_out[(t0 + r) * ldq + (int64_t)kh * dk + c0 + a] = kda_group_bf16(dkx);
                else dkv[rows + (size_t)r * nv * dk + a] = dkx;
                sDG[r * ldg + a] = sDG[r * ldg + a] - kr * Y - kdd;
                sX[r * ldf + a] = kdd; /* k_r dec_r (D vn_r) for dL/dG_{L-1} below (Y read: this thread's) */
            }
#pragma unroll
            for (int u = 0; u < PF; u++) pk[u] = pn[u];
        }
        __syncthreads();
        /* thread a: dL/dG_{L-1}[a] also gets gam_{L-1} (S_a . D_a) and sum_j k_j dec_j (D_a . vn_j) (the terms from
         * the loop above, in sX); then dg = the reverse sum of dL/dG inside the chunk (double, as the oracle) */
        if (threadIdx.x < W) {
            const int a = threadIdx.x;
            const float GL = sG[(L - 1) * ldg + a];
            float extra = 0.0f;
            if (S && D) extra = expf(GL) * sd[(ch.slot * nv + h) * (int64_t)dk + c0 + a];
            for (int j = 0; j < L; j++) extra += sX[j * ldf + a];
            double acc = (double)extra;
            for (int r = L - 1; r >= 0; r--) {
                acc += (double)sDG[r * ldg + a];
                dg[rows + (size_t)r * nv * dk + a] = (float)acc;
            }
        }
        __syncthreads();
    }
}

__global__ void kda_group_reduce_kernel(bf16 *dq /* (T,ldq) */, bf16 *dk /* (T,ldq) */, const float *dqv /* (T,nv,d) */,
                                        const float *dkv /* (T,nv,d) */, int64_t T, int nk, int nv, int d, int ldq) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = T * nk * d;
    if (i >= n) return;
    const int64_t t = i / ((int64_t)nk * d);
    const int kh = (int)(i / d % nk), a = (int)(i % d), grp = nv / nk;
    float sq = 0.0f, sk = 0.0f;
    for (int j = 0; j < grp; j++) {
        const int64_t at = (t * nv + (int64_t)kh * grp + j) * d + a;
        sq += dqv[at];
        sk += dkv[at];
    }
    dq[t * ldq + (int64_t)kh * d + a] = __float2bfloat16_rn(sq);
    dk[t * ldq + (int64_t)kh * d + a] = __float2bfloat16_rn(sk);
}
