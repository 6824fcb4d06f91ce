/*
 * wu.cuh — the chunk-parallel factors of KDA's sequential state passes, one block per (chunk, value head), so that
 * the passes (state_pass.cuh) do nothing per chunk but the two products with the carried state:
 *
 *   kda_wu_kernel  from the kept Tinv (prep.cuh) and the chunk's k, v, g, beta:
 *                    W     = Tinv diag(beta) (gam * K)   (64 x dk)  -> w (T, nv, dk) bf16
 *                    dec*K = e^{G_{L-1} - G_r} k_r       (64 x dk)  -> x (T, nv, dk) bf16
 *                    U     = Tinv diag(beta) V           (64 x dv)  -> u (T, nv, dv) fp32 (where u is not NULL:
 *                                                                      only the forward pass reads it)
 *                    gam_{L-1} = e^{G_{L-1}}             (dk)       -> gl (ns, nv, dk) fp32 at the chunk's slot
 *                                                                      t0 / 64, for chunks without a document
 *                                                                      start only (a reset chunk's carried state
 *                                                                      is 0: the passes never read its gl, and its
 *                                                                      slot may be another chunk's)
 *                  Rows >= L of a chunk are not written (the passes read them as zeros: cp.async zero fill).
 *
 * W and dec*K are the passes' operands of tensor-core products, stored rounded to bf16 once (common.cuh's
 * precision); W and U are products of Tinv diag(beta) in bf16 with gam * K in bf16 and with V, one MMA each, fp32
 * accumulation; U is subtracted in fp32. The state pass reads each chunk's rows with cp.async (kda_cp_rows below).
 * The backward's other factors (scale gam * q bf16, and scale QK^T dO) come from prep.cuh's kda_qk_kernel<DK, true>.
 * Templates on DK = dk = dv. Shared memory 66 KB at 128 (Tb over G), 80 registers: three blocks per SM. Part of
 * kda.cu.
 */
#pragma once

template <int DK> struct KdaWuSmem {
    static constexpr int LDK = DK + 8, LDT = KDA_C + 8;
    static_assert((size_t)KDA_C * LDT * sizeof(bf16) <= (size_t)KDA_C * DK * sizeof(float), "wu: Tb fits over G");
    float *G, *beta;
    bf16 *tb, *x, *v;
    size_t bytes;
    __host__ __device__ explicit KdaWuSmem(void *b) {
        KdaCarve c(b);
        G = c.take<float>((size_t)KDA_C * DK);
        tb = (bf16 *)G; /* Tb over G, dead when Tb is formed */
        beta = c.take<float>(KDA_C);
        x = c.take<bf16>((size_t)KDA_C * LDK);
        v = c.take<bf16>((size_t)KDA_C * LDK);
        bytes = c.off;
    }
};

/* rows [0, 64) of head h of a (T, nv, DK) bf16 buffer (row t0 + r) into a tile of row stride DK + 8 with cp.async
 * (16 bytes a copy); rows >= L zero-filled. Thread t copies piece t % (DK / 8) of rows t / (DK / 8) + RS j: its
 * addresses step by a constant, no division or 64-bit product per copy (the state passes issue these between their
 * dependent steps). All threads; the caller commits and waits. */
template <int DK> KDA_DEV void kda_cp_rows(bf16 *s, const bf16 *src, int64_t t0, int L, int h, int nv) {
    constexpr int CPR = DK / 8, RS = KDA_THREADS / CPR; /* 16-byte copies per row; rows a pass */
    static_assert(KDA_THREADS % CPR == 0 && KDA_C % RS == 0, "kda_cp_rows: whole rows a pass");
    const int r0 = threadIdx.x / CPR, c = (threadIdx.x % CPR) * 8;
    bf16 *d = s + r0 * (DK + 8) + c;
    const bf16 *g = src + ((t0 + r0) * nv + h) * (int64_t)DK + c;
    const int64_t step = (int64_t)RS * nv * DK;
#pragma unroll
    for (int j = 0; j < KDA_C / RS; j++) {
        const bool ok = r0 + RS * j < L;
        ptx_cp_async16(d + RS * j * (DK + 8), ok ? g + j * step : src, ok);
    }
}

/* a chunk state or state gradient (DK x DV bf16, rows contiguous: hs or dhs at a slot and head) into a tile of row
 * stride DV + 8 with cp.async (16 bytes a copy), every row. Thread t copies piece t % (DV / 8) of rows
 * t / (DV / 8) + RS j. All threads; the caller commits and waits. */
template <int DK, int DV> KDA_DEV void kda_cp_state(bf16 *s, const bf16 *src) {
    constexpr int CPR = DV / 8, RS = KDA_THREADS / CPR; /* 16-byte copies per row; rows a pass */
    static_assert(KDA_THREADS % CPR == 0 && DK % RS == 0, "kda_cp_state: whole rows a pass");
    const int r0 = threadIdx.x / CPR, c = (threadIdx.x % CPR) * 8;
#pragma unroll
    for (int j = 0; j < DK / RS; j++)
        ptx_cp_async16(s + (r0 + RS * j) * (DV + 8) + c, src + (r0 + RS * j) * DV + c, true);
}

