/*
 * cuda_conv.cu — the causal depthwise conv1d + SiLU of the Gated DeltaNet
 * layer on the cuda backend (lib/backend.h: conv1d_silu_forward/backward;
 * the oracle and the exact definition, halo and document masks included, are
 * in kernels/cpu/cpu_conv.c).
 *
 *   u[t,c] = sum_j w[c,j] x(t - (Kc-1-j), c), y = silu(u); x(t-b) is inp[t-b], or
 *   halo[Kc-1+t-b] before the first row (NULL halo = zeros); a tap with
 *   lookback b > doc_pos[t] reads 0.
 *
 * Forward: one thread per (token, 8 channels), taps summed oldest first in
 * fp32 like the cpu (16-byte loads of the rows; the previous rows are L1/L2
 * hits of the neighbouring tokens' threads).
 *
 * Backward, input gradient: gathered, not scattered. One thread per (row s,
 * 8 channels), s from -(Kc-1) (the halo rows, when dhalo is wanted) to T-1:
 *   dinp[s] = sum_{b=0}^{Kc-1} w[c,Kc-1-b] du[s+b]   over the taps (t = s+b, b) the
 *   forward used (t < T, b <= doc_pos[t]), du = dout silu'(u), u recomputed.
 * Terms are added in b order, the order in which the cpu's scatter adds
 * them, and every row is written (=) exactly once: no atomics, no zeroing pass.
 *
 * Backward, weight gradient: dw[c,j] += sum_t du[t,c] x(t-b,c), a column
 * reduction over tokens, deterministic in two stages: blocks own fixed token
 * ranges (their count is a function of T and C only), threads of a block
 * sum their tokens per (channel, tap) in registers, the block adds its 8 row
 * lanes in order into its partials (kernel scratch), and cuda_partials_add
 * adds the blocks in order.
 *
 * A doc_pos < 0 is recorded in the device error word (cuda_common.h) and the
 * token is skipped. Kc <= CONV_KC_MAX.
 *
 * Callers: through backend_cuda (lib/model_block.c), tests/cuda/test_cuda_conv.cu.
 */
#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"

#define CONV_KC_MAX 16
#define CONV_THREADS 256
#define CONV_DW_ROWS 8 /* blockDim.y of the weight-gradient kernel */

static void conv_check_sizes(int64_t T, int C, int Kc, int ldi, int ldo) {
    RS_CHECK(T >= 0 && C > 0, "conv1d_silu: T = %lld, C = %d", (long long)T, C);
    RS_CHECK(Kc >= 1 && Kc <= CONV_KC_MAX, "conv1d_silu: Kc = %d (the cuda kernel supports 1..%d)", Kc, CONV_KC_MAX);
    RS_CHECK(ldi >= C && ldo >= C, "conv1d_silu: ldi = %d, ldo = %d, need >= C = %d", ldi, ldo, C);
}

/* u[t, c..c+n) into u[], oldest tap first; returns false when doc_pos[t] < 0 (recorded) */
__device__ __forceinline__ bool conv_preact8(float u[CUDA_VEC], const bf16 *inp, const bf16 *halo, const bf16 *w,
                                             const int32_t *doc_pos, int64_t t, int c, int n, int C, int Kc, int ldi,
                                             bool vec, int *err) {
    const int dp = doc_pos[t];
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) u[i] = 0.0f;
    if (dp < 0) {
        cuda_raise(err, CUDA_ERR_DOC_POS, t, dp);
        return false;
    }
    const int nb = min(Kc - 1, dp);
    for (int b = nb; b >= 0; b--) {
        const bf16 *row;
        if (t - b >= 0) row = inp + (t - b) * ldi;
        else if (halo) row = halo + (Kc - 1 + t - b) * (int64_t)C;
        else continue;
        float x[CUDA_VEC];
        cuda_load8n(x, row + c, n, vec);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++)
            if (i < n) u[i] += __bfloat162float(w[(int64_t)(c + i) * Kc + Kc - 1 - b]) * x[i];
    }
    return true;
}

