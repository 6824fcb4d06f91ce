/*
 * cuda_conv.cu — the causal depthwise conv1d + SiLU of the Gated DeltaNet layer on the cuda backend
 * (lib/backend/backend.h: conv1d_silu_forward/backward; the oracle and the exact definition, halo and
 * document masks included, are kernels/cpu/cpu_conv.c):
 *   u[t,c] = sum_j w[c,j] x(t - (Kc-1-j), c), y = silu(u); x(t-b) is inp[t-b], or halo[Kc-1+t-b] before
 *   the first row (NULL halo = zeros); a tap with lookback b > doc_pos[t] reads 0.
 *
 * General kernels (any Kc <= CONV_KC_MAX). Forward: one thread per (token, 8 channels), taps summed oldest first in
 * fp32 like the cpu. Input gradient gathered, not scattered: one thread per (row s, 8 channels), s from -(Kc-1) (the
 * halo rows, when dhalo is wanted) to T-1, dinp[s] = sum_b w[c,Kc-1-b] du[s+b] over the taps the forward used, du =
 * dout silu'(u) with u recomputed; terms in b order (the cpu's scatter order), every row written once: no atomics,
 * no zeroing pass. Weight gradient dw[c,j] += sum_t du[t,c] x(t-b,c) in two deterministic stages: blocks own fixed
 * token ranges (their count a function of T and C only) and write per-block partials, cuda_partials_add adds the
 * blocks in order.
 *
 * Run kernels (Kc = 4, the model's width): one thread owns CONV_CV = 4 channels (8-byte vectors: half the registers
 * of 8, so two 256-thread blocks fit an SM with their windows and sums in registers) of a run of consecutive tokens
 * and slides a window of the last Kc-1 input rows (backward: the last Kc values of du) through registers, so each
 * row is read once per run rather than Kc times (Kc^2 in the gathered input gradient), with the weights in
 * registers. The backward fuses the input and weight gradients in one pass (per-block partials of at most
 * CONV_PART_BYTES, added in a fixed order): deterministic, and the same sums in the same tap order as the general
 * kernels. Both load rows in groups (CONV_RUN_G, CONV_RUN_GB) and issue the next group's loads before they use the
 * current one, and ask L2 for the rows CONV_PF_ROWS ahead, so every thread keeps reads in flight while it computes
 * (one group in flight at a time left them latency-bound).
 *
 * The GDN layer's conv and the split after it, fused (gdn_conv_split_forward/backward; the oracle is the unfused
 * pair, kernels/cpu/cpu_conv.c): the same run walk over proj's [q|k|v] channels with the L2 norm of each q, k head
 * (forward) or its backward (dconv made per row from dqk, y = qk, rstd) done in registers, a head being 16 or 32
 * lanes of one warp (dk = 64, 128): the conv output and its gradient never reach memory; blocks past the conv's copy
 * z (dz) for the same rows. The forward reads proj's q|k|v|z columns and writes qk, rstd, v, z; the backward reads
 * proj, dqk, qk, rstd, dv, dz and writes dproj's q|k|v|z columns, dhalo and the dw partials.
 *
 * The sigmoid is conv_sigmoid: __expf and __fdividef (a few ulp in fp32, below the outputs' bf16 rounding). A
 * doc_pos < 0 is recorded in the device error word (cuda_common.h) and the token skipped.
 *
 * Callers: through backend_cuda (lib/model/model_block.c), tests/cuda/test_cuda_conv.cu; the device code runs under
 * the host emulation of tests/cuda/glue_emu too.
 */
#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_norm.cuh" /* L2NORM_EPS */

#define CONV_KC_MAX 16
#define CONV_THREADS 256
#define CONV_DW_ROWS 8 /* blockDim.y of the weight-gradient kernel */
#define CONV_RUN_KC 4              /* the kernel width the run kernels are built for */
#define CONV_RUN_LANES 32          /* blockDim.x of the run kernels: channel groups of CONV_CV */
#define CONV_RUN_ROWS 8            /* blockDim.y: runs of tokens per block */
#define CONV_CV 4                  /* channels per thread of the run kernels (8-byte vectors) */
#define CONV_RUN_FWD 32            /* tokens per thread, forward */
#define CONV_RUN_BWD_MIN 32        /* tokens per thread of the backward, at least (each run reads KC-1 more) */
#define CONV_PF_ROWS 8              /* rows ahead of the current group that the run kernels prefetch into L2 */
#define CONV_RUN_GB 2              /* the same in the backward, whose registers hold twice the rows */
#define CONV_RUN_G 4               /* rows a run thread loads as a group (= CONV_RUN_KC: the unrolled group
                                    * also turns the window shifts into register renames) */
#define CONV_PART_BYTES (8u << 20) /* the backward's per-block weight partials, at most */
#define CONV_SPLIT_GB 2            /* rows the fused GDN conv + split backward loads as a group (2 fit in
                                    * 128 registers beside its windows, dw and weights) */
#define CONV_SPLIT_BLOCK (CONV_RUN_KC / CONV_SPLIT_GB) /* groups per unrolled block of the backward: KC tokens */
#define CONV_SPLIT_ZG 8            /* rows the z copies of the fused GDN conv + split load as a group (2 KB
                                    * of reads in flight per warp; the conv warps have 1 KB and an L2 prefetch) */

static void conv_check_sizes(int64_t T, int C, int Kc, int ldi, int ldo) {
    RS_CHECK(T >= 0 && C > 0, "conv1d_silu: T = %lld, C = %d", (long long)T, C);
    RS_CHECK(Kc >= 1 && Kc <= CONV_KC_MAX, "conv1d_silu: Kc = %d (the cuda kernel supports 1..%d)", Kc, CONV_KC_MAX);
    RS_CHECK(ldi >= C && ldo >= C, "conv1d_silu: ldi = %d, ldo = %d, need >= C = %d", ldi, ldo, C);
}

/* sigmoid(u) = 1 / (1 + exp(-u)) with the fast intrinsics (ex2.approx, rcp.approx: a few ulp in fp32,
 * far below the bf16 rounding of every output): the IEEE expf and division were half of the
 * kernels' instructions. exp(-u) = inf gives 0, as the IEEE form does. */
__device__ __forceinline__ float conv_sigmoid(float u) { return __fdividef(1.0f, 1.0f + __expf(-u)); }

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
    for (int i = 0; i < CUDA_VEC; i++) u[i] = u[i] * conv_sigmoid(u[i]);
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
            const float sg = conv_sigmoid(u[i]);
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
            const float sg = conv_sigmoid(u);
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

/* ---- Kc = CONV_RUN_KC: one thread = CONV_CV channels x a run of tokens, sliding windows in registers ---- */

/* Rows of `width` bf16 at stride `ld` from `p` can be read as 8-byte vectors of CONV_CV */
static bool conv_vec4_ok(const void *p, int64_t width, int64_t ld) {
    return p == NULL || (cuda_ptr_align(p) >= 8 && width % CONV_CV == 0 && ld % CONV_CV == 0);
}

/* the n <= CONV_CV bf16 at p as they are (8 bytes when `vec`), the rest 0: the run kernels load a group of
 * rows before using any */
__device__ __forceinline__ uint2 conv_raw4(const bf16 *p, int n, bool vec) {
    if (vec && n == CONV_CV) return *reinterpret_cast<const uint2 *>(p);
    uint2 u = make_uint2(0, 0);
    bf16 *h = reinterpret_cast<bf16 *>(&u);
#pragma unroll
    for (int i = 0; i < CONV_CV; i++)
        if (i < n) h[i] = p[i];
    return u;
}