/* rows [0, 64) x W fp32 columns [col0, col0 + W) of a (T, nv, ld) buffer's head h into a tile of row stride lds
 * with cp.async; rows >= L (or all, when !on) zero-filled; the addresses as kda_cp_rows' */
template <int W>
KDA_DEV void kda_cp_f32(float *s, int lds, const float *src, int64_t t0, int L, int h, int nv, int ld, int col0,
                        bool on) {
    constexpr int CPR = W / 4, RS = KDA_THREADS / CPR;
    static_assert(KDA_THREADS % CPR == 0 && KDA_C % RS == 0, "kda_cp_f32: whole rows a pass");
    const int r0 = threadIdx.x / CPR, c = (threadIdx.x % CPR) * 4;
    float *d = s + r0 * lds + c;
    const float *g = src + ((t0 + r0) * nv + h) * (int64_t)ld + col0 + c;
    const int64_t step = (int64_t)RS * nv * ld;
#pragma unroll
    for (int j = 0; j < KDA_C / RS; j++) {
        const bool ok = on && r0 + RS * j < L;
        ptx_cp_async16(d + RS * j * lds, ok ? g + j * step : src, ok);
    }
}

/* rows [0, 64) x W bf16 columns of a (T, ld) matrix from column col0 (row t0 + r) into a tile of row stride lds
 * with cp.async; rows >= L zero-filled (W a multiple of 8, col0 and ld too: 16-byte copies) */
template <int W>
KDA_DEV void kda_cp_bf16(bf16 *s, int lds, const bf16 *src, int64_t t0, int L, int64_t ld, int64_t col0) {
    constexpr int CPR = W / 8;
    for (int i = threadIdx.x; i < KDA_C * CPR; i += KDA_THREADS) {
        const int r = i / CPR, c = (i % CPR) * 8;
        const bool ok = r < L;
        const bf16 *g = ok ? src + (t0 + r) * ld + col0 + c : src;
        ptx_cp_async16(s + r * lds + c, g, ok);
    }
}

/* Per (chunk, value head): Tb = Tinv diag(beta) and X = gam * K in bf16, W = Tb X and U = Tb V on tensor cores,
 * warp w rows [16 (w % 4), +16) and half w / 4 of the columns; dec * K and gam_{L-1} elementwise, fp32
 * exponentials with exponents <= 0, four channels a thread (8-byte bf16 and 16-byte fp32 accesses, consecutive
 * lanes on consecutive addresses). Order: Tinv's rows into registers with the copies of k, v and g in flight, the
 * cumsum, X and dec * K, then Tb over G (dead by then): 66 KB of shared memory at 128 and at most 80 registers, three
 * blocks per SM. */
