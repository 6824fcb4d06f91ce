/*
 * test_cuda_big.cu — the cuda Backend entries at sizes where element offsets pass 2^31 (issue 22:
 * 1M tokens x 16 heads x 128 = 2^31): every case runs the entry on one GPU at T ~ 2^20 rows (2^19
 * for attention) with row strides of 2560..5120 elements, so that row * ld, T * nh * hd and the
 * (T, nv, dk) workspaces of the GDN pass 2^31 elements in the last rows, and compares against the
 * cpu oracle. Cases are named cuda_big_* (`build/test_cuda cuda_big_norm ...`); each needs the
 * device memory its comment counts (an 80 GB H100 holds the largest, cuda_big_gdn, ~72 GiB), so run
 * them one process per case (cuda_big_gdn leaves the GDN workspace, 58 GB, allocated; it comes last).
 * cuda_big_host_kept_bytes needs no GPU.
 *
 * How: inputs are drawn on the device (a counter-based hash, approximately N(0, scale), stored as
 * bf16 / fp32: the values the cpu gets are the ones the kernel read, downloaded). Outputs start
 * poisoned (0xFF bytes, NaN). Two kinds of check:
 *   - narrow blocks (norms, matmul, rope, conv, gates): the tensors are column blocks of 64..128
 *     columns inside rows of BIG_LD = 2560 (a projection row), so the whole (T, cols) block fits on
 *     the host and is compared in full, parameter gradients (sums over all 2^20 rows) included;
 *   - wide tensors (gated RMSNorm, attention, merge, lm_head, GDN, embedding, sigmoid gate, SwiGLU,
 *     the flat copies and adds, AdamW; sum_squares is summed whole on the host): the rows of
 *     a few windows (the first rows, the rows where the offsets pass 2^31, the last rows) are
 *     compared, the cpu oracle running on each window alone (every such entry is row-local, or
 *     local to a document that the window holds whole); where a parameter gradient sums over all
 *     rows, the upstream gradient is 0 outside the windows (lm_head: target -1, ignored) so the
 *     sum over the windows is the whole sum. A device count then requires every element of every
 *     output to be written (no poison left anywhere, windows or not) and every column outside the
 *     blocks to keep its poison.
 * Bounds: those of cuda_test.h; parameter gradients summed over ~2^20 rows use BIG_BOUND_SUM.
 * cuda_big_norm also shows the comparison fails when the rows past 2^31 elements come from other rows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cpu_kernels.h"
#include "cuda_gdn_tune.h"
#include "cuda_kernels.h"
#include "cuda_test.h"

#define BIG_T   (((int64_t)1 << 20) + 64) /* rows: 2^20 tokens and a partial 64-row tile */
#define BIG_LD  2560                      /* a projection row (the 1B config's attention [q|gate|k|v]) */
#define BIG_WIN 256                       /* rows of a check window */
#define BIG_2G  ((int64_t)1 << 31)
/* fp32 sums over ~2^21 rows: the cpu adds them one by one in fp32, whose rounding walks ~sqrt(n) eps
 * ~ 1e-4 of the sum (the kernels' blocked sums less); a kernel that loses or repeats the rows past
 * 2^31 elements (1/5 of them) is off by ~0.2 or more */
#define BIG_BOUND_SUM 1e-3

/* ---- device side: inputs, poison counts ---- */

__device__ __forceinline__ uint64_t big_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* uniform in (0, 1) */
__device__ __forceinline__ float big_unit(uint64_t seed, uint64_t i) {
    return ((float)(big_mix(seed ^ big_mix(i)) >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

/* ~N(0, 1): Irwin-Hall of 4, never 0 */
__device__ __forceinline__ float big_normal(uint64_t seed, uint64_t i) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) s += big_unit(seed + (uint64_t)k * 0x632BE59BD9B4E019ull, i);
    s = (s - 2.0f) * 1.7320508f;
    return s == 0.0f ? 1e-3f : s;
}

__global__ void big_fill_bf16_kernel(bf16 *p, int64_t rows, int cols, int64_t ld, uint64_t seed, float scale) {
    const int64_t n = rows * cols;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        p[(e / cols) * ld + e % cols] = __float2bfloat16_rn(scale * big_normal(seed, (uint64_t)e));
}

/* lo + (hi - lo) u, u uniform in (0, 1) */
__global__ void big_fill_f32_kernel(float *p, int64_t rows, int cols, int64_t ld, uint64_t seed, float lo, float hi) {
    const int64_t n = rows * cols;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        p[(e / cols) * ld + e % cols] = lo + (hi - lo) * big_unit(seed, (uint64_t)e);
}

/* elements of the (rows, cols) block at p (stride ld, esize 2 or 4 bytes) that still hold the poison */
__global__ void big_poison_kernel(unsigned long long *count, const void *p, int esize, int64_t rows, int cols,
                                  int64_t ld) {
    const int64_t n = rows * cols;
    unsigned long long c = 0;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = (e / cols) * ld + e % cols;
        c += esize == 2 ? ((const uint16_t *)p)[i] == 0xFFFFu : ((const uint32_t *)p)[i] == 0xFFFFFFFFu;
    }
    if (c) atomicAdd(count, c);
}

static unsigned big_grid(int64_t n) { return (unsigned)(n / 256 + 1 < 65536 ? n / 256 + 1 : 65536); }

/* ---- host side ---- */

#define BIG_MAX_BUFFERS 64
static void *big_bufs[BIG_MAX_BUFFERS];
static uint64_t big_seed = 1;

/* a device buffer of 0xFF bytes, freed by big_free or big_end */
static void *big_dev(size_t bytes) {
    void *p = NULL;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        fprintf(stderr, "big_dev: cudaMalloc of %.2f GiB failed (%s): %.2f GiB free of %.2f; the cuda_big_* cases "
                        "need an 80 GB GPU, one process per case\n",
                (double)bytes / (1 << 30), cudaGetErrorString(e), (double)fr / (1 << 30), (double)tot / (1 << 30));
        exit(2);
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes, cuda_stream()));
    for (int i = 0; i < BIG_MAX_BUFFERS; i++)
        if (!big_bufs[i]) return big_bufs[i] = p;
    fprintf(stderr, "big_dev: raise BIG_MAX_BUFFERS\n");
    exit(2);
}

static void big_free(void *p) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    for (int i = 0; i < BIG_MAX_BUFFERS; i++)
        if (big_bufs[i] == p) {
            CUDA_CHECK(cudaFree(p));
            big_bufs[i] = NULL;
        }
}

static void big_end(void) {
    for (int i = 0; i < BIG_MAX_BUFFERS; i++)
        if (big_bufs[i]) big_free(big_bufs[i]);
    long long index;
    int value, code = cuda_error_take(&index, &value);
    EXPECT(code == CUDA_ERR_NONE, "device error %d (index %lld, value %d)", code, index, value);
}

static void big_fill(bf16 *p, int64_t rows, int cols, int64_t ld, float scale) {
    big_fill_bf16_kernel<<<big_grid(rows * cols), 256, 0, cuda_stream()>>>(p, rows, cols, ld, big_seed++, scale);
    CUDA_LAUNCH_CHECK();
}

static void big_fill_f32(float *p, int64_t rows, int cols, int64_t ld, float lo, float hi) {
    big_fill_f32_kernel<<<big_grid(rows * cols), 256, 0, cuda_stream()>>>(p, rows, cols, ld, big_seed++, lo, hi);
    CUDA_LAUNCH_CHECK();
}

static int64_t big_poison(const void *p, int esize, int64_t rows, int cols, int64_t ld) {
    unsigned long long *d = (unsigned long long *)ct_dev(sizeof *d), h = 0;
    CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof *d, cuda_stream()));
    big_poison_kernel<<<big_grid(rows * cols), 256, 0, cuda_stream()>>>(d, p, esize, rows, cols, ld);
    CUDA_LAUNCH_CHECK();
    /* on the kernels' stream: cuda_stream() is non-blocking, so a plain cudaMemcpy on the legacy stream
     * would not wait for the count (and read 0) */
    CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    return (int64_t)h;
}

/* every element of an output block written */
static void big_written(const char *what, const void *p, int esize, int64_t rows, int cols, int64_t ld) {
    const int64_t n = big_poison(p, esize, rows, cols, ld);
    printf("%s: %lld x %d elements, %lld unwritten %s\n", what, (long long)rows, cols, (long long)n, n ? "FAIL" : "ok");
    EXPECT(n == 0, "%s: %lld elements of the output never written", what, (long long)n);
}

/* a block no entry writes still all poison */
static void big_untouched(const char *what, const void *p, int esize, int64_t rows, int cols, int64_t ld) {
    const int64_t n = big_poison(p, esize, rows, cols, ld), want = rows * cols;
    printf("%s: %lld of %lld poisoned elements kept %s\n", what, (long long)n, (long long)want, n == want ? "ok" : "FAIL");
    EXPECT(n == want, "%s: %lld elements outside the blocks written", what, (long long)(want - n));
}

