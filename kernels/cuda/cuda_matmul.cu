/*
 * cuda_matmul.cu — cuBLASLt GEMMs (cuda_gemm.h) and the dense layer y = x W^T
 * of the cuda backend (lib/backend/backend.h: matmul_forward, matmul_backward; W is
 * (OC, IC) row-major, the nn.Linear layout).
 *
 *   forward   out (T,ldo) = inp (T,ldi) @ W^T; `accumulate` adds into out
 *             (beta = 1 into the bf16 C: the residual add fused in the GEMM)
 *   backward  dinp (T,ldi) = dout @ W (= or +=, bf16; skipped when NULL);
 *             dW (OC,IC) fp32 += dout^T @ inp (bf16 operands, fp32 C, beta 1)
 *
 * Row-major to cuBLASLt (column-major): C = op(A) op(B) row-major is
 * C^T = op(B)^T op(A)^T column-major, and a row-major (r, c) matrix with
 * stride ld is the column-major (c, r) matrix with the same ld. So cuBLASLt
 * gets m = N, n = M, k = K with B as its first operand and A as its second,
 * each with its own transpose flag unchanged.
 *
 * Plans: the matmul descriptor, the three layouts and the heuristic's choice
 * for a (shape, strides, alignments, types) key are made once and kept in a
 * small table (GEMM_PLANS entries; the model has a few dozen distinct
 * shapes). The heuristic is deterministic, so a key always gets the same
 * algorithm, and the results are the same run to run.
 *
 * Callers: through backend_cuda (lib/model/model_block.c), cuda_loss.cu, tests/cuda.
 */
#include <limits.h>
#include <string.h>

#include "cuda_common.h"
#include "cuda_gemm.h"
#include "cuda_kernels.h"

#define GEMM_PLANS 256

typedef struct {
    int64_t M, N, K, lda, ldb, ldc;
    int     trans_a, trans_b, c_fp32, accumulate, align_a, align_b, align_c;
    int64_t ld_in;    /* the added input's stride when it is not the output (cuda_gemm_residual); 0: C = D */
    int     align_in;
} GemmKey;

typedef struct {
    GemmKey                key;
    cublasLtMatmulDesc_t   op;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), D (and C when C = D) */
    cublasLtMatrixLayout_t lin;        /* cuBLASLt's C when it is not D (key.ld_in > 0) */
    cublasLtMatmulAlgo_t   algo;
} GemmPlan;

static GemmPlan gemm_plans[GEMM_PLANS];
static int      gemm_nplans;

/* alignment cuBLASLt may assume of a matrix: its pointer's, and every row start's */
static int gemm_align(const void *p, int64_t ld, int elt) {
    int a = cuda_ptr_align(p);
    int64_t row = ld * elt;
    while (a > 1 && row % a) a >>= 1;
    return a;
}

static void gemm_plan_build(GemmPlan *g, const GemmKey *k) {
    g->key = *k;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A is our B */
    cublasOperation_t tb = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    /* our B: (K,N) stored -> column-major (N,K); transposed, (N,K) stored -> column-major (K,N) */
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, (uint64_t)(k->trans_b ? k->K : k->N),
                                            (uint64_t)(k->trans_b ? k->N : k->K), k->ldb));
    /* our A: (M,K) stored -> column-major (K,M); transposed, (K,M) stored -> column-major (M,K) */
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_16BF, (uint64_t)(k->trans_a ? k->M : k->K),
                                            (uint64_t)(k->trans_a ? k->K : k->M), k->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g->lc, k->c_fp32 ? CUDA_R_32F : CUDA_R_16BF, (uint64_t)k->N,
                                            (uint64_t)k->M, k->ldc));
    g->lin = NULL;
    if (k->ld_in)
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g->lin, k->c_fp32 ? CUDA_R_32F : CUDA_R_16BF, (uint64_t)k->N,
                                                (uint64_t)k->M, k->ld_in));
    const cublasLtMatrixLayout_t lcin = k->ld_in ? g->lin : g->lc;
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws_bytes = 0;
    cuda_lt_workspace(&ws_bytes);
    uint64_t ws = ws_bytes;
    uint32_t al_a = (uint32_t)k->align_b, al_b = (uint32_t)k->align_a, al_d = (uint32_t)k->align_c;
    uint32_t al_c = k->ld_in ? (uint32_t)k->align_in : al_d;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cuda_lt_handle(), g->op, g->la, g->lb, lcin, g->lc, pref, 1,
                                                       &res, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
        RS_FATAL("cuBLASLt has no algorithm for C (%lld,%lld; ld %lld, %s%s) = op(A) (ld %lld%s) op(B) (ld %lld%s), "
                 "K %lld, alignments A %d B %d C %d bytes (status %d)",
                 (long long)k->M, (long long)k->N, (long long)k->ldc, k->c_fp32 ? "fp32" : "bf16",
                 k->accumulate ? ", accumulate" : "", (long long)k->lda, k->trans_a ? ", transposed" : "",
                 (long long)k->ldb, k->trans_b ? ", transposed" : "", (long long)k->K, k->align_a, k->align_b,
                 k->align_c, (int)st);
    g->algo = res.algo;
}

static void gemm_plan_free(GemmPlan *g) {
    cublasLtMatrixLayoutDestroy(g->la);
    cublasLtMatrixLayoutDestroy(g->lb);
    cublasLtMatrixLayoutDestroy(g->lc);
    if (g->lin) cublasLtMatrixLayoutDestroy(g->lin);
    cublasLtMatmulDescDestroy(g->op);
}

