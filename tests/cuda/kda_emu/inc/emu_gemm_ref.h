/* emu_gemm_ref.h (kda_emu) — what the emulations' tensor-core unit checks share (kda_emu/mma_check.cpp,
 * gdn_emu/mma_check.cpp): the operand tiles of a warp GEMM put into shared memory as the kernels hold them, and the
 * reference: the worst error of an M x N fp32 result C (row-major) against acc0 + A B in double, each element's error
 * relative to its magnitude |acc0| + sum_k |a_ik b_kj| (a NaN counts as the worst); a(i, k), b(k, j) give the
 * operands' values. */
#pragma once
#include <math.h>
#include "cuda_common.h"

/* A stored (M, K) or, AT, (K, M); B stored (K, N) or, BT, (N, K): copied by the block into padded shared tiles (rows
 * of the stored width + pad) at the start of the dynamic shared memory, then a barrier */
template <bool AT, bool BT>
static void emu_gemm_tiles(const bf16 *A, const bf16 *B, int M, int N, int K, int pad, bf16 **sA, int *lda, bf16 **sB,
                           int *ldb) {
    const int ar = AT ? K : M, ac = AT ? M : K, br = BT ? N : K, bc = BT ? K : N;
    *lda = ac + pad;
    *ldb = bc + pad;
    *sA = (bf16 *)kda_smem;
    *sB = *sA + ar * *lda;
    for (int i = threadIdx.x; i < ar * ac; i += blockDim.x) (*sA)[(i / ac) * *lda + i % ac] = A[i];
    for (int i = threadIdx.x; i < br * bc; i += blockDim.x) (*sB)[(i / bc) * *ldb + i % bc] = B[i];
    __syncthreads();
}

template <class FA, class FB>
static double emu_gemm_worst(const float *C, int M, int N, int K, double acc0, FA a, FB b) {
    double worst = 0.0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = acc0, mag = fabs(acc0) + 1e-30;
            for (int k = 0; k < K; k++) {
                const double p = (double)a(i, k) * b(k, j);
                want += p;
                mag += fabs(p);
            }
            const double e = fabs(C[i * N + j] - want) / mag;
            if (!(e <= worst)) worst = e;
        }
    return worst;
}