/* rows [r0, r0 + n) x cols of a strided bf16 / fp32 device block -> dense host floats */
static float *big_rows(const bf16 *d, int64_t r0, int64_t n, int cols, int64_t ld) {
    bf16 *tmp = (bf16 *)test_alloc(n * cols * (int64_t)sizeof(bf16));
    if (ld == cols) /* contiguous: one plain copy */
        CUDA_CHECK(cudaMemcpyAsync(tmp, d + r0 * ld, (size_t)(n * cols) * 2, cudaMemcpyDeviceToHost, cuda_stream()));
    else
        CUDA_CHECK(cudaMemcpy2DAsync(tmp, (size_t)cols * 2, d + r0 * ld, (size_t)ld * 2, (size_t)cols * 2, (size_t)n,
                                     cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    float *h = ct_host(n * cols);
    for (int64_t i = 0; i < n * cols; i++) h[i] = __bfloat162float(tmp[i]);
    return h;
}

static float *big_rows_f32(const float *d, int64_t r0, int64_t n, int cols, int64_t ld) {
    float *h = ct_host(n * cols);
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, d + r0 * ld) != cudaSuccess || at.type != cudaMemoryTypeDevice) {
        fprintf(stderr, "big_rows_f32: rows [%lld, +%lld) x %d (ld %lld) of %p: %p is not device memory (type %d, %s)\n",
                (long long)r0, (long long)n, cols, (long long)ld, (const void *)d, (const void *)(d + r0 * ld),
                (int)at.type, cudaGetErrorString(cudaGetLastError()));
        exit(2);
    }
    if (ld == cols) {
        const cudaError_t e = cudaMemcpyAsync(h, d + r0 * ld, (size_t)(n * cols) * 4, cudaMemcpyDeviceToHost,
                                              cuda_stream());
        if (e != cudaSuccess) { /* say what the copy was (a window past the buffer reads as invalid argument) */
            fprintf(stderr, "big_rows_f32: copy of rows [%lld, +%lld) x %d (ld %lld) from %p (+%lld B) to %p: %s\n",
                    (long long)r0, (long long)n, cols, (long long)ld, (const void *)d, (long long)(r0 * ld * 4),
                    (void *)h, cudaGetErrorString(e));
            exit(2);
        }
    } else
        CUDA_CHECK(cudaMemcpy2DAsync(h, (size_t)cols * 4, d + r0 * ld, (size_t)ld * 4, (size_t)cols * 4, (size_t)n,
                                     cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    return h;
}

static float *big_all(const bf16 *d, int cols) { return big_rows(d, 0, BIG_T, cols, BIG_LD); }

static bf16 *big_up_w(float **h, int64_t n, double scale) {
    *h = ct_host_normal(n, scale);
    ct_round_bf16(*h, n);
    return ct_up_bf16(*h, n);
}

/* the first row whose element offset row * ld reaches 2^31 */
static int64_t big_cross(int64_t ld) { return (BIG_2G + ld - 1) / ld; }

typedef struct {
    int64_t r0, n;
} BigWin;

/* the flat tensors of n = BIG_N elements (an odd tail): windows at the start, across 2^31 (from 2^19 before it
 * to the end: only 4099 elements lie past 2^31) and the last 2^20 */
#define BIG_N (BIG_2G + 4099)
static const BigWin big_flat_win[3] = {
    {0, 1 << 20}, {BIG_2G - (1 << 19), BIG_N - (BIG_2G - (1 << 19))}, {BIG_N - (1 << 20), 1 << 20}};

/* rows of a dense (T, cols) bf16 tensor outside the windows (in row order) set to 0 */
static void big_zero_outside(bf16 *p, int64_t T, int cols, const BigWin *win, int nw) {
    int64_t t = 0;
    for (int i = 0; i <= nw; i++) {
        const int64_t next = i < nw ? win[i].r0 : T;
        if (next > t) CUDA_CHECK(cudaMemsetAsync(p + t * cols, 0, (size_t)((next - t) * cols) * 2, cuda_stream()));
        if (i < nw) t = win[i].r0 + win[i].n;
    }
}

/* ---- narrow blocks in (BIG_T, BIG_LD) rows: the whole block on the host ---- */

/* RMSNorm (2 heads of 64, zero-centred) and L2 norm forward and backward. Device: one (T, 2560) bf16
 * buffer, 5.4 GB: inp, out, dout, dinp in its last 512 columns (offsets up to 2.7e9). */
TEST(cuda_big_norm) {
    ct_begin();
    const int64_t T = BIG_T;
    const int nh = 2, D = 64, W = nh * D, ld = BIG_LD;
    bf16 *X = (bf16 *)big_dev((size_t)T * ld * 2);
    bf16 *inp = X + ld - 4 * W, *out = X + ld - 3 * W, *dout = X + ld - 2 * W, *dinp = X + ld - W;
    float *w, *rstd = (float *)big_dev((size_t)T * nh * 4);
    bf16 *d_w = big_up_w(&w, D, 0.5);
    big_fill(inp, T, W, ld, 1.0f);
    cuda_rmsnorm_forward(out, rstd, inp, d_w, T, nh, D, ld, ld, 1e-6f, 1);
    float *x = big_all(inp, W), *y = big_all(out, W), *r = big_rows_f32(rstd, 0, T * nh, 1, 1);
    float *yc = ct_host_nan(T * W), *rc = ct_host_nan(T * nh);
    cpu_rmsnorm_forward(yc, rc, x, w, T, nh, D, W, W, 1e-6f, 1);
    test_check_rel_f("big rmsnorm fwd out", y, yc, T * W, CT_BOUND_BF16_OUT);
    test_check_rel_f("big rmsnorm fwd rstd", r, rc, T * nh, CT_BOUND_F32);
    { /* the check can fail: the rows past 2^31 elements read 1000 rows too early, as a wrapped index would */
        const int64_t cr = big_cross(ld);
        float *bad = ct_clone(y, T * W);
        memmove(bad + cr * W, bad + (cr - 1000) * W, (size_t)(T - cr) * W * sizeof(float));
        const double e = test_rel_err_f(bad, yc, T * W);
        printf("big can fail: rows past 2^31 elements shifted: rel err %.3e > %.0e %s\n", e, CT_BOUND_BF16_OUT,
               e > CT_BOUND_BF16_OUT ? "ok" : "FAIL");
        EXPECT(e > CT_BOUND_BF16_OUT, "shifted rows gave rel err %.3e: the check cannot fail", e);
    }

    big_fill(dout, T, W, ld, 1.0f);
    big_fill(dinp, T, W, ld, 0.5f); /* += */
    float *g = big_all(dout, W), *dic = big_all(dinp, W), *dw0 = ct_host_normal(D, 0.1), *dwc = ct_clone(dw0, D);
    float *d_dw = ct_up_f32(dw0, D), *d_rc = ct_up_f32(rc, T * nh), *dw = ct_host(D);
    cuda_rmsnorm_backward(dinp, d_dw, dout, inp, d_w, d_rc, T, nh, D, ld, ld, 1);
    cpu_rmsnorm_backward(dic, dwc, g, x, w, rc, T, nh, D, W, W, 1);
    test_check_rel_f("big rmsnorm bwd dinp +=", big_all(dinp, W), dic, T * W, CT_BOUND_BF16_OUT);
    ct_down_f32(dw, d_dw, D);
    test_check_rel_f("big rmsnorm bwd dw += (2^21 rows)", dw, dwc, D, BIG_BOUND_SUM);

    /* L2 norm: the group kernel (D 64, 16-byte rows) */
    cuda_l2norm_forward(out, rstd, inp, T, nh, D, ld, ld);
    cpu_l2norm_forward(yc, rc, x, T, nh, D, W, W);
    y = big_all(out, W);
    test_check_rel_f("big l2norm fwd out", y, yc, T * W, CT_BOUND_BF16_OUT);
    test_check_rel_f("big l2norm fwd rstd", big_rows_f32(rstd, 0, T * nh, 1, 1), rc, T * nh, CT_BOUND_F32);
    CUDA_CHECK(cudaMemcpyAsync(d_rc, rc, (size_t)T * nh * 4, cudaMemcpyHostToDevice, cuda_stream()));
    cuda_l2norm_backward(dinp, dout, out, d_rc, T, nh, D, ld, ld);
    cpu_l2norm_backward(dic, g, y, rc, T, nh, D, W, W);
    test_check_rel_f("big l2norm bwd dinp", big_all(dinp, W), dic, T * W, CT_BOUND_BF16_OUT);
    big_untouched("big norm: columns outside the blocks", X, 2, T, ld - 4 * W, ld);
    big_end();
}

/* y = x W^T and its backward through cuBLASLt with T = 2^20 + 64 rows of ld 2560 (IC = OC = 64).
 * Device: one (T, 2560) bf16 buffer, 5.4 GB. */
TEST(cuda_big_matmul) {
    ct_begin();
    const int64_t T = BIG_T;
    const int IC = 64, OC = 64, ld = BIG_LD;
    bf16 *X = (bf16 *)big_dev((size_t)T * ld * 2);
    bf16 *inp = X + ld - 256, *out = X + ld - 192, *dout = X + ld - 128, *dinp = X + ld - 64;
    float *w;
    bf16 *d_w = big_up_w(&w, (int64_t)OC * IC, 0.125);
    big_fill(inp, T, IC, ld, 1.0f);
    cuda_matmul_forward(out, inp, d_w, T, IC, OC, ld, ld, 0);
    float *x = big_all(inp, IC), *yc = ct_host_nan(T * OC);
    cpu_matmul_forward(yc, x, w, T, IC, OC, IC, OC, 0);
    test_check_rel_f("big matmul fwd out", big_all(out, OC), yc, T * OC, CT_BOUND_BF16_OUT);

    big_fill(dout, T, OC, ld, 1.0f);
    float *g = big_all(dout, OC), *dic = ct_host_nan(T * IC), *dw0 = ct_host_normal((int64_t)OC * IC, 0.1);
    float *dwc = ct_clone(dw0, (int64_t)OC * IC), *d_dw = ct_up_f32(dw0, (int64_t)OC * IC), *dw = ct_host(OC * IC);
    cuda_matmul_backward(dinp, d_dw, dout, inp, d_w, T, IC, OC, ld, ld, 0);
    cpu_matmul_backward(dic, dwc, g, x, w, T, IC, OC, IC, OC, 0);
    test_check_rel_f("big matmul bwd dinp", big_all(dinp, IC), dic, T * IC, CT_BOUND_BF16_OUT);
    ct_down_f32(dw, d_dw, (int64_t)OC * IC);
    test_check_rel_f("big matmul bwd dW += (K = 2^20 + 64)", dw, dwc, (int64_t)OC * IC, BIG_BOUND_SUM);
    big_untouched("big matmul: columns outside the blocks", X, 2, T, ld - 256, ld);
    big_end();
}

/* partial RoPE (hd 128, rd 64) in place on the last 128 columns, pos = t up to 2^20 (the compensated
 * angle). Device: 5.4 GB. */
TEST(cuda_big_rope) {
    ct_begin();
    const int64_t T = BIG_T;
    const int nh = 1, hd = 128, rd = 64, ld = BIG_LD;
    bf16 *X = (bf16 *)big_dev((size_t)T * ld * 2), *x = X + ld - hd;
    int32_t *pos = (int32_t *)test_alloc(T * 4);
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)t;
    int32_t *d_pos = ct_up_i32(pos, T);
    big_fill(x, T, hd, ld, 1.0f);
    float *xc = big_all(x, hd);
    cuda_rope_forward(x, d_pos, T, nh, hd, rd, ld, 1e6f);
    cpu_rope_forward(xc, pos, T, nh, hd, rd, hd, 1e6f);
    float *y = big_all(x, hd);
    test_check_rel_f("big rope fwd", y, xc, T * hd, CT_BOUND_BF16_OUT);
    cuda_rope_backward(x, d_pos, T, nh, hd, rd, ld, 1e6f);
    cpu_rope_backward(y, pos, T, nh, hd, rd, hd, 1e6f);
    test_check_rel_f("big rope bwd", big_all(x, hd), y, T * hd, CT_BOUND_BF16_OUT);
    big_untouched("big rope: columns outside the block", X, 2, T, ld - hd, ld);
    big_end();
}

/* conv1d + SiLU, Kc 4 (the run kernels) and Kc 3 (the generic kernels), C = 64 in rows of 2560,
 * documents of 2048 tokens, the first one begun before the call (halo read). Device: 5.4 GB. */
TEST(cuda_big_conv) {
    ct_begin();
    const int64_t T = BIG_T;
    const int C = 64, ld = BIG_LD;
    bf16 *X = (bf16 *)big_dev((size_t)T * ld * 2);
    bf16 *inp = X + ld - 256, *out = X + ld - 192, *dout = X + ld - 128, *dinp = X + ld - 64;
    int32_t *dp = (int32_t *)test_alloc(T * 4);
    for (int64_t t = 0; t < T; t++) dp[t] = (int32_t)((t + 5) % 2048);
    int32_t *d_dp = ct_up_i32(dp, T);
    big_fill(inp, T, C, ld, 1.0f);
    big_fill(dout, T, C, ld, 1.0f);
    float *x = big_all(inp, C), *g = big_all(dout, C);
    for (int Kc = 4; Kc >= 3; Kc--) {
        char what[96];
        float *w, *halo;
        bf16 *d_w = big_up_w(&w, (int64_t)C * Kc, 0.5), *d_halo = big_up_w(&halo, (int64_t)(Kc - 1) * C, 1.0);
        bf16 *d_dhalo = (bf16 *)ct_dev((size_t)(Kc - 1) * C * 2);
        cuda_conv1d_silu_forward(out, inp, d_halo, d_w, d_dp, T, C, Kc, ld, ld);
        float *yc = ct_host_nan(T * C);
        cpu_conv1d_silu_forward(yc, x, halo, w, dp, T, C, Kc, C, C);
        snprintf(what, sizeof what, "big conv Kc %d fwd out", Kc);
        test_check_rel_f(what, big_all(out, C), yc, T * C, CT_BOUND_BF16_OUT);

        float *dw0 = ct_host_normal((int64_t)C * Kc, 0.1), *dwc = ct_clone(dw0, (int64_t)C * Kc);
        float *d_dw = ct_up_f32(dw0, (int64_t)C * Kc), *dw = ct_host((int64_t)C * Kc);
        float *dic = ct_host_nan(T * C), *dhc = ct_host_nan((int64_t)(Kc - 1) * C), *dh = ct_host((Kc - 1) * C);
        cuda_conv1d_silu_backward(dinp, d_dhalo, d_dw, dout, inp, d_halo, d_w, d_dp, T, C, Kc, ld, ld);
        cpu_conv1d_silu_backward(dic, dhc, dwc, g, x, halo, w, dp, T, C, Kc, C, C);
        snprintf(what, sizeof what, "big conv Kc %d bwd dinp", Kc);
        test_check_rel_f(what, big_all(dinp, C), dic, T * C, CT_BOUND_BF16_OUT);
        ct_down_bf16(dh, d_dhalo, (int64_t)(Kc - 1) * C);
        snprintf(what, sizeof what, "big conv Kc %d bwd dhalo", Kc);
        test_check_rel_f(what, dh, dhc, (int64_t)(Kc - 1) * C, CT_BOUND_BF16_OUT);
        ct_down_f32(dw, d_dw, (int64_t)C * Kc);
        snprintf(what, sizeof what, "big conv Kc %d bwd dw += (2^20 rows)", Kc);
        test_check_rel_f(what, dw, dwc, (int64_t)C * Kc, BIG_BOUND_SUM);
    }
    big_untouched("big conv: columns outside the blocks", X, 2, T, ld - 256, ld);
    big_end();
}

/* GDN gates forward and backward, 16 value heads, b and a in rows of 2560. Device: 5.4 GB + 4 x 67 MB. */
TEST(cuda_big_gdn_gates) {
    ct_begin();
    const int64_t T = BIG_T;
    const int nv = 16, ld = BIG_LD;
    bf16 *X = (bf16 *)big_dev((size_t)T * ld * 2);
    bf16 *b = X + ld - 64, *a = X + ld - 48, *db = X + ld - 32, *da = X + ld - 16;
    float *beta = (float *)big_dev((size_t)T * nv * 4), *g = (float *)big_dev((size_t)T * nv * 4);
    float *dbeta = (float *)big_dev((size_t)T * nv * 4), *dg = (float *)big_dev((size_t)T * nv * 4);
    float *A_log = ct_host(nv), *dt_bias = ct_host_normal(nv, 0.5);
    for (int h = 0; h < nv; h++) A_log[h] = logf(0.3f + 0.1f * h);
    float *d_A = ct_up_f32(A_log, nv), *d_dt = ct_up_f32(dt_bias, nv);
    big_fill(b, T, nv, ld, 1.0f);
    big_fill(a, T, nv, ld, 1.0f);
    cuda_gdn_gates_forward(beta, g, b, a, d_A, d_dt, T, nv, ld);
    float *bh = big_all(b, nv), *ah = big_all(a, nv), *bc = ct_host_nan(T * nv), *gc = ct_host_nan(T * nv);
    cpu_gdn_gates_forward(bc, gc, bh, ah, A_log, dt_bias, T, nv, nv);
    test_check_rel_f("big gates fwd beta", big_rows_f32(beta, 0, T, nv, nv), bc, T * nv, CT_BOUND_F32);
    test_check_rel_f("big gates fwd g", big_rows_f32(g, 0, T, nv, nv), gc, T * nv, CT_BOUND_F32);

    big_fill_f32(dbeta, T, nv, nv, -1.0f, 1.0f);
    big_fill_f32(dg, T, nv, nv, -1.0f, 1.0f);
    float *dbh = big_rows_f32(dbeta, 0, T, nv, nv), *dgh = big_rows_f32(dg, 0, T, nv, nv);
    float *dA0 = ct_host_normal(nv, 0.1), *ddt0 = ct_host_normal(nv, 0.1);
    float *dAc = ct_clone(dA0, nv), *ddtc = ct_clone(ddt0, nv), *d_dA = ct_up_f32(dA0, nv), *d_ddt = ct_up_f32(ddt0, nv);
    float *dbc = ct_host_nan(T * nv), *dac = ct_host_nan(T * nv), *dA = ct_host(nv), *ddt = ct_host(nv);
    cuda_gdn_gates_backward(db, da, d_dA, d_ddt, dbeta, dg, b, a, d_A, d_dt, T, nv, ld);
    cpu_gdn_gates_backward(dbc, dac, dAc, ddtc, dbh, dgh, bh, ah, A_log, dt_bias, T, nv, nv);
    test_check_rel_f("big gates bwd db", big_all(db, nv), dbc, T * nv, CT_BOUND_BF16_OUT);
    test_check_rel_f("big gates bwd da", big_all(da, nv), dac, T * nv, CT_BOUND_BF16_OUT);
    ct_down_f32(dA, d_dA, nv);
    ct_down_f32(ddt, d_ddt, nv);
    test_check_rel_f("big gates bwd dA_log += (2^20 rows)", dA, dAc, nv, BIG_BOUND_SUM);
    test_check_rel_f("big gates bwd ddt_bias += (2^20 rows)", ddt, ddtc, nv, BIG_BOUND_SUM);
    big_untouched("big gates: columns outside the blocks", X, 2, T, ld - 64, ld);
    big_end();
}

/* ---- wide tensors: windows ---- */

/* bf16 <-> fp32 and add_f32 over n = 2^31 + 4099 elements (an odd tail), add_2d over (T, 2560) rows;
 * windows: the first 2^20 elements, 2^20 around 2^31, the last 2^20 (bitwise). Device: 8.6 GB fp32 x 3 +
 * 4.3 GB bf16 = 30 GB, then 2 x 5.4 GB. */
TEST(cuda_big_memory) {
    ct_begin();
    const int64_t n = BIG_N;
    const BigWin *win = big_flat_win;
    float *src = (float *)big_dev((size_t)n * 4), *back = (float *)big_dev((size_t)n * 4);
    float *acc = (float *)big_dev((size_t)n * 4);
    bf16 *act = (bf16 *)big_dev((size_t)n * 2);
    big_fill_f32(src, n, 1, 1, -3.0f, 3.0f);
    big_fill_f32(acc, n, 1, 1, -1.0f, 1.0f);
    float *acc0[3];
    for (int i = 0; i < 3; i++) acc0[i] = big_rows_f32(acc, win[i].r0, win[i].n, 1, 1);
    cuda_act_from_f32(act, src, n);
    cuda_act_to_f32(back, act, n);
    cuda_add_f32(acc, src, n);
    for (int i = 0; i < 3; i++) {
        char what[96];
        const int64_t r0 = win[i].r0, k = win[i].n;
        float *s = big_rows_f32(src, r0, k, 1, 1), *want = ct_host(k), *sum = ct_host(k);
        for (int64_t j = 0; j < k; j++) {
            want[j] = __bfloat162float(__float2bfloat16_rn(s[j]));
            sum[j] = acc0[i][j] + s[j];
        }
        snprintf(what, sizeof what, "big act_from_f32 [%lld, +%lld)", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(act, r0, k, 1, 1), want, k, 0.0);
        snprintf(what, sizeof what, "big act_to_f32 [%lld, +%lld)", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows_f32(back, r0, k, 1, 1), want, k, 0.0);
        snprintf(what, sizeof what, "big add_f32 [%lld, +%lld)", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows_f32(acc, r0, k, 1, 1), sum, k, 0.0);
    }
    big_written("big act_from_f32", act, 2, n, 1, 1);
    big_written("big act_to_f32", back, 4, n, 1, 1);
    big_free(src), big_free(back), big_free(acc), big_free(act);

    /* add_2d: dst (T, 2560) += src (T, 2560) on a 1001-column block that starts mid-vector (the scalar path) */
    const int64_t T = BIG_T;
    const int ld = BIG_LD, cols = 1001, c0 = ld - cols;
    bf16 *dst = (bf16 *)big_dev((size_t)T * ld * 2), *s2 = (bf16 *)big_dev((size_t)T * ld * 2);
    big_fill(dst + c0, T, cols, ld, 1.0f);
    big_fill(s2 + c0, T, cols, ld, 1.0f);
    const BigWin w2[3] = {{0, BIG_WIN}, {big_cross(ld) - BIG_WIN / 2, BIG_WIN}, {T - BIG_WIN, BIG_WIN}};
    float *d0[3];
    for (int i = 0; i < 3; i++) d0[i] = big_rows(dst + c0, w2[i].r0, w2[i].n, cols, ld);
    cuda_add_2d(dst + c0, s2 + c0, T, cols, ld, ld);
    for (int i = 0; i < 3; i++) {
        char what[96];
        const int64_t k = w2[i].n * cols;
        float *b = big_rows(s2 + c0, w2[i].r0, w2[i].n, cols, ld), *want = ct_host(k);
        for (int64_t j = 0; j < k; j++) want[j] = __bfloat162float(__float2bfloat16_rn(d0[i][j] + b[j]));
        snprintf(what, sizeof what, "big add_2d rows [%lld, +%lld)", (long long)w2[i].r0, (long long)w2[i].n);
        test_check_rel_f(what, big_rows(dst + c0, w2[i].r0, w2[i].n, cols, ld), want, k, 0.0);
    }
    big_untouched("big add_2d: columns outside the block", dst, 2, T, c0, ld);
    big_end();
}

/* gated RMSNorm, 16 heads of 128: x, out, dout, dx dense (T, 2048) (row r = t nv + h: r dv passes 2^31
 * in the last 64 tokens), z and dz in rows of 2560. dout is 0 outside the windows, so dw sums the
 * windows only. Device: 4 x 4.3 + 2 x 5.4 GB = 28 GB. */
TEST(cuda_big_gated_rmsnorm) {
    ct_begin();
    const int64_t T = BIG_T;
    const int nv = 16, dv = 128, W = nv * dv, ldz = BIG_LD;
    const BigWin win[4] = {{0, BIG_WIN}, {T / 2 + 7, BIG_WIN}, {big_cross(ldz) - BIG_WIN / 2, BIG_WIN},
                           {T - BIG_WIN, BIG_WIN}}; /* in row order (dout is zeroed between them) */
    bf16 *x = (bf16 *)big_dev((size_t)T * W * 2), *out = (bf16 *)big_dev((size_t)T * W * 2);
    bf16 *dout = (bf16 *)big_dev((size_t)T * W * 2), *dx = (bf16 *)big_dev((size_t)T * W * 2);
    bf16 *z = (bf16 *)big_dev((size_t)T * ldz * 2), *dz = (bf16 *)big_dev((size_t)T * ldz * 2);
    float *rstd = (float *)big_dev((size_t)T * nv * 4), *w;
    bf16 *d_w = big_up_w(&w, dv, 0.5);
    big_fill(x, T, W, W, 1.0f);
    big_fill(z, T, W, ldz, 1.0f);
    big_fill(dout, T, W, W, 1.0f);
    big_zero_outside(dout, T, W, win, 4);
    cuda_gated_rmsnorm_forward(out, rstd, x, z, d_w, T, nv, dv, ldz, 1e-6f);
    float *dw0 = ct_host_normal(dv, 0.1), *dwc = ct_clone(dw0, dv), *d_dw = ct_up_f32(dw0, dv), *dw = ct_host(dv);
    cuda_gated_rmsnorm_backward(dx, dz, d_dw, dout, x, z, d_w, rstd, T, nv, dv, ldz);
    for (int i = 0; i < 4; i++) {
        char what[128];
        const int64_t r0 = win[i].r0, k = win[i].n;
        float *xh = big_rows(x, r0, k, W, W), *zh = big_rows(z, r0, k, W, ldz), *gh = big_rows(dout, r0, k, W, W);
        float *yc = ct_host_nan(k * W), *rc = ct_host_nan(k * nv), *dxc = ct_host_nan(k * W), *dzc = ct_host_nan(k * W);
        cpu_gated_rmsnorm_forward(yc, rc, xh, zh, w, k, nv, dv, W, 1e-6f);
        float *rg = big_rows_f32(rstd, r0, k, nv, nv);
        cpu_gated_rmsnorm_backward(dxc, dzc, dwc, gh, xh, zh, w, rg, k, nv, dv, W);
        snprintf(what, sizeof what, "big gated rmsnorm rows [%lld, +%lld) fwd out", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(out, r0, k, W, W), yc, k * W, CT_BOUND_BF16_OUT);
        snprintf(what, sizeof what, "big gated rmsnorm rows [%lld, +%lld) fwd rstd", (long long)r0, (long long)k);
        test_check_rel_f(what, rg, rc, k * nv, CT_BOUND_F32);
        snprintf(what, sizeof what, "big gated rmsnorm rows [%lld, +%lld) bwd dx", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(dx, r0, k, W, W), dxc, k * W, CT_BOUND_BF16_OUT);
        snprintf(what, sizeof what, "big gated rmsnorm rows [%lld, +%lld) bwd dz", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(dz, r0, k, W, ldz), dzc, k * W, CT_BOUND_BF16_OUT);
    }
    ct_down_f32(dw, d_dw, dv);
    test_check_rel_f("big gated rmsnorm bwd dw += (the windows)", dw, dwc, dv, BIG_BOUND_SUM);
    big_written("big gated rmsnorm out", out, 2, T, W, W);
    big_written("big gated rmsnorm dx", dx, 2, T, W, W);
    big_written("big gated rmsnorm dz", dz, 2, T, W, ldz);
    big_untouched("big gated rmsnorm: dz columns past nv dv", dz + W, 2, T, ldz - W, ldz);
    big_end();
}

/* LSE merge, 16 heads of 128: out (T, 2048) fp32 (w hd, w = t nh + h, passes 2^31 in the last 64
 * tokens), out_b bf16 in rows of 2560; lse_b = -inf on every 7th (row, head), lse = -inf on every 5th.
 * Device: 8.6 + 5.4 GB. */
__global__ void big_neg_inf_kernel(float *p, int64_t n, int every) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        if (i % every == 0) p[i] = -INFINITY;
}

