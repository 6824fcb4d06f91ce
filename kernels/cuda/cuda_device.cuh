/*
 * cuda_device.cuh — device-side helpers the cuda kernels share (C++ only,
 * included by the kernel files of kernels/cuda):
 *   - 16-byte vector access to bf16 rows (8 elements) and fp32 rows (4), with
 *     a scalar path for rows that are not 16-byte aligned (odd widths or
 *     strides, column blocks that start mid-vector). The choice is made once
 *     per launch on the host (cuda_vec_ok) and is uniform inside a kernel.
 *   - the scalar activations of cpu_dense_math.h, written the same way (a
 *     sigmoid that never overflows, softplus linear above 20), so cpu and cuda
 *     compute the same function;
 *   - warp and block sums in a fixed order (butterfly shuffles, then warps in
 *     index order), so every reduction is deterministic run to run;
 *   - the second stage of the deterministic column reductions: per-block
 *     partial sums of a parameter gradient are written to the scratch, and
 *     cuda_partials_add_kernel adds them to the gradient in a fixed order;
 *   - cuda_raise: records a bad input in the device error word (cuda_common.h).
 */
#ifndef RS_CUDA_DEVICE_CUH
#define RS_CUDA_DEVICE_CUH

#include <stdint.h>

#include "cuda_common.h"

#define CUDA_VEC 8              /* bf16 elements per 16-byte vector */
#define CUDA_MAX_PARTIALS 256   /* blocks of a deterministic column reduction, at most */
#define CUDA_WARP 32

/* ---- host side: launch helpers ---- */

static inline int64_t cuda_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Rows of `width` bf16 elements at stride `ld` from `p` can be read as 16-byte vectors. */
static inline bool cuda_vec_ok(const void *p, int64_t width, int64_t ld) {
    return p == NULL || (cuda_ptr_align(p) >= 16 && width % CUDA_VEC == 0 && ld % CUDA_VEC == 0);
}

/* Blocks of a deterministic reduction over `rows` rows: a function of the sizes only (never of the
 * device), so the summation order, and the result, is the same on every run and every GPU. */
static inline int cuda_partial_blocks(int64_t rows, int64_t rows_per_block_min) {
    int64_t b = cuda_ceil_div(rows, rows_per_block_min);
    if (b > CUDA_MAX_PARTIALS) b = CUDA_MAX_PARTIALS;
    return b < 1 ? 1 : (int)b;
}

/* ---- vector access ---- */

/* the 8 bf16 of a 16-byte vector as fp32 (exact); kernels that load several vectors before using the
 * first keep them packed and unpack at the use */
__device__ __forceinline__ void cuda_unpack8(float f[CUDA_VEC], uint4 u) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

__device__ __forceinline__ void cuda_load8(float f[CUDA_VEC], const bf16 *p) {
    cuda_unpack8(f, *reinterpret_cast<const uint4 *>(p));
}

__device__ __forceinline__ void cuda_store8(bf16 *p, const float f[CUDA_VEC]) {
    uint4 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<uint4 *>(p) = u;
}

/* The n <= 8 elements at p (vectorised when `vec`, which implies n == 8 at aligned p); the rest 0. */
__device__ __forceinline__ void cuda_load8n(float f[CUDA_VEC], const bf16 *p, int n, bool vec) {
    if (vec && n == CUDA_VEC) {
        cuda_load8(f, p);
        return;
    }
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) f[i] = i < n ? __bfloat162float(p[i]) : 0.0f;
}

__device__ __forceinline__ void cuda_store8n(bf16 *p, const float f[CUDA_VEC], int n, bool vec) {
    if (vec && n == CUDA_VEC) {
        cuda_store8(p, f);
        return;
    }
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++)
        if (i < n) p[i] = __float2bfloat16_rn(f[i]);
}

/* asks L2 for the line of p (a hint: nothing is loaded into registers), so that a later load of it finds it
 * there; the streaming kernels keep more rows in flight than their registers hold */
__device__ __forceinline__ void cuda_prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* ---- activations (cpu_dense_math.h, on the device) ---- */

