/*
 * prep.cuh — the per-chunk factors of KDA that need the pairwise per-channel decay E_ij[c] = e^{G_i[c] - G_j[c]}
 * (j <= i, exponent <= 0; pairs j > i are never evaluated), one block per (chunk, value head):
 *
 *   kda_prep_kernel  Tinv = (I + A)^-1, A_ij = beta_i sum_c k_i[c] k_j[c] E_ij[c] (i > j), then the blocked
 *                    inverse by 16 (kda_solve: the diagonal blocks by substitution in parallel, the blocks below by
 *                    products, fixed orders). Written to tinv (T, nv, 64):
 *                    row i of the chunk at ((t0 + i) nv + h) 64, zeros right of the diagonal (cpu_kda.c's kept
 *                    layout). This is the kept buffer's prep.
 *   kda_qk_kernel    QK_rj = sum_c q_r[c] k_j[c] E_rj[c] (j <= r, else 0): <DK, false> into qk (T, nv, 64) bf16,
 *                    the same layout, the output's intra-chunk weights (rounded once as stored: the output's
 *                    operand); <DK, true> the backward state pass's
 *                    chunk-parallel factors from it instead (scale gam * q bf16, scale QK^T dO; state_pass.cuh).
 *   kda_prep_qk_kernel  the forward's: both of the above (Tinv and <DK, false>'s QK) in one pass, the same bits:
 *                    k, G and the scaled reference rows of k formed once, the diagonal blocks' decays once for
 *                    both sums, one launch. prep and qk alone remain for the kept prep (PREP_IN) and the
 *                    backward's prep.
 *
 * The pair sums P_ij = sum_c l_i[c] r_j[c] E_ij[c] (kda_pair_decay; l = k or q, r = k) in 16-row sub-chunks: for i
 * in sub-chunk b > 0 and j in an earlier one, E_ij = e^{G_i - G_ref} e^{G_ref - G_j} with G_ref = G at the
 * sub-chunk's first row 16 b, both exponents <= 0 (G falls along the chunk), so the block of P is one product of
 * decay-scaled rows, on tensor cores (the scaled rows rounded to bf16 once, one MMA, fp32 accumulation: common.cuh);
 * for the chunk that is a
 * product per reference (16, 32, 48 earlier rows). A factor that underflows to 0 bounds a true E below 1e-38.
 * The 16 x 16 blocks on the diagonal (E with both rows in one sub-chunk) stay fp32 on CUDA cores, a warp per block
 * and half its rows, a lane per channel: E as running products of the 15 one-step factors e^{G_m - G_{m-1}} <= 1
 * (15 exponentials per block and channel, not one per pair; precision: kda_pair_diag), the pairs above the
 * diagonal not visited, each term one fmaf of the rounded product, the channels summed in a fixed order
 * (kda_pair_diag: the same bits whichever sums run beside it).
 * Rows >= L are zero. Templates on DK = dk. Part of kda.cu.
 */
#pragma once

/* shared memory of both (DK = dk): G fp32 (64, DK); l, r raw bf16 (64, DK + 8); the decay-scaled l (bf16, 64 rows)
 * and r (bf16, 96 rows: 16, 32, 48 rows for the references of sub-chunks 1, 2, 3); the 64 x 64 fp32 pair sums A;
 * beta. PREP (kda_prep_kernel): l = r = k, one tile, and Tinv (64 x 64 fp32) over the scaled r rows, dead after the
 * pair sums: 108 KB at DK = 128; else (kda_qk_kernel) l = q and r = k apart, and A itself over the scaled r rows
 * (kda_pair_decay writes it after a barrier that ends their reads): 109 KB. Both two blocks per SM. */
