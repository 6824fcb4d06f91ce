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
 * (one group in flight at a time left them latency-bound). The walk's constants and steps are in cuda_conv_run.cuh:
 * the GDN layer's conv fused with the split after it (gdn_conv_split_forward/backward) walks the same runs, in
 * cuda_gdn_conv_split.cu.
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
#include "cuda_conv_run.cuh" /* the run walk's constants and steps, shared with cuda_gdn_conv_split.cu */

#define CONV_KC_MAX 16
#define CONV_THREADS 256
#define CONV_DW_ROWS 8 /* blockDim.y of the weight-gradient kernel */
#define CONV_RUN_GB 2  /* CONV_RUN_G of the run backward, whose registers hold twice the rows (inp and dout) */

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
        conv_bwd_start<KC>(wr, xw, duw, dpw, w, inp, halo, t0, c, n, C, ldi, vec);
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
