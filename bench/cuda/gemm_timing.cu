/*
 * gemm_timing.cu — `build/bench_kernels gemm [ROWS]`: the training step's dense GEMMs (the 1B hybrid of
 * configs/hybrid-1b-256k-h200x4.yaml: hidden 1536, GDN in_proj 8224 columns, attention in_proj 4608, MLP
 * 8192 / 4096, out_proj 2048, lm head 151,936 at its 3,533-row chunk) through cuBLASLt, timing every
 * algorithm of the heuristic's first BK_GEMM_ALGOS answers: is the heuristic's first choice (the one
 * kernels/cuda/cuda_matmul.cu takes) the fastest at these shapes, and by how much is it not?
 *
 * Each shape runs in the three forms the dense layer uses (kernels/cuda/cuda_matmul.cu): forward
 * y (R,OC) = x (R,IC) W^T (bf16 out), backward data dx (R,IC) = dy W (bf16), backward weight
 * dW (OC,IC) += dy^T x (fp32 C, beta 1). Row-major operands as cuda_gemm.h describes them, given to
 * cuBLASLt column-major (C^T = op(B)^T op(A)^T). Median of BK_GEMM_REPS runs per algorithm; TFLOP/s at
 * 2 M N K. Each algorithm's output (beta 0) is compared bit for bit with the first's: where an algorithm
 * both beats the first and gives its bits, choosing it by timing could not change a run's results. Each
 * line names the algorithm's configuration (cuBLASLt algo id, tile, stages, split-K, cluster shape ids).
 * The operands hold random values in [-1, 1) (constant operands let the clocks run higher than
 * the training step's do). Information only, nothing checked.
 *
 * Called by bench_kernels.cu (main).
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench_kernels.h"
#include "cuda_common.h"

#define BK_GEMM_ALGOS 16
#define BK_GEMM_REPS 9

/* *ndiff += the count of 32-bit words where a and b differ */
__global__ void bk_gemm_diff_kernel(unsigned long long *ndiff, const uint32_t *a /* (n) */, const uint32_t *b /* (n) */,
                                    int64_t n) {
    unsigned long long d = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        d += a[i] != b[i];
    if (d) atomicAdd(ndiff, d);
}

static int bk_algo_attr(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t what, size_t bytes) {
    uint64_t v = 0;
    size_t got = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(algo, what, &v, bytes, &got) != CUBLAS_STATUS_SUCCESS) return -1;
    return (int)v;
}

static void bk_algo_name(char *out, size_t n, const cublasLtMatmulAlgo_t *algo) {
    snprintf(out, n, "id %d tile %d st %d sk %d red %d in %d opt %d cl %d",
             bk_algo_attr(algo, CUBLASLT_ALGO_CONFIG_ID, 4), bk_algo_attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, 4),
             bk_algo_attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, 4),
             bk_algo_attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4),
             bk_algo_attr(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 4),
             bk_algo_attr(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, 2),
             bk_algo_attr(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, 4),
             bk_algo_attr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, 2));
}

typedef struct {
    const char *name;
    int64_t     rows, oc, ic; /* the dense layer's T, OC, IC; rows 0: the ROWS argument */
    int         fwd_fp32;     /* the forward writes fp32 (the lm head's logits, kernels/cuda/cuda_loss.cu) */
} BkGemmShape;