/* the 4 bf16 of u as fp32 (exact): a pair's low half shifted up, its high half masked (no byte permutes, and
 * plain integer ops the compiler can share) */
__device__ __forceinline__ void conv_unpack4(float f[CONV_CV], uint2 u) {
    f[0] = __uint_as_float(u.x << 16), f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16), f[3] = __uint_as_float(u.y & 0xffff0000u);
}

/* f[0..n) rounded to bf16 at p (one 8-byte store when `vec`) */
__device__ __forceinline__ void conv_store4(bf16 *p, const float f[CONV_CV], int n, bool vec) {
    if (vec && n == CONV_CV) {
        uint2 u;
        __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
        h[0] = __floats2bfloat162_rn(f[0], f[1]);
        h[1] = __floats2bfloat162_rn(f[2], f[3]);
        *reinterpret_cast<uint2 *>(p) = u;
        return;
    }
#pragma unroll
    for (int i = 0; i < CONV_CV; i++)
        if (i < n) p[i] = __float2bfloat16_rn(f[i]);
}

/* row r (>= -(KC-1)) of the conv input at channels c..c+n as read (bf16): inp, the halo before row 0, or zeros */
template <int KC>
__device__ __forceinline__ uint2 conv_rowraw4(const bf16 *inp, const bf16 *halo, int64_t r, int c, int n, int C,
                                              int ldi, bool vec) {
    if (r >= 0) return conv_raw4(inp + r * ldi + c, n, vec);
    if (halo) return conv_raw4(halo + (KC - 1 + r) * (int64_t)C + c, n, vec);
    return make_uint2(0, 0);
}

/* the same row unpacked to fp32 (zeros unpack to +0) */
template <int KC>
__device__ __forceinline__ void conv_row4(float x[CONV_CV], const bf16 *inp, const bf16 *halo, int64_t r, int c, int n,
                                          int C, int ldi, bool vec) {
    conv_unpack4(x, conv_rowraw4<KC>(inp, halo, r, c, n, C, ldi, vec));
}

/* the rows [tg, tg + G) of src's channels c..c+n that lie before t1: their bf16 as read into xn and their doc_pos
 * into dpn (the slots of rows past t1 keep what they held); the forward run kernels' next group, in flight while
 * they compute the current one */
template <int G>
__device__ __forceinline__ void conv_load_rows(uint2 xn[G], int dpn[G], const bf16 *src /* (T,ld) */, int64_t ld,
                                               const int32_t *doc_pos, int64_t tg, int64_t t1, int c, int n,
                                               bool vec) {
#pragma unroll
    for (int g = 0; g < G; g++)
        if (tg + g < t1) {
            xn[g] = conv_raw4(src + (tg + g) * ld + c, n, vec);
            dpn[g] = doc_pos[tg + g];
        }
}

/* the L2 prefetch of src's rows [tg, tg + G) + CONV_PF_ROWS that lie before t1, at channel c */
template <int G>
__device__ __forceinline__ void conv_prefetch_rows(const bf16 *src /* (T,ld) */, int64_t ld, int64_t tg, int64_t t1,
                                                   int c) {
#pragma unroll
    for (int g = 0; g < G; g++)
        if (tg + CONV_PF_ROWS + g < t1) cuda_prefetch_l2(src + (tg + CONV_PF_ROWS + g) * ld + c);
}

/* the input window one token on: xw[b] = x(t-b) becomes x(t+1-b) once xw[0] takes the next row */
template <int KC> __device__ __forceinline__ void conv_window_shift(float xw[KC][CONV_CV]) {
#pragma unroll
    for (int b = KC - 1; b > 0; b--)
#pragma unroll
        for (int i = 0; i < CONV_CV; i++) xw[b][i] = xw[b - 1][i];
}

/* u = sum over taps b = nb..0 (oldest first) of w[KC-1-b] x(t-b); xw[b] = x(t-b) */
template <int KC>
__device__ __forceinline__ void conv_run_preact(float u[CONV_CV], const float xw[KC][CONV_CV],
                                                const float wr[CONV_CV][KC], int nb) {
#pragma unroll
    for (int i = 0; i < CONV_CV; i++) u[i] = 0.0f;
#pragma unroll
    for (int b = KC - 1; b >= 0; b--)
        if (b <= nb)
#pragma unroll
            for (int i = 0; i < CONV_CV; i++) u[i] += wr[i][KC - 1 - b] * xw[b][i];
}

template <int KC>
__device__ __forceinline__ void conv_run_weights(float wr[CONV_CV][KC], const bf16 *w, int c, int n) {
#pragma unroll
    for (int i = 0; i < CONV_CV; i++)
#pragma unroll
        for (int j = 0; j < KC; j++) wr[i][j] = i < n ? __bfloat162float(w[(int64_t)(c + i) * KC + j]) : 0.0f;
}

/* out rows [t0, t0 + run) of CONV_CV channels per thread; the next group's rows are loaded while this
 * group's are used */
template <int KC>
__global__ void __launch_bounds__(CONV_RUN_LANES *CONV_RUN_ROWS, 3) conv_run_forward_kernel(
    bf16 *out /* (T,ldo) */, const bf16 *inp /* (T,ldi) */, const bf16 *halo /* (KC-1,C) or NULL */,
    const bf16 *w /* (C,KC) */, const int32_t *doc_pos /* (T) */, int64_t T, int64_t run, int C, int ldi, int ldo,
    int *err, bool vec) {
    const int c = (blockIdx.x * CONV_RUN_LANES + threadIdx.x) * CONV_CV;
    const int64_t t0 = ((int64_t)blockIdx.y * CONV_RUN_ROWS + threadIdx.y) * run;
    if (c >= C || t0 >= T) return;
    const int n = min(CONV_CV, C - c);
    const int64_t t1 = min(T, t0 + run);
    float wr[CONV_CV][KC], xw[KC][CONV_CV];
    conv_run_weights<KC>(wr, w, c, n);
#pragma unroll
    for (int b = 1; b < KC; b++) conv_row4<KC>(xw[b], inp, halo, t0 - b, c, n, C, ldi, vec);
    uint2 xn[CONV_RUN_G]; /* the next group's rows, in flight while this group computes */
    int dpn[CONV_RUN_G];
    conv_load_rows<CONV_RUN_G>(xn, dpn, inp, ldi, doc_pos, t0, t1, c, n, vec);
    for (int64_t tg = t0; tg < t1; tg += CONV_RUN_G) {
        uint2 xr[CONV_RUN_G];
        int dpg[CONV_RUN_G];
#pragma unroll
        for (int g = 0; g < CONV_RUN_G; g++) xr[g] = xn[g], dpg[g] = dpn[g];
        if (tg + CONV_RUN_G < t1)
            conv_load_rows<CONV_RUN_G>(xn, dpn, inp, ldi, doc_pos, tg + CONV_RUN_G, t1, c, n, vec);
        conv_prefetch_rows<CONV_RUN_G>(inp, ldi, tg, t1, c);
#pragma unroll
        for (int g = 0; g < CONV_RUN_G; g++) {
            const int64_t t = tg + g;
            if (t >= t1) break;
            conv_unpack4(xw[0], xr[g]);
            const int dp = dpg[g];
            if (dp < 0) cuda_raise(err, CUDA_ERR_DOC_POS, t, dp);
            else {
                float u[CONV_CV];
                conv_run_preact<KC>(u, xw, wr, min(KC - 1, dp));
#pragma unroll
                for (int i = 0; i < CONV_CV; i++) u[i] = u[i] * conv_sigmoid(u[i]);
                conv_store4(out + t * ldo + c, u, n, vec);
            }
            conv_window_shift<KC>(xw);
        }
    }
}

