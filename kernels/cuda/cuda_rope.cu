/*
 * cuda_rope.cu — partial rotary position embedding on the cuda backend
 * (lib/backend/backend.h: rope_forward, rope_backward; the oracle is
 * kernels/cpu/cpu_rope.c): in place, rotate-half pairing inside the first rd
 * dims of every head, dims [rd, hd) untouched; backward is the inverse
 * rotation of the gradient.
 *
 * Angles in fp32, made accurate at long context. inv_freq_i = theta^(-2i/rd)
 * is computed on the host in double and passed as two floats (hi, lo: hi the
 * nearest float, lo the rest). On the device, with p = (float)pos (exact
 * below 2^24):
 *   a = fl(p hi),  e = fma(p, hi, -a) + p lo       (what rounding took from the angle)
 *   sin(a + e), cos(a + e) from sincosf(a) and the Taylor terms of e to e^3.
 * A plain fp32 angle p inv_freq is off by up to half an ulp of the angle,
 * 0.03 rad at pos 1e6; the compensated one is off by the rounding of the
 * few operations above (~1e-7 rad for |e| < 0.1, i.e. pos < 2^24); the error
 * is measured against float64 by tests/cuda/test_cuda_rope.cu (README there).
 * sincosf reduces large arguments exactly (CUDA's slow path above 1e5), so
 * sin(a) and cos(a) are correct to a few ulp of 1 for every fp32 a.
 *
 * Layout: one thread per (token, pair i), looping over the heads with its
 * (cos, sin) computed once; a warp touches consecutive i of one token.
 *
 * Callers: through backend_cuda (lib/model/model_block.c), tests/cuda/test_cuda_rope.cu.
 */
#include <math.h>

#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_rope.h"

#define ROPE_HALF_MAX 128 /* rd <= 256 */
#define ROPE_THREADS 256

typedef struct {
    float hi[ROPE_HALF_MAX], lo[ROPE_HALF_MAX];
} RopeFreq;

static void rope_freq(RopeFreq *f, int rd, float theta) {
    for (int i = 0; i < rd / 2; i++) {
        double inv = pow((double)theta, -2.0 * i / rd);
        f->hi[i] = (float)inv;
        f->lo[i] = (float)(inv - (double)f->hi[i]);
    }
}

__device__ __forceinline__ void rope_cos_sin(float *c, float *s, int32_t pos, float hi, float lo, bool compensated) {
    const float p = (float)pos;
    const float a = p * hi;
    float sa, ca;
    sincosf(a, &sa, &ca);
    if (!compensated) {
        *c = ca, *s = sa;
        return;
    }
    const float e = fmaf(p, hi, -a) + p * lo;
    const float e2 = 0.5f * e * e, e3 = e * e * e * (1.0f / 6.0f);
    *s = sa * (1.0f - e2) + ca * (e - e3);
    *c = ca * (1.0f - e2) - sa * (e - e3);
}

__global__ void __launch_bounds__(ROPE_THREADS) rope_rotate_kernel(bf16 *x /* (T,ld) nh heads of hd */,
                                                                   const int32_t *pos /* (T) */, int64_t T, int nh,
                                                                   int hd, int half, int ld, RopeFreq f, float dir) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * half) return;
    const int64_t t = idx / half;
    const int i = (int)(idx % half);
    float c, s;
    rope_cos_sin(&c, &s, pos[t], f.hi[i], f.lo[i], true);
    s *= dir;
    bf16 *row = x + t * ld;
    for (int h = 0; h < nh; h++) {
        bf16 *xh = row + (int64_t)h * hd;
        const float x0 = __bfloat162float(xh[i]), x1 = __bfloat162float(xh[i + half]);
        xh[i] = __float2bfloat16_rn(x0 * c - x1 * s);
        xh[i + half] = __float2bfloat16_rn(x1 * c + x0 * s);
    }
}

__global__ void rope_table_kernel(float *cs /* (T,half,2) */, const int32_t *pos, int64_t T, int half, RopeFreq f,
                                  bool compensated) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= T * half) return;
    const int i = (int)(idx % half);
    rope_cos_sin(&cs[2 * idx], &cs[2 * idx + 1], pos[idx / half], f.hi[i], f.lo[i], compensated);
}

static void rope_check(int64_t T, int nh, int hd, int rd, int ld, float theta) {
    RS_CHECK(T >= 0 && nh > 0 && hd > 0, "T %lld nh %d hd %d", (long long)T, nh, hd);
    RS_CHECK(rd >= 0 && rd <= hd && rd % 2 == 0, "rotary dims rd = %d must be even and <= hd = %d", rd, hd);
    RS_CHECK(rd / 2 <= ROPE_HALF_MAX, "rotary dims rd = %d: the cuda kernel supports up to %d", rd, 2 * ROPE_HALF_MAX);
    RS_CHECK(ld >= nh * hd, "ld %d < nh*hd = %d", ld, nh * hd);
    RS_CHECK(theta > 0.0f, "theta = %g", (double)theta);
}

static void rope_rotate(void *x, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta,
                        float dir) {
    rope_check(T, nh, hd, rd, ld, theta);
    const int half = rd / 2;
    if (!T || !half) return;
    RopeFreq f;
    rope_freq(&f, rd, theta);
    rope_rotate_kernel<<<(unsigned)cuda_ceil_div(T * half, ROPE_THREADS), ROPE_THREADS, 0, cuda_stream()>>>(
        (bf16 *)x, pos, T, nh, hd, half, ld, f, dir);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_rope_forward(void *x, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta) {
    rope_rotate(x, pos, T, nh, hd, rd, ld, theta, 1.0f);
}

extern "C" void cuda_rope_backward(void *dx, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld,
                                   float theta) {
    rope_rotate(dx, pos, T, nh, hd, rd, ld, theta, -1.0f);
}

extern "C" void cuda_rope_table(float *cs, const int32_t *pos, int64_t T, int rd, float theta, int compensated) {
    rope_check(T, 1, rd > 0 ? rd : 2, rd, rd > 0 ? rd : 2, theta);
    const int half = rd / 2;
    if (!T || !half) return;
    RopeFreq f;
    rope_freq(&f, rd, theta);
    rope_table_kernel<<<(unsigned)cuda_ceil_div(T * half, ROPE_THREADS), ROPE_THREADS, 0, cuda_stream()>>>(
        cs, pos, T, half, f, compensated != 0);
    CUDA_LAUNCH_CHECK();
}
