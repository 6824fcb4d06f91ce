/*
 * mma.cuh — the tensor-core products of the KDA kernels, on the warp GEMM of cuda_gdn_mma.h (gdn_warp_mma:
 * mma.sync m16n8k16, bf16 operands from shared memory, fp32 accumulation; fragment layout in its header).
 * Operands the kernels form in fp32 (the decay-scaled keys, Tinv diag(beta), W, the state, vn) are split
 * x = hi + lo, both bf16 (hi = bf16(x), lo = bf16(x - hi): ~16 significant bits together; common.cuh's
 * kda_split), and a product of
 * two split operands is the three terms Ahi Bhi + Ahi Blo + Alo Bhi (the dropped Alo Blo is ~2^-16 of it), the
 * small terms first, into one fp32 accumulator: near-fp32 results from bf16 mma. A bf16 input (v, k) needs
 * no lo. Part of kda.cu's translation unit; tests/cuda/kda_emu runs it on the host (its cuda_gdn_mma.h).
 */
#pragma once

/* one warp: acc += (Ahi + Alo) (Bhi + Blo) less Alo Blo; A row-major (rows m, cols k), or AT: stored (rows k,
 * cols m); B row-major (rows k, cols n), or BT: stored (rows n, cols k); rows [m0, m0 + 16 MT), cols
 * [n0, n0 + 8 NT), k in [0, KD) */
template <int MT, int NT, bool AT, int KD, bool BT = false>
KDA_DEV void kda_mma3(float (&acc)[MT][NT][4], const bf16 *ah, const bf16 *al, int lda, const bf16 *bh,
                      const bf16 *bl, int ldb, int m0, int n0) {
    gdn_warp_mma<MT, NT, AT, BT, KD>(acc, al, lda, bh, ldb, m0, n0);
    gdn_warp_mma<MT, NT, AT, BT, KD>(acc, ah, lda, bl, ldb, m0, n0);
    gdn_warp_mma<MT, NT, AT, BT, KD>(acc, ah, lda, bh, ldb, m0, n0);
}

/* one warp: acc += (Ahi + Alo) B, B a bf16 input (exact) */
template <int MT, int NT, bool AT, int KD>
KDA_DEV void kda_mma2(float (&acc)[MT][NT][4], const bf16 *ah, const bf16 *al, int lda, const bf16 *b, int ldb,
                      int m0, int n0) {
    gdn_warp_mma<MT, NT, AT, false, KD>(acc, al, lda, b, ldb, m0, n0);
    gdn_warp_mma<MT, NT, AT, false, KD>(acc, ah, lda, b, ldb, m0, n0);
}

/* acc += (Ahi + Alo) (Bhi + Blo) less Alo Blo as kda_mma3, each term in its own accumulator over one k loop
 * (gdn_warp_mma_split: chains of KD / 16 mma, not 3 KD / 16), added at the end small terms first:
 * acc += (Alo Bhi + Ahi Blo) + Ahi Bhi. Three accumulators' registers (3 MT NT 4 floats): for the sequential
 * passes' short products, whose latency is the pass's time */
template <int MT, int NT, bool AT, int KD, bool BT = false>
KDA_DEV void kda_mma3s(float (&acc)[MT][NT][4], const bf16 *ah, const bf16 *al, int lda, const bf16 *bh,
                       const bf16 *bl, int ldb, int m0, int n0) {
    float lh[MT][NT][4], hl[MT][NT][4], hh[MT][NT][4];
    gdn_zero(lh);
    gdn_zero(hl);
    gdn_zero(hh);
    gdn_warp_mma_split<MT, NT, AT, BT, KD, true>(lh, hl, hh, ah, al, lda, bh, bl, ldb, m0, n0);
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] += (lh[mi][ni][e] + hl[mi][ni][e]) + hh[mi][ni][e];
}

/* acc += (Ahi + Alo) B as kda_mma2, the two terms in their own accumulators: acc += Alo B + Ahi B */
template <int MT, int NT, bool AT, int KD>
KDA_DEV void kda_mma2s(float (&acc)[MT][NT][4], const bf16 *ah, const bf16 *al, int lda, const bf16 *b, int ldb,
                       int m0, int n0) {
    float lh[MT][NT][4], hh[MT][NT][4];
    gdn_zero(lh);
    gdn_zero(hh);
    gdn_warp_mma_split<MT, NT, AT, false, KD, false>(lh, hh, hh, ah, al, lda, b, b, ldb, m0, n0);
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] += lh[mi][ni][e] + hh[mi][ni][e];
}
