/*
 * cuda_elementwise.cu — the cuda backend's per-element and per-row ops without
 * row reductions (lib/backend/backend.h; the oracle is kernels/cpu/cpu_elementwise.c):
 * the token embedding, the Gated DeltaNet gates (beta, g), the sigmoid output
 * gate of the softmax attention, and the SwiGLU of the MLP, forward and
 * backward.
 *
 * Layout: one thread per 8 consecutive columns of a row (a 16-byte bf16
 * vector; the scalar path of the same loop where rows are not 16-byte
 * aligned), rows x ceil(width / 8) threads in 256-thread blocks (the sigmoid
 * gate and SwiGLU: one row per block row, no index division). All math is
 * fp32 with the activations of cuda_device.cuh (the cpu's formulas; the
 * sigmoid gate and SwiGLU take cuda_sigmoid_fast).
 *
 * Parameter gradients, deterministically (no float atomics):
 *   embedding_backward  dwte[tok] += dout[t] for every t with tokens[t] = tok,
 *                       in token order: a stable radix sort (CUB) of the ids
 *                       with their positions groups each id's tokens in
 *                       increasing t; the first sorted position of each id
 *                       owns that vocabulary row, sums its tokens' rows in
 *                       order (fp32) and adds the sum to dwte once. Each
 *                       (row, 256-column block) has one owner warp.
 *   gdn_gates_backward  dA_log, ddt_bias: blocks own fixed row ranges, sum
 *                       per head in a fixed order (threads, then rows of the
 *                       block), and cuda_partials_add adds the blocks in order.
 *
 * Bad inputs: a token id < 0 is recorded in the device error word (the run
 * stops at the next host read, naming it) and its row is skipped.
 * Backward outputs may alias the incoming gradient of the same shape, as on
 * cpu: each thread reads its elements before writing them.
 *
 * Callers: through backend_cuda (lib/model*.c), tests/cuda/test_cuda_elementwise.cu.
 */
#include <cub/cub.cuh>

#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"

#define EW_THREADS 256

static unsigned ew_blocks(int64_t threads) { return (unsigned)cuda_ceil_div(threads, EW_THREADS); }

/* ---- embedding ------------------------------------------------------------------------------ */

__global__ void __launch_bounds__(EW_THREADS) ew_embedding_forward_kernel(bf16 *out /* (T,C) */,
                                                                          const int32_t *tokens /* (T) */,
                                                                          const bf16 *wte /* (V,C) */, int64_t T,
                                                                          int C, int *err, bool vec) {
    const int nc = (C + CUDA_VEC - 1) / CUDA_VEC;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * nc) return;
    const int64_t t = idx / nc;
    const int c = (int)(idx % nc) * CUDA_VEC, n = min(CUDA_VEC, C - c);
    const int32_t tok = tokens[t];
    if (tok < 0) {
        cuda_raise(err, CUDA_ERR_TOKEN_ID, t, tok);
        return;
    }
    float f[CUDA_VEC];
    cuda_load8n(f, wte + (int64_t)tok * C + c, n, vec);
    cuda_store8n(out + t * C + c, f, n, vec);
}

__global__ void ew_iota_kernel(int32_t *v, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = (int32_t)i;
}

/* one warp per sorted position; the first position of each id sums its segment over 256 columns */
__global__ void __launch_bounds__(EW_THREADS) ew_embedding_backward_kernel(float *dwte /* (V,C) += */,
                                                                           const bf16 *dout /* (T,C) */,
                                                                           const int32_t *ids /* (T) sorted */,
                                                                           const int32_t *rows /* (T) t of each */,
                                                                           int64_t T, int C, int *err, bool vec) {
    const int64_t i = (int64_t)blockIdx.x * (EW_THREADS / CUDA_WARP) + threadIdx.x / CUDA_WARP;
    if (i >= T) return;
    const int32_t tok = ids[i];
    if (i > 0 && ids[i - 1] == tok) return; /* not the first of its id */
    const int lane = threadIdx.x % CUDA_WARP;
    if (tok < 0) {
        if (lane == 0 && blockIdx.y == 0) cuda_raise(err, CUDA_ERR_TOKEN_ID, rows[i], tok);
        return;
    }
    const int c = blockIdx.y * CUDA_WARP * CUDA_VEC + lane * CUDA_VEC;
    if (c >= C) return;
    const int n = min(CUDA_VEC, C - c);
    float acc[CUDA_VEC] = {0};
    for (int64_t j = i; j < T && ids[j] == tok; j++) {
        float f[CUDA_VEC];
        cuda_load8n(f, dout + (int64_t)rows[j] * C + c, n, vec);
#pragma unroll
        for (int k = 0; k < CUDA_VEC; k++) acc[k] += f[k];
    }
    float *dst = dwte + (int64_t)tok * C + c;
    if (vec && n == CUDA_VEC) {
        float4 a = *reinterpret_cast<float4 *>(dst), b = *reinterpret_cast<float4 *>(dst + 4);
        a.x += acc[0], a.y += acc[1], a.z += acc[2], a.w += acc[3];
        b.x += acc[4], b.y += acc[5], b.z += acc[6], b.w += acc[7];
        *reinterpret_cast<float4 *>(dst) = a;
        *reinterpret_cast<float4 *>(dst + 4) = b;
    } else {
        for (int k = 0; k < n; k++) dst[k] += acc[k];
    }
}

