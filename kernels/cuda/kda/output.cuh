/*
 * output.cuh — KDA's output from the chunk states, one block per (chunk, value head):
 *   o_r = scale (S^T (gam_r * q_r) + sum_{j <= r} QK_rj vn_j)
 * with S the state entering the chunk (hs at slot t0 / 64; 0 at a document start), vn the state pass's (T, nv, dv)
 * and QK prep.cuh's. One thread per output element (lanes over the value columns: S and vn rows are read
 * coalesced from global memory, gam * q and QK from shared memory), fp32 sums in the cpu oracle's order, o
 * rounded to bf16 once. Part of kda.cu.
 */
#pragma once

static __host__ __device__ size_t kda_out_smem(int dk, KdaCarve *c, float **sG, float **sQg, float **sQK) {
    *sG = c->take<float>((size_t)KDA_C * dk);
    *sQg = c->take<float>((size_t)KDA_C * dk);
    *sQK = c->take<float>((size_t)KDA_C * KDA_LDT);
    return c->off;
}

__global__ void __launch_bounds__(KDA_THREADS) kda_output_kernel(bf16 *o /* (T,ldo) */, const bf16 *q,
                                                                 const float *g, const float *hs /* (ns,nv,dk,dv) */,
                                                                 const float *vn /* (T,nv,dv) */,
                                                                 const float *qk /* (T,nv,64) */,
                                                                 const int32_t *starts, const int32_t *meta,
                                                                 const int32_t *doc_pos, int64_t T, int nk, int nv,
                                                                 int dk, int dv, int ldq, int ldo, float scale) {
    extern __shared__ __align__(16) unsigned char kda_smem[];
    KdaCarve cv(kda_smem);
    float *sG, *sQg, *sQK;
    kda_out_smem(dk, &cv, &sG, &sQg, &sQK);
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC];
    const size_t sn = (size_t)dk * dv;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        kda_load_G(sG, dk, g, ch.t0, L, h, nv, dk);
        kda_load_tile(sQK, qk, ch.t0, L, h, nv);
        __syncthreads();
        for (int i = threadIdx.x; i < KDA_C * dk; i += KDA_THREADS) {
            const int r = i / dk, a = i % dk;
            sQg[i] = r < L ? expf(sG[i]) * __bfloat162float(q[(ch.t0 + r) * ldq + (int64_t)kh * dk + a]) : 0.0f;
        }
        __syncthreads();
        const float *S = ch.reset ? NULL : hs + (ch.slot * nv + h) * sn;
        for (int i = threadIdx.x; i < L * dv; i += KDA_THREADS) {
            const int r = i / dv, cc = i % dv;
            float x = 0.0f;
            if (S)
                for (int a = 0; a < dk; a++) x += sQg[r * dk + a] * S[(size_t)a * dv + cc];
            for (int j = 0; j <= r; j++) x += sQK[r * KDA_LDT + j] * vn[((ch.t0 + j) * nv + h) * (int64_t)dv + cc];
            o[(ch.t0 + r) * ldo + (int64_t)h * dv + cc] = __float2bfloat16_rn(scale * x);
        }
        __syncthreads();
    }
}