/* The run backward's per-token steps, shared by conv_run_backward_kernel and conv_split_backward_kernel (the same
 * operations in the same order in both). A run walks its tokens t in order; duw[b] = du[s+b] and dpw[b] = their
 * doc_pos (-1: none) for s = t - (KC-1), the oldest row whose input gradient is complete at t. */

/* duw, dpw one token on: du[t] starts as 0 (a row past T or of a negative doc_pos adds nothing) */
template <int KC>
__device__ __forceinline__ void conv_bwd_shift(float duw[KC][CONV_CV], int dpw[KC]) {
#pragma unroll
    for (int b = 0; b < KC - 1; b++) {
        dpw[b] = dpw[b + 1];
#pragma unroll
        for (int i = 0; i < CONV_CV; i++) duw[b][i] = duw[b + 1][i];
    }
    dpw[KC - 1] = -1;
#pragma unroll
    for (int i = 0; i < CONV_CV; i++) duw[KC - 1][i] = 0.0f;
}

/* token t < T with its input window xw[b] = x(t-b) and output gradient dy: du[t] = dy silu'(u) into duw[KC-1] and,
 * where the run owns t (t < t1), dw += du[t] x(t-b) over the taps inside t's document; a negative doc_pos is
 * recorded in err and adds nothing. FULL: the caller knows t < t1 and doc_pos >= KC-1 (every tap inside the
 * document): the same operations without the tests. */
template <int KC, bool FULL = false>
__device__ __forceinline__ void conv_bwd_token(float duw[KC][CONV_CV], int dpw[KC], float dw[CONV_CV][KC],
                                               const float wr[CONV_CV][KC], const float xw[KC][CONV_CV],
                                               const float dy[CONV_CV], int dp, int t, int t1, int *err) {
    if (!FULL && dp < 0) {
        cuda_raise(err, CUDA_ERR_DOC_POS, t, dp);
        return;
    }
    const int nb = FULL ? KC - 1 : min(KC - 1, dp);
    float u[CONV_CV];
    conv_run_preact<KC>(u, xw, wr, nb);
#pragma unroll
    for (int i = 0; i < CONV_CV; i++) {
        const float sg = conv_sigmoid(u[i]);
        duw[KC - 1][i] = dy[i] * sg * (1.0f + u[i] * (1.0f - sg));
    }
    dpw[KC - 1] = dp;
    if (FULL || t < t1)
#pragma unroll
        for (int b = 0; b < KC; b++)
            if (b <= nb)
#pragma unroll
                for (int i = 0; i < CONV_CV; i++) dw[i][KC - 1 - b] += duw[KC - 1][i] * xw[b][i];
}

/* row s = t - (KC-1), where the run owns it: dinp[s] at drow (dinp + s ldi + c; used when s >= 0) or, s < 0, the
 * halo's row when the call wants dhalo and this is the first run; = sum_b w[KC-1-b] du[s+b] over the taps token s+b
 * used, in b order. FULL: the caller knows t0 <= s < t1, every tap used (dpw[b] >= b) and 8-byte rows of CONV_CV
 * channels: the same sums without the tests. */
template <int KC, bool FULL = false>
__device__ __forceinline__ void conv_bwd_input_row(bf16 *drow, bf16 *dhalo /* (KC-1,C) */,
                                                   const float duw[KC][CONV_CV], const int dpw[KC],
                                                   const float wr[CONV_CV][KC], int t, int t0, int t1, int C, int c,
                                                   int n, bool vec) {
    const int s = t - (KC - 1);
    const bool own = FULL || (s >= t0 ? s < t1 : s < 0 && dhalo != NULL && t0 == 0);
    if (!own) return;
    float acc[CONV_CV];
#pragma unroll
    for (int i = 0; i < CONV_CV; i++) acc[i] = 0.0f;
#pragma unroll
    for (int b = 0; b < KC; b++)
        if (FULL || (dpw[b] >= b && s + b >= 0))
#pragma unroll
            for (int i = 0; i < CONV_CV; i++) acc[i] += wr[i][KC - 1 - b] * duw[b][i];
    if (FULL) conv_store4(drow, acc, CONV_CV, true);
    else if (s >= 0) conv_store4(drow, acc, n, vec);
    else conv_store4(dhalo + (KC - 1 + s) * (int64_t)C + c, acc, n, vec);
}

/* the block's dw partials into part's row blockIdx.y: its CONV_RUN_ROWS runs added in order (every thread calls) */
template <int KC>
__device__ __forceinline__ void conv_run_dw_partials(float *part /* (gridDim.y, C*KC) */,
                                                     float (*sh)[CONV_RUN_LANES][CONV_CV * KC + 1],
                                                     const float dw[CONV_CV][KC], int C) {
    const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
    for (int i = 0; i < CONV_CV; i++)
#pragma unroll
        for (int j = 0; j < KC; j++) sh[ty][tx][i * KC + j] = dw[i][j];
    __syncthreads();
    const int cg0 = blockIdx.x * CONV_RUN_LANES * CONV_CV * KC; /* first partial index of the block's channels */
    for (int e = ty * CONV_RUN_LANES + tx; e < CONV_RUN_LANES * CONV_CV * KC; e += CONV_RUN_LANES * CONV_RUN_ROWS) {
        const int lane = e / (CONV_CV * KC), k = e % (CONV_CV * KC);
        if ((blockIdx.x * CONV_RUN_LANES + lane) * CONV_CV + k / KC >= C) continue;
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < CONV_RUN_ROWS; r++) sum += sh[r][lane][k];
        part[(int64_t)blockIdx.y * C * KC + cg0 + e] = sum;
    }
}

/* dinp (and dhalo) rows and per-block dw partials of the tokens [t0, t1) each thread owns; the thread
 * walks t from t0 to t1 + KC - 2, computing du[t], and writes row s = t - (KC-1) once du[s..s+KC-1]
 * are known (rows < t0 belong to the previous run, except the halo rows of the first run). The next
 * group's rows are loaded while this group's are used. */