template <int DK, bool PREP> struct KdaPairSmem {
    static constexpr int LDK = DK + 8, NR = 96;
    float *G, *A, *T, *beta;
    bf16 *l, *r, *ls, *rs;
    size_t bytes;
    __host__ __device__ explicit KdaPairSmem(void *b) {
        KdaCarve c(b);
        G = c.take<float>((size_t)KDA_C * DK);
        A = PREP ? c.take<float>((size_t)KDA_C * KDA_LDT) : NULL;
        beta = c.take<float>(KDA_C);
        l = c.take<bf16>((size_t)KDA_C * LDK);
        r = PREP ? l : c.take<bf16>((size_t)KDA_C * LDK);
        ls = c.take<bf16>((size_t)KDA_C * LDK);
        const size_t nrs = (size_t)NR * LDK * sizeof(bf16), nt = (size_t)KDA_C * KDA_LDT * sizeof(float);
        rs = (bf16 *)c.take<unsigned char>(nrs > nt ? nrs : nt);
        T = PREP ? (float *)rs : NULL; /* prep: Tinv over the scaled rows */
        if (!PREP) A = (float *)rs;    /* qk: A over them */
        bytes = c.off;
    }
};

/* the first row of sub-chunk b's r segment (b = 1, 2, 3: rows j < 16 b scaled by e^{G_16b - G_j}) */
KDA_DEV int kda_rseg(int b) { return b == 1 ? 0 : b == 2 ? 16 : 48; }

/* The pieces of the pair sums (kda_pair_decay for prep and qk alone, kda_prep_qk_kernel for both at once: the same
 * arithmetic per entry, so the same bits either way). Row strides: l, r, k, q and their scaled rows DK + 8. */

/* four channels [c, c + 4) of a bf16 row x scaled by e^{G_hi - G_lo} (fp32 exponent <= 0, one rounding to bf16)
 * into y: 8-byte bf16 and 16-byte fp32 shared accesses, consecutive lanes on consecutive addresses (no bank
 * conflict; eight channels a lane would put a warp's 16-byte G loads 32 bytes apart: two-way), the same arithmetic
 * per element as one at a time */
KDA_DEV void kda_scale4(bf16 *y, const bf16 *x, const float *ghi, const float *glo) {
    bf16 xb[4], yb[4];
    const uint2 xr = *(const uint2 *)x;
    memcpy(xb, &xr, sizeof xr);
    const float4 h4 = *(const float4 *)ghi, l4 = *(const float4 *)glo;
    const float hi[4] = {h4.x, h4.y, h4.z, h4.w}, lo[4] = {l4.x, l4.y, l4.z, l4.w};
#pragma unroll
    for (int e = 0; e < 4; e++) yb[e] = __float2bfloat16(__bfloat162float(xb[e]) * expf(hi[e] - lo[e]));
    uint2 yr;
    memcpy(&yr, yb, sizeof yr);
    *(uint2 *)y = yr;
}

/* the decay-scaled r rows of the references of sub-chunks 1, 2, 3 (rs, 96 rows: kda_rseg): r_j e^{G_16b - G_j},
 * four channels a thread (kda_scale4) */
template <int DK> KDA_DEV void kda_pair_scale_r(const float *G, const bf16 *r, bf16 *rs) {
    constexpr int LDK = DK + 8, CPR = DK / 4;
    for (int i = threadIdx.x; i < 96 * CPR; i += KDA_THREADS) {
        const int q = i / CPR, c = (i % CPR) * 4;
        const int b = q < 16 ? 1 : q < 48 ? 2 : 3, j = q - kda_rseg(b);
        kda_scale4(rs + q * LDK + c, r + j * LDK + c, G + 16 * b * DK + c, G + j * DK + c);
    }
}

/* the decay-scaled l rows: ls_i = l_i e^{G_i - G_16(i/16)}, four channels a thread (kda_scale4); ls may be l (in
 * place: one thread reads and writes an element) */
template <int DK> KDA_DEV void kda_pair_scale_l(const float *G, const bf16 *l, bf16 *ls) {
    constexpr int LDK = DK + 8, CPR = DK / 4;
    for (int i = threadIdx.x; i < KDA_C * CPR; i += KDA_THREADS) {
        const int row = i / CPR, c = (i % CPR) * 4, ref = row & ~15;
        kda_scale4(ls + row * LDK + c, l + row * LDK + c, G + row * DK + c, G + ref * DK + c);
    }
}

/* tile t of the six 16 x 16 column pairs below the diagonal blocks ((b, n0) = (1, 0), (2, 0), (2, 16), (3, 0),
 * (3, 16), (3, 32)): one warp's product of the scaled rows (tensor cores), then its store: P[i ld + j] for rows
 * i < rows (0 where i >= L) */