__device__ __forceinline__ float cuda_sigmoidf(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}
__device__ __forceinline__ float cuda_sigmoid_gradf(float x) { return cuda_sigmoidf(x) * cuda_sigmoidf(-x); }
__device__ __forceinline__ float cuda_siluf(float x) { return x * cuda_sigmoidf(x); }
__device__ __forceinline__ float cuda_silu_gradf(float x) { return cuda_sigmoidf(x) * (1.0f + x * cuda_sigmoidf(-x)); }
__device__ __forceinline__ float cuda_softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float cuda_softplus_gradf(float x) { return x > 20.0f ? 1.0f : cuda_sigmoidf(x); }
/* the sigmoid of the streaming glue kernels (SwiGLU, the sigmoid and SiLU gates): 1 / (1 + exp(-x)) with
 * the fast intrinsics (ex2.approx, rcp.approx: a few ulp in fp32, far below the bf16 rounding of their
 * outputs; the IEEE expf and division were most of those kernels' instructions). exp(-x) = inf gives 0. */
__device__ __forceinline__ float cuda_sigmoid_fast(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

/* ---- fixed-order reductions ---- */

template <typename F>
__device__ __forceinline__ F cuda_warp_sum(F v) {
#pragma unroll
    for (int o = CUDA_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cuda_warp_max(float v) {
#pragma unroll
    for (int o = CUDA_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * `sh` holds 32 values of F. Ends with a barrier, so `sh` can be reused right after. */
template <typename F>
__device__ F cuda_block_sum(F v, F *sh) {
    const int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP, nw = blockDim.x / CUDA_WARP;
    v = cuda_warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    F t = lane < nw ? sh[lane] : F(0);
    t = cuda_warp_sum(t);
    __syncthreads();
    return t;
}

#define CUDA_PARTIALS_BATCH 16 /* partials a warp loads before adding them (in order) */
#define CUDA_PARTIALS_WARPS 8  /* warps of a stage-2 block: each adds a fixed slice of the partial rows */

/* out[c] += sum_{b < nb} part[b * ncols + c] (stage 2 of a column reduction). A block owns 32 columns
 * (one per lane, 128-byte rows); its warp k adds the rows [k per, (k+1) per), per = ceil(nb / 8), in
 * increasing b, CUDA_PARTIALS_BATCH loads in flight; then the 8 warp sums are added in warp order. The
 * association depends on nb and ncols only: the same bits on every run and GPU. (One thread walking all
 * nb rows of a column left a few hundred columns latency-bound: ~16 rounds of dependent loads.) */
static __global__ void __launch_bounds__(CUDA_WARP *CUDA_PARTIALS_WARPS) cuda_partials_add_kernel(
    float *out /* (ncols) += */, const float *part /* (nb,ncols) */, int nb, int64_t ncols) {
    __shared__ float sh[CUDA_PARTIALS_WARPS][CUDA_WARP];
    const int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP;
    const int64_t c = (int64_t)blockIdx.x * CUDA_WARP + lane;
    const int per = (nb + CUDA_PARTIALS_WARPS - 1) / CUDA_PARTIALS_WARPS;
    const int b1 = min(nb, (warp + 1) * per);
    float s = 0.0f;
    if (c < ncols) {
        int b = warp * per;
        for (; b + CUDA_PARTIALS_BATCH <= b1; b += CUDA_PARTIALS_BATCH) {
            float v[CUDA_PARTIALS_BATCH];
#pragma unroll
            for (int k = 0; k < CUDA_PARTIALS_BATCH; k++) v[k] = part[(int64_t)(b + k) * ncols + c];
#pragma unroll
            for (int k = 0; k < CUDA_PARTIALS_BATCH; k++) s += v[k];
        }
        for (; b < b1; b++) s += part[(int64_t)b * ncols + c];
    }
    sh[warp][lane] = s;
    __syncthreads();
    if (warp == 0 && c < ncols) {
        float t = sh[0][lane];
#pragma unroll
        for (int k = 1; k < CUDA_PARTIALS_WARPS; k++) t += sh[k][lane];
        out[c] += t;
    }
}

static inline void cuda_partials_add(float *out, const float *part, int nb, int64_t ncols) {
    if (ncols == 0) return;
    cuda_partials_add_kernel<<<(unsigned)cuda_ceil_div(ncols, CUDA_WARP), CUDA_WARP * CUDA_PARTIALS_WARPS, 0,
                               cuda_stream()>>>(out, part, nb, ncols);
    CUDA_LAUNCH_CHECK();
}

/* ---- bad inputs ---- */

__device__ __forceinline__ void cuda_raise(int *word, int code, int64_t index, int value) {
    if (atomicCAS(word, 0, code) == 0) {
        word[1] = (int)(uint32_t)((uint64_t)index & 0xffffffffu);
        word[2] = (int)(uint32_t)((uint64_t)index >> 32);
        word[3] = value;
    }
}

#endif