TEST(cuda_big_attention_merge) {
    ct_begin();
    const int64_t T = BIG_T;
    const int nh = 16, hd = 128, W = nh * hd, ldb = BIG_LD;
    const BigWin win[4] = {{0, BIG_WIN}, {big_cross(ldb) - BIG_WIN / 2, BIG_WIN}, {T / 2 + 3, BIG_WIN},
                           {T - BIG_WIN, BIG_WIN}};
    float *out = (float *)big_dev((size_t)T * W * 4), *lse = (float *)big_dev((size_t)T * nh * 4);
    float *lse_b = (float *)big_dev((size_t)T * nh * 4);
    bf16 *ob = (bf16 *)big_dev((size_t)T * ldb * 2);
    big_fill_f32(out, T, W, W, -1.0f, 1.0f);
    big_fill_f32(lse, T, nh, nh, -2.0f, 2.0f);
    big_fill_f32(lse_b, T, nh, nh, -2.0f, 2.0f);
    big_neg_inf_kernel<<<big_grid(T * nh), 256, 0, cuda_stream()>>>(lse_b, T * nh, 7);
    big_neg_inf_kernel<<<big_grid(T * nh), 256, 0, cuda_stream()>>>(lse, T * nh, 5);
    big_fill(ob, T, W, ldb, 1.0f);
    float *o0[4], *l0[4];
    for (int i = 0; i < 4; i++) {
        o0[i] = big_rows_f32(out, win[i].r0, win[i].n, W, W);
        l0[i] = big_rows_f32(lse, win[i].r0, win[i].n, nh, nh);
    }
    cuda_attention_merge(out, lse, ob, lse_b, T, nh, hd, ldb);
    for (int i = 0; i < 4; i++) {
        char what[128];
        const int64_t r0 = win[i].r0, k = win[i].n;
        float *obh = big_rows(ob, r0, k, W, ldb), *lbh = big_rows_f32(lse_b, r0, k, nh, nh);
        cpu_attention_merge(o0[i], l0[i], obh, lbh, k, nh, hd, W);
        snprintf(what, sizeof what, "big merge rows [%lld, +%lld) out", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows_f32(out, r0, k, W, W), o0[i], k * W, CT_BOUND_F32);
        /* where both sides were empty (-inf, one row-head in 35) the merged lse stays -inf: compared
         * exactly, then set to 0 for the relative check of the rest */
        float *lg = big_rows_f32(lse, r0, k, nh, nh);
        int64_t empty = 0, wrong = 0;
        for (int64_t j = 0; j < k * nh; j++)
            if (isinf(l0[i][j]) || isinf(lg[j])) {
                empty++;
                wrong += !(isinf(l0[i][j]) && l0[i][j] < 0 && lg[j] == l0[i][j]);
                l0[i][j] = lg[j] = 0.0f;
            }
        printf("big merge rows [%lld, +%lld) lse: %lld empty row-heads, %lld not -inf on both sides %s\n",
               (long long)r0, (long long)k, (long long)empty, (long long)wrong, empty && !wrong ? "ok" : "FAIL");
        EXPECT(empty && !wrong, "big merge lse: %lld of %lld empty row-heads differ", (long long)wrong, (long long)empty);
        snprintf(what, sizeof what, "big merge rows [%lld, +%lld) lse", (long long)r0, (long long)k);
        test_check_rel_f(what, lg, l0[i], k * nh, CT_BOUND_F32);
    }
    big_written("big merge out", out, 4, T, W, W);
    big_end();
}