template <int KC>
__global__ void __launch_bounds__(CONV_RUN_LANES *CONV_RUN_ROWS, 2) conv_run_backward_kernel(
    bf16 *dinp /* (T,ldi) = */, bf16 *dhalo /* (KC-1,C) = or NULL */, float *part /* (gridDim.y, C*KC) */,
    const bf16 *dout /* (T,ldo) */, const bf16 *inp /* (T,ldi) */, const bf16 *halo /* (KC-1,C) or NULL */,
    const bf16 *w /* (C,KC) */, const int32_t *doc_pos /* (T) */, int T, int run, int C, int ldi, int ldo, int *err,
    bool vec) {
    __shared__ float sh[CONV_RUN_ROWS][CONV_RUN_LANES][CONV_CV * KC + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = (blockIdx.x * CONV_RUN_LANES + tx) * CONV_CV;
    const int t0 = (blockIdx.y * CONV_RUN_ROWS + ty) * run; /* T < 2^31 (the host checks) */
    const int n = c < C ? min(CONV_CV, C - c) : 0;
    float dw[CONV_CV][KC];
#pragma unroll
    for (int i = 0; i < CONV_CV; i++)
#pragma unroll
        for (int j = 0; j < KC; j++) dw[i][j] = 0.0f;
    if (n > 0 && t0 < T) {
        const int t1 = min(T, t0 + run);
        float wr[CONV_CV][KC], xw[KC][CONV_CV], duw[KC][CONV_CV]; /* duw[b] = du[s+b], s = t-(KC-1) */
        int dpw[KC];                                                 /* doc_pos of those tokens; -1: none */
        conv_run_weights<KC>(wr, w, c, n);
#pragma unroll
        for (int b = 1; b < KC; b++) conv_row4<KC>(xw[b], inp, halo, t0 - b, c, n, C, ldi, vec);
#pragma unroll
        for (int b = 0; b < KC; b++) {
            dpw[b] = -1;
#pragma unroll
            for (int i = 0; i < CONV_CV; i++) duw[b][i] = 0.0f;
        }
        const int tend = t1 + KC - 1, tlim = min(tend, T); /* rows past tlim are not read */
        uint2 xn[CONV_RUN_GB], dn[CONV_RUN_GB]; /* the next group's input and output-gradient rows */
        int dpn[CONV_RUN_GB];
        auto load_group = [&](int tg) {
#pragma unroll
            for (int g = 0; g < CONV_RUN_GB; g++)
                if (tg + g < tlim) {
                    xn[g] = conv_raw4(inp + (int64_t)(tg + g) * ldi + c, n, vec);
                    dn[g] = conv_raw4(dout + (int64_t)(tg + g) * ldo + c, n, vec);
                    dpn[g] = doc_pos[tg + g];
                }
        };
        load_group(t0);
        for (int tg = t0; tg < tend; tg += CONV_RUN_GB) {
            uint2 xr[CONV_RUN_GB], dr[CONV_RUN_GB];
            int dpg[CONV_RUN_GB];
#pragma unroll
            for (int g = 0; g < CONV_RUN_GB; g++) xr[g] = xn[g], dr[g] = dn[g], dpg[g] = dpn[g];
            if (tg + CONV_RUN_GB < tlim) load_group(tg + CONV_RUN_GB);
#pragma unroll
            for (int g = 0; g < CONV_RUN_GB; g++)
                if (tg + CONV_PF_ROWS + g < tlim) {
                    cuda_prefetch_l2(inp + (int64_t)(tg + CONV_PF_ROWS + g) * ldi + c);
                    cuda_prefetch_l2(dout + (int64_t)(tg + CONV_PF_ROWS + g) * ldo + c);
                }
#pragma unroll
            for (int g = 0; g < CONV_RUN_GB; g++) {
                const int t = tg + g;
                if (t >= tend) break;
                conv_bwd_shift<KC>(duw, dpw); /* du[t] into duw[KC-1] below */
                if (t < T) {
                    float dy[CONV_CV];
                    conv_unpack4(xw[0], xr[g]);
                    conv_unpack4(dy, dr[g]);
                    conv_bwd_token<KC>(duw, dpw, dw, wr, xw, dy, dpg[g], t, t1, err);
                    conv_window_shift<KC>(xw);
                }
                conv_bwd_input_row<KC>(dinp + (int64_t)(t - (KC - 1)) * ldi + c, dhalo, duw, dpw, wr, t, t0, t1, C,
                                       c, n, vec);
            }
        }
    }
    conv_run_dw_partials<KC>(part, sh, dw, C);
}

/* ---- the GDN conv and split fused (backend.h gdn_conv_split_*) ----------------------------------------
 * The run kernels' walk (KC = 4) over proj's [q|k|v] channels with gdn_split done on each row in registers,
 * so the conv output (forward) and its gradient (backward) never reach memory. A warp's 32 lanes hold 128
 * consecutive channels of one token, and the q|k part (2 nk dk channels, a multiple of 128 for dk = 64, 128)
 * ends on a warp boundary: a warp is all q|k or all v (the branch is uniform per warp), and a q or k head is
 * HL = dk/4 lanes of one warp, so its sum of squares (forward) or dot (dqk . y) (backward) is a butterfly
 * over those lanes, in a fixed order; the forward does a group's CONV_RUN_G rows' sums as interleaved
 * butterflies (conv_head_sums), the backward its CONV_SPLIT_GB rows' dots, so the rows' shuffle chains overlap.
 * Both keep the conv input window in fp32, each row unpacked once as it enters (bit ops on the bf16 pairs), and
 * make a group's row addresses once from its 32-bit row index. A group whose tokens lie inside the run, with every
 * tap inside its document (doc_pos >= KC-1 along the windows) and 8-byte rows, takes the FULL instance of its group
 * code: the same operations without the per-token tests, their branches and predicates; the backward walks blocks
 * of KC tokens (two groups) unrolled, so its window shifts are register renames. Blocks past the conv's along x
 * copy z for the same rows (forward: proj's z columns into z; backward: dz into dproj's z columns). The conv output
 * and its gradient are rounded to bf16 where the unfused pair stored them, so the values are those of conv1d_silu_*
 * and gdn_split_* up to the order of a head's sum; dw and dhalo are the run backward's, bitwise, for that gradient. */

__device__ __forceinline__ float conv_bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/* the n <= CONV_CV bf16 of u at p (one 8-byte store when `vec`) */
__device__ __forceinline__ void conv_put4(bf16 *p, uint2 u, int n, bool vec) {
    if (vec && n == CONV_CV) {
        *reinterpret_cast<uint2 *>(p) = u;
        return;
    }
    const bf16 *h = reinterpret_cast<const bf16 *>(&u);
#pragma unroll
    for (int i = 0; i < CONV_CV; i++)
        if (i < n) p[i] = h[i];
}

/* dst rows [t0, t1) = src rows, n <= CONV_CV columns: a group of CONV_SPLIT_ZG rows loaded before any store */
__device__ __forceinline__ void conv_copy_rows(bf16 *dst, int ldd, const bf16 *src, int lds, int t0, int t1, int n,
                                               bool vec) {
    for (int tg = t0; tg < t1; tg += CONV_SPLIT_ZG) {
        uint2 r[CONV_SPLIT_ZG];
#pragma unroll
        for (int g = 0; g < CONV_SPLIT_ZG; g++)
            if (tg + g < t1) r[g] = conv_raw4(src + (int64_t)(tg + g) * lds, n, vec);
#pragma unroll
        for (int g = 0; g < CONV_SPLIT_ZG; g++)
            if (tg + g < t1) conv_put4(dst + (int64_t)(tg + g) * ldd, r[g], n, vec);
    }
}

/* each v[r] of v[0..R) summed over the HL lanes of its head (aligned groups of HL lanes of the warp) by a
 * butterfly, the R butterflies interleaved (R independent shuffle chains: each step's R shuffles are in flight
 * together); every v[r] gets the same additions in the same order as a butterfly of its own */
template <int HL, int R>
__device__ __forceinline__ void conv_head_sums(float v[R]) {
#pragma unroll
    for (int o = HL / 2; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < R; r++) v[r] += __shfl_xor_sync(0xffffffffu, v[r], o);
}

/* the forward's group [tg, tg + CONV_RUN_G) (xr: its input rows in, its conv + SiLU rows out; dpg its doc_pos): the
 * group's conv + SiLU rows first, rounded to bf16 and kept packed (xr's registers), with their sums of squares;
 * then the group's head sums as one butterfly of CONV_RUN_G independent chains; then the stores. No branch between
 * the rows: the shuffle chains of the rows overlap rather than run one after another. Rows past t1 or with
 * doc_pos < 0 are computed (a warp's branches are uniform) but not stored. FULL: the caller knows the rows lie
 * before t1, every doc_pos >= KC-1 (every tap inside the document) and 8-byte rows: the same operations without the
 * tests. */
template <int KC, int HL, bool FULL>
__device__ __forceinline__ void conv_split_fwd_group(bf16 *out /* (T,ldo) */, int ldo, float *rs_out /* (T,nqk) */,
                                                     int nqk, float xw[KC][CONV_CV], const float wr[CONV_CV][KC],
                                                     uint2 xr[CONV_RUN_G], const int dpg[CONV_RUN_G], int tg, int t1,
                                                     int c, int n, bool is_qk, bool vec, int *err) {
    constexpr int DK = HL * CONV_CV;
    float ss[CONV_RUN_G];
#pragma unroll
    for (int g = 0; g < CONV_RUN_G; g++) {
        conv_unpack4(xw[0], xr[g]);
        float u[CONV_CV];
        conv_run_preact<KC>(u, xw, wr, FULL ? KC - 1 : min(KC - 1, dpg[g]));
        __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&xr[g]);
        h[0] = __floats2bfloat162_rn(u[0] * conv_sigmoid(u[0]), u[1] * conv_sigmoid(u[1]));
        h[1] = __floats2bfloat162_rn(u[2] * conv_sigmoid(u[2]), u[3] * conv_sigmoid(u[3]));
        conv_unpack4(u, xr[g]);
        ss[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < CONV_CV; i++) ss[g] += u[i] * u[i];
        conv_window_shift<KC>(xw);
    }
    if (is_qk) {
        conv_head_sums<HL, CONV_RUN_G>(ss);
#pragma unroll
        for (int g = 0; g < CONV_RUN_G; g++) ss[g] = 1.0f / sqrtf(ss[g] + L2NORM_EPS); /* the rows' rstd */
    }
#pragma unroll
    for (int g = 0; g < CONV_RUN_G; g++) {
        const int t = tg + g;
        if (!FULL && t >= t1) break;
        const int dp = dpg[g]; /* the same for the warp's lanes: its branches are uniform */
        if (!FULL && dp < 0) cuda_raise(err, CUDA_ERR_DOC_POS, t, dp);
        else if (is_qk) {
            const float rs = ss[g];
            if (c % DK == 0) rs_out[(int64_t)t * nqk] = rs;
            float u[CONV_CV];
            conv_unpack4(u, xr[g]);
#pragma unroll
            for (int i = 0; i < CONV_CV; i++) u[i] *= rs;
            conv_store4(out + (int64_t)t * ldo, u, FULL ? CONV_CV : n, FULL || vec);
        } else conv_put4(out + (int64_t)t * ldo, xr[g], FULL ? CONV_CV : n, FULL || vec);
    }
}