__global__ void __launch_bounds__(CONV_THREADS) conv_forward_kernel(bf16 *out /* (T,ldo) */, const bf16 *inp /* (T,ldi) */,
                                                                    const bf16 *halo /* (Kc-1,C) or NULL */,
                                                                    const bf16 *w /* (C,Kc) */,
                                                                    const int32_t *doc_pos /* (T) */, int64_t T, int C,
                                                                    int Kc, int ldi, int ldo, int *err, bool vec) {
    const int nc = (C + CUDA_VEC - 1) / CUDA_VEC;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * nc) return;
    const int64_t t = idx / nc;
    const int c = (int)(idx % nc) * CUDA_VEC, n = min(CUDA_VEC, C - c);
    float u[CUDA_VEC];
    if (!conv_preact8(u, inp, halo, w, doc_pos, t, c, n, C, Kc, ldi, vec, err)) return;
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) u[i] = u[i] / (1.0f + expf(-u[i]));
    cuda_store8n(out + t * ldo + c, u, n, vec);
}

/* dinp[s] (s >= 0) or dhalo[Kc-1+s] (s < 0) for 8 channels, gathered from the tokens that read row s */
__global__ void __launch_bounds__(CONV_THREADS) conv_backward_input_kernel(
    bf16 *dinp /* (T,ldi) = */, bf16 *dhalo /* (Kc-1,C) = or NULL */, const bf16 *dout /* (T,ldo) */,
    const bf16 *inp /* (T,ldi) */, const bf16 *halo /* (Kc-1,C) or NULL */, const bf16 *w /* (C,Kc) */,
    const int32_t *doc_pos /* (T) */, int64_t T, int C, int Kc, int ldi, int ldo, int *err, bool vec) {
    const int nc = (C + CUDA_VEC - 1) / CUDA_VEC;
    const int64_t first = dhalo ? -(int64_t)(Kc - 1) : 0; /* the first row s this launch covers */
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (T - first) * nc) return;
    const int64_t s = first + idx / nc;
    const int c = (int)(idx % nc) * CUDA_VEC, n = min(CUDA_VEC, C - c);
    float acc[CUDA_VEC] = {0};
    for (int b = 0; b < Kc; b++) {
        const int64_t t = s + b;
        if (t < 0) continue;
        if (t >= T) break;
        const int dp = doc_pos[t];
        if (dp >= 0 && b > dp) continue; /* token t does not read row s */
        float u[CUDA_VEC], dy[CUDA_VEC];
        if (!conv_preact8(u, inp, halo, w, doc_pos, t, c, n, C, Kc, ldi, vec, err)) continue; /* dp < 0: recorded */
        cuda_load8n(dy, dout + t * ldo + c, n, vec);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) {
            if (i >= n) continue;
            const float sg = 1.0f / (1.0f + expf(-u[i]));
            const float du = dy[i] * sg * (1.0f + u[i] * (1.0f - sg));
            acc[i] += __bfloat162float(w[(int64_t)(c + i) * Kc + Kc - 1 - b]) * du;
        }
    }
    if (s >= 0) cuda_store8n(dinp + s * ldi + c, acc, n, vec);
    else cuda_store8n(dhalo + (Kc - 1 + s) * (int64_t)C + c, acc, n, vec);
}

/* per-block partials of dw[c, Kc-1-b] = sum over the block's tokens t of du[t,c] x(t-b,c) */
__global__ void __launch_bounds__(CUDA_WARP *CONV_DW_ROWS) conv_backward_weight_kernel(
    float *part /* (gridDim.y, C*Kc) */, const bf16 *dout /* (T,ldo) */, const bf16 *inp /* (T,ldi) */,
    const bf16 *halo /* (Kc-1,C) or NULL */, const bf16 *w /* (C,Kc) */, const int32_t *doc_pos /* (T) */, int64_t T,
    int64_t rows_per_block, int C, int Kc, int ldi, int ldo) {
    __shared__ float sh[CONV_DW_ROWS][CUDA_WARP][CONV_KC_MAX + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = blockIdx.x * CUDA_WARP + tx;
    const int64_t r0 = (int64_t)blockIdx.y * rows_per_block, r1 = min(T, r0 + rows_per_block);
    float acc[CONV_KC_MAX];
#pragma unroll
    for (int b = 0; b < CONV_KC_MAX; b++) acc[b] = 0.0f;
    if (c < C) {
        for (int64_t t = r0 + ty; t < r1; t += CONV_DW_ROWS) {
            const int dp = doc_pos[t];
            if (dp < 0) continue; /* recorded by the input-gradient kernel */
            const int nb = min(Kc - 1, dp);
            float xs[CONV_KC_MAX];
            float u = 0.0f;
#pragma unroll
            for (int b = CONV_KC_MAX - 1; b >= 0; b--) {
                xs[b] = 0.0f;
                if (b > nb) continue;
                if (t - b >= 0) xs[b] = __bfloat162float(inp[(t - b) * ldi + c]);
                else if (halo) xs[b] = __bfloat162float(halo[(Kc - 1 + t - b) * (int64_t)C + c]);
                else continue;
                u += __bfloat162float(w[(int64_t)c * Kc + Kc - 1 - b]) * xs[b];
            }
            const float sg = 1.0f / (1.0f + expf(-u));
            const float du = __bfloat162float(dout[t * ldo + c]) * sg * (1.0f + u * (1.0f - sg));
#pragma unroll
            for (int b = 0; b < CONV_KC_MAX; b++)
                if (b <= nb) acc[b] += du * xs[b];
        }
    }
#pragma unroll
    for (int b = 0; b < CONV_KC_MAX; b++) sh[ty][tx][b] = acc[b];
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int b = 0; b < Kc; b++) {
            float s = 0.0f;
            for (int k = 0; k < CONV_DW_ROWS; k++) s += sh[k][tx][b];
            part[(int64_t)blockIdx.y * C * Kc + (int64_t)c * Kc + Kc - 1 - b] = s;
        }
    }
}