/* one GEMM C (M,N; ldc = N) = op(A) op(B) (+ C), row-major, as cuda_gemm.h; A (M,K) or (K,M) when trans_a */
static void bk_gemm_one(const char *label, int64_t M, int64_t N, int64_t K, int trans_a, int trans_b, int c_fp32,
                        int accumulate) {
    const void *A = bk_dev_random_bf16(M * K, 1), *B = bk_dev_random_bf16(K * N, 2);
    void *C = bk_dev_alloc((size_t)M * N * (c_fp32 ? 4 : 2));
    CUDA_CHECK(cudaMemsetAsync(C, 0, (size_t)M * N * (c_fp32 ? 4 : 2), cuda_stream()));
    const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;

    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, (uint64_t)(trans_b ? K : N), (uint64_t)(trans_b ? N : K),
                                            ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, (uint64_t)(trans_a ? M : K), (uint64_t)(trans_a ? K : M),
                                            lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, c_fp32 ? CUDA_R_32F : CUDA_R_16BF, (uint64_t)N, (uint64_t)M, N));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws_bytes = 0;
    void *ws = cuda_lt_workspace(&ws_bytes);
    uint64_t wsb = ws_bytes;
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t res[BK_GEMM_ALGOS];
    int found = 0;
    CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(cuda_lt_handle(), op, la, lb, lc, lc, pref, BK_GEMM_ALGOS, res, &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));

    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const double flop = 2.0 * (double)M * (double)N * (double)K;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float first = 0, best = 1e30f, best_same = 1e30f;
    int best_i = -1, best_same_i = -1, nsame = 0;
    const size_t cbytes = (size_t)M * N * (c_fp32 ? 4 : 2);
    void *C0 = bk_dev_alloc(cbytes), *C1 = bk_dev_alloc(cbytes);
    unsigned long long *ndiff = (unsigned long long *)bk_dev_alloc(sizeof *ndiff), diff_best = 0;
    const float zero = 0.0f;
    for (int a = 0; a < found; a++) {
        float t[BK_GEMM_REPS];
        int ok = 1;
        for (int r = -2; r < BK_GEMM_REPS && ok; r++) {
            CUDA_CHECK(cudaEventRecord(e0, cuda_stream()));
            ok = cublasLtMatmul(cuda_lt_handle(), op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &res[a].algo, ws,
                                ws_bytes, cuda_stream()) == CUBLAS_STATUS_SUCCESS;
            CUDA_CHECK(cudaEventRecord(e1, cuda_stream()));
            CUDA_CHECK(cudaEventSynchronize(e1));
            if (r >= 0) CUDA_CHECK(cudaEventElapsedTime(&t[r], e0, e1));
        }
        if (!ok) continue;
        /* the product alone (beta 0) into C0 (the first algorithm) or C1, compared with C0 */
        CUBLAS_CHECK(cublasLtMatmul(cuda_lt_handle(), op, &alpha, B, la, A, lb, &zero, a ? C1 : C0, lc, a ? C1 : C0,
                                    lc, &res[a].algo, ws, ws_bytes, cuda_stream()));
        unsigned long long d = 0;
        if (a) {
            CUDA_CHECK(cudaMemsetAsync(ndiff, 0, sizeof *ndiff, cuda_stream()));
            bk_gemm_diff_kernel<<<1024, 256, 0, cuda_stream()>>>(ndiff, (const uint32_t *)C0, (const uint32_t *)C1,
                                                                 (int64_t)(cbytes / 4));
            CUDA_CHECK(cudaMemcpyAsync(&d, ndiff, sizeof d, cudaMemcpyDeviceToHost, cuda_stream()));
            CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
        }
        const float ms = bk_median(t, BK_GEMM_REPS);
        if (a == 0) first = ms;
        if (ms < best) best = ms, best_i = a, diff_best = d;
        if (d) {
            char nd[96];
            bk_algo_name(nd, sizeof nd, &res[a].algo);
            printf("  %s: #%d [%s] differs from #0 in %llu words\n", label, a, nd, d);
        } else {
            nsame++;
            if (ms < best_same) best_same = ms, best_same_i = a;
        }
    }
    char n0[96], nb[96];
    bk_algo_name(n0, sizeof n0, &res[0].algo);
    bk_algo_name(nb, sizeof nb, &res[best_i].algo);
    printf("%-24s M %6lld N %6lld K %6lld  #0 %7.3f ms %5.1f TF/s [%s]  best #%-2d %7.3f ms %5.1f TF/s [%s] "
           "words differing from #0 %llu  #0/best %.3f  best of the %d of %d with #0's bits: #%d, #0/it %.3f\n",
           label, (long long)M, (long long)N, (long long)K, first, flop / first / 1e9, n0, best_i, best,
           flop / best / 1e9, nb, diff_best, first / best, nsame, found, best_same_i, first / best_same);
    fflush(stdout);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    bk_dev_free_all();
}

void bk_gemm_timing(int64_t rows) {
    static const BkGemmShape shapes[] = {
        {"gdn in_proj", 0, 8224, 1536}, {"attn in_proj", 0, 4608, 1536}, {"mlp gate_up", 0, 8192, 1536},
        {"mlp down", 0, 1536, 4096},    {"out_proj", 0, 1536, 2048},     {"lm head", 3533, 151936, 1536, 1},
    };
    printf("bench_kernels gemm: rows %lld, cuBLASLt heuristic's first %d answers, median of %d\n", (long long)rows,
           BK_GEMM_ALGOS, BK_GEMM_REPS);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t R = shapes[s].rows ? shapes[s].rows : rows, OC = shapes[s].oc, IC = shapes[s].ic;
        char label[64];
        snprintf(label, sizeof label, "%s fwd", shapes[s].name);
        bk_gemm_one(label, R, OC, IC, 0, 1, shapes[s].fwd_fp32, 0); /* y = x W^T */
        snprintf(label, sizeof label, "%s bwd data", shapes[s].name);
        bk_gemm_one(label, R, IC, OC, 0, 0, 0, 0); /* dx = dy W */
        snprintf(label, sizeof label, "%s bwd weight", shapes[s].name);
        bk_gemm_one(label, OC, IC, R, 1, 0, 1, 1); /* dW += dy^T x */
    }
}