/* fused lm_head + cross entropy, C = 2048, V = 512, chunks of 65536 rows: x and dx (T, 2048) dense (r0 C
 * passes 2^31 in the last chunk); targets -1 (ignored) outside the windows, so dw sums the windows
 * only. Device: 2 x 4.3 GB. */
TEST(cuda_big_lm_head_loss) {
    ct_begin();
    const int64_t T = BIG_T, rows = 65536;
    const int C = 2048, V = 512;
    const BigWin win[3] = {{0, BIG_WIN}, {T / 2 + 11, BIG_WIN}, {T - BIG_WIN, BIG_WIN}};
    bf16 *x = (bf16 *)big_dev((size_t)T * C * 2), *dx = (bf16 *)big_dev((size_t)T * C * 2);
    float *losses = (float *)big_dev((size_t)T * 4), *ws = (float *)big_dev((size_t)rows * V * 4), *w;
    bf16 *d_w = big_up_w(&w, (int64_t)V * C, 0.05);
    int32_t *tg = (int32_t *)test_alloc(T * 4);
    for (int64_t t = 0; t < T; t++) tg[t] = -1;
    for (int i = 0; i < 3; i++)
        for (int64_t t = win[i].r0; t < win[i].r0 + win[i].n; t++) tg[t] = (int32_t)((t * 7919) % V);
    int32_t *d_tg = ct_up_i32(tg, T);
    big_fill(x, T, C, C, 1.0f);
    float *dw0 = ct_host_normal((int64_t)V * C, 0.01), *dwc = ct_clone(dw0, (int64_t)V * C);
    float *d_dw = ct_up_f32(dw0, (int64_t)V * C), *dw = ct_host((int64_t)V * C);
    cuda_lm_head_loss(losses, dx, d_dw, x, d_w, d_tg, 1.0f / 768, ws, rows, T, C, V);
    float *lc = ct_host(T); /* 0 where the target is ignored */
    float *cws = ct_host((int64_t)BIG_WIN * V);
    for (int i = 0; i < 3; i++) {
        char what[128];
        const int64_t r0 = win[i].r0, k = win[i].n;
        float *xh = big_rows(x, r0, k, C, C), *dxc = ct_host_nan(k * C);
        cpu_lm_head_loss(lc + r0, dxc, dwc, xh, w, tg + r0, 1.0f / 768, cws, k, k, C, V);
        snprintf(what, sizeof what, "big lm_head rows [%lld, +%lld) dx", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(dx, r0, k, C, C), dxc, k * C, CT_BOUND_BF16_TWICE);
    }
    test_check_rel_f("big lm_head losses (all rows)", big_rows_f32(losses, 0, T, 1, 1), lc, T, CT_BOUND_F32);
    ct_down_f32(dw, d_dw, (int64_t)V * C);
    test_check_rel_f("big lm_head dw += (the windows)", dw, dwc, (int64_t)V * C, CT_BOUND_BF16_TWICE);
    big_written("big lm_head dx", dx, 2, T, C, C);
    big_end();
}