/* a pair-sum entry into its tile: fp32 (the shared-memory A) or bf16 (QK in the workspace: the output reads it as a
 * bf16 operand, so the value rounded here is the one it read rounded from fp32) */
KDA_DEV void kda_pair_put(float *p, float x) { *p = x; }
KDA_DEV void kda_pair_put(bf16 *p, float x) { *p = __float2bfloat16(x); }

KDA_DEV int kda_pair_tile_b(int t) { return t == 0 ? 1 : t < 3 ? 2 : 3; }
KDA_DEV int kda_pair_tile_n0(int t) { return 16 * (t == 0 ? 0 : t < 3 ? t - 1 : t - 3); }
template <int DK> KDA_DEV void kda_pair_tile(float (&acc)[1][2][4], const bf16 *ls, const bf16 *rs, int t) {
    constexpr int LDK = DK + 8;
    const int b = kda_pair_tile_b(t);
    gdn_zero(acc);
    gdn_warp_mma<1, 2, false, true, DK>(acc, ls, LDK, rs + kda_rseg(b) * LDK, LDK, 16 * b, kda_pair_tile_n0(t));
}
template <class TP>
KDA_DEV void kda_pair_tile_store(const float (&acc)[1][2][4], TP *P, int64_t ld, int t, int rows, int L) {
    const int b = kda_pair_tile_b(t), n0 = kda_pair_tile_n0(t);
#pragma unroll
    for (int ni = 0; ni < 2; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = 16 * b + gdn_frag_row(e), j = n0 + 8 * ni + gdn_frag_col(e);
            if (i < rows) kda_pair_put(&P[i * ld + j], i < L ? acc[0][ni][e] : 0.0f);
        }
}

/* the 16 values v[0..15] of every lane summed over the warp, scattered: afterwards lane l holds the sum of index
 * kda_scatter_idx(l) in v[0] (the pair of lanes l, l ^ 1 the same). Halving exchanges (16 shuffles, not 80): at
 * each step a lane keeps the half of its values its lane bit selects and adds the partner's copy of that half.
 * The order of the adds is fixed: the same bits every call. */
KDA_DEV int kda_scatter_idx(int lane) {
    return ((lane >> 4) & 1) * 8 + ((lane >> 3) & 1) * 4 + ((lane >> 2) & 1) * 2 + ((lane >> 1) & 1);
}
template <int N> KDA_DEV void kda_scatter_step(float (&v)[16], int lane) {
    const bool hi = lane & (2 * N);
#pragma unroll
    for (int i = 0; i < N; i++) {
        const float send = hi ? v[i] : v[i + N], keep = hi ? v[i + N] : v[i];
        v[i] = keep + __shfl_xor_sync(KDA_FULL, send, 2 * N);
    }
}
KDA_DEV void kda_warp_scatter16(float (&v)[16]) {
    const int lane = threadIdx.x & 31;
    kda_scatter_step<8>(v, lane);
    kda_scatter_step<4>(v, lane);
    kda_scatter_step<2>(v, lane);
    kda_scatter_step<1>(v, lane);
    v[0] += __shfl_xor_sync(KDA_FULL, v[0], 1);
}

/* the diagonal 16 x 16 blocks, fp32 on CUDA cores. Warp w takes block b = w / 2 and the rows m of it with
 * ((m + 1) / 2) % 2 == w % 2 (68 pairs each: rows 0, 3, 4, 7, ... and 1, 2, 5, 6, ...); lane l the channels
 * c = l + 32 k. Per channel the 15 one-step factors e_m = e^{G_{16b+m}[c] - G_{16b+m-1}[c]} once into registers
 * (15 exponentials per block, channel and warp instead of one per pair: 120), then for row i = 16 b + m every
 * E_ij = e_m e_{m-1} ... e_{j+1} as a running product outward from the diagonal (E_ii = 1). Precision: G falls
 * along the chunk, so every factor and every partial product is <= 1 (no overflow; an underflow to 0 bounds the
 * true E below 1e-38, as the single exponential's would), and a product of up to 15 rounded factors carries a
 * relative error of at most ~15 ulp (2^-20), far inside the bf16 operands' 2^-8 and the emulation's bounds.
 * Per pair and channel one term fmaf(a_i[c] r_j[c], E_ij[c], acc) (the rounded product, as before), the channels
 * in the order k, then the lanes (kda_warp_scatter16): a sum's bits do not depend on which sums run beside it.
 * DOA: A_ij = sum_c (la_i[c] r_j[c]) E_ij[c] into PA (stride KDA_LDT, j < i, every row: 0 where i >= L); DOQ:
 * QK_ij = sum_c (lq_i[c] r_j[c]) E_ij[c] into PQ (stride ldq, j <= i, rows i < qrows: 0 where i >= L). The pairs
 * above the diagonal are not visited. All threads, no barrier. */