extern "C" void cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, int64_t T, int C) {
    RS_CHECK(T >= 0 && C > 0, "T %lld C %d", (long long)T, C);
    if (!T) return;
    const bool vec = cuda_vec_ok(out, C, C) && cuda_vec_ok(wte, C, C);
    ew_embedding_forward_kernel<<<ew_blocks(T * cuda_ceil_div(C, CUDA_VEC)), EW_THREADS, 0, cuda_stream()>>>(
        (bf16 *)out, tokens, (const bf16 *)wte, T, C, cuda_error_word(), vec);
    CUDA_LAUNCH_CHECK();
}

static size_t ew_align256(size_t b) { return (b + 255) & ~(size_t)255; }

extern "C" void cuda_embedding_backward(float *dwte, const void *dout, const int32_t *tokens, int64_t T, int C) {
    RS_CHECK(T >= 0 && C > 0, "T %lld C %d", (long long)T, C);
    RS_CHECK(T <= INT32_MAX, "T = %lld: the sort takes 32-bit counts", (long long)T);
    if (!T) return;
    const int n = (int)T;
    size_t sort_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const int32_t *)NULL, (int32_t *)NULL,
                                               (const int32_t *)NULL, (int32_t *)NULL, n, 0, 32, cuda_stream()));
    const size_t col = ew_align256((size_t)n * sizeof(int32_t));
    char *s = (char *)cuda_scratch(3 * col + sort_bytes, "embedding_backward (sort of the token ids)");
    int32_t *ids = (int32_t *)s, *pos_in = (int32_t *)(s + col), *pos = (int32_t *)(s + 2 * col);
    ew_iota_kernel<<<ew_blocks(T), EW_THREADS, 0, cuda_stream()>>>(pos_in, T);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s + 3 * col, sort_bytes, tokens, ids, pos_in, pos, n, 0, 32,
                                               cuda_stream()));
    const bool vec = cuda_vec_ok(dout, C, C) && cuda_ptr_align(dwte) >= 16 && C % CUDA_VEC == 0;
    dim3 grid((unsigned)cuda_ceil_div(T, EW_THREADS / CUDA_WARP), (unsigned)cuda_ceil_div(C, CUDA_WARP * CUDA_VEC));
    ew_embedding_backward_kernel<<<grid, EW_THREADS, 0, cuda_stream()>>>(dwte, (const bf16 *)dout, ids, pos, T, C,
                                                                         cuda_error_word(), vec);
    CUDA_LAUNCH_CHECK();
}

/* ---- Gated DeltaNet gates ------------------------------------------------------------------- */

/* beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias) */
__global__ void __launch_bounds__(EW_THREADS) ew_gates_forward_kernel(float *beta /* (T,nv) */, float *g /* (T,nv) */,
                                                                      const bf16 *b /* (T,ld) */,
                                                                      const bf16 *a /* (T,ld) */,
                                                                      const float *A_log /* (nv) */,
                                                                      const float *dt_bias /* (nv) */, int64_t T,
                                                                      int nv, int ld) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * nv) return;
    const int64_t t = idx / nv;
    const int h = (int)(idx % nv);
    beta[idx] = cuda_sigmoidf(__bfloat162float(b[t * ld + h]));
    g[idx] = -expf(A_log[h]) * cuda_softplusf(__bfloat162float(a[t * ld + h]) + dt_bias[h]);
}

#define GATES_ROWS 8 /* blockDim.y: rows of a block in flight */

/* db = dbeta beta (1 - beta); da = dg (-exp(A_log)) softplus'(a + dt_bias); per-block partial sums of
 * dA_log (dg g) and ddt_bias (da) over the block's rows */
