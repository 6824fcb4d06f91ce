/*
 * output.cuh — KDA's output from the chunk states, one block per (chunk, value head):
 *   o_r = scale (S^T (gam_r * q_r) + sum_{j <= r} QK_rj vn_j)
 * with S the state entering the chunk (hs at slot t0 / 64; 0 at a document start), vn the state pass's
 * (T, nv, dv) and QK prep.cuh's (T, nv, 64), all three stored in bf16 (cp.async into their tiles). Both products on
 * tensor cores (gdn_warp_mma: gam * q rounded to bf16 once here, S, QK and vn by their writers; fp32
 * accumulation; common.cuh's precision): o (64 x dv) = (gam * Q) S + QK vn, warp w owning rows [16 (w % 4),
 * +16) and half w / 4 of the columns; o rounded to bf16. Templates on DK = dk = dv. Shared memory ~109 KB at 128:
 * two blocks per SM (launch bounds 2: 128 registers). Part of kda.cu.
 */
#pragma once

template <int DK> struct KdaOutSmem {
    static constexpr int LDK = DK + 8, LDT = KDA_C + 8;
    float *G;
    bf16 *q, *st, *qk, *vn;
    size_t bytes;
    __host__ __device__ explicit KdaOutSmem(void *b) {
        KdaCarve c(b);
        G = c.take<float>((size_t)KDA_C * DK);
        q = c.take<bf16>((size_t)KDA_C * LDK);
        st = c.take<bf16>((size_t)DK * LDK);
        qk = c.take<bf16>((size_t)KDA_C * LDT);
        vn = c.take<bf16>((size_t)KDA_C * LDK);
        bytes = c.off;
    }
};

template <int DK>
__global__ void __launch_bounds__(KDA_THREADS, 2) kda_output_kernel(
    bf16 *o /* (T,ldo) */, const bf16 *q, const float *g, const bf16 *hs /* (ns,nv,dk,dv) */,
    const bf16 *vn /* (T,nv,dv) */, const bf16 *qk /* (T,nv,64) */, const int32_t *starts, const int32_t *meta,
    const int32_t *doc_pos, int64_t T, int nk, int nv, int ldq, int ldo, float scale) {
    using Sm = KdaOutSmem<DK>;
    constexpr int LDK = Sm::LDK, LDT = Sm::LDT, DV = DK;
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const Sm s(kda_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC];
    const int w = threadIdx.x >> 5, mt = w & 3, half = w >> 2;
    const size_t sn = (size_t)DK * DV;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        const bf16 *S = ch.reset ? NULL : hs + (ch.slot * nv + h) * sn;
        kda_load_bf16(s.q, LDK, q + t0 * ldq + (int64_t)kh * DK, ldq, DK, L); /* q, then gam * q over it */
        kda_load_G_start(s.G, DK, g, t0, L, h, nv, DK, 0, DK); /* g lands while the tiles below load */
        /* qk holds 0 right of the diagonal (kda_qk_kernel) */
        kda_cp_rows<KDA_C>(s.qk, qk, t0, L, h, nv);
        kda_cp_rows<DV>(s.vn, vn, t0, L, h, nv);
        if (S) kda_cp_state<DK, DV>(s.st, S);
        kda_load_G_sum(s.G, DK, DK); /* waits for q, qk, vn and S too */
        __syncthreads();
        for (int i = threadIdx.x; i < KDA_C * DK; i += KDA_THREADS) { /* in place: each element read by its writer */
            const int r = i / DK, a = i % DK;
            s.q[r * LDK + a] = __float2bfloat16(r < L ? expf(s.G[i]) * __bfloat162float(s.q[r * LDK + a]) : 0.0f);
        }
        __syncthreads();
        float acc[1][DV / 16][4];
        gdn_zero(acc);
        if (S) gdn_warp_mma<1, DV / 16, false, false, DK>(acc, s.q, LDK, s.st, LDK, 16 * mt, half * (DV / 2));
        gdn_warp_mma<1, DV / 16, false, false, KDA_C>(acc, s.qk, LDT, s.vn, LDK, 16 * mt, half * (DV / 2));
#pragma unroll
        for (int ni = 0; ni < DV / 16; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 16 * mt + gdn_frag_row(e), cc = half * (DV / 2) + 8 * ni + gdn_frag_col(e);
                if (r < L) o[(t0 + r) * ldo + (int64_t)h * DV + cc] = __float2bfloat16_rn(scale * acc[0][ni][e]);
            }
        __syncthreads();
    }
}
