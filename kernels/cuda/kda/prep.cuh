/*
 * prep.cuh — the per-chunk factors of KDA that need the pairwise per-channel decay E_ij[c] = e^{G_i[c] - G_j[c]}
 * (j <= i, exponent <= 0; pairs j > i are never evaluated), one block per (chunk, value head):
 *
 *   kda_prep_kernel  Tinv = (I + A)^-1, A_ij = beta_i sum_c k_i[c] k_j[c] E_ij[c] (i > j), then the blocked
 *                    inverse by 16 (kda_solve: the diagonal blocks by substitution in parallel, the blocks below by
 *                    products, fixed orders). Written to tinv (T, nv, 64):
 *                    row i of the chunk at ((t0 + i) nv + h) 64, zeros right of the diagonal (cpu_kda.c's kept
 *                    layout). This is the kept buffer's prep.
 *   kda_qk_kernel    QK_rj = sum_c q_r[c] k_j[c] E_rj[c] (j <= r, else 0): <DK, false> into qk (T, nv, 64), the
 *                    same layout, the output's intra-chunk weights; <DK, true> the backward state pass's
 *                    chunk-parallel factors from it instead (scale gam * q bf16, scale QK^T dO; state_pass.cuh).
 *
 * The pair sums P_ij = sum_c l_i[c] r_j[c] E_ij[c] (kda_pair_decay; l = k or q, r = k) in 16-row sub-chunks: for i
 * in sub-chunk b > 0 and j in an earlier one, E_ij = e^{G_i - G_ref} e^{G_ref - G_j} with G_ref = G at the
 * sub-chunk's first row 16 b, both exponents <= 0 (G falls along the chunk), so the block of P is one product of
 * decay-scaled rows, on tensor cores (the scaled rows rounded to bf16 once, one MMA, fp32 accumulation: common.cuh);
 * for the chunk that is a
 * product per reference (16, 32, 48 earlier rows). A factor that underflows to 0 bounds a true E below 1e-38.
 * The 16 x 16 blocks on the diagonal (E with both rows in one sub-chunk) stay fp32 on CUDA cores, four lanes per
 * pair below the diagonal (the pairs above it not visited), a loop over the channels (no bank conflicts on G).
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

/* P[i][j] (row stride KDA_LDT) = sum_c l_i[c] r_j[c] E_ij[c] for j < i (DIAG: j <= i) and i < L, else 0, from s.G,
 * s.l, s.r (rows >= L zero, synchronised before the call). Warps 0..5 the six 16 x 16 column pairs below the
 * diagonal blocks ((b, n0) = (1, 0), (2, 0), (2, 16), (3, 0), (3, 16), (3, 32)); then every warp the diagonal
 * blocks' pairs and every thread the zeros. All threads; ends synchronised. */