/* Block attention forward and backward at Tq = Tk = 2^19 + 64, 4 query heads and 2 kv heads of 128,
 * causal, documents of 1024 tokens (doc_pos = t % 1024): the pair bitmasks skip every tile pair of two
 * documents, so a call does ~1/500 of the dense work (timed below: dense would take ~0.6 s forward).
 * q (columns 0..512), k (4096..4352), v (4608..4864) in rows of 5120 (t ldq passes 2^31 from
 * t = 419431); out in columns [0, 512) and dout in [4608, 5120) of a second such buffer; dq, dk, dv
 * (+=, random prefill) fp32 at the columns of q, k, v of a (T, 5120) fp32 buffer. Device: 5.4 + 5.4 +
 * 10.7 GB. Windows (whole documents, so the cpu runs each alone): [0, 1024), the document holding
 * t = 419431, and [T - 1088, T) (a document and the 64-token one). The backward is given the cuda
 * forward's out and lse on both sides. Bounds: those of test_cuda_attention.cu. */
#define BIG_ATT_OUT_BOUND  5e-3
#define BIG_ATT_LSE_BOUND  1e-5
#define BIG_ATT_GRAD_BOUND 5e-3
TEST(cuda_big_attention) {
    ct_begin();
    const int64_t T = ((int64_t)1 << 19) + 64;
    const int nh = 4, nkv = 2, hd = 128, ld = 5120, DOC = 1024, wq = nh * hd, wk = nkv * hd;
    const int cq = 0, ck = 4096, cv = 4608, co = 0, cdo = 4608;
    bf16 *QKV = (bf16 *)big_dev((size_t)T * ld * 2), *OD = (bf16 *)big_dev((size_t)T * ld * 2);
    float *G = (float *)big_dev((size_t)T * ld * 4), *lse = (float *)big_dev((size_t)T * nh * 4);
    int32_t *pos = (int32_t *)test_alloc(T * 4), *dp = (int32_t *)test_alloc(T * 4);
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)t, dp[t] = (int32_t)(t % DOC);
    int32_t *d_pos = ct_up_i32(pos, T), *d_dp = ct_up_i32(dp, T);
    big_fill(QKV + cq, T, wq, ld, 1.0f);
    big_fill(QKV + ck, T, wk, ld, 1.0f);
    big_fill(QKV + cv, T, wk, ld, 1.0f);
    big_fill(OD + cdo, T, wq, ld, 1.0f);
    big_fill_f32(G + cq, T, wq, ld, -1.0f, 1.0f);
    big_fill_f32(G + ck, T, wk, ld, -1.0f, 1.0f);
    big_fill_f32(G + cv, T, wk, ld, -1.0f, 1.0f);
    const int64_t cross = big_cross(ld);
    const BigWin win[3] = {{0, DOC}, {cross - cross % DOC, DOC}, {T - 64 - DOC, DOC + 64}};
    float *g0[3][3];
    for (int i = 0; i < 3; i++) {
        g0[i][0] = big_rows_f32(G + cq, win[i].r0, win[i].n, wq, ld);
        g0[i][1] = big_rows_f32(G + ck, win[i].r0, win[i].n, wk, ld);
        g0[i][2] = big_rows_f32(G + cv, win[i].r0, win[i].n, wk, ld);
    }
    cudaEvent_t e0, e1, e2;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventCreate(&e2));
    for (int run = 0; run < 2; run++) { /* the second run timed (the first sizes the workspace) */
        CUDA_CHECK(cudaEventRecord(e0, cuda_stream()));
        cuda_attention_forward(OD + co, lse, QKV + cq, QKV + ck, QKV + cv, d_pos, d_dp, d_pos, d_dp, NULL, T, T, nh,
                               nkv, hd, ld, ld, ld, 1);
        CUDA_CHECK(cudaEventRecord(e1, cuda_stream()));
    }
    cuda_attention_backward(G + cq, G + ck, G + cv, OD + cdo, OD + co, lse, QKV + cq, QKV + ck, QKV + cv, d_pos, d_dp,
                            d_pos, d_dp, NULL, T, T, nh, nkv, hd, ld, ld, ld, 1);
    CUDA_CHECK(cudaEventRecord(e2, cuda_stream()));
    CUDA_CHECK(cudaEventSynchronize(e2));
    float ms_f = 0.0f, ms_b = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms_f, e0, e1));
    CUDA_CHECK(cudaEventElapsedTime(&ms_b, e1, e2));
    printf("big attention: forward %.2f ms, backward %.2f ms (dense causal: ~600 ms and ~2500 ms on an H100) %s\n",
           (double)ms_f, (double)ms_b, ms_f < 100.0f && ms_b < 500.0f ? "ok" : "FAIL");
    EXPECT(ms_f < 100.0f && ms_b < 500.0f, "the document mask did not skip tiles: forward %.1f ms, backward %.1f ms",
           (double)ms_f, (double)ms_b);
    for (int i = 0; i < 3; i++) {
        char what[128];
        const int64_t r0 = win[i].r0, n = win[i].n;
        float *q = big_rows(QKV + cq, r0, n, wq, ld), *k = big_rows(QKV + ck, r0, n, wk, ld);
        float *v = big_rows(QKV + cv, r0, n, wk, ld), *o = big_rows(OD + co, r0, n, wq, ld);
        float *go = big_rows(OD + cdo, r0, n, wq, ld), *l = big_rows_f32(lse, r0, n, nh, nh);
        float *oc = ct_host_nan(n * wq), *lc = ct_host_nan(n * nh);
        cpu_attention_forward(oc, lc, q, k, v, pos + r0, dp + r0, pos + r0, dp + r0, NULL, n, n, nh, nkv, hd, wq, wk,
                              wq, 1);
        snprintf(what, sizeof what, "big attention rows [%lld, +%lld) fwd out", (long long)r0, (long long)n);
        test_check_rel_f(what, o, oc, n * wq, BIG_ATT_OUT_BOUND);
        snprintf(what, sizeof what, "big attention rows [%lld, +%lld) fwd lse", (long long)r0, (long long)n);
        test_check_rel_f(what, l, lc, n * nh, BIG_ATT_LSE_BOUND);
        cpu_attention_backward(g0[i][0], g0[i][1], g0[i][2], go, o, l, q, k, v, pos + r0, dp + r0, pos + r0, dp + r0,
                               NULL, n, n, nh, nkv, hd, wq, wk, wq, 1);
        snprintf(what, sizeof what, "big attention rows [%lld, +%lld) bwd dq +=", (long long)r0, (long long)n);
        test_check_rel_f(what, big_rows_f32(G + cq, r0, n, wq, ld), g0[i][0], n * wq, BIG_ATT_GRAD_BOUND);
        snprintf(what, sizeof what, "big attention rows [%lld, +%lld) bwd dk +=", (long long)r0, (long long)n);
        test_check_rel_f(what, big_rows_f32(G + ck, r0, n, wk, ld), g0[i][1], n * wk, BIG_ATT_GRAD_BOUND);
        snprintf(what, sizeof what, "big attention rows [%lld, +%lld) bwd dv +=", (long long)r0, (long long)n);
        test_check_rel_f(what, big_rows_f32(G + cv, r0, n, wk, ld), g0[i][2], n * wk, BIG_ATT_GRAD_BOUND);
    }
    big_written("big attention out", OD + co, 2, T, wq, ld);
    big_written("big attention lse", lse, 4, T * nh, 1, 1);
    big_untouched("big attention: out/dout buffer between the blocks", OD + wq, 2, T, cdo - wq, ld);
    big_untouched("big attention: dq/dk/dv buffer between the blocks", G + wq, 4, T, ck - wq, ld);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaEventDestroy(e2));
    big_end();
}