/* rows [t0, t0 + run) of CONV_CV channels per thread: conv + SiLU (rounded to bf16), then q|k lanes the L2
 * norm of their head into qk and rstd, v lanes the copy into v; blocks x >= nbc copy z */
template <int KC, int HL>
__global__ void __launch_bounds__(CONV_RUN_LANES *CONV_RUN_ROWS, 3) conv_split_forward_kernel(
    bf16 *qk /* (T,Kd2) */, float *rstd /* (T,Kd2/dk) */, bf16 *v /* (T,Vd) */, bf16 *z /* (T,Vd) */,
    const bf16 *proj /* (T,ldp) [q|k|v|z] */, const bf16 *halo /* (KC-1,Kd2+Vd) or NULL */,
    const bf16 *w /* (Kd2+Vd,KC) */, const int32_t *doc_pos /* (T) */, int T, int run, int Kd2, int Vd,
    int ldp, unsigned nbc, int *err, bool vec) {
    constexpr int DK = HL * CONV_CV;
    const int C = Kd2 + Vd, nqk = Kd2 / DK;
    const int t0 = (blockIdx.y * CONV_RUN_ROWS + threadIdx.y) * run; /* T < 2^31 (the host checks) */
    if (t0 >= T) return;
    const int t1 = min(T, t0 + run);
    if (blockIdx.x >= nbc) { /* z */
        const int c = ((blockIdx.x - nbc) * CONV_RUN_LANES + threadIdx.x) * CONV_CV;
        if (c < Vd) conv_copy_rows(z + c, Vd, proj + C + c, ldp, t0, t1, min(CONV_CV, Vd - c), vec);
        return;
    }
    const int c = (blockIdx.x * CONV_RUN_LANES + threadIdx.x) * CONV_CV;
    if (c >= C) return; /* v lanes only: a q|k warp is whole */
    const int n = min(CONV_CV, C - c);
    const bool is_qk = c < Kd2; /* uniform per warp */
    bf16 *out = is_qk ? qk + c : v + (c - Kd2); /* the lane's output columns */
    const int ldo = is_qk ? Kd2 : Vd;
    float *rs_out = rstd + c / DK; /* its head's rstd (q|k lanes) */
    float wr[CONV_CV][KC], xw[KC][CONV_CV]; /* xw[b] = x(t-b), each row unpacked once */
    conv_run_weights<KC>(wr, w, c, n);
#pragma unroll
    for (int b = 1; b < KC; b++) conv_row4<KC>(xw[b], proj, halo, t0 - b, c, n, C, ldp, vec);
    uint2 xn[CONV_RUN_G]; /* the next group's rows, in flight while this group computes */
    int dpn[CONV_RUN_G];
#pragma unroll
    for (int g = 0; g < CONV_RUN_G; g++) xn[g] = make_uint2(0, 0), dpn[g] = -1; /* rows past t1: never stored */
    /* the group's rows before t1: one address from the 32-bit row index, rows at + g ldp; the 8-byte case once */
    auto load_group = [&](int tg) {
        const bf16 *px = proj + (int64_t)tg * ldp + c;
        auto rows = [&](int nr, bool vr) {
#pragma unroll
            for (int g = 0; g < CONV_RUN_G; g++)
                if (tg + g < t1) xn[g] = conv_raw4(px + g * ldp, nr, vr), dpn[g] = doc_pos[tg + g];
        };
        if (vec && n == CONV_CV) rows(CONV_CV, true); else rows(n, vec);
    };
    load_group(t0);
    for (int tg = t0; tg < t1; tg += CONV_RUN_G) {
        uint2 xr[CONV_RUN_G];
        int dpg[CONV_RUN_G];
#pragma unroll
        for (int g = 0; g < CONV_RUN_G; g++) xr[g] = xn[g], dpg[g] = dpn[g];
        if (tg + CONV_RUN_G < t1) load_group(tg + CONV_RUN_G);
#pragma unroll
        for (int g = 0; g < CONV_RUN_G; g++)
            if (tg + CONV_PF_ROWS + g < t1) cuda_prefetch_l2(proj + (int64_t)(tg + CONV_PF_ROWS + g) * ldp + c);
        int dpmin = dpg[0];
#pragma unroll
        for (int g = 1; g < CONV_RUN_G; g++) dpmin = min(dpmin, dpg[g]);
        if (vec && tg + CONV_RUN_G <= t1 && dpmin >= KC - 1)
            conv_split_fwd_group<KC, HL, true>(out, ldo, rs_out, nqk, xw, wr, xr, dpg, tg, t1, c, n, is_qk, vec, err);
        else
            conv_split_fwd_group<KC, HL, false>(out, ldo, rs_out, nqk, xw, wr, xr, dpg, tg, t1, c, n, is_qk, vec, err);
    }
}