/* D = op(A) op(B) (+ Cin, or + D when accumulate and Cin is NULL) */
static void gemm_run(void *C, int c_fp32, int64_t ldc, const void *Cin, int64_t ld_in, const void *A, int64_t lda,
                     int trans_a, const void *B, int64_t ldb, int trans_b, int64_t M, int64_t N, int64_t K,
                     int accumulate) {
    RS_CHECK(M >= 0 && N >= 0 && K > 0, "gemm M %lld N %lld K %lld", (long long)M, (long long)N, (long long)K);
    RS_CHECK(ldc >= N && lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N),
             "gemm strides: ldc %lld (N %lld), lda %lld, ldb %lld", (long long)ldc, (long long)N, (long long)lda,
             (long long)ldb);
    if (M == 0 || N == 0) return;
    GemmKey key;
    memset(&key, 0, sizeof key); /* padding too: keys are compared with memcmp */
    key.M = M;
    key.N = N;
    key.K = K;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.trans_a = trans_a != 0;
    key.trans_b = trans_b != 0;
    key.c_fp32 = c_fp32 != 0;
    key.accumulate = accumulate != 0;
    key.align_a = gemm_align(A, lda, 2);
    key.align_b = gemm_align(B, ldb, 2);
    key.align_c = gemm_align(C, ldc, c_fp32 ? 4 : 2);
    if (Cin) {
        RS_CHECK(ld_in >= N, "gemm: the added input's stride %lld < N %lld", (long long)ld_in, (long long)N);
        key.ld_in = ld_in;
        key.align_in = gemm_align(Cin, ld_in, c_fp32 ? 4 : 2);
    }

    GemmPlan *g = NULL, tmp;
    for (int i = 0; i < gemm_nplans && !g; i++)
        if (!memcmp(&gemm_plans[i].key, &key, sizeof key)) g = &gemm_plans[i];
    if (!g) {
        g = gemm_nplans < GEMM_PLANS ? &gemm_plans[gemm_nplans++] : &tmp; /* a full table only costs speed */
        gemm_plan_build(g, &key);
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    size_t ws_bytes = 0;
    void *ws = cuda_lt_workspace(&ws_bytes);
    cublasStatus_t st = cublasLtMatmul(cuda_lt_handle(), g->op, &alpha, B, g->la, A, g->lb, &beta, Cin ? Cin : C,
                                       Cin ? g->lin : g->lc, C, g->lc, &g->algo, ws, ws_bytes, cuda_stream());
    if (g == &tmp) gemm_plan_free(&tmp);
    if (st != CUBLAS_STATUS_SUCCESS)
        RS_FATAL("cublasLtMatmul failed (status %d) for C (%lld,%lld) = op(A) op(B), K %lld", (int)st, (long long)M,
                 (long long)N, (long long)K);
}

extern "C" void cuda_gemm(void *C, int c_fp32, int64_t ldc, const void *A, int64_t lda, int trans_a, const void *B,
                          int64_t ldb, int trans_b, int64_t M, int64_t N, int64_t K, int accumulate) {
    gemm_run(C, c_fp32, ldc, NULL, 0, A, lda, trans_a, B, ldb, trans_b, M, N, K, accumulate);
}

/* ---- the dense layer ---- */

static void matmul_check_sizes(int64_t T, int IC, int OC, int ldi, int ldo) {
    RS_CHECK(T >= 0 && T <= INT_MAX, "T = %lld", (long long)T);
    RS_CHECK(IC > 0 && OC > 0, "IC %d OC %d", IC, OC);
    RS_CHECK(ldi >= IC && ldo >= OC, "ldi %d < IC %d or ldo %d < OC %d", ldi, IC, ldo, OC);
}

extern "C" void cuda_matmul_forward(void *out /* (T,ldo) OC columns */, const void *inp /* (T,ldi) IC columns */,
                                    const void *w /* (OC,IC) */, int64_t T, int IC, int OC, int ldi, int ldo,
                                    int accumulate) {
    matmul_check_sizes(T, IC, OC, ldi, ldo);
    if (T == 0) return;
    cuda_gemm(out, 0, ldo, inp, ldi, 0, w, IC, 1, T, OC, IC, accumulate);
}

/* out = resid + inp @ w^T: cuBLASLt's C is resid, its D out (the residual add in the GEMM's epilogue, no copy) */
extern "C" void cuda_matmul_forward_residual(void *out /* (T,ldo) OC columns */, const void *inp /* (T,ldi) */,
                                             const void *w /* (OC,IC) */, const void *resid /* (T,ldr) OC columns */,
                                             int64_t T, int IC, int OC, int ldi, int ldo, int ldr) {
    matmul_check_sizes(T, IC, OC, ldi, ldo);
    RS_CHECK(resid != NULL && ldr >= OC, "matmul_forward_residual: resid %p, ldr %d < OC %d", resid, ldr, OC);
    if (T == 0) return;
    gemm_run(out, 0, ldo, resid, ldr, inp, ldi, 0, w, IC, 1, T, OC, IC, 1);
}

extern "C" void cuda_matmul_backward(void *dinp /* (T,ldi) or NULL */, float *dw /* (OC,IC) += */,
                                     const void *dout /* (T,ldo) */, const void *inp /* (T,ldi) */,
                                     const void *w /* (OC,IC) */, int64_t T, int IC, int OC, int ldi, int ldo,
                                     int accumulate_dinp) {
    matmul_check_sizes(T, IC, OC, ldi, ldo);
    RS_CHECK(dw != NULL, "dw is NULL (parameter gradients always accumulate)");
    if (T == 0) return;
    if (dinp) cuda_gemm(dinp, 0, ldi, dout, ldo, 0, w, IC, 0, T, IC, OC, accumulate_dinp);
    cuda_gemm(dw, 1, IC, dout, ldo, 1, inp, ldi, 0, OC, IC, T, 1);
}