template <int DK, bool DOA, bool DOQ, class TQ>
KDA_DEV void kda_pair_diag(const float *G, const bf16 *la, const bf16 *lq, const bf16 *r, float *PA, TQ *PQ,
                           int64_t ldq, int qrows, int L) {
    constexpr int LDK = DK + 8, NK = DK / 32;
    static_assert(KDA_THREADS == 256 && DK % 32 == 0, "kda_pair_diag: 8 warps, 4 blocks x 2 row sets");
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, b = w >> 1, half = w & 1, r0 = 16 * b;
    float e[NK][16]; /* e[k][m] = e_m at channel lane + 32 k (m >= 1; past row L - 1 never used) */
#pragma unroll
    for (int k = 0; k < NK; k++) {
        const int c = lane + 32 * k;
#pragma unroll
        for (int m = 1; m < 16; m++) e[k][m] = expf(G[(r0 + m) * DK + c] - G[(r0 + m - 1) * DK + c]);
    }
    const int idx = kda_scatter_idx(lane);
#pragma unroll
    for (int m = 0; m < 16; m++) {
        if ((((m + 1) >> 1) & 1) != half) continue; /* warp-uniform */
        const int i = r0 + m;
        float xa[16], xq[16];
#pragma unroll
        for (int j = 0; j < 16; j++) xa[j] = xq[j] = 0.0f;
        if (i < L) { /* warp-uniform; rows >= L: zeros */
#pragma unroll
            for (int k = 0; k < NK; k++) {
                const int c = lane + 32 * k;
                const float a = DOA ? __bfloat162float(la[i * LDK + c]) : 0.0f;
                const float q = DOQ ? __bfloat162float(lq[i * LDK + c]) : 0.0f;
                float E = 1.0f;
#pragma unroll
                for (int j = m; j >= 0; j--) { /* E = E_{i, r0 + j} */
                    if (j < m) E *= e[k][j + 1];
                    const float rc = __bfloat162float(r[(r0 + j) * LDK + c]);
                    if (DOA && j < m) xa[j] = fmaf(a * rc, E, xa[j]);
                    if (DOQ) xq[j] = fmaf(q * rc, E, xq[j]);
                }
            }
        }
        if (DOA) kda_warp_scatter16(xa);
        if (DOQ) kda_warp_scatter16(xq);
        if ((lane & 1) == 0 && idx <= m) {
            if (DOA && idx < m) PA[i * KDA_LDT + r0 + idx] = xa[0];
            if (DOQ && i < qrows) kda_pair_put(&PQ[i * ldq + r0 + idx], xq[0]);
        }
    }
}

/* the zeros of a pair-sum tile: entries right of the diagonal blocks and, in them, j >= i (DIAG: j > i); rows
 * i < rows */
template <bool DIAG, class TP> KDA_DEV void kda_pair_zero(TP *P, int64_t ld, int rows) {
    for (int p = threadIdx.x; p < rows * KDA_C; p += KDA_THREADS) {
        const int i = p / KDA_C, j = p % KDA_C;
        if ((j >> 4) > (i >> 4) || ((j >> 4) == (i >> 4) && (DIAG ? j > i : j >= i)))
            kda_pair_put(&P[i * ld + j], 0.0f);
    }
}

/* P[i][j] (row stride KDA_LDT) = sum_c l_i[c] r_j[c] E_ij[c] for j < i (DIAG: j <= i) and i < L, else 0, from s.G,
 * s.l, s.r (rows >= L zero, synchronised before the call). Warps 0..5 the six tiles below the diagonal blocks;
 * then every warp the diagonal blocks' pairs (kda_pair_diag) and every thread the zeros (disjoint entries: no
 * barrier between them). All threads; ends synchronised. */