/* the backward's tokens [tg, tg + CONV_SPLIT_GB) as the run backward walks them (xr their input rows, dr their
 * dconv rows, dpg their doc_pos), the window xw shifted with every token (a token past T shifts in a row no later
 * token reads, so both instances keep one register layout); the rows s = t - (KC-1) they complete go to dproj
 * (the address of row tg - (KC-1) made once) or dhalo. FULL: the caller knows the tokens lie in the run's own
 * rows past its first KC-1, every token of their windows has doc_pos >= KC-1 and the rows are 8-byte vectors:
 * the same operations without the tests. */
template <int KC, bool FULL>
__device__ __forceinline__ void conv_split_bwd_group(bf16 *dproj /* (T,ldp) */, int ldp, bf16 *dhalo /* (KC-1,C) */,
                                                     float duw[KC][CONV_CV], int dpw[KC], float dw[CONV_CV][KC],
                                                     float xw[KC][CONV_CV], const float wr[CONV_CV][KC],
                                                     const uint2 xr[CONV_SPLIT_GB], const uint2 dr[CONV_SPLIT_GB],
                                                     const int dpg[CONV_SPLIT_GB], int tg, int t0, int t1, int tend,
                                                     int T, int C, int c, int n, bool vec, int *err) {
    bf16 *drow = dproj + (int64_t)(tg - (KC - 1)) * ldp + c; /* row tg - (KC-1), used where it is >= 0 */
#pragma unroll
    for (int g = 0; g < CONV_SPLIT_GB; g++) {
        const int t = tg + g;
        if (!FULL && t >= tend) break;
        conv_bwd_shift<KC>(duw, dpw); /* du[t] into duw[KC-1] below */
        float dy[CONV_CV];
        conv_unpack4(dy, dr[g]);
        conv_unpack4(xw[0], xr[g]);
        if (FULL || t < T) conv_bwd_token<KC, FULL>(duw, dpw, dw, wr, xw, dy, dpg[g], t, t1, err);
        conv_window_shift<KC>(xw);
        conv_bwd_input_row<KC, FULL>(drow + g * ldp, dhalo, duw, dpw, wr, t, t0, t1, C, c, n, vec);
    }
}

/* conv_run_backward_kernel with dout[t] made in registers: q|k lanes the L2 norm's backward of their head,
 * rstd (dqk - (dqk . y) y) rounded to bf16, v lanes dv; blocks x >= nbc copy dz into dproj's z columns */
template <int KC, int HL>
__global__ void __launch_bounds__(CONV_RUN_LANES *CONV_RUN_ROWS, 2) conv_split_backward_kernel(
    bf16 *dproj /* (T,ldp) [q|k|v|z] = */, bf16 *dhalo /* (KC-1,C) = or NULL */, float *part /* (gridDim.y, C*KC) */,
    const bf16 *dqk /* (T,Kd2) */, const bf16 *qk /* (T,Kd2) */, const float *rstd /* (T,Kd2/dk) */,
    const bf16 *dv /* (T,Vd) */, const bf16 *dz /* (T,Vd) */, const bf16 *proj /* (T,ldp) */,
    const bf16 *halo /* (KC-1,C) or NULL */, const bf16 *w /* (C,KC) */, const int32_t *doc_pos /* (T) */, int T,
    int run, int Kd2, int Vd, int ldp, unsigned nbc, int *err, bool vec) {
    constexpr int DK = HL * CONV_CV;
    __shared__ float sh[CONV_RUN_ROWS][CONV_RUN_LANES][CONV_CV * KC + 1];
    const int C = Kd2 + Vd, nqk = Kd2 / DK;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int t0 = (blockIdx.y * CONV_RUN_ROWS + ty) * run; /* T < 2^31 (the host checks) */
    if (blockIdx.x >= nbc) { /* dz: the whole block returns here */
        const int c = ((blockIdx.x - nbc) * CONV_RUN_LANES + tx) * CONV_CV;
        if (c < Vd && t0 < T)
            conv_copy_rows(dproj + C + c, ldp, dz + c, Vd, t0, min(T, t0 + run), min(CONV_CV, Vd - c), vec);
        return;
    }
    const int c = (blockIdx.x * CONV_RUN_LANES + tx) * CONV_CV;
    const int n = c < C ? min(CONV_CV, C - c) : 0;
    const bool is_qk = c < Kd2; /* uniform per warp */
    /* the lane's gradient columns (dqk or dv), its y columns and its head's rstd (q|k lanes) */
    const bf16 *gsrc = is_qk ? dqk + c : dv + (c - Kd2), *ysrc = qk + c;
    const int ldg = is_qk ? Kd2 : Vd;
    const float *rsrc = rstd + c / DK;
    float dw[CONV_CV][KC];
#pragma unroll
    for (int i = 0; i < CONV_CV; i++)
#pragma unroll
        for (int j = 0; j < KC; j++) dw[i][j] = 0.0f;
    if (n > 0 && t0 < T) {
        const int t1 = min(T, t0 + run);
        float wr[CONV_CV][KC], duw[KC][CONV_CV]; /* duw[b] = du[s+b], s = t-(KC-1) */
        float xw[KC][CONV_CV]; /* xw[b] = x(t-b), each row unpacked once */
        int dpw[KC];           /* doc_pos of the tokens of duw; -1: none */
        conv_run_weights<KC>(wr, w, c, n);
#pragma unroll
        for (int b = 1; b < KC; b++) conv_row4<KC>(xw[b], proj, halo, t0 - b, c, n, C, ldp, vec);
#pragma unroll
        for (int b = 0; b < KC; b++) {
            dpw[b] = -1;
#pragma unroll
            for (int i = 0; i < CONV_CV; i++) duw[b][i] = 0.0f;
        }
        const int tend = t1 + KC - 1, tlim = min(tend, T); /* rows past tlim are not read */
        /* the next group's input rows, dqk (or dv) and y rows, rstd */
        uint2 xn[CONV_SPLIT_GB], gn[CONV_SPLIT_GB], yn[CONV_SPLIT_GB];
        float rn[CONV_SPLIT_GB];
        int dpn[CONV_SPLIT_GB];
#pragma unroll
        for (int g = 0; g < CONV_SPLIT_GB; g++)
            xn[g] = gn[g] = yn[g] = make_uint2(0, 0), rn[g] = 0.0f, dpn[g] = -1;
        /* the group's rows before tlim as in the forward: one address per stream, rows at + g ld */
        auto load_group = [&](int tg) {
            const bf16 *px = proj + (int64_t)tg * ldp + c, *pg = gsrc + (int64_t)tg * ldg,
                       *py = ysrc + (int64_t)tg * Kd2;
            const float *pr = rsrc + (int64_t)tg * nqk;
            auto rows = [&](int nr, bool vr) {
#pragma unroll
                for (int g = 0; g < CONV_SPLIT_GB; g++)
                    if (tg + g < tlim) {
                        xn[g] = conv_raw4(px + g * ldp, nr, vr);
                        gn[g] = conv_raw4(pg + g * ldg, nr, vr);
                        if (is_qk) yn[g] = conv_raw4(py + g * Kd2, CONV_CV, vr), rn[g] = pr[g * nqk];
                        dpn[g] = doc_pos[tg + g];
                    }
            };
            if (vec && n == CONV_CV) rows(CONV_CV, true); else rows(n, vec);
        };
        load_group(t0);
        /* blocks of KC tokens, each CONV_SPLIT_BLOCK groups unrolled: the window shifts are register renames */
        for (int tb = t0; tb < tend; tb += KC) {
#pragma unroll
            for (int h = 0; h < CONV_SPLIT_BLOCK; h++) {
                const int tg = tb + h * CONV_SPLIT_GB;
                if (tg >= tend) break;
                /* this group's dout rows made first (the loads behind them die before the next group's are
                 * issued): dconv = rstd (dqk - (dqk . y) y) rounded to bf16 as gdn_split_backward stores it, or dv.
                 * Rows past T give values no one reads; the head sums run uniformly per warp all the same. */
                uint2 xr[CONV_SPLIT_GB], dr[CONV_SPLIT_GB];
                int dpg[CONV_SPLIT_GB];
#pragma unroll
                for (int g = 0; g < CONV_SPLIT_GB; g++) xr[g] = xn[g], dpg[g] = dpn[g], dr[g] = gn[g];
                if (is_qk) { /* the group's dots (dqk . y) as CONV_SPLIT_GB interleaved butterflies */
                    float dot[CONV_SPLIT_GB], gv[CONV_SPLIT_GB][CONV_CV], y[CONV_SPLIT_GB][CONV_CV];
#pragma unroll
                    for (int g = 0; g < CONV_SPLIT_GB; g++) {
                        conv_unpack4(gv[g], gn[g]);
                        conv_unpack4(y[g], yn[g]);
                        dot[g] = 0.0f;
#pragma unroll
                        for (int i = 0; i < CONV_CV; i++) dot[g] += gv[g][i] * y[g][i];
                    }
                    conv_head_sums<HL, CONV_SPLIT_GB>(dot);
#pragma unroll
                    for (int g = 0; g < CONV_SPLIT_GB; g++) {
#pragma unroll
                        for (int i = 0; i < CONV_CV; i++) gv[g][i] = rn[g] * (gv[g][i] - dot[g] * y[g][i]);
                        __nv_bfloat162 *hp = reinterpret_cast<__nv_bfloat162 *>(&dr[g]);
                        hp[0] = __floats2bfloat162_rn(gv[g][0], gv[g][1]);
                        hp[1] = __floats2bfloat162_rn(gv[g][2], gv[g][3]);
                    }
                }
                if (tg + CONV_SPLIT_GB < tlim) load_group(tg + CONV_SPLIT_GB);
#pragma unroll
                for (int g = 0; g < CONV_SPLIT_GB; g++)
                    if (tg + CONV_PF_ROWS + g < tlim) {
                        const int t = tg + CONV_PF_ROWS + g;
                        cuda_prefetch_l2(proj + (int64_t)t * ldp + c);
                        cuda_prefetch_l2(gsrc + (int64_t)t * ldg);
                        if (is_qk) cuda_prefetch_l2(ysrc + (int64_t)t * Kd2);
                    }
                /* The group's tokens inside the run's own rows, past its first KC-1, with every token of their
                 * windows at doc_pos >= KC-1: every test below is known to pass (the common case), else each
                 * token as the run backward walks it. Both shift the windows the same way (a token past T
                 * shifts in a row no later token reads), so the unrolled block keeps one register layout. */
                int dpmin = dpg[0];
#pragma unroll
                for (int g = 1; g < CONV_SPLIT_GB; g++) dpmin = min(dpmin, dpg[g]);
#pragma unroll
                for (int b = 1; b < KC; b++) dpmin = min(dpmin, dpw[b]);
                if (vec && tg >= t0 + KC - 1 && tg + CONV_SPLIT_GB <= t1 && dpmin >= KC - 1)
                    conv_split_bwd_group<KC, true>(dproj, ldp, dhalo, duw, dpw, dw, xw, wr, xr, dr, dpg, tg, t0, t1,
                                                   tend, T, C, c, n, vec, err);
                else
                    conv_split_bwd_group<KC, false>(dproj, ldp, dhalo, duw, dpw, dw, xw, wr, xr, dr, dpg, tg, t0, t1,
                                                    tend, T, C, c, n, vec, err);
            }
        }
    }
    conv_run_dw_partials<KC>(part, sh, dw, C);
}