extern "C" void cuda_conv1d_silu_forward(void *out, const void *inp, const void *halo, const void *w,
                                         const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo) {
    conv_check_sizes(T, C, Kc, ldi, ldo);
    if (!T) return;
    const bool vec = cuda_vec_ok(out, C, ldo) && cuda_vec_ok(inp, C, ldi) && cuda_vec_ok(halo, C, C);
    conv_forward_kernel<<<(unsigned)cuda_ceil_div(T * cuda_ceil_div(C, CUDA_VEC), CONV_THREADS), CONV_THREADS, 0,
                          cuda_stream()>>>((bf16 *)out, (const bf16 *)inp, (const bf16 *)halo, (const bf16 *)w, doc_pos,
                                           T, C, Kc, ldi, ldo, cuda_error_word(), vec);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_conv1d_silu_backward(void *dinp, void *dhalo, float *dw, const void *dout, const void *inp,
                                          const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int C,
                                          int Kc, int ldi, int ldo) {
    conv_check_sizes(T, C, Kc, ldi, ldo);
    if (dhalo && Kc == 1) dhalo = NULL; /* no halo rows */
    const int64_t rows = T + (dhalo ? Kc - 1 : 0);
    if (!rows) return;
    const bool vec = cuda_vec_ok(dinp, C, ldi) && cuda_vec_ok(dhalo, C, C) && cuda_vec_ok(dout, C, ldo) &&
                     cuda_vec_ok(inp, C, ldi) && cuda_vec_ok(halo, C, C);
    conv_backward_input_kernel<<<(unsigned)cuda_ceil_div(rows * cuda_ceil_div(C, CUDA_VEC), CONV_THREADS),
                                 CONV_THREADS, 0, cuda_stream()>>>((bf16 *)dinp, (bf16 *)dhalo, (const bf16 *)dout,
                                                                   (const bf16 *)inp, (const bf16 *)halo,
                                                                   (const bf16 *)w, doc_pos, T, C, Kc, ldi, ldo,
                                                                   cuda_error_word(), vec);
    CUDA_LAUNCH_CHECK();
    if (!T) return;
    const int gx = (int)cuda_ceil_div(C, CUDA_WARP);
    int gy = (int)cuda_ceil_div(1024, gx); /* about 1024 blocks in all; the count depends on T and C only */
    if (gy > CUDA_MAX_PARTIALS) gy = CUDA_MAX_PARTIALS;
    if (gy > cuda_ceil_div(T, 4 * CONV_DW_ROWS)) gy = (int)cuda_ceil_div(T, 4 * CONV_DW_ROWS);
    if (gy < 1) gy = 1;
    const int64_t rpb = cuda_ceil_div(T, gy);
    float *part = (float *)cuda_scratch((size_t)gy * C * Kc * sizeof(float), "conv1d_silu_backward");
    conv_backward_weight_kernel<<<dim3(gx, gy), dim3(CUDA_WARP, CONV_DW_ROWS), 0, cuda_stream()>>>(
        part, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)halo, (const bf16 *)w, doc_pos, T, rpb, C, Kc, ldi,
        ldo);
    CUDA_LAUNCH_CHECK();
    cuda_partials_add(dw, part, gy, (int64_t)C * Kc);
}