__global__ void __launch_bounds__(CUDA_WARP *GATES_ROWS) ew_gates_backward_kernel(
    bf16 *db /* (T,ld) = */, bf16 *da /* (T,ld) = */, float *part_A /* (gridDim.x, nv) */,
    float *part_dt /* (gridDim.x, nv) */, const float *dbeta /* (T,nv) */, const float *dg /* (T,nv) */,
    const bf16 *b /* (T,ld) */, const bf16 *a /* (T,ld) */, const float *A_log /* (nv) */,
    const float *dt_bias /* (nv) */, int64_t T, int64_t rows_per_block, int nv, int ld) {
    __shared__ float sh_A[GATES_ROWS][CUDA_WARP], sh_dt[GATES_ROWS][CUDA_WARP];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t r0 = (int64_t)blockIdx.x * rows_per_block, r1 = min(T, r0 + rows_per_block);
    for (int h0 = 0; h0 < nv; h0 += CUDA_WARP) {
        const int h = h0 + tx;
        float acc_A = 0.0f, acc_dt = 0.0f;
        if (h < nv) {
            const float A = expf(A_log[h]), dtb = dt_bias[h];
            for (int64_t t = r0 + ty; t < r1; t += GATES_ROWS) {
                const float x = __bfloat162float(a[t * ld + h]) + dtb;
                const float dgt = dg[t * nv + h];
                const float dat = dgt * -A * cuda_softplus_gradf(x);
                acc_A += dgt * (-A * cuda_softplusf(x));
                acc_dt += dat;
                db[t * ld + h] = __float2bfloat16_rn(dbeta[t * nv + h] * cuda_sigmoid_gradf(__bfloat162float(b[t * ld + h])));
                da[t * ld + h] = __float2bfloat16_rn(dat);
            }
        }
        sh_A[ty][tx] = acc_A;
        sh_dt[ty][tx] = acc_dt;
        __syncthreads();
        if (ty == 0 && h < nv) {
            float sA = 0.0f, sdt = 0.0f;
            for (int k = 0; k < GATES_ROWS; k++) sA += sh_A[k][tx], sdt += sh_dt[k][tx];
            part_A[(int64_t)blockIdx.x * nv + h] = sA;
            part_dt[(int64_t)blockIdx.x * nv + h] = sdt;
        }
        __syncthreads();
    }
}

extern "C" void cuda_gdn_gates_forward(float *beta, float *g, const void *b, const void *a, const float *A_log,
                                       const float *dt_bias, int64_t T, int nv, int ld) {
    RS_CHECK(T >= 0 && nv > 0 && ld >= nv, "T %lld nv %d ld %d", (long long)T, nv, ld);
    if (!T) return;
    ew_gates_forward_kernel<<<ew_blocks(T * nv), EW_THREADS, 0, cuda_stream()>>>(beta, g, (const bf16 *)b,
                                                                                 (const bf16 *)a, A_log, dt_bias, T, nv,
                                                                                 ld);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_gdn_gates_backward(void *db, void *da, float *dA_log, float *ddt_bias, const float *dbeta,
                                        const float *dg, const void *b, const void *a, const float *A_log,
                                        const float *dt_bias, int64_t T, int nv, int ld) {
    RS_CHECK(T >= 0 && nv > 0 && ld >= nv, "T %lld nv %d ld %d", (long long)T, nv, ld);
    if (!T) return;
    const int blocks = cuda_partial_blocks(T, 4 * GATES_ROWS);
    const int64_t rpb = cuda_ceil_div(T, blocks);
    float *part = (float *)cuda_scratch(2 * (size_t)blocks * nv * sizeof(float), "gdn_gates_backward");
    ew_gates_backward_kernel<<<blocks, dim3(CUDA_WARP, GATES_ROWS), 0, cuda_stream()>>>(
        (bf16 *)db, (bf16 *)da, part, part + (size_t)blocks * nv, dbeta, dg, (const bf16 *)b, (const bf16 *)a, A_log,
        dt_bias, T, rpb, nv, ld);
    CUDA_LAUNCH_CHECK();
    cuda_partials_add(dA_log, part, blocks, nv);
    cuda_partials_add(ddt_bias, part + (size_t)blocks * nv, blocks, nv);
}

/* ---- sigmoid output gate -------------------------------------------------------------------- */

/* The streaming kernels below (the sigmoid gate, SwiGLU): block (row t, 256 column vectors), one thread per
 * 8 columns; no index division, and the row count is the grid's x (2^31 - 1). */
static dim3 ew_row_grid(int64_t T, int width) {
    return dim3((unsigned)T, (unsigned)cuda_ceil_div(cuda_ceil_div(width, CUDA_VEC), EW_THREADS));
}

__global__ void __launch_bounds__(EW_THREADS) ew_sigmoid_gate_forward_kernel(bf16 *out /* (T,D) */,
                                                                             const bf16 *x /* (T,D) */,
                                                                             const bf16 *gate /* (T,ldg) */, int D,
                                                                             int ldg, bool vec) {
    const int64_t t = blockIdx.x;
    const int c = (blockIdx.y * EW_THREADS + threadIdx.x) * CUDA_VEC;
    if (c >= D) return;
    const int n = min(CUDA_VEC, D - c);
    float xv[CUDA_VEC], gv[CUDA_VEC];
    cuda_load8n(xv, x + t * D + c, n, vec);
    cuda_load8n(gv, gate + t * ldg + c, n, vec);
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) xv[i] *= cuda_sigmoid_fast(gv[i]);
    cuda_store8n(out + t * D + c, xv, n, vec);
}

