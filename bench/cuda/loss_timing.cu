/*
 * loss_timing.cu — `build/bench_kernels loss [ROWS]`: the fused lm_head + cross-entropy of the cuda backend
 * (kernels/cuda/cuda_loss.cu, cuda_lm_head_loss) at the 1B hybrid's head (hidden 1536, vocab 151,936) on one
 * row chunk of ROWS rows (default 3,533: the step's chunk of 2 GiB of fp32 logits, lib/model/model_acts.c),
 * and its three GEMMs alone with the same operands and strides; the loss pass (cuda_loss_rows) alone on fresh
 * logits, and as the whole call less the GEMMs, against the least bytes it moves (the fp32 logits read once,
 * the bf16 dlogits written once).
 * Beside them, the same three GEMMs as they would run with bf16 logits (the logits GEMM's output in bf16, the
 * dlogits a dense (n, V) bf16 matrix): what the GEMMs of a bf16-logits head would take, not a production path.
 * Random operands in [-1, 1), random targets. Median of BK_LOSS_REPS runs after two warm-ups; information
 * only, nothing checked (the parity is test_cuda's cuda_lm_head_loss).
 *
 * Called by bench_kernels.cu (main).
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench_kernels.h"
#include "cuda_common.h"
#include "cuda_gemm.h"
#include "cuda_kernels.h"

#define BK_LOSS_REPS 9
#define BK_LOSS_C 1536
#define BK_LOSS_V 151936

typedef struct {
    int64_t n;
    const bf16 *x, *w;
    const int32_t *targets;
    float *losses, *dw, *ws;
    bf16 *dx;
} BkLoss;

static void bk_loss_whole(const BkLoss *b) {
    cuda_lm_head_loss(b->losses, b->dx, b->dw, b->x, b->w, b->targets, 1.0f / (float)b->n, b->ws, b->n, b->n,
                      BK_LOSS_C, BK_LOSS_V);
}
static void bk_loss_gemm_fwd(const BkLoss *b) {
    cuda_gemm(b->ws, 1, BK_LOSS_V, b->x, BK_LOSS_C, 0, b->w, BK_LOSS_C, 1, b->n, BK_LOSS_V, BK_LOSS_C, 0);
}
static void bk_loss_gemm_dx(const BkLoss *b) {
    cuda_gemm(b->dx, 0, BK_LOSS_C, b->ws, 2 * (int64_t)BK_LOSS_V, 0, b->w, BK_LOSS_C, 0, b->n, BK_LOSS_C, BK_LOSS_V,
              0);
}
static void bk_loss_gemm_dw(const BkLoss *b) {
    cuda_gemm(b->dw, 1, BK_LOSS_C, b->ws, 2 * (int64_t)BK_LOSS_V, 1, b->x, BK_LOSS_C, 0, BK_LOSS_V, BK_LOSS_C, b->n, 1);
}

/* the bf16-logits form: logits (n, V) bf16 into the workspace, the dlogits read at stride V */
static void bk_loss_gemm_fwd_bf16(const BkLoss *b) {
    cuda_gemm(b->ws, 0, BK_LOSS_V, b->x, BK_LOSS_C, 0, b->w, BK_LOSS_C, 1, b->n, BK_LOSS_V, BK_LOSS_C, 0);
}
static void bk_loss_gemm_dx_dense(const BkLoss *b) {
    cuda_gemm(b->dx, 0, BK_LOSS_C, b->ws, BK_LOSS_V, 0, b->w, BK_LOSS_C, 0, b->n, BK_LOSS_C, BK_LOSS_V, 0);
}
static void bk_loss_gemm_dw_dense(const BkLoss *b) {
    cuda_gemm(b->dw, 1, BK_LOSS_C, b->ws, BK_LOSS_V, 1, b->x, BK_LOSS_C, 0, BK_LOSS_V, BK_LOSS_C, b->n, 1);
}

/* the loss pass alone (cuda_loss_rows) */
static void bk_loss_pass(const BkLoss *b) {
    cuda_loss_rows(b->losses, b->ws, b->targets, 0, b->n, BK_LOSS_V, 1.0f / (float)b->n, 1);
}

/* median ms of f over BK_LOSS_REPS runs after two warm-ups; `pre` (or NULL) runs before each, untimed (the pass
 * alone: fresh fp32 logits from the logits GEMM each run) */
