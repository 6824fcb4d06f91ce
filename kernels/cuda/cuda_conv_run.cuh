/*
 * cuda_conv_run.cuh — what the conv's run kernels share (C++ only): the Kc = CONV_RUN_KC = 4 walk in which one
 * thread owns CONV_CV = 4 channels (8-byte vectors) of a run of consecutive tokens and slides the conv's windows
 * through registers. Holds the walk's constants (block shape, tokens per run, the forward's row group, the L2
 * prefetch distance, the backward's partials budget), the sigmoid, the row loads, unpacks and stores, the window
 * shift and the tap sum, the backward's per-token steps (du into the window, the finished input-gradient row, the
 * block's dw partials) and, for the launchers, the 8-byte check and the backward's grid.
 * Shapes: rows (T,ld) bf16 read at channels c..c+n (n <= CONV_CV), w (C,KC), halo (KC-1,C) before row 0 (NULL =
 * zeros), the windows xw[KC][CONV_CV] (xw[b] = x(t-b)) and duw[KC][CONV_CV] in fp32, dw partials (gridDim.y, C*KC).
 *
 * Callers: cuda_conv.cu (conv1d_silu's run kernels; its general kernels use conv_sigmoid) and cuda_gdn_conv_split.cu
 * (the fused GDN conv + split walks the same runs: the same sums in the same order). The device part also runs
 * under the host emulation of tests/cuda/glue_emu (extract.py cuts it out).
 */
#ifndef RS_CUDA_CONV_RUN_CUH
#define RS_CUDA_CONV_RUN_CUH

#include "cuda_common.h"
#include "cuda_device.cuh"

#define CONV_RUN_KC 4              /* the kernel width the run kernels are built for */
#define CONV_RUN_LANES 32          /* blockDim.x of the run kernels: channel groups of CONV_CV */
#define CONV_RUN_ROWS 8            /* blockDim.y: runs of tokens per block */
#define CONV_CV 4                  /* channels per thread of the run kernels (8-byte vectors) */
#define CONV_RUN_FWD 32            /* tokens per thread, forward */
#define CONV_RUN_BWD_MIN 32        /* tokens per thread of the backward, at least (each run reads KC-1 more) */
#define CONV_PF_ROWS 8              /* rows ahead of the current group that the run kernels prefetch into L2 */
#define CONV_RUN_G 4               /* rows a run thread loads as a group (= CONV_RUN_KC: the unrolled group
                                    * also turns the window shifts into register renames) */
#define CONV_PART_BYTES (8u << 20) /* the backward's per-block weight partials, at most */

/* sigmoid(u) = 1 / (1 + exp(-u)) with the fast intrinsics (ex2.approx, rcp.approx: a few ulp in fp32,
 * far below the bf16 rounding of every output): the IEEE expf and division were half of the
 * kernels' instructions. exp(-u) = inf gives 0, as the IEEE form does. */
__device__ __forceinline__ float conv_sigmoid(float u) { return __fdividef(1.0f, 1.0f + __expf(-u)); }

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

/* the L2 prefetch of src's rows [tg, tg + G) + CONV_PF_ROWS that lie before t1, at channel c; the row test and
 * index in the caller's type I of tg, t1 (int64_t in the run forward, int in the fused conv + split: 32-bit
 * compares and widening multiplies there, as its own loads make them) */
template <int G, typename I>
__device__ __forceinline__ void conv_prefetch_rows(const bf16 *src /* (T,ld) */, int64_t ld, I tg, I t1, int c) {
#pragma unroll
    for (int g = 0; g < G; g++)
        if (tg + CONV_PF_ROWS + g < t1) cuda_prefetch_l2(src + (int64_t)(tg + CONV_PF_ROWS + g) * ld + c);
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

/* ---- the run backward's per-token steps ----
 * Shared by conv_run_backward_kernel (cuda_conv.cu) and conv_split_backward_kernel (cuda_gdn_conv_split.cu): the
 * same operations in the same order in both. A run walks its tokens t in order; duw[b] = du[s+b] and dpw[b] = their
 * doc_pos (-1: none) for s = t - (KC-1), the oldest row whose input gradient is complete at t. */

/* a run's start at t0: its lane's weights, the input window xw[b] = x(t0-b) for b >= 1 (the previous run's rows,
 * or the halo's before row 0), and no du known yet (duw 0, dpw -1) */
template <int KC>
__device__ __forceinline__ void conv_bwd_start(float wr[CONV_CV][KC], float xw[KC][CONV_CV], float duw[KC][CONV_CV],
                                               int dpw[KC], const bf16 *w, const bf16 *inp /* (T,ld) */,
                                               const bf16 *halo /* (KC-1,C) or NULL */, int t0, int c, int n, int C,
                                               int ld, bool vec) {
    conv_run_weights<KC>(wr, w, c, n);
#pragma unroll
    for (int b = 1; b < KC; b++) conv_row4<KC>(xw[b], inp, halo, t0 - b, c, n, C, ld, vec);
#pragma unroll
    for (int b = 0; b < KC; b++) {
        dpw[b] = -1;
#pragma unroll
        for (int i = 0; i < CONV_CV; i++) duw[b][i] = 0.0f;
    }
}

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

/* ---- host: what the launchers of both files check and size the same way ---- */

/* Rows of `width` bf16 at stride `ld` from `p` can be read as 8-byte vectors of CONV_CV */
static inline bool conv_vec4_ok(const void *p, int64_t width, int64_t ld) {
    return p == NULL || (cuda_ptr_align(p) >= 8 && width % CONV_CV == 0 && ld % CONV_CV == 0);
}

/* the run backward's blocks along T (its grid's y) and tokens per run (*run): as many blocks as CONV_PART_BYTES of
 * partials allow, at most CUDA_MAX_PARTIALS, at least CONV_RUN_BWD_MIN tokens per run; a function of T, C and Kc
 * only, so the dw partials sum in the same order every call. `what` names the entry in the 32-bit index check. */
static inline int64_t conv_run_backward_grid(int64_t *run, int64_t T, int C, int Kc, const char *what) {
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

#endif