/* embedding, sigmoid output gate, SwiGLU, forward and backward, on windows: the (T, 2048) dense tensors
 * (t C passes 2^31 in the last 64 tokens) and the gate in rows of 2560. The embedding backward's dout is
 * 0 outside the windows, so dwte sums the windows only. Device, at most (the gate): 28 GB. */
TEST(cuda_big_elementwise) {
    ct_begin();
    const int64_t T = BIG_T;
    const int C = 2048, V = 1024, ldg = BIG_LD, I = 1024;
    const BigWin win[4] = {{0, BIG_WIN}, {T / 2 + 5, BIG_WIN}, {big_cross(ldg) - BIG_WIN / 2, BIG_WIN},
                           {T - BIG_WIN, BIG_WIN}};
    char what[128];
    int32_t *tok = (int32_t *)test_alloc(T * 4);
    for (int64_t t = 0; t < T; t++) tok[t] = (int32_t)((t * 2654435761u) % V);
    int32_t *d_tok = ct_up_i32(tok, T);
    float *wte;
    bf16 *d_wte = big_up_w(&wte, (int64_t)V * C, 1.0);
    bf16 *out = (bf16 *)big_dev((size_t)T * C * 2), *dout = (bf16 *)big_dev((size_t)T * C * 2);
    cuda_embedding_forward(out, d_tok, d_wte, T, C);
    big_fill(dout, T, C, C, 1.0f);
    big_zero_outside(dout, T, C, win, 4);
    float *dw0 = ct_host_normal((int64_t)V * C, 0.1), *dwc = ct_clone(dw0, (int64_t)V * C);
    float *d_dw = ct_up_f32(dw0, (int64_t)V * C), *dw = ct_host((int64_t)V * C);
    cuda_embedding_backward(d_dw, dout, d_tok, T, C);
    for (int i = 0; i < 4; i++) {
        const int64_t r0 = win[i].r0, k = win[i].n;
        float *oc = ct_host_nan(k * C);
        cpu_embedding_forward(oc, tok + r0, wte, k, C);
        cpu_embedding_backward(dwc, big_rows(dout, r0, k, C, C), tok + r0, k, C);
        snprintf(what, sizeof what, "big embedding rows [%lld, +%lld) fwd", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(out, r0, k, C, C), oc, k * C, 0.0);
    }
    ct_down_f32(dw, d_dw, (int64_t)V * C);
    test_check_rel_f("big embedding bwd dwte += (the windows)", dw, dwc, (int64_t)V * C, CT_BOUND_F32);
    big_written("big embedding out", out, 2, T, C, C);
    big_free(out), big_free(dout);

    /* sigmoid gate: out = x sigmoid(gate), x / out / dout / dx (T, 2048), gate / dgate in rows of 2560 */
    bf16 *x = (bf16 *)big_dev((size_t)T * C * 2), *y = (bf16 *)big_dev((size_t)T * C * 2);
    bf16 *gy = (bf16 *)big_dev((size_t)T * C * 2), *dx = (bf16 *)big_dev((size_t)T * C * 2);
    bf16 *gate = (bf16 *)big_dev((size_t)T * ldg * 2), *dgate = (bf16 *)big_dev((size_t)T * ldg * 2);
    big_fill(x, T, C, C, 1.0f);
    big_fill(gate, T, C, ldg, 1.0f);
    big_fill(gy, T, C, C, 1.0f);
    cuda_sigmoid_gate_forward(y, x, gate, T, C, ldg);
    cuda_sigmoid_gate_backward(dx, dgate, gy, x, gate, T, C, ldg);
    for (int i = 0; i < 4; i++) {
        const int64_t r0 = win[i].r0, k = win[i].n;
        float *xh = big_rows(x, r0, k, C, C), *gh = big_rows(gate, r0, k, C, ldg), *dyh = big_rows(gy, r0, k, C, C);
        float *yc = ct_host_nan(k * C), *dxc = ct_host_nan(k * C), *dgc = ct_host_nan(k * C);
        cpu_sigmoid_gate_forward(yc, xh, gh, k, C, C);
        cpu_sigmoid_gate_backward(dxc, dgc, dyh, xh, gh, k, C, C);
        snprintf(what, sizeof what, "big sigmoid gate rows [%lld, +%lld) fwd", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(y, r0, k, C, C), yc, k * C, CT_BOUND_BF16_OUT);
        snprintf(what, sizeof what, "big sigmoid gate rows [%lld, +%lld) bwd dx", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(dx, r0, k, C, C), dxc, k * C, CT_BOUND_BF16_OUT);
        snprintf(what, sizeof what, "big sigmoid gate rows [%lld, +%lld) bwd dgate", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(dgate, r0, k, C, ldg), dgc, k * C, CT_BOUND_BF16_OUT);
    }
    big_written("big sigmoid gate out", y, 2, T, C, C);
    big_written("big sigmoid gate dx", dx, 2, T, C, C);
    big_written("big sigmoid gate dgate", dgate, 2, T, C, ldg);
    big_untouched("big sigmoid gate: dgate columns past D", dgate + C, 2, T, ldg - C, ldg);
    big_free(x), big_free(y), big_free(gy), big_free(dx), big_free(gate), big_free(dgate);

    /* SwiGLU: gate_up (T, 2I) = (T, 2048), out (T, I) */
    bf16 *gu = (bf16 *)big_dev((size_t)T * 2 * I * 2), *so = (bf16 *)big_dev((size_t)T * I * 2);
    bf16 *sdo = (bf16 *)big_dev((size_t)T * I * 2), *dgu = (bf16 *)big_dev((size_t)T * 2 * I * 2);
    big_fill(gu, T, 2 * I, 2 * I, 1.0f);
    big_fill(sdo, T, I, I, 1.0f);
    cuda_swiglu_forward(so, gu, T, I);
    cuda_swiglu_backward(dgu, NULL, sdo, gu, T, I);
    for (int i = 0; i < 4; i++) {
        const int64_t r0 = win[i].r0, k = win[i].n;
        float *guh = big_rows(gu, r0, k, 2 * I, 2 * I), *doh = big_rows(sdo, r0, k, I, I);
        float *oc = ct_host_nan(k * I), *dc = ct_host_nan(k * 2 * I);
        cpu_swiglu_forward(oc, guh, k, I);
        cpu_swiglu_backward(dc, NULL, doh, guh, k, I);
        snprintf(what, sizeof what, "big swiglu rows [%lld, +%lld) fwd", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(so, r0, k, I, I), oc, k * I, CT_BOUND_BF16_OUT);
        snprintf(what, sizeof what, "big swiglu rows [%lld, +%lld) bwd", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(dgu, r0, k, 2 * I, 2 * I), dc, k * 2 * I, CT_BOUND_BF16_OUT);
    }
    big_written("big swiglu out", so, 2, T, I, I);
    big_written("big swiglu dgate_up", dgu, 2, T, 2 * I, 2 * I);
    big_end();
}

