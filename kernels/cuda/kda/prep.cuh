/*
 * prep.cuh — the per-chunk factors of KDA that need the pairwise per-channel decay E_ij[c] = e^{G_i[c] - G_j[c]}
 * (j <= i, exponent <= 0; pairs j > i are never evaluated), one block per (chunk, value head):
 *
 *   kda_prep_kernel  Tinv = (I + A)^-1, A_ij = beta_i sum_c k_i[c] k_j[c] E_ij[c] (i > j): the pairs one thread
 *                    each (a loop over the channels), then forward substitution, one thread per column (the cpu
 *                    oracle's order). Written to tinv (T, nv, 64): row i of the chunk at ((t0 + i) nv + h) 64,
 *                    zeros right of the diagonal (cpu_kda.c's kept layout). This is the kept buffer's prep.
 *   kda_qk_kernel    QK_rj = sum_c q_r[c] k_j[c] E_rj[c] (j <= r, else 0) into qk (T, nv, 64), the same layout:
 *                    the output's and the backward state pass's intra-chunk weights.
 *
 * fp32 on CUDA cores (the pairwise decay is per channel, so these are not plain products); rows >= L are
 * zero. Part of kda.cu.
 */
#pragma once

/* shared memory of both: k (and q) bf16 (64, dk + 2), G fp32 (64, dk + 1), two 64 x 64 tiles, beta */
static __host__ __device__ size_t kda_prep_smem(int dk, KdaCarve *c, bf16 **sK, bf16 **sQ, float **sG, float **sA,
                                                float **sT, float **sBeta) {
    *sK = c->take<bf16>((size_t)KDA_C * (dk + 2));
    *sQ = c->take<bf16>((size_t)KDA_C * (dk + 2));
    *sG = c->take<float>((size_t)KDA_C * (dk + 1));
    *sA = c->take<float>((size_t)KDA_C * KDA_LDT);
    *sT = c->take<float>((size_t)KDA_C * KDA_LDT);
    *sBeta = c->take<float>(KDA_C);
    return c->off;
}

__global__ void __launch_bounds__(KDA_THREADS) kda_prep_kernel(float *tinv /* (T,nv,64) */, const bf16 *k,
                                                               const float *g, const float *beta,
                                                               const int32_t *starts, const int32_t *meta,
                                                               const int32_t *doc_pos, int64_t T, int nk, int nv,
                                                               int dk, int ldq) {
    extern __shared__ __align__(16) unsigned char kda_smem[];
    KdaCarve cv(kda_smem);
    bf16 *sK, *sQ;
    float *sG, *sA, *sT, *sBeta;
    kda_prep_smem(dk, &cv, &sK, &sQ, &sG, &sA, &sT, &sBeta);
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC];
    const int ldk = dk + 2, ldg = dk + 1;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        kda_load_bf16(sK, ldk, k + ch.t0 * ldq + (int64_t)kh * dk, ldq, dk, L);
        kda_load_G(sG, ldg, g, ch.t0, L, h, nv, dk);
        if (threadIdx.x < KDA_C) sBeta[threadIdx.x] = threadIdx.x < L ? beta[(ch.t0 + threadIdx.x) * nv + h] : 0.0f;
        __syncthreads();
        /* A_ij = beta_i sum_c k_i[c] k_j[c] E_ij[c] for j < i < L (lanes over j) */
        for (int p = threadIdx.x; p < KDA_C * KDA_C; p += KDA_THREADS) {
            const int i = p / KDA_C, j = p % KDA_C;
            float a = 0.0f;
            if (j < i && i < L) {
                const bf16 *ki = sK + i * ldk, *kj = sK + j * ldk;
                const float *Gi = sG + i * ldg, *Gj = sG + j * ldg;
                float s = 0.0f;
                for (int cc = 0; cc < dk; cc++)
                    s += __bfloat162float(ki[cc]) * __bfloat162float(kj[cc]) * expf(Gi[cc] - Gj[cc]);
                a = sBeta[i] * s;
            }
            sA[i * KDA_LDT + j] = a;
        }
        __syncthreads();
        /* Tinv by forward substitution, thread = column col:
         * T_i[col] = [i == col] - sum_{col <= j < i} A_ij T_j[col] */
        if (threadIdx.x < KDA_C) {
            const int col = threadIdx.x;
            for (int i = 0; i < L; i++) {
                float s = i == col ? 1.0f : 0.0f;
                for (int j = col; j < i; j++) s += -sA[i * KDA_LDT + j] * sT[j * KDA_LDT + col];
                sT[i * KDA_LDT + col] = col <= i ? s : 0.0f;
            }
        }
        __syncthreads();
        for (int p = threadIdx.x; p < L * KDA_C; p += KDA_THREADS) {
            const int i = p / KDA_C, j = p % KDA_C;
            tinv[((ch.t0 + i) * nv + h) * (int64_t)KDA_C + j] = sT[i * KDA_LDT + j];
        }
        __syncthreads();
    }
}

__global__ void __launch_bounds__(KDA_THREADS) kda_qk_kernel(float *qk /* (T,nv,64) */, const bf16 *q, const bf16 *k,
                                                             const float *g, const int32_t *starts, const int32_t *meta,
                                                             const int32_t *doc_pos, int64_t T, int nk, int nv, int dk,
                                                             int ldq) {
    extern __shared__ __align__(16) unsigned char kda_smem[];
    KdaCarve cv(kda_smem);
    bf16 *sK, *sQ;
    float *sG, *sA, *sT, *sBeta;
    kda_prep_smem(dk, &cv, &sK, &sQ, &sG, &sA, &sT, &sBeta);
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC];
    const int ldk = dk + 2, ldg = dk + 1;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        kda_load_bf16(sK, ldk, k + ch.t0 * ldq + (int64_t)kh * dk, ldq, dk, L);
        kda_load_bf16(sQ, ldk, q + ch.t0 * ldq + (int64_t)kh * dk, ldq, dk, L);
        kda_load_G(sG, ldg, g, ch.t0, L, h, nv, dk);
        __syncthreads();
        for (int p = threadIdx.x; p < L * KDA_C; p += KDA_THREADS) {
            const int r = p / KDA_C, j = p % KDA_C;
            float s = 0.0f;
            if (j <= r) {
                const bf16 *qr = sQ + r * ldk, *kj = sK + j * ldk;
                const float *Gr = sG + r * ldg, *Gj = sG + j * ldg;
                for (int cc = 0; cc < dk; cc++)
                    s += __bfloat162float(qr[cc]) * __bfloat162float(kj[cc]) * expf(Gr[cc] - Gj[cc]);
            }
            qk[((ch.t0 + r) * nv + h) * (int64_t)KDA_C + j] = s;
        }
        __syncthreads();
    }
}
