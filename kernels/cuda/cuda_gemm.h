/*
 * cuda_gemm.h — the one GEMM of the cuda backend, through cuBLASLt, in
 * row-major terms (cuda_matmul.cu implements it; cuda_matmul.cu's dense
 * layers and cuda_loss.cu's fused lm_head call it).
 *
 *   C (M,N; ldc) = op(A) @ op(B)            (accumulate = 0)
 *   C (M,N; ldc) = op(A) @ op(B) + C        (accumulate = 1: beta = 1, C read)
 *
 * op(A) is (M,K): A is stored (M,K) with stride lda, or with trans_a (K,M).
 * op(B) is (K,N): B is stored (K,N) with stride ldb, or with trans_b (N,K).
 * A and B are bf16; C is bf16 or, with c_fp32, fp32; accumulation and the
 * scale are fp32 (CUBLAS_COMPUTE_32F). Runs on the compute stream with the
 * backend's cuBLASLt workspace; a key's first call may run the GEMM several
 * times to choose among cuBLASLt's algorithms of one summation order
 * (cuda_matmul.cu), and C's bits never depend on the choice. Strides and
 * pointer alignments are passed to cuBLASLt's heuristic as they are, so
 * column blocks of wider rows work; a shape no algorithm supports is a fatal
 * error naming the shape (no fallback).
 */
#ifndef RS_CUDA_GEMM_H
#define RS_CUDA_GEMM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void cuda_gemm(void *C, int c_fp32, int64_t ldc, const void *A, int64_t lda, int trans_a, const void *B, int64_t ldb,
               int trans_b, int64_t M, int64_t N, int64_t K, int accumulate);

/* Tests: forget every plan (the next call of each key plans, and chooses, again); tune 0: plans keep the heuristic's
 * first choice (the reference whose bits a chosen algorithm must give), 1: the default. Returns how many of the
 * forgotten plans had chosen another algorithm than the first. */
int cuda_gemm_reset(int tune);

#ifdef __cplusplus
}
#endif

#endif
