/*
 * cuda_matmul.cu — cuBLASLt GEMMs (cuda_gemm.h) and the dense layer y = x W^T
 * of the cuda backend (lib/backend/backend.h: matmul_forward, matmul_backward; W is
 * (OC, IC) row-major, the nn.Linear layout).
 *
 *   forward   out (T,ldo) = inp (T,ldi) @ W^T; `accumulate` adds into out
 *             (beta = 1 into the bf16 C: the residual add fused in the GEMM)
 *   backward  dinp (T,ldi) = dout @ W (= or +=, bf16; skipped when NULL);
 *             dW (OC,IC) fp32 += dout^T @ inp (bf16 operands, fp32 C, beta 1; skipped when NULL)
 *
 * Row-major to cuBLASLt (column-major): C = op(A) op(B) row-major is
 * C^T = op(B)^T op(A)^T column-major, and a row-major (r, c) matrix with
 * stride ld is the column-major (c, r) matrix with the same ld. So cuBLASLt
 * gets m = N, n = M, k = K with B as its first operand and A as its second,
 * each with its own transpose flag unchanged.
 *
 * Plans: the matmul descriptor, the three layouts and the algorithm for a
 * (shape, strides, alignments, types) key are made once and kept in a small
 * table (GEMM_PLANS entries; the model has a few dozen distinct shapes).
 *
 * The algorithm: cuBLASLt's heuristic ranks its candidates by a model, and its
 * first is not always the fastest at the model's shapes (bench_kernels gemm;
 * docs/bench-log/2026-11-29-e-chunk-rows-gemm-choice-kda-conv.md). So a plan
 * keeps the heuristic's first GEMM_CANDIDATES answers that share the first's
 * accumulation order (the same kernel id, no split-K, the same reduction
 * scheme, inner shape and custom option: they differ only in the output tile,
 * the pipeline stages and the cluster shape, which do not change the order in
 * which any output element sums its K products), and its first call times them
 * on the call's own operands (GEMM_TUNE_REPS runs each, on the compute stream)
 * and checks each one's output, bit for bit by a 64-bit hash, against the
 * first's: a candidate with other bits is dropped, and one replaces the first
 * only when it is at least GEMM_TUNE_GAIN faster. Whichever runs, every call
 * gives the heuristic's first choice's bits, so the results are the same run to
 * run and across resumes. Only calls that may run again unchanged are timed (C
 * written, or D = Cin + A B with Cin not D); a call that adds into C keeps the
 * first (timing those out of place was tried: docs/design/measurement-notes.md,
 * the step). The call itself then runs the chosen algorithm.
 *
 * Callers: through backend_cuda (lib/model/model_block.c), cuda_loss.cu, tests/cuda.
 */
#include <limits.h>
#include <string.h>

#include "cuda_common.h"
#include "cuda_gemm.h"
#include "cuda_kernels.h"

#define GEMM_PLANS 256
#define GEMM_CANDIDATES 8    /* heuristic answers a plan asks for and may time */
#define GEMM_TUNE_REPS 3     /* timed runs per candidate (median) at a plan's first call */
#define GEMM_TUNE_GAIN 0.98f /* a candidate replaces the first only below this fraction of its time */

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
    cublasLtMatmulAlgo_t   algo;                   /* what every call runs */
    cublasLtMatmulAlgo_t   cand[GEMM_CANDIDATES];  /* the first and those of its accumulation order */
    int                    ncand, tuned;           /* tuned: the first call has chosen */
} GemmPlan;

static GemmPlan gemm_plans[GEMM_PLANS];
static int      gemm_nplans;
static int      gemm_tuning = 1; /* 0: plans keep the heuristic's first choice (cuda_gemm_reset, tests) */

/* alignment cuBLASLt may assume of a matrix: its pointer's, and every row start's */
static int gemm_align(const void *p, int64_t ld, int elt) {
    int a = cuda_ptr_align(p);
    int64_t row = ld * elt;
    while (a > 1 && row % a) a >>= 1;
    return a;
}

/* an algorithm's configuration attribute of `bytes` bytes (cublasLt.h gives each one's type: 2 or 4 bytes) */
static uint64_t gemm_algo_attr(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t what, size_t bytes) {
    uint64_t v = 0; /* little-endian: the attribute's bytes are its low bytes */
    size_t got = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, what, &v, bytes, &got));
    return v;
}

/* a and b sum every output element's K products in the same order: the same kernel, no split-K, the same
 * reduction scheme, inner (instruction) shape and custom option; tile, stages, swizzle and cluster may differ */