extern "C" void cuda_conv1d_silu_forward(void *out, const void *inp, const void *halo, const void *w,
                                         const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo) {
    conv_check_sizes(T, C, Kc, ldi, ldo);
    if (!T) return;
    const bool vec = cuda_vec_ok(out, C, ldo) && cuda_vec_ok(inp, C, ldi) && cuda_vec_ok(halo, C, C);
    if (Kc == CONV_RUN_KC) {
        const bool v4 = conv_vec4_ok(out, C, ldo) && conv_vec4_ok(inp, C, ldi) && conv_vec4_ok(halo, C, C);
        const int64_t gy = cuda_ceil_div(T, (int64_t)CONV_RUN_ROWS * CONV_RUN_FWD);
        RS_CHECK(gy <= 65535, "conv1d_silu_forward: T = %lld exceeds the run kernel's grid (65535 blocks of %d rows)",
                 (long long)T, CONV_RUN_ROWS * CONV_RUN_FWD);
        const dim3 grid((unsigned)cuda_ceil_div(cuda_ceil_div(C, CONV_CV), CONV_RUN_LANES), (unsigned)gy);
        conv_run_forward_kernel<CONV_RUN_KC><<<grid, dim3(CONV_RUN_LANES, CONV_RUN_ROWS), 0, cuda_stream()>>>(
            (bf16 *)out, (const bf16 *)inp, (const bf16 *)halo, (const bf16 *)w, doc_pos, T, CONV_RUN_FWD, C, ldi, ldo,
            cuda_error_word(), v4);
        CUDA_LAUNCH_CHECK();
        return;
    }
    conv_forward_kernel<<<(unsigned)cuda_ceil_div(T * cuda_ceil_div(C, CUDA_VEC), CONV_THREADS), CONV_THREADS, 0,
                          cuda_stream()>>>((bf16 *)out, (const bf16 *)inp, (const bf16 *)halo, (const bf16 *)w, doc_pos,
                                           T, C, Kc, ldi, ldo, cuda_error_word(), vec);
    CUDA_LAUNCH_CHECK();
}

/* the run backward's blocks along T (its grid's y) and tokens per run (*run): as many blocks as CONV_PART_BYTES of
 * partials allow, at most CUDA_MAX_PARTIALS, at least CONV_RUN_BWD_MIN tokens per run; a function of T, C and Kc
 * only, so the dw partials sum in the same order every call. `what` names the entry in the 32-bit index check. */