static float bk_loss_time(void (*f)(const BkLoss *), void (*pre)(const BkLoss *), const BkLoss *b) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float t[BK_LOSS_REPS];
    for (int r = -2; r < BK_LOSS_REPS; r++) {
        if (pre) pre(b);
        CUDA_CHECK(cudaEventRecord(e0, cuda_stream()));
        f(b);
        CUDA_CHECK(cudaEventRecord(e1, cuda_stream()));
        CUDA_CHECK(cudaEventSynchronize(e1));
        if (r >= 0) CUDA_CHECK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return bk_median(t, BK_LOSS_REPS);
}

void bk_loss_timing(int64_t rows) {
    BkLoss b = {.n = rows};
    const bf16 *x = (const bf16 *)bk_dev_random_bf16(rows * BK_LOSS_C, 1),
               *w = (const bf16 *)bk_dev_random_bf16((int64_t)BK_LOSS_V * BK_LOSS_C, 2);
    int32_t *tg = (int32_t *)bk_host_alloc((size_t)rows * 4);
    for (int64_t i = 0; i < rows; i++) tg[i] = (int32_t)(((uint64_t)i * 2654435761u) % BK_LOSS_V);
    b.x = x, b.w = w;
    b.targets = (const int32_t *)bk_upload(tg, (size_t)rows * 4);
    b.losses = (float *)bk_dev_alloc((size_t)rows * 4);
    b.dx = (bf16 *)bk_dev_alloc((size_t)rows * BK_LOSS_C * 2);
    b.dw = (float *)bk_dev_alloc((size_t)BK_LOSS_V * BK_LOSS_C * 4);
    CUDA_CHECK(cudaMemsetAsync(b.dw, 0, (size_t)BK_LOSS_V * BK_LOSS_C * 4, cuda_stream()));
    b.ws = (float *)bk_dev_alloc((size_t)rows * BK_LOSS_V * 4);
    const float whole = bk_loss_time(bk_loss_whole, NULL, &b), fwd = bk_loss_time(bk_loss_gemm_fwd, NULL, &b),
                dx = bk_loss_time(bk_loss_gemm_dx, NULL, &b), dw = bk_loss_time(bk_loss_gemm_dw, NULL, &b);
    const double flop = 2.0 * (double)rows * BK_LOSS_V * BK_LOSS_C, bytes = (double)rows * BK_LOSS_V * 6.0;
    const float fwd16 = bk_loss_time(bk_loss_gemm_fwd_bf16, NULL, &b),
                dx16 = bk_loss_time(bk_loss_gemm_dx_dense, NULL, &b),
                dw16 = bk_loss_time(bk_loss_gemm_dw_dense, NULL, &b);
    const float pass = whole - fwd - dx - dw, pass_alone = bk_loss_time(bk_loss_pass, bk_loss_gemm_fwd, &b);
    printf("bench_kernels loss: rows %lld, C %d, V %d, median of %d\n", (long long)rows, BK_LOSS_C, BK_LOSS_V,
           BK_LOSS_REPS);
    printf("loss whole call      %8.3f ms  (x %.1f chunks of a 131,072-token step: %.1f ms)\n", whole,
           131072.0 / rows, whole * 131072.0 / rows);
    printf("loss gemm logits     %8.3f ms  %6.1f TF/s (fp32 out)\n", fwd, flop / fwd / 1e9);
    printf("loss gemm dx         %8.3f ms  %6.1f TF/s\n", dx, flop / dx / 1e9);
    printf("loss gemm dw         %8.3f ms  %6.1f TF/s (fp32 C, beta 1)\n", dw, flop / dw / 1e9);
    printf("bf16 logits: gemm logits %8.3f ms  %6.1f TF/s (bf16 out)\n", fwd16, flop / fwd16 / 1e9);
    printf("bf16 logits: gemm dx     %8.3f ms  %6.1f TF/s (dlogits stride V)\n", dx16, flop / dx16 / 1e9);
    printf("bf16 logits: gemm dw     %8.3f ms  %6.1f TF/s (dlogits stride V, fp32 C, beta 1)\n", dw16,
           flop / dw16 / 1e9);
    printf("loss pass alone      %8.3f ms  %7.1f GB/s for %.2f GB, %.1f%% of 4.8 TB/s\n", pass_alone,
           bytes / pass_alone / 1e6, bytes / 1e9, 100.0 * bytes / pass_alone / 1e6 / 4800.0);
    printf("loss pass (by diff.) %8.3f ms  %7.1f GB/s for %.2f GB (fp32 logits read, bf16 dlogits written), "
           "%.1f%% of 4.8 TB/s\n",
           pass, bytes / pass / 1e6, bytes / 1e9, 100.0 * bytes / pass / 1e6 / 4800.0);
    fflush(stdout);
    bk_dev_free_all();
}