static bool gemm_same_order(const cublasLtMatmulAlgo_t *a, const cublasLtMatmulAlgo_t *b) {
    static const struct {
        cublasLtMatmulAlgoConfigAttributes_t what;
        size_t                               bytes;
    } order[] = {{CUBLASLT_ALGO_CONFIG_ID, 4},
                 {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4},
                 {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 4},
                 {CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, 2},
                 {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, 4}};
    if ((int32_t)gemm_algo_attr(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 4) > 1) return false;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (gemm_algo_attr(a, order[i].what, order[i].bytes) != gemm_algo_attr(b, order[i].what, order[i].bytes))
            return false;
    return true;
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
    cublasLtMatmulHeuristicResult_t res[GEMM_CANDIDATES];
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cuda_lt_handle(), g->op, g->la, g->lb, lcin, g->lc, pref,
                                                       GEMM_CANDIDATES, res, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
        RS_FATAL("cuBLASLt has no algorithm for C (%lld,%lld; ld %lld, %s%s) = op(A) (ld %lld%s) op(B) (ld %lld%s), "
                 "K %lld, alignments A %d B %d C %d bytes (status %d)",
                 (long long)k->M, (long long)k->N, (long long)k->ldc, k->c_fp32 ? "fp32" : "bf16",
                 k->accumulate ? ", accumulate" : "", (long long)k->lda, k->trans_a ? ", transposed" : "",
                 (long long)k->ldb, k->trans_b ? ", transposed" : "", (long long)k->K, k->align_a, k->align_b,
                 k->align_c, (int)st);
    g->algo = g->cand[0] = res[0].algo;
    g->ncand = 1; /* the first, then the others of its order (none when the first splits K) */
    for (int i = 1; i < found; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && gemm_same_order(&res[i].algo, &res[0].algo))
            g->cand[g->ncand++] = res[i].algo;
    g->tuned = 0;
}

static void gemm_plan_free(GemmPlan *g) {
    cublasLtMatrixLayoutDestroy(g->la);
    cublasLtMatrixLayoutDestroy(g->lb);
    cublasLtMatrixLayoutDestroy(g->lc);
    if (g->lin) cublasLtMatrixLayoutDestroy(g->lin);
    cublasLtMatmulDescDestroy(g->op);
}

/* one call's operands: D = C = op(A) op(B) (+ beta C), or D = C = Cin + op(A) op(B) */
typedef struct {
    void       *C;
    const void *Cin, *A, *B;
    float       beta;
} GemmCall;

static cublasStatus_t gemm_launch(const GemmPlan *g, const cublasLtMatmulAlgo_t *algo, const GemmCall *c) {
    const float alpha = 1.0f;
    size_t ws_bytes = 0;
    void *ws = cuda_lt_workspace(&ws_bytes);
    return cublasLtMatmul(cuda_lt_handle(), g->op, &alpha, c->B, g->la, c->A, g->lb, &c->beta, c->Cin ? c->Cin : c->C,
                          c->Cin ? g->lin : g->lc, c->C, g->lc, algo, ws, ws_bytes, cuda_stream());
}

/* *h += a hash of every 16-bit unit of the (rows, units) block of stride ld units and its position: a fixed sum
 * (integer adds), so equal blocks give equal hashes in any schedule */
__global__ void gemm_hash_kernel(unsigned long long *h, const uint16_t *c /* (rows, ld) */, int64_t rows,
                                 int64_t units, int64_t ld) {
    unsigned long long s = 0;
    const int64_t n = rows * units;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        unsigned long long x = ((unsigned long long)i << 16 | c[(i / units) * ld + i % units]) + 0x9e3779b97f4a7c15ull;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        s += x ^ (x >> 31);
    }
    atomicAdd(h, s);
}