/* dx = dout s; dgate = dout x s (1 - s) */
__global__ void __launch_bounds__(EW_THREADS) ew_sigmoid_gate_backward_kernel(bf16 *dx /* (T,D) */,
                                                                              bf16 *dgate /* (T,ldg) */,
                                                                              const bf16 *dout /* (T,D) */,
                                                                              const bf16 *x /* (T,D) */,
                                                                              const bf16 *gate /* (T,ldg) */, int D,
                                                                              int ldg, bool vec) {
    const int64_t t = blockIdx.x;
    const int c = (blockIdx.y * EW_THREADS + threadIdx.x) * CUDA_VEC;
    if (c >= D) return;
    const int n = min(CUDA_VEC, D - c);
    float dy[CUDA_VEC], xv[CUDA_VEC], gv[CUDA_VEC], dg[CUDA_VEC];
    cuda_load8n(dy, dout + t * D + c, n, vec);
    cuda_load8n(xv, x + t * D + c, n, vec);
    cuda_load8n(gv, gate + t * ldg + c, n, vec);
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) {
        /* s' = s (1 - s), with 1 - s = e s for gate >= 0 (no cancellation as s -> 1) */
        const float e = __expf(-gv[i]), s = __fdividef(1.0f, 1.0f + e);
        dg[i] = dy[i] * xv[i] * (s * (gv[i] >= 0.0f ? e * s : 1.0f - s));
        dy[i] *= s;
    }
    cuda_store8n(dgate + t * ldg + c, dg, n, vec);
    cuda_store8n(dx + t * D + c, dy, n, vec);
}

extern "C" void cuda_sigmoid_gate_forward(void *out, const void *x, const void *gate, int64_t T, int D, int ldg) {
    RS_CHECK(T >= 0 && D > 0 && ldg >= D, "T %lld D %d ldg %d", (long long)T, D, ldg);
    RS_CHECK(T <= INT32_MAX, "sigmoid_gate_forward: T = %lld rows", (long long)T);
    if (!T) return;
    const bool vec = cuda_vec_ok(out, D, D) && cuda_vec_ok(x, D, D) && cuda_vec_ok(gate, D, ldg);
    ew_sigmoid_gate_forward_kernel<<<ew_row_grid(T, D), EW_THREADS, 0, cuda_stream()>>>(
        (bf16 *)out, (const bf16 *)x, (const bf16 *)gate, D, ldg, vec);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_sigmoid_gate_backward(void *dx, void *dgate, const void *dout, const void *x, const void *gate,
                                           int64_t T, int D, int ldg) {
    RS_CHECK(T >= 0 && D > 0 && ldg >= D, "T %lld D %d ldg %d", (long long)T, D, ldg);
    RS_CHECK(T <= INT32_MAX, "sigmoid_gate_backward: T = %lld rows", (long long)T);
    if (!T) return;
    const bool vec = cuda_vec_ok(dx, D, D) && cuda_vec_ok(dgate, D, ldg) && cuda_vec_ok(dout, D, D) &&
                     cuda_vec_ok(x, D, D) && cuda_vec_ok(gate, D, ldg);
    ew_sigmoid_gate_backward_kernel<<<ew_row_grid(T, D), EW_THREADS, 0, cuda_stream()>>>(
        (bf16 *)dx, (bf16 *)dgate, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)gate, D, ldg, vec);
    CUDA_LAUNCH_CHECK();
}

/* ---- SwiGLU --------------------------------------------------------------------------------- */

/* silu(g) u, the one expression of both kernels: the backward's `out` has the forward's bits */
__device__ __forceinline__ float ew_swiglu(float g, float sg /* sigmoid(g) */, float u) { return g * sg * u; }