template <int DK, bool DIAG, bool PREP> KDA_DEV void kda_pair_decay(const KdaPairSmem<DK, PREP> &s, float *P, int L) {
    kda_pair_scale_l<DK>(s.G, s.l, s.ls);
    kda_pair_scale_r<DK>(s.G, s.r, s.rs);
    __syncthreads();
    const int w = threadIdx.x >> 5;
    float acc[1][2][4];
    if (w < 6) kda_pair_tile<DK>(acc, s.ls, s.rs, w);
    if (!PREP) __syncthreads(); /* P (qk's A) lies over the scaled r rows: every warp's reads of them are done */
    if (w < 6) kda_pair_tile_store(acc, P, KDA_LDT, w, KDA_C, L);
    if (DIAG) kda_pair_diag<DK, false, true, float>(s.G, NULL, s.l, s.r, NULL, P, KDA_LDT, KDA_C, L);
    else kda_pair_diag<DK, true, false, float>(s.G, s.l, NULL, s.r, P, NULL, 0, 0, L);
    kda_pair_zero<DIAG>(P, KDA_LDT, KDA_C);
    __syncthreads();
}

/* rows [0, 64) x DK of a bf16 matrix (row t at src + t ld) into a tile of row stride DK + 8; rows >= L read 0;
 * asynchronous (kda_load_bf16) */
template <int DK> KDA_DEV void kda_load_rows(bf16 *s, const bf16 *src, int64_t ld, int L) {
    kda_load_bf16(s, DK + 8, src, ld, DK, L);
}

/* Tinv = (I + A)^-1 (unit lower triangular, fp32) into sT (row stride KDA_LDT) from the strictly lower A (stride
 * KDA_LDT), blocked by 16 (gdn/common.cuh's gdn_solve on 256 threads): the four diagonal blocks by forward
 * substitution, one thread per (block, column), T_ic = [i == c] - sum_{j < i} A_ij T_jc, in parallel; then the
 * blocks below by distance d = bi - bj from the diagonal, d = 1, 2, 3: X = sum_{kb = bj}^{bi - 1} A_{bi kb} T_{kb bj}
 * (k in order, one thread per entry), T_{bi bj} = -T_{bi bi} X. Serial steps: 16 rows, then three levels of two
 * 16-long dot products, instead of 64 dependent rows. sX: (3, 16, 17) scratch. All threads; ends synchronised. */
#define KDA_SOLVE_SCRATCH (3 * 16 * 17)
KDA_DEV void kda_solve(float *sT, float *sX, const float *sA) {
    const int tid = threadIdx.x;
    for (int i = tid; i < KDA_C * KDA_C; i += KDA_THREADS) sT[(i / KDA_C) * KDA_LDT + i % KDA_C] = 0.0f;
    __syncthreads();
    if (tid < KDA_C) {
        const int o = 16 * (tid >> 4), c = tid & 15;
        float tc[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            float x = i == c ? 1.0f : 0.0f;
#pragma unroll
            for (int j = 0; j < i; j++) x = fmaf(-sA[(o + i) * KDA_LDT + o + j], tc[j], x);
            tc[i] = x;
            sT[(o + i) * KDA_LDT + o + c] = x;
        }
    }
    __syncthreads();
#pragma unroll 1
    for (int d = 1; d < 4; d++) {
        const int n = (4 - d) * 256; /* the 16 x 16 entries of the 4 - d blocks at this distance */
        for (int e = tid; e < n; e += KDA_THREADS) {
            const int bi = d + (e >> 8), bj = bi - d, r = (e >> 4) & 15, cc = e & 15;
            const float *arow = sA + (16 * bi + r) * KDA_LDT;
            float x = 0.0f;
#pragma unroll 1
            for (int kb = bj; kb < bi; kb++) {
                const float *ak = arow + 16 * kb, *tk = sT + 16 * kb * KDA_LDT + 16 * bj + cc;
#pragma unroll
                for (int m = 0; m < 16; m++) x = fmaf(ak[m], tk[m * KDA_LDT], x);
            }
            sX[(e >> 8) * 272 + r * 17 + cc] = x;
        }
        __syncthreads();
        for (int e = tid; e < n; e += KDA_THREADS) {
            const int bi = d + (e >> 8), bj = bi - d, r = (e >> 4) & 15, cc = e & 15;
            const float *trow = sT + (16 * bi + r) * KDA_LDT + 16 * bi, *xb = sX + (e >> 8) * 272;
            float t = 0.0f;
#pragma unroll
            for (int m = 0; m < 16; m++) t = fmaf(trow[m], xb[m * 17 + cc], t);
            sT[(16 * bi + r) * KDA_LDT + 16 * bj + cc] = -t;
        }
        __syncthreads();
    }
}