static int64_t conv_run_backward_grid(int64_t *run, int64_t T, int C, int Kc, const char *what) {
    int64_t gy = (int64_t)CONV_PART_BYTES / ((int64_t)C * Kc * (int64_t)sizeof(float));
    gy = gy < 1 ? 1 : gy > CUDA_MAX_PARTIALS ? CUDA_MAX_PARTIALS : gy;
    const int64_t gy_min_run = cuda_ceil_div(T, (int64_t)CONV_RUN_ROWS * CONV_RUN_BWD_MIN);
    if (gy > gy_min_run) gy = gy_min_run;
    *run = cuda_ceil_div(T, gy * CONV_RUN_ROWS);
    gy = cuda_ceil_div(T, *run * CONV_RUN_ROWS);
    RS_CHECK(gy <= 65535 && gy * CONV_RUN_ROWS * *run + CONV_RUN_KC <= INT32_MAX,
             "%s: T = %lld exceeds the run kernel's 32-bit token indices", what, (long long)T);
    return gy;
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
    if (Kc == CONV_RUN_KC && T > 0) {
        const bool v4 = conv_vec4_ok(dinp, C, ldi) && conv_vec4_ok(dhalo, C, C) && conv_vec4_ok(dout, C, ldo) &&
                        conv_vec4_ok(inp, C, ldi) && conv_vec4_ok(halo, C, C);
        int64_t run = 0;
        const int64_t gy = conv_run_backward_grid(&run, T, C, Kc, "conv1d_silu_backward");
        float *part = (float *)cuda_scratch((size_t)gy * C * Kc * sizeof(float), "conv1d_silu_backward");
        const dim3 grid((unsigned)cuda_ceil_div(cuda_ceil_div(C, CONV_CV), CONV_RUN_LANES), (unsigned)gy);
        conv_run_backward_kernel<CONV_RUN_KC><<<grid, dim3(CONV_RUN_LANES, CONV_RUN_ROWS), 0, cuda_stream()>>>(
            (bf16 *)dinp, (bf16 *)dhalo, part, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)halo,
            (const bf16 *)w, doc_pos, (int)T, (int)run, C, ldi, ldo, cuda_error_word(), v4);
        CUDA_LAUNCH_CHECK();
        cuda_partials_add(dw, part, (int)gy, (int64_t)C * Kc);
        return;
    }
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

/* the fused GDN conv + split's sizes: Kc = 4 (the run kernels'), dk = 64 or 128 (a head within one warp) */
static void conv_split_check(int64_t T, int nk, int dk, int Vd, int Kc, int ldp) {
    RS_CHECK(T >= 0 && nk > 0 && Vd > 0, "gdn_conv_split: T %lld nk %d Vd %d", (long long)T, nk, Vd);
    RS_CHECK(Kc == CONV_RUN_KC, "gdn_conv_split: Kc = %d (the cuda kernel is built for %d)", Kc, CONV_RUN_KC);
    RS_CHECK(dk == 64 || dk == 128, "gdn_conv_split: dk = %d (the cuda kernel supports 64, 128)", dk);
    RS_CHECK(ldp >= 2 * nk * dk + 2 * Vd, "gdn_conv_split: ldp = %d, need >= Cc + Vd = %d", ldp, 2 * nk * dk + 2 * Vd);
}

extern "C" void cuda_gdn_conv_split_forward(void *qk, float *qk_rstd, void *v, void *z, const void *proj,
                                            const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int nk,
                                            int dk, int Vd, int Kc, int ldp) {
    conv_split_check(T, nk, dk, Vd, Kc, ldp);
    if (!T) return;
    const int Kd2 = 2 * nk * dk, C = Kd2 + Vd;
    const bool v4 = conv_vec4_ok(qk, Kd2, Kd2) && conv_vec4_ok(v, Vd, Vd) && conv_vec4_ok(z, Vd, Vd) &&
                    conv_vec4_ok(proj, C + Vd, ldp) && conv_vec4_ok(halo, C, C);
    const int64_t gy = cuda_ceil_div(T, (int64_t)CONV_RUN_ROWS * CONV_RUN_FWD);
    RS_CHECK(gy <= 65535, "gdn_conv_split_forward: T = %lld exceeds the run kernel's grid (65535 blocks of %d rows; "
                          "its token indices are 32-bit)",
             (long long)T, CONV_RUN_ROWS * CONV_RUN_FWD);
    const unsigned nbc = (unsigned)cuda_ceil_div(cuda_ceil_div(C, CONV_CV), CONV_RUN_LANES);
    const unsigned nbz = (unsigned)cuda_ceil_div(cuda_ceil_div(Vd, CONV_CV), CONV_RUN_LANES);
    const dim3 grid(nbc + nbz, (unsigned)gy), block(CONV_RUN_LANES, CONV_RUN_ROWS);
#define CONV_SPLIT_FWD(HL)                                                                                           \
    conv_split_forward_kernel<CONV_RUN_KC, HL><<<grid, block, 0, cuda_stream()>>>(                                  \
        (bf16 *)qk, qk_rstd, (bf16 *)v, (bf16 *)z, (const bf16 *)proj, (const bf16 *)halo, (const bf16 *)w, doc_pos, \
        (int)T, CONV_RUN_FWD, Kd2, Vd, ldp, nbc, cuda_error_word(), v4)
    if (dk == 128) CONV_SPLIT_FWD(32);
    else CONV_SPLIT_FWD(16);
#undef CONV_SPLIT_FWD
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_gdn_conv_split_backward(void *dproj, void *dhalo, float *dw, const void *dqk, const void *qk,
                                             const float *qk_rstd, const void *dv, const void *dz, const void *proj,
                                             const void *halo, const void *w, const int32_t *doc_pos, int64_t T,
                                             int nk, int dk, int Vd, int Kc, int ldp) {
    conv_split_check(T, nk, dk, Vd, Kc, ldp);
    if (!T) return; /* no token reads the halo rows: their gradient is not asked of an empty call */
    const int Kd2 = 2 * nk * dk, C = Kd2 + Vd;
    const bool v4 = conv_vec4_ok(dproj, C + Vd, ldp) && conv_vec4_ok(dhalo, C, C) && conv_vec4_ok(dqk, Kd2, Kd2) &&
                    conv_vec4_ok(qk, Kd2, Kd2) && conv_vec4_ok(dv, Vd, Vd) && conv_vec4_ok(dz, Vd, Vd) &&
                    conv_vec4_ok(proj, C + Vd, ldp) && conv_vec4_ok(halo, C, C);
    int64_t run = 0;
    const int64_t gy = conv_run_backward_grid(&run, T, C, Kc, "gdn_conv_split_backward");
    float *part = (float *)cuda_scratch((size_t)gy * C * Kc * sizeof(float), "gdn_conv_split_backward");
    const unsigned nbc = (unsigned)cuda_ceil_div(cuda_ceil_div(C, CONV_CV), CONV_RUN_LANES);
    const unsigned nbz = (unsigned)cuda_ceil_div(cuda_ceil_div(Vd, CONV_CV), CONV_RUN_LANES);
    const dim3 grid(nbc + nbz, (unsigned)gy), block(CONV_RUN_LANES, CONV_RUN_ROWS);
#define CONV_SPLIT_BWD(HL)                                                                                           \
    conv_split_backward_kernel<CONV_RUN_KC, HL><<<grid, block, 0, cuda_stream()>>>(                                 \
        (bf16 *)dproj, (bf16 *)dhalo, part, (const bf16 *)dqk, (const bf16 *)qk, qk_rstd, (const bf16 *)dv,          \
        (const bf16 *)dz, (const bf16 *)proj, (const bf16 *)halo, (const bf16 *)w, doc_pos, (int)T, (int)run, Kd2,   \
        Vd, ldp, nbc, cuda_error_word(), v4)
    if (dk == 128) CONV_SPLIT_BWD(32);
    else CONV_SPLIT_BWD(16);
#undef CONV_SPLIT_BWD
    CUDA_LAUNCH_CHECK();
    cuda_partials_add(dw, part, (int)gy, (int64_t)C * Kc);
}