/* out = silu(gate) up, gate_up rows = [gate | up] */
__global__ void __launch_bounds__(EW_THREADS) ew_swiglu_forward_kernel(bf16 *out /* (T,I) */,
                                                                       const bf16 *gate_up /* (T,2I) */, int I,
                                                                       bool vec) {
    const int64_t t = blockIdx.x;
    const int c = (blockIdx.y * EW_THREADS + threadIdx.x) * CUDA_VEC;
    if (c >= I) return;
    const int n = min(CUDA_VEC, I - c);
    float gv[CUDA_VEC], uv[CUDA_VEC];
    cuda_load8n(gv, gate_up + t * 2 * I + c, n, vec);
    cuda_load8n(uv, gate_up + t * 2 * I + I + c, n, vec);
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) gv[i] = ew_swiglu(gv[i], cuda_sigmoid_fast(gv[i]), uv[i]);
    cuda_store8n(out + t * I + c, gv, n, vec);
}

/* dgate = dout up silu'(gate); dup = dout silu(gate); OUT: out = silu(gate) up too, as the forward (out unused
 * without it) */
template <bool OUT>
__global__ void __launch_bounds__(EW_THREADS) ew_swiglu_backward_kernel(bf16 *dgate_up /* (T,2I) */,
                                                                        bf16 *out /* (T,I) */,
                                                                        const bf16 *dout /* (T,I) */,
                                                                        const bf16 *gate_up /* (T,2I) */, int I,
                                                                        bool vec) {
    const int64_t t = blockIdx.x;
    const int c = (blockIdx.y * EW_THREADS + threadIdx.x) * CUDA_VEC;
    if (c >= I) return;
    const int n = min(CUDA_VEC, I - c);
    float gv[CUDA_VEC], uv[CUDA_VEC], dy[CUDA_VEC], dgv[CUDA_VEC], duv[CUDA_VEC], ov[CUDA_VEC];
    cuda_load8n(gv, gate_up + t * 2 * I + c, n, vec);
    cuda_load8n(uv, gate_up + t * 2 * I + I + c, n, vec);
    cuda_load8n(dy, dout + t * I + c, n, vec);
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) { /* one sigmoid: silu = g s, silu' = s (1 + g (1 - s)) */
        const float sg = cuda_sigmoid_fast(gv[i]);
        dgv[i] = dy[i] * uv[i] * (sg * (1.0f + gv[i] * (1.0f - sg)));
        duv[i] = dy[i] * (gv[i] * sg);
        if (OUT) ov[i] = ew_swiglu(gv[i], sg, uv[i]);
    }
    cuda_store8n(dgate_up + t * 2 * I + c, dgv, n, vec);
    cuda_store8n(dgate_up + t * 2 * I + I + c, duv, n, vec);
    if (OUT) cuda_store8n(out + t * I + c, ov, n, vec);
}

extern "C" void cuda_swiglu_forward(void *out, const void *gate_up, int64_t T, int I) {
    RS_CHECK(T >= 0 && I > 0, "T %lld I %d", (long long)T, I);
    RS_CHECK(T <= INT32_MAX, "swiglu_forward: T = %lld rows", (long long)T);
    if (!T) return;
    const bool vec = cuda_vec_ok(out, I, I) && cuda_vec_ok(gate_up, I, 2 * I);
    ew_swiglu_forward_kernel<<<ew_row_grid(T, I), EW_THREADS, 0, cuda_stream()>>>((bf16 *)out, (const bf16 *)gate_up,
                                                                                  I, vec);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_swiglu_backward(void *dgate_up, void *out, const void *dout, const void *gate_up, int64_t T,
                                     int I) {
    RS_CHECK(T >= 0 && I > 0, "T %lld I %d", (long long)T, I);
    RS_CHECK(T <= INT32_MAX, "swiglu_backward: T = %lld rows", (long long)T);
    if (!T) return;
    const bool vec = cuda_vec_ok(dgate_up, I, 2 * I) && cuda_vec_ok(dout, I, I) && cuda_vec_ok(gate_up, I, 2 * I) &&
                     (!out || cuda_vec_ok(out, I, I));
    (out ? ew_swiglu_backward_kernel<true> : ew_swiglu_backward_kernel<false>)<<<ew_row_grid(T, I), EW_THREADS, 0,
                                                                                cuda_stream()>>>(
        (bf16 *)dgate_up, (bf16 *)out, (const bf16 *)dout, (const bf16 *)gate_up, I, vec);
    CUDA_LAUNCH_CHECK();
}