/* AdamW and sum_squares over n = 2^31 + 4099 parameters: AdamW on windows (the first 2^20, 2^20 around
 * 2^31, the last 2^20), sum_squares against a long double sum of all n on the host (read in 256 MiB
 * pieces). Device: p, m, v, grad 8.6 GB each + the bf16 copy 4.3 GB = 39 GB. Bounds: CT_BOUND_F32,
 * the bf16 copy CT_BOUND_BF16_OUT, sum_squares 1e-12 (test_cuda_optim.cu's). */
TEST(cuda_big_optim) {
    ct_begin();
    const int64_t n = BIG_N;
    const BigWin *win = big_flat_win;
    float *p = (float *)big_dev((size_t)n * 4), *m = (float *)big_dev((size_t)n * 4);
    float *v = (float *)big_dev((size_t)n * 4), *g = (float *)big_dev((size_t)n * 4);
    bf16 *c = (bf16 *)big_dev((size_t)n * 2);
    big_fill_f32(p, n, 1, 1, -1.0f, 1.0f);
    big_fill_f32(m, n, 1, 1, -0.1f, 0.1f);
    big_fill_f32(v, n, 1, 1, 1e-4f, 1e-2f);
    big_fill_f32(g, n, 1, 1, -1.0f, 1.0f);
    float *h[3][4];
    for (int i = 0; i < 3; i++) {
        const float *src[4] = {p, m, v, g};
        for (int j = 0; j < 4; j++) h[i][j] = big_rows_f32(src[j], win[i].r0, win[i].n, 1, 1);
    }
    cuda_adamw_update(p, m, v, c, g, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3);
    for (int i = 0; i < 3; i++) {
        char what[128];
        const int64_t r0 = win[i].r0, k = win[i].n;
        cpu_adamw_update(h[i][0], h[i][1], h[i][2], NULL, h[i][3], k, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3);
        const float *got[3] = {big_rows_f32(p, r0, k, 1, 1), big_rows_f32(m, r0, k, 1, 1), big_rows_f32(v, r0, k, 1, 1)};
        const char *names[3] = {"p", "m", "v"};
        for (int j = 0; j < 3; j++) {
            snprintf(what, sizeof what, "big adamw [%lld, +%lld) %s", (long long)r0, (long long)k, names[j]);
            test_check_rel_f(what, got[j], h[i][j], k, CT_BOUND_F32);
        }
        snprintf(what, sizeof what, "big adamw [%lld, +%lld) bf16 copy", (long long)r0, (long long)k);
        test_check_rel_f(what, big_rows(c, r0, k, 1, 1), h[i][0], k, CT_BOUND_BF16_OUT);
    }
    big_written("big adamw bf16 copy", c, 2, n, 1, 1);
    big_free(p), big_free(m), big_free(v), big_free(c);

    const double got = cuda_sum_squares(g, n);
    const int64_t piece = (int64_t)1 << 26;
    float *buf = ct_host(piece);
    long double want = 0.0L;
    for (int64_t i0 = 0; i0 < n; i0 += piece) {
        const int64_t k = n - i0 < piece ? n - i0 : piece;
        CUDA_CHECK(cudaMemcpyAsync(buf, g + i0, (size_t)k * 4, cudaMemcpyDeviceToHost, cuda_stream()));
        CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
        for (int64_t j = 0; j < k; j++) want += (long double)buf[j] * buf[j];
    }
    const double e = fabs(got - (double)want) / (double)want;
    printf("big sum_squares n %lld: %.17g vs %.17Lg, rel err %.3e <= 1e-12 %s\n", (long long)n, got, want, e,
           e <= 1e-12 ? "ok" : "FAIL");
    EXPECT(e <= 1e-12, "sum_squares over %lld elements: rel err %.3e", (long long)n, e);
    big_end();
}

/* The chunked gated delta rule, backward then forward, at T = 2^20 + 64 tokens, 4 key heads and 16 value
 * heads of 128 (GVA 4): the (T, nv, dk) workspaces (W, U, vn, dv2, the fp32 dq / dk partials) pass 2^31
 * elements from t = 2^20, the (T/64, nv, dk, dv) states h, dh from t = 2^19; q | k | v in rows of 3072
 * (t ldq passes 2^31 from t = 699051), dout and then o at columns [512, 2560) of rows of 2560 (from
 * t = 838861). g and beta come from the gates forward, q and k are L2-normalised in place by the l2norm
 * forward (as the layer does). Documents of 2048 tokens, the first begun 1000 tokens before the call
 * (S0 read, dS0 written), the last one ending the call (S_final, dS_final). Windows (whole documents,
 * so the cpu runs each alone): [0, 1048) with S0 and dS0, the documents holding t = 699051 and
 * t = 838861, and [1047576, T) with S_final / dS_final (it holds t >= 2^20).
 * Device at the backward's peak: q|k|v 6.4 GB, dout 5.4, dq|dk|dv 6.4, and the GDN workspace (W, U, vn,
 * dv2 4.3 GB each; h, dh, the fp32 dq / dk partials 8.6 GB each: 51.9 GB, allocated with 1/8 headroom,
 * 58.4 GB) = 77 GB = 72 GiB of an H100's 79: run this case in a process of its own. The forward then
 * reuses the workspace, and o the buffer of dout. Bound: test_cuda_gdn.cu's. */