template <int DK>
__global__ void __launch_bounds__(KDA_THREADS, 3) kda_wu_kernel(
    bf16 *wo /* (T,nv,dk) */, bf16 *xo /* (T,nv,dk) */, float *u /* (T,nv,dv) or NULL */,
    float *gl /* (ns,nv,dk) */, const bf16 *k, const bf16 *v, const float *g, const float *beta,
    const float *tinv /* (T,nv,64) */, const int32_t *starts, const int32_t *meta, const int32_t *doc_pos, int64_t T,
    int nk, int nv, int ldq, int ldv) {
    using Sm = KdaWuSmem<DK>;
    constexpr int LDK = Sm::LDK, LDT = Sm::LDT, DV = DK, NT4 = KDA_C * KDA_C / 4 / KDA_THREADS, CPR = DK / 4;
    static_assert(NT4 * 4 * KDA_THREADS == KDA_C * KDA_C, "wu: Tinv's float4 evenly over the threads");
    extern __shared__ __align__(16) unsigned char kda_smem[];
    const Sm s(kda_smem);
    const int h = blockIdx.y, kh = h / (nv / nk), nc = meta[KDA_META_NC];
    const int w = threadIdx.x >> 5, mt = w & 3, half = w >> 2;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        const KdaChunk ch = kda_chunk(starts, doc_pos, c, T);
        const int L = ch.L;
        const int64_t t0 = ch.t0;
        /* Tinv's rows, 16 bytes a load (plain loads if tinv is not 16-byte aligned), all of a thread's in flight
         * together and with the copies of v, k and g (one memory latency a chunk, not two), held in registers
         * until Tb is formed (through the cumsum: its loads 16 at a time, kda_load_G_sum<16>, or ptxas spills at
         * 80 registers) */
        const bool t16 = ((uintptr_t)tinv & 15) == 0;
        float4 tv[NT4];
#pragma unroll
        for (int q = 0; q < NT4; q++) {
            const int i = threadIdx.x + q * KDA_THREADS, r = i / (KDA_C / 4), j = (i % (KDA_C / 4)) * 4;
            tv[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const float *src = tinv + ((t0 + r) * nv + h) * (int64_t)KDA_C + j;
            if (r < L) tv[q] = t16 ? *(const float4 *)src : make_float4(src[0], src[1], src[2], src[3]);
        }
        if (u) kda_load_bf16(s.v, LDK, v + t0 * ldv + (int64_t)h * DV, ldv, DV, L);
        kda_load_bf16(s.x, LDK, k + t0 * ldq + (int64_t)kh * DK, ldq, DK, L); /* k, then gam * k over it */
        if (threadIdx.x < KDA_C) s.beta[threadIdx.x] = threadIdx.x < L ? beta[(t0 + threadIdx.x) * nv + h] : 0.0f;
        kda_load_G_start(s.G, DK, g, t0, L, h, nv, DK, 0, DK);
        kda_load_G_sum<16>(s.G, DK, DK); /* waits for v and k too; its barrier publishes beta */
        __syncthreads(); /* G */
        /* gam * k (in place over k: each element read by its writer) and dec * k into xo (rows < L), bf16, four
         * channels [a, a + 4) of row r a step (consecutive lanes on consecutive addresses: prep.cuh's kda_scale4) */
#pragma unroll 1
        for (int i = threadIdx.x; i < KDA_C * CPR; i += KDA_THREADS) {
            const int r = i / CPR, a = (i % CPR) * 4;
            bf16 kb[4], xb[4], db[4]; /* k (0 for rows >= L), gam * k, dec * k */
            const uint2 kraw = *(const uint2 *)&s.x[r * LDK + a];
            memcpy(kb, &kraw, sizeof kraw);
            const float4 r4 = *(const float4 *)&s.G[r * DK + a], z4 = *(const float4 *)&s.G[(L - 1) * DK + a];
            const float gr[4] = {r4.x, r4.y, r4.z, r4.w}, gz[4] = {z4.x, z4.y, z4.z, z4.w}; /* G_r, G_{L-1} */
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float kv = __bfloat162float(kb[e]);
                xb[e] = __float2bfloat16(expf(gr[e]) * kv);
                db[e] = __float2bfloat16(expf(gz[e] - gr[e]) * kv);
            }
            uint2 xw, dw;
            memcpy(&xw, xb, sizeof xw);
            memcpy(&dw, db, sizeof dw);
            *(uint2 *)&s.x[r * LDK + a] = xw;
            if (r < L) *(uint2 *)&xo[((t0 + r) * nv + h) * (int64_t)DK + a] = dw;
            if (r == 0 && !ch.reset)
                *(float4 *)&gl[(ch.slot * nv + h) * (int64_t)DK + a] =
                    make_float4(expf(gz[0]), expf(gz[1]), expf(gz[2]), expf(gz[3]));
        }
        __syncthreads(); /* G's reads are done: Tb over it */
        /* Tb = Tinv diag(beta) in bf16 from the registers */
#pragma unroll
        for (int q = 0; q < NT4; q++) {
            const int i = threadIdx.x + q * KDA_THREADS, r = i / (KDA_C / 4), j = (i % (KDA_C / 4)) * 4;
            const float tq[4] = {tv[q].x, tv[q].y, tv[q].z, tv[q].w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float x = r < L && j + e <= r ? tq[e] * s.beta[j + e] : 0.0f;
                s.tb[r * LDT + j + e] = __float2bfloat16(x);
            }
        }
        __syncthreads();
        {
            float aw[1][DK / 16][4];
            gdn_zero(aw);
            gdn_warp_mma<1, DK / 16, false, false, KDA_C>(aw, s.tb, LDT, s.x, LDK, 16 * mt, half * (DK / 2));
#pragma unroll
            for (int ni = 0; ni < DK / 16; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) { /* elements e, e + 1: adjacent columns, one 4-byte store each */
                    const int r = 16 * mt + gdn_frag_row(e), a = half * (DK / 2) + 8 * ni + gdn_frag_col(e);
                    if (r < L)
                        kda_st_bf16x2(&wo[((t0 + r) * nv + h) * (int64_t)DK + a], __float2bfloat16(aw[0][ni][e]),
                                      __float2bfloat16(aw[0][ni][e + 1]));
                }
        }
        if (u) {
            float au[1][DV / 16][4];
            gdn_zero(au);
            gdn_warp_mma<1, DV / 16, false, false, KDA_C>(au, s.tb, LDT, s.v, LDK, 16 * mt, half * (DV / 2));
#pragma unroll
            for (int ni = 0; ni < DV / 16; ni++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    const int r = 16 * mt + gdn_frag_row(e), cc = half * (DV / 2) + 8 * ni + gdn_frag_col(e);
                    if (r < L)
                        *(float2 *)&u[((t0 + r) * nv + h) * (int64_t)DV + cc] =
                            make_float2(au[0][ni][e], au[0][ni][e + 1]);
                }
        }
        __syncthreads();
    }
}
