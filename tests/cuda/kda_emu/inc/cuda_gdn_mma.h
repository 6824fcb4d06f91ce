/*
 * cuda_gdn_mma.h (kda_emu) — the host emulation's stand-in for kernels/cuda/cuda_gdn_mma.h: the warp-level
 * tensor-core pieces (gdn_warp_mma, gdn_frag_row / gdn_frag_col, gdn_zero, gdn_zero_row) with the same
 * signatures and fragment layout, so kernels written against the real header build here unchanged. Each lane
 * computes its own accumulator elements (the C fragment of mma.m16n8k16: row g / g + 8, cols 2t, 2t + 1) straight
 * from the shared-memory tiles: per k step of 16, the 16 products of the bf16 values (exact in fp32) summed in
 * fp32 and added to the accumulator, the products the mma forms. No lane reads another's registers, so no
 * cross-lane traffic; what the hardware needs and the host does not (16-byte row addresses for ldmatrix, a row
 * stride that is a multiple of 8, NT even, KD a multiple of 16) is checked and aborts. The order of the
 * additions inside one k step is the host's, not the tensor core's (whose fp32 accumulation rounds differently in
 * the last bits): the emulation proves layouts and algebra, the GPU run the device's rounding. The unit check
 * mma_check.cpp compares it with a plain GEMM for the four transpose combinations. cp.async is emulated in
 * emu_cp_async.h beside it (deferred copies).
 */
#ifndef RS_CUDA_GDN_MMA_H
#define RS_CUDA_GDN_MMA_H
#include "cuda_common.h"

#define GDN_DEV static inline

#include "emu_cp_async.h" /* cp.async (cuda_ptx.h's ptx_cp_async*), emu_mma_fault */

template <int N> GDN_DEV void gdn_zero_row(__nv_bfloat16 *p) {
    static_assert(N % 8 == 0, "gdn_zero_row: N % 8");
    if (((uintptr_t)p & 15) != 0) emu_mma_fault("gdn_zero_row: row not 16-byte aligned");
    for (int i = 0; i < N; i++) p[i].x = 0;
}

GDN_DEV int gdn_frag_row(int e) { return (int)((threadIdx.x & 31) >> 2) + ((e >> 1) << 3); }
GDN_DEV int gdn_frag_col(int e) { return (int)((threadIdx.x & 3) << 1) + (e & 1); }

/* acc[mi][ni] += A B over k in [0, KD) (see the real header for AT / BT and the tile conventions) */
template <int MT, int NT, bool AT, bool BT, int KD>
GDN_DEV void gdn_warp_mma(float (&acc)[MT][NT][4], const __nv_bfloat16 *sA, int lda, const __nv_bfloat16 *sB,
                          int ldb, int m0, int n0) {
    static_assert(NT % 2 == 0 && KD % 16 == 0, "gdn_warp_mma: NT even, KD multiple of 16");
    if (((uintptr_t)sA & 15) != 0 || ((uintptr_t)sB & 15) != 0) emu_mma_fault("tile base not 16-byte aligned");
    if (lda % 8 != 0 || ldb % 8 != 0) emu_mma_fault("row stride not a multiple of 8 elements");
    if (m0 % 8 != 0 || n0 % 8 != 0) emu_mma_fault("tile corner not on an 8-element boundary");
    /* the lane's rows of A (g, g + 8 of each m tile) and columns of B (2t, 2t + 1 of each n tile) as floats first */
    float ar[KD][MT][2], bc[KD][NT][2];
    for (int mi = 0; mi < MT; mi++)
        for (int h = 0; h < 2; h++) {
            const int r = m0 + mi * 16 + gdn_frag_row(2 * h);
            for (int kk = 0; kk < KD; kk++)
                ar[kk][mi][h] = __bfloat162float(AT ? sA[(size_t)kk * lda + r] : sA[(size_t)r * lda + kk]);
        }
    for (int ni = 0; ni < NT; ni++)
        for (int j = 0; j < 2; j++) {
            const int c = n0 + ni * 8 + gdn_frag_col(j);
            for (int kk = 0; kk < KD; kk++)
                bc[kk][ni][j] = __bfloat162float(BT ? sB[(size_t)c * ldb + kk] : sB[(size_t)kk * ldb + c]);
        }
    /* per k step: each element's 16 products summed in k order, then added to the accumulator (the elements'
     * sums interleaved, each in its own order) */
    for (int k0 = 0; k0 < KD; k0 += 16) {
        float sum[MT][NT][4] = {};
        for (int kk = k0; kk < k0 + 16; kk++)
            for (int mi = 0; mi < MT; mi++) {
                const float a0 = ar[kk][mi][0], a1 = ar[kk][mi][1];
                for (int ni = 0; ni < NT; ni++) {
                    const float b0 = bc[kk][ni][0], b1 = bc[kk][ni][1];
                    sum[mi][ni][0] += a0 * b0;
                    sum[mi][ni][1] += a0 * b1;
                    sum[mi][ni][2] += a1 * b0;
                    sum[mi][ni][3] += a1 * b1;
                }
            }
        for (int mi = 0; mi < MT; mi++)
            for (int ni = 0; ni < NT; ni++)
                for (int e = 0; e < 4; e++) acc[mi][ni][e] += sum[mi][ni][e];
    }
}

template <int MT, int NT> GDN_DEV void gdn_zero(float (&acc)[MT][NT][4]) {
    for (int mi = 0; mi < MT; mi++)
        for (int ni = 0; ni < NT; ni++)
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;
}

#endif