template <int DK, bool DIAG, bool PREP> KDA_DEV void kda_pair_decay(const KdaPairSmem<DK, PREP> &s, float *P, int L) {
    constexpr int LDK = KdaPairSmem<DK, PREP>::LDK;
    for (int i = threadIdx.x; i < KDA_C * DK; i += KDA_THREADS) {
        const int row = i / DK, c = i % DK, ref = row & ~15;
        const float x = __bfloat162float(s.l[row * LDK + c]) * expf(s.G[i] - s.G[ref * DK + c]);
        s.ls[row * LDK + c] = __float2bfloat16(x);
    }
    for (int i = threadIdx.x; i < KdaPairSmem<DK, PREP>::NR * DK; i += KDA_THREADS) {
        const int q = i / DK, c = i % DK;
        const int b = q < 16 ? 1 : q < 48 ? 2 : 3, j = q - kda_rseg(b);
        const float x = __bfloat162float(s.r[j * LDK + c]) * expf(s.G[16 * b * DK + c] - s.G[j * DK + c]);
        s.rs[q * LDK + c] = __float2bfloat16(x);
    }
    __syncthreads();
    const int w = threadIdx.x >> 5;
    const int b = w == 0 ? 1 : w < 3 ? 2 : 3, n0 = 16 * (w == 0 ? 0 : w < 3 ? w - 1 : w - 3);
    float acc[1][2][4];
    gdn_zero(acc);
    if (w < 6) gdn_warp_mma<1, 2, false, true, DK>(acc, s.ls, LDK, s.rs + kda_rseg(b) * LDK, LDK, 16 * b, n0);
    if (!PREP) __syncthreads(); /* P (qk's A) lies over the scaled r rows: every warp's reads of them are done */
    if (w < 6) {
#pragma unroll
        for (int ni = 0; ni < 2; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = 16 * b + gdn_frag_row(e), j = n0 + 8 * ni + gdn_frag_col(e);
                P[i * KDA_LDT + j] = i < L ? acc[0][ni][e] : 0.0f;
            }
    }
    /* the diagonal blocks: only their pairs j < i (DIAG: j <= i), NPB per block, four lanes per pair (a quad of the
     * warp), lane q of the quad taking the channels c = q (mod 4) in the order (lane + 4 cc) mod DK (the 32 lanes of
     * a warp read 32 distinct banks of G and the rows), the quad's partial sums added by a fixed butterfly; pairs
     * with i >= L are 0. Every other entry of the diagonal blocks and those right of them: 0 (disjoint entries: no
     * barrier between the two). */
    constexpr int NPB = DIAG ? 136 : 120, NP = 4 * NPB;
    const int lane = threadIdx.x & 31;
    for (int e = w * 8; e < NP; e += 8 * (KDA_THREADS / 32)) { /* warp-uniform trip count: shuffles below */
        const int pe = e + (lane >> 2), b = pe / NPB, idx = pe % NPB;
        /* row ii of a block holds ii + 1 pairs (DIAG) or ii: the triangular index inverted (exact: small ints) */
        const int ii = DIAG ? (int)((sqrtf(8.0f * idx + 1.0f) - 1.0f) * 0.5f)
                            : (int)((sqrtf(8.0f * idx + 1.0f) + 1.0f) * 0.5f);
        const int jj = idx - (DIAG ? ii * (ii + 1) / 2 : ii * (ii - 1) / 2);
        const int i = 16 * b + ii, j = 16 * b + jj;
        float x = 0.0f;
        if (pe < NP && i < L) {
            const bf16 *li = s.l + i * LDK, *rj = s.r + j * LDK;
            const float *Gi = s.G + i * DK, *Gj = s.G + j * DK;
#pragma unroll 4
            for (int cc = 0; cc < DK / 4; cc++) {
                const int c = (lane + 4 * cc) & (DK - 1);
                x += __bfloat162float(li[c]) * __bfloat162float(rj[c]) * expf(Gi[c] - Gj[c]);
            }
        }
        x += __shfl_xor_sync(KDA_FULL, x, 1);
        x += __shfl_xor_sync(KDA_FULL, x, 2);
        if (pe < NP && (lane & 3) == 0) P[i * KDA_LDT + j] = x;
    }
    for (int p = threadIdx.x; p < KDA_C * KDA_C; p += KDA_THREADS) {
        const int i = p / KDA_C, j = p % KDA_C;
        if ((j >> 4) > (i >> 4) || ((j >> 4) == (i >> 4) && (DIAG ? j > i : j >= i))) P[i * KDA_LDT + j] = 0.0f;
    }
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

/* kda_qk_kernel<DK, true>'s work for one chunk after QK is in s.A (synchronised): gq and P (below) */
template <int DK>
KDA_DEV void kda_qk_bwd_chunk(const KdaPairSmem<DK, false> &s, bf16 *gq, float *p, const bf16 *dout, int64_t t0, int L,
                              int h, int nv, int ldo, float scale) {
    constexpr int LDK = KdaPairSmem<DK, false>::LDK, LDT = KDA_C + 8, DV = DK;
    const int w = threadIdx.x >> 5, mt = w & 3, half = w >> 2;
    /* gq (q in s.l); dO over k (s.r); scale QK in bf16 over the scaled l rows (s.ls, row stride LDT) */
    for (int i = threadIdx.x; i < L * DK; i += KDA_THREADS) {
        const int r = i / DK, a = i % DK;
        const float gam = expf(s.G[i]), qv = __bfloat162float(s.l[r * LDK + a]);
        gq[((t0 + r) * nv + h) * (int64_t)DK + a] = __float2bfloat16(scale * gam * qv);
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
        for (int e = 0; e < 4; e++) {
            const int j = 16 * mt + gdn_frag_row(e), cc = half * (DV / 2) + 8 * ni + gdn_frag_col(e);
            if (j < L) p[((t0 + j) * nv + h) * (int64_t)DV + cc] = acc[0][ni][e];
        }
    __syncthreads();
}

/* QK of the chunk (kda_pair_decay<DK, true>); !BWD: into qk (the output's weights). BWD: the backward state pass's
 * chunk-parallel factors instead (nothing into qk): gq = scale gam_r * q_r (T, nv, dk) bf16, and
 * p = scale QK^T dO (T, nv, dv) fp32, P_j = scale sum_{r >= j} QK_rj dO_r, on tensor cores (scale QK rounded to
 * bf16, dO bf16: warp w rows [16 (w % 4), +16) and half w / 4 of the columns). Rows >= L not written. */
template <int DK, bool BWD>
__global__ void __launch_bounds__(KDA_THREADS, 2) kda_qk_kernel(
    float *qk /* (T,nv,64) */, bf16 *gq /* (T,nv,dk) */, float *p /* (T,nv,dv) */, const bf16 *q, const bf16 *k,
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
                qk[((t0 + r) * nv + h) * (int64_t)KDA_C + j] = s.A[r * KDA_LDT + j];
            }
            __syncthreads();
        } else {
            kda_qk_bwd_chunk<DK>(s, gq, p, dout, t0, L, h, nv, ldo, scale);
        }
    }
}