static unsigned long long gemm_hash(const GemmPlan *g, const void *C) {
    static unsigned long long *dev;
    if (!dev) dev = (unsigned long long *)cuda_internal_alloc(sizeof *dev);
    const int64_t elt = g->key.c_fp32 ? 2 : 1; /* 16-bit units per element */
    unsigned long long h = 0;
    CUDA_CHECK(cudaMemsetAsync(dev, 0, sizeof *dev, cuda_stream()));
    gemm_hash_kernel<<<528, 256, 0, cuda_stream()>>>(dev, (const uint16_t *)C, g->key.M, g->key.N * elt,
                                                     g->key.ldc * elt);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(&h, dev, sizeof h, cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    return h;
}

/* the median ms of GEMM_TUNE_REPS runs of algo after one untimed run; its output's hash into *h; < 0 when
 * cuBLASLt refuses the algorithm for this call */
static float gemm_time(const GemmPlan *g, const cublasLtMatmulAlgo_t *algo, const GemmCall *c, unsigned long long *h) {
    static cudaEvent_t ev[GEMM_TUNE_REPS + 1];
    if (!ev[0])
        for (int i = 0; i <= GEMM_TUNE_REPS; i++) CUDA_CHECK(cudaEventCreate(&ev[i]));
    if (gemm_launch(g, algo, c) != CUBLAS_STATUS_SUCCESS) return -1.0f;
    *h = gemm_hash(g, c->C);
    CUDA_CHECK(cudaEventRecord(ev[0], cuda_stream()));
    for (int r = 0; r < GEMM_TUNE_REPS; r++) {
        if (gemm_launch(g, algo, c) != CUBLAS_STATUS_SUCCESS) return -1.0f;
        CUDA_CHECK(cudaEventRecord(ev[r + 1], cuda_stream()));
    }
    CUDA_CHECK(cudaEventSynchronize(ev[GEMM_TUNE_REPS]));
    float t[GEMM_TUNE_REPS];
    for (int r = 0; r < GEMM_TUNE_REPS; r++) CUDA_CHECK(cudaEventElapsedTime(&t[r], ev[r], ev[r + 1]));
    for (int i = 0; i < GEMM_TUNE_REPS; i++) /* median */
        for (int j = i + 1; j < GEMM_TUNE_REPS; j++)
            if (t[j] < t[i]) {
                const float x = t[i];
                t[i] = t[j], t[j] = x;
            }
    return t[GEMM_TUNE_REPS / 2];
}

/* the plan's first call: time its candidates on this call's operands (the header: same bits or dropped) */
static void gemm_tune(GemmPlan *g, const GemmCall *c) {
    g->tuned = 1;
    const bool rerunnable = c->beta == 0.0f || (c->Cin && c->Cin != c->C);
    if (g->ncand < 2 || !rerunnable) return;
    unsigned long long h0 = 0, h = 0;
    const float t0 = gemm_time(g, &g->cand[0], c, &h0);
    if (t0 < 0) return; /* the call itself reports it */
    float best = t0 * GEMM_TUNE_GAIN;
    for (int i = 1; i < g->ncand; i++) {
        const float t = gemm_time(g, &g->cand[i], c, &h);
        if (t >= 0 && h == h0 && t < best) best = t, g->algo = g->cand[i];
    }
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
        if (g == &tmp || !gemm_tuning) g->tuned = 1;
    }
    const GemmCall call = {C, Cin, A, B, accumulate ? 1.0f : 0.0f};
    if (!g->tuned) gemm_tune(g, &call);
    cublasStatus_t st = gemm_launch(g, &g->algo, &call);
    if (g == &tmp) gemm_plan_free(&tmp);
    if (st != CUBLAS_STATUS_SUCCESS)
        RS_FATAL("cublasLtMatmul failed (status %d) for C (%lld,%lld) = op(A) op(B), K %lld", (int)st, (long long)M,
                 (long long)N, (long long)K);
}

extern "C" int cuda_gemm_reset(int tune) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    int moved = 0;
    for (int i = 0; i < gemm_nplans; i++) {
        moved += memcmp(&gemm_plans[i].algo, &gemm_plans[i].cand[0], sizeof gemm_plans[i].algo) != 0;
        gemm_plan_free(&gemm_plans[i]);
    }
    gemm_nplans = 0;
    gemm_tuning = tune != 0;
    return moved;
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

extern "C" void cuda_matmul_backward(void *dinp /* (T,ldi) or NULL */, float *dw /* (OC,IC) += or NULL */,
                                     const void *dout /* (T,ldo) */, const void *inp /* (T,ldi) */,
                                     const void *w /* (OC,IC) */, int64_t T, int IC, int OC, int ldi, int ldo,
                                     int accumulate_dinp) {
    matmul_check_sizes(T, IC, OC, ldi, ldo);
    RS_CHECK(dinp || dw, "both dinp and dw are NULL: nothing to compute");
    if (T == 0) return;
    if (dinp) cuda_gemm(dinp, 0, ldi, dout, ldo, 0, w, IC, 0, T, IC, OC, accumulate_dinp);
    if (dw) cuda_gemm(dw, 1, IC, dout, ldo, 1, inp, ldi, 0, OC, IC, T, 1);
}