template <int DK>
__global__ void __launch_bounds__(KDA_THREADS, 2) kda_prep_kernel(
    float *tinv /* (T,nv,64) */, const bf16 *k, const float *g, const float *beta, const int32_t *starts,
    const int32_t *meta, const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq) {
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const KdaPairSmem<DK, true> s(kda_smem);
    float *sA = s.A, *sT = s.T;
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC];
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        kda_load_rows<DK>(s.l, k + ch.t0 * ldq + (int64_t)kh * DK, ldq, L); /* l = r = k */
        kda_load_G(s.G, DK, g, ch.t0, L, h, nv, DK); /* waits for the rows too */
        if (threadIdx.x < KDA_C) s.beta[threadIdx.x] = threadIdx.x < L ? beta[(ch.t0 + threadIdx.x) * nv + h] : 0.0f;
        __syncthreads();
        /* A_ij = beta_i sum_c k_i[c] k_j[c] E_ij[c] for j < i < L */
        kda_pair_decay<DK, false, true>(s, sA, L);
        for (int p = threadIdx.x; p < KDA_C * KDA_C; p += KDA_THREADS)
            sA[p / KDA_C * KDA_LDT + p % KDA_C] *= s.beta[p / KDA_C];
        __syncthreads();
        static_assert(KDA_SOLVE_SCRATCH * sizeof(float) <= KDA_C * (DK + 8) * sizeof(bf16), "prep: solve scratch");
        kda_solve(sT, (float *)s.ls, sA); /* ls, rs (under sT) are dead after the pair sums */
        for (int p = threadIdx.x; p < L * KDA_C; p += KDA_THREADS) {
            const int i = p / KDA_C, j = p % KDA_C;
            tinv[((ch.t0 + i) * nv + h) * (int64_t)KDA_C + j] = sT[i * KDA_LDT + j];
        }
        __syncthreads();
    }
}

/* the forward's prep and qk in one pass (kda_prep_qk_kernel): both read the chunk's k, G and the scaled k rows of
 * the references; q (bf16, 64 x (DK + 8)) beside k. Order: the scaled r rows and the diagonal blocks (both sums,
 * one set of decays) from the raw rows, then the scaled l rows in place over k and q, the twelve tiles, the
 * solve with Tinv over the scaled r rows and its scratch over k. G 32 KB + A 16.3 KB + k, q 17 KB each + rs
 * 25.5 KB: 108 KB at DK = 128, two blocks per SM. */
template <int DK> struct KdaPrepQkSmem {
    static constexpr int LDK = DK + 8;
    float *G, *A, *T, *beta;
    bf16 *k, *q, *rs;
    size_t bytes;
    __host__ __device__ explicit KdaPrepQkSmem(void *b) {
        KdaCarve c(b);
        G = c.take<float>((size_t)KDA_C * DK);
        A = c.take<float>((size_t)KDA_C * KDA_LDT);
        beta = c.take<float>(KDA_C);
        k = c.take<bf16>((size_t)KDA_C * LDK);
        q = c.take<bf16>((size_t)KDA_C * LDK);
        const size_t nrs = (size_t)96 * LDK * sizeof(bf16), nt = (size_t)KDA_C * KDA_LDT * sizeof(float);
        rs = (bf16 *)c.take<unsigned char>(nrs > nt ? nrs : nt);
        T = (float *)rs; /* Tinv over the scaled r rows, dead after the tiles */
        bytes = c.off;
    }
};

/* kda_prep_kernel's Tinv (into tinv) and kda_qk_kernel<DK, false>'s QK (into qk) of each chunk in one block: the
 * same bits as the two (kda_pair_decay's pieces, the same arithmetic per entry), one load of k and G, one cumsum,
 * the scaled r rows formed once, the diagonal blocks' decays once for both sums. QK straight to qk (rows < L) from
 * the tiles' fragments and the diagonal blocks' lanes. Warps: the twelve tiles (six of A, six of QK), warp
 * w tiles w and w + 8. */