#define BIG_GDN_BOUND 1e-2
TEST(cuda_big_gdn) {
    ct_begin();
    const int64_t T = BIG_T;
    const int nk = 4, nv = 16, d = 128, ld = 3072, DOC = 2048, OFF = 1000, wk = nk * d, wv = nv * d;
    bf16 *QKV = (bf16 *)big_dev((size_t)T * ld * 2), *q = QKV, *k = QKV + wk, *v = QKV + 2 * wk;
    const int ldo = BIG_LD;
    bf16 *OD = (bf16 *)big_dev((size_t)T * ldo * 2), *dout = OD + ldo - wv;
    bf16 *dQKV = (bf16 *)big_dev((size_t)T * ld * 2);
    bf16 *BA = (bf16 *)big_dev((size_t)T * 2 * nv * 2);
    float *beta = (float *)big_dev((size_t)T * nv * 4), *g = (float *)big_dev((size_t)T * nv * 4);
    float *dg = (float *)big_dev((size_t)T * nv * 4), *dbeta = (float *)big_dev((size_t)T * nv * 4);
    float *rs = (float *)big_dev((size_t)T * nk * 4);
    const int64_t nS = (int64_t)nv * d * d;
    int32_t *dp = (int32_t *)test_alloc(T * 4);
    for (int64_t t = 0; t < T; t++) dp[t] = (int32_t)((t + OFF) % DOC);
    int32_t *d_dp = ct_up_i32(dp, T);
    float *A_log = ct_host(nv), *dt_bias = ct_host(nv);
    for (int h = 0; h < nv; h++) A_log[h] = logf(0.02f + 0.1f * h), dt_bias[h] = 0.0f;
    big_fill(BA, T, 2 * nv, 2 * nv, 1.0f);
    cuda_gdn_gates_forward(beta, g, BA, BA + nv, ct_up_f32(A_log, nv), ct_up_f32(dt_bias, nv), T, nv, 2 * nv);
    big_fill(q, T, wk, ld, 1.0f);
    big_fill(k, T, wk, ld, 1.0f);
    big_fill(v, T, wv, ld, 1.0f);
    cuda_l2norm_forward(q, rs, q, T, nk, d, ld, ld);
    cuda_l2norm_forward(k, rs, k, T, nk, d, ld, ld);
    big_fill(dout, T, wv, ldo, 1.0f);
    float *S0 = ct_host_normal(nS, 0.1), *dSf = ct_host_normal(nS, 0.1);
    float *d_S0 = ct_up_f32(S0, nS), *d_dSf = ct_up_f32(dSf, nS);
    float *d_dS0 = (float *)ct_dev((size_t)nS * 4), *d_Sf = (float *)ct_dev((size_t)nS * 4);
    const int64_t first = DOC - OFF, last = first + (T - 1 - first) / DOC * DOC;
    const int64_t mid1 = first + (big_cross(ld) - first) / DOC * DOC, mid2 = first + (big_cross(ldo) - first) / DOC * DOC;
    const BigWin win[4] = {{0, first}, {mid1, DOC}, {mid2, DOC}, {last, T - last}};
    enum { NW = 4 };
    CUDA_CHECK(cudaDeviceSynchronize()); /* memory the pool holds from earlier cases back to the device */
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));

    cuda_gdn_chunk_backward(dQKV, dQKV + wk, dQKV + 2 * wk, dg, dbeta, d_dS0, dout, d_dSf, q, k, v, g, beta, d_S0,
                            d_dp, T, nk, nv, d, d, ld, ld, ldo, NULL, 0);
    for (int i = 0; i < NW; i++) {
        char what[128];
        const int64_t r0 = win[i].r0, n = win[i].n;
        float *qh = big_rows(q, r0, n, wk, ld), *kh = big_rows(k, r0, n, wk, ld), *vh = big_rows(v, r0, n, wv, ld);
        float *gh = big_rows_f32(g, r0, n, nv, nv), *bh = big_rows_f32(beta, r0, n, nv, nv);
        float *doh = big_rows(dout, r0, n, wv, ldo);
        float *dqc = ct_host_nan(n * wk), *dkc = ct_host_nan(n * wk), *dvc = ct_host_nan(n * wv);
        float *dgc = ct_host_nan(n * nv), *dbc = ct_host_nan(n * nv), *dS0c = ct_host_nan(nS);
        cpu_gdn_chunk_backward(dqc, dkc, dvc, dgc, dbc, i == 0 ? dS0c : NULL, doh, i == NW - 1 ? dSf : NULL, qh, kh, vh, gh,
                               bh, i == 0 ? S0 : NULL, dp + r0, n, nk, nv, d, d, wk, wv, wv, NULL, 0);
        const float *got[5] = {big_rows(dQKV, r0, n, wk, ld), big_rows(dQKV + wk, r0, n, wk, ld),
                               big_rows(dQKV + 2 * wk, r0, n, wv, ld), big_rows_f32(dg, r0, n, nv, nv),
                               big_rows_f32(dbeta, r0, n, nv, nv)};
        const float *want[5] = {dqc, dkc, dvc, dgc, dbc};
        const int64_t cnt[5] = {n * wk, n * wk, n * wv, n * nv, n * nv};
        const char *names[5] = {"dq", "dk", "dv", "dg", "dbeta"};
        for (int j = 0; j < 5; j++) {
            snprintf(what, sizeof what, "big gdn rows [%lld, +%lld) bwd %s", (long long)r0, (long long)n, names[j]);
            test_check_rel_f(what, got[j], want[j], cnt[j], BIG_GDN_BOUND);
        }
        if (i == 0) {
            float *dS0 = ct_host(nS);
            ct_down_f32(dS0, d_dS0, nS);
            test_check_rel_f("big gdn bwd dS0", dS0, dS0c, nS, BIG_GDN_BOUND);
        }
    }
    big_written("big gdn bwd dq|dk|dv", dQKV, 2, T, ld, ld);
    big_written("big gdn bwd dg", dg, 4, T * nv, 1, 1);
    big_written("big gdn bwd dbeta", dbeta, 4, T * nv, 1, 1);
    big_free(dQKV);

    bf16 *o = dout; /* the forward's output over dout's columns, poisoned again */
    CUDA_CHECK(cudaMemsetAsync(OD, 0xff, (size_t)T * ldo * 2, cuda_stream()));
    cuda_gdn_chunk_forward(o, d_Sf, q, k, v, g, beta, d_S0, d_dp, T, nk, nv, d, d, ld, ld, ldo, NULL, 0);
    for (int i = 0; i < NW; i++) {
        char what[128];
        const int64_t r0 = win[i].r0, n = win[i].n;
        float *qh = big_rows(q, r0, n, wk, ld), *kh = big_rows(k, r0, n, wk, ld), *vh = big_rows(v, r0, n, wv, ld);
        float *gh = big_rows_f32(g, r0, n, nv, nv), *bh = big_rows_f32(beta, r0, n, nv, nv);
        float *oc = ct_host_nan(n * wv), *Sfc = ct_host_nan(nS);
        cpu_gdn_chunk_forward(oc, i == NW - 1 ? Sfc : NULL, qh, kh, vh, gh, bh, i == 0 ? S0 : NULL, dp + r0, n, nk, nv, d,
                              d, wk, wv, wv, NULL, 0);
        snprintf(what, sizeof what, "big gdn rows [%lld, +%lld) fwd o", (long long)r0, (long long)n);
        test_check_rel_f(what, big_rows(o, r0, n, wv, ldo), oc, n * wv, BIG_GDN_BOUND);
        if (i == NW - 1) {
            float *Sf = ct_host(nS);
            ct_down_f32(Sf, d_Sf, nS);
            test_check_rel_f("big gdn fwd S_final", Sf, Sfc, nS, BIG_GDN_BOUND);
        }
    }
    big_written("big gdn fwd o", o, 2, T, wv, ldo);
    big_untouched("big gdn fwd: the columns before o", OD, 2, T, ldo - wv, ldo);
    big_end();
}

/* Host side, no GPU work: the bytes of the GDN kept buffer at 1M tokens x 64 value heads of 128 (W, U,
 * vn 17 GB each, h 34 GB: products of int sizes that pass 2^32) against the formula of gdn/gdn.cu's
 * header, each part on 256 bytes: in one piece (the tune's piece set above T) and in the default pieces
 * (backend.h GDN_PIECE_ROWS: each piece's parts, then the fp32 states entering pieces 1..). */
static int64_t big_up256(int64_t b) { return (b + 255) / 256 * 256; }

static int64_t big_kept_one(int64_t T, int64_t nv, int64_t d, int states) {
    const int64_t ns = (T + 63) / 64 + 1;
    int64_t b = big_up256(T * nv * d * 2) * 2 + big_up256(T * nv * 4);
    if (states) b += big_up256(ns * nv * d * d * 2) + big_up256(T * nv * d * 2);
    return b;
}

TEST(cuda_big_host_kept_bytes) {
    const int64_t Ts[3] = {((int64_t)1 << 20) + 64, (int64_t)1 << 21, 3};
    const int nvs[2] = {16, 64};
    CudaGdnTune one;
    memset(&one, 0, sizeof one);
    one.piece = 1 << 22;
    for (int pieced = 0; pieced <= 1; pieced++)
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            for (int states = 0; states <= 1; states++) {
                const int64_t T = Ts[i], nv = nvs[j], d = 128, R = pieced ? GDN_PIECE_ROWS : T;
                int64_t want = 0, np = 0;
                for (int64_t r0 = 0; r0 < T; r0 += R, np++) want += big_kept_one(T - r0 < R ? T - r0 : R, nv, d, states);
                want += (np - 1) * nv * d * d * 4;
                cuda_gdn_tune_set(pieced ? NULL : &one);
                const int64_t got = (int64_t)cuda_gdn_kept_bytes(T, (int)nv, (int)d, (int)d, states);
                cuda_gdn_tune_set(NULL);
                printf("gdn kept bytes T %lld nv %lld states %d, %lld piece(s): %lld (formula %lld) %s\n",
                       (long long)T, (long long)nv, states, (long long)np, (long long)got, (long long)want,
                       got == want ? "ok" : "FAIL");
                EXPECT(got == want, "cuda_gdn_kept_bytes(T %lld, nv %lld, states %d) = %lld, want %lld", (long long)T,
                       (long long)nv, states, (long long)got, (long long)want);
            }
}