template <int DK>
__global__ void __launch_bounds__(KDA_THREADS, 2) kda_prep_qk_kernel(
    float *tinv /* (T,nv,64) */, bf16 *qk /* (T,nv,64) */, const bf16 *q, const bf16 *k, const float *g,
    const float *beta, const int32_t *starts, const int32_t *meta, const int32_t *doc_pos, int64_t T, int nk, int nv,
    int ldq) {
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const KdaPrepQkSmem<DK> s(kda_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC], w = threadIdx.x >> 5;
    const int64_t ldqk = (int64_t)nv * KDA_C;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        bf16 *qkc = qk + (t0 * nv + h) * (int64_t)KDA_C; /* row i at qkc + i ldqk */
        kda_load_rows<DK>(s.k, k + t0 * ldq + (int64_t)kh * DK, ldq, L);
        kda_load_rows<DK>(s.q, q + t0 * ldq + (int64_t)kh * DK, ldq, L);
        kda_load_G(s.G, DK, g, t0, L, h, nv, DK); /* waits for the rows too */
        if (threadIdx.x < KDA_C) s.beta[threadIdx.x] = threadIdx.x < L ? beta[(t0 + threadIdx.x) * nv + h] : 0.0f;
        __syncthreads();
        kda_pair_scale_r<DK>(s.G, s.k, s.rs);
        kda_pair_diag<DK, true, true, bf16>(s.G, s.k, s.q, s.k, s.A, qkc, ldqk, L, L);
        kda_pair_zero<false>(s.A, KDA_LDT, KDA_C);
        kda_pair_zero<true>(qkc, ldqk, L);
        __syncthreads(); /* the raw rows' reads are done */
        kda_pair_scale_l<DK>(s.G, s.k, s.k);
        kda_pair_scale_l<DK>(s.G, s.q, s.q);
        __syncthreads();
#pragma unroll 1
        for (int t = w; t < 12; t += KDA_THREADS / 32) {
            float acc[1][2][4];
            if (t < 6) {
                kda_pair_tile<DK>(acc, s.k, s.rs, t);
                kda_pair_tile_store(acc, s.A, KDA_LDT, t, KDA_C, L);
            } else {
                kda_pair_tile<DK>(acc, s.q, s.rs, t - 6);
                kda_pair_tile_store(acc, qkc, ldqk, t - 6, L, L);
            }
        }
        __syncthreads();
        /* A_ij = beta_i sum_c k_i[c] k_j[c] E_ij[c] for j < i < L; then as kda_prep_kernel */
        for (int p = threadIdx.x; p < KDA_C * KDA_C; p += KDA_THREADS)
            s.A[p / KDA_C * KDA_LDT + p % KDA_C] *= s.beta[p / KDA_C];
        __syncthreads();
        static_assert(KDA_SOLVE_SCRATCH * sizeof(float) <= KDA_C * (DK + 8) * sizeof(bf16), "prep_qk: solve scratch");
        kda_solve(s.T, (float *)s.k, s.A);
        for (int p = threadIdx.x; p < L * KDA_C; p += KDA_THREADS) {
            const int i = p / KDA_C, j = p % KDA_C;
            tinv[((t0 + i) * nv + h) * (int64_t)KDA_C + j] = s.T[i * KDA_LDT + j];
        }
        __syncthreads();
    }
}

/* kda_qk_kernel<DK, true>'s work for one chunk after QK is in s.A (synchronised): gq and P (below) */
template <int DK>
KDA_DEV void kda_qk_bwd_chunk(const KdaPairSmem<DK, false> &s, bf16 *gq, float *p, const bf16 *dout, int64_t t0, int L,
                              int h, int nv, int ldo, float scale) {
    constexpr int LDK = KdaPairSmem<DK, false>::LDK, LDT = KDA_C + 8, DV = DK;
    const int w = threadIdx.x >> 5, mt = w & 3, half = w >> 2;
    /* gq (q in s.l); dO over k (s.r); scale QK in bf16 over the scaled l rows (s.ls, row stride LDT) */
    for (int i = threadIdx.x; i < L * (DK / 4); i += KDA_THREADS) { /* four channels a step (as kda_scale4) */
        const int r = i / (DK / 4), a = (i % (DK / 4)) * 4;
        bf16 qb[4], ob[4];
        const uint2 qr = *(const uint2 *)&s.l[r * LDK + a];
        memcpy(qb, &qr, sizeof qr);
        const float4 g4 = *(const float4 *)&s.G[r * DK + a];
        const float gr[4] = {g4.x, g4.y, g4.z, g4.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float gam = expf(gr[e]), qv = __bfloat162float(qb[e]);
            ob[e] = __float2bfloat16(scale * gam * qv);
        }
        uint2 o;
        memcpy(&o, ob, sizeof o);
        *(uint2 *)&gq[((t0 + r) * nv + h) * (int64_t)DK + a] = o;
    }
    kda_load_rows<DV>(s.r, dout + t0 * ldo + (int64_t)h * DV, ldo, L);
    for (int i = threadIdx.x; i < KDA_C * KDA_C; i += KDA_THREADS) {
        const int r = i / KDA_C, j = i % KDA_C;
        s.ls[r * LDT + j] = __float2bfloat16(scale * s.A[r * KDA_LDT + j]);
    }
    kda_load_wait();
    __syncthreads();
    float acc[1][DV / 16][4];
    gdn_zero(acc);
    gdn_warp_mma<1, DV / 16, true, false, KDA_C>(acc, s.ls, LDT, s.r, LDK, 16 * mt, half * (DV / 2));
#pragma unroll
    for (int ni = 0; ni < DV / 16; ni++)
#pragma unroll
        for (int e = 0; e < 4; e += 2) { /* elements e, e + 1: adjacent columns, one 8-byte store (a row's 8 columns
                                          * of a fragment one whole 32-byte sector) */
            const int j = 16 * mt + gdn_frag_row(e), cc = half * (DV / 2) + 8 * ni + gdn_frag_col(e);
            if (j < L)
                *(float2 *)&p[((t0 + j) * nv + h) * (int64_t)DV + cc] = make_float2(acc[0][ni][e], acc[0][ni][e + 1]);
        }
    __syncthreads();
}

/* QK of the chunk (kda_pair_decay<DK, true>); !BWD: into qk (the output's weights). BWD: the backward state pass's
 * chunk-parallel factors instead (nothing into qk): gq = scale gam_r * q_r (T, nv, dk) bf16, and
 * p = scale QK^T dO (T, nv, dv) fp32, P_j = scale sum_{r >= j} QK_rj dO_r, on tensor cores (scale QK rounded to
 * bf16, dO bf16: warp w rows [16 (w % 4), +16) and half w / 4 of the columns). Rows >= L not written. */
template <int DK, bool BWD>
__global__ void __launch_bounds__(KDA_THREADS, 2) kda_qk_kernel(
    bf16 *qk /* (T,nv,64) */, bf16 *gq /* (T,nv,dk) */, float *p /* (T,nv,dv) */, const bf16 *q, const bf16 *k,
    const float *g, const bf16 *dout /* (T,ldo) */, const int32_t *starts, const int32_t *meta, const int32_t *doc_pos,
    int64_t T, int nk, int nv, int ldq, int ldo, float scale) {
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const KdaPairSmem<DK, false> s(kda_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC];
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        kda_load_rows<DK>(s.l, q + t0 * ldq + (int64_t)kh * DK, ldq, L);
        kda_load_rows<DK>(s.r, k + t0 * ldq + (int64_t)kh * DK, ldq, L);
        kda_load_G(s.G, DK, g, t0, L, h, nv, DK); /* waits for the rows too */
        __syncthreads();
        kda_pair_decay<DK, true, false>(s, s.A, L);
        if (!BWD) {
            for (int i = threadIdx.x; i < L * KDA_C; i += KDA_THREADS) {
                const int r = i / KDA_C, j = i % KDA_C;
                qk[((t0 + r) * nv + h) * (int64_t)KDA_C + j] = __float2bfloat16(s.A[r * KDA_LDT + j]);
            }
            __syncthreads();
        } else {
            kda_qk_bwd_chunk<DK>(s, gq, p, dout, t0, L, h, nv, ldo, scale);
        }
    }
}
