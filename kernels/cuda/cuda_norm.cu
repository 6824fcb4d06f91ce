/*
 * cuda_norm.cu — the cuda backend's normalisations other than RMSNorm (cuda_rmsnorm.cu), forward and
 * backward (lib/backend/backend.h: l2norm_*, gated_rmsnorm_*; the math and layouts of
 * kernels/cpu/cpu_norm.c, the oracle):
 *   L2 norm        y = x rstd, rstd = 1/sqrt(sum(x^2) + 1e-6)
 *   gated RMSNorm  y = w (x rstd) silu(z), rows of dv per (token, value head)
 *
 * Row kernels: one warp per row, 8 rows per 256-thread block; a lane reads 8 consecutive bf16 (one 16-byte
 * load) at columns lane*8 + 256k, so rows of any D loop. Statistics and intermediates are fp32, row sums
 * warp butterflies (fixed order); rows not 16-byte aligned take the scalar path of the same loop.
 * Group kernels (L2 norm and gated RMSNorm at dv = 64, 128, 256 on the 16-byte path: the GDN heads): a row
 * is one group of dv/8 lanes, so no lane idles, and each lane keeps its 8-column vector of w and of the
 * dw sums in registers across the rows it walks. Shared helpers: cuda_norm.cuh.
 *
 * Parameter gradients (dw +=) are deterministic, with no float atomics: each block owns a fixed range of
 * rows (the block count depends on the sizes only), sums its warps' (groups') terms in order into its row
 * of partials in the kernel scratch, and cuda_partials_add adds the blocks in a fixed order.
 *
 * Aliasing as on cpu: l2norm_backward may run with dinp == dout (same ld), gated_rmsnorm_backward with
 * dx == dout: a lane reads a column's inputs before it writes it, and the row's dot product is complete
 * first.
 *
 * Callers: through backend_cuda (lib/model/model_block.c, lib/model/model_step.c), tests/cuda/test_cuda_norm.cu.
 */
#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_norm.cuh"

/* ---- L2 norm --------------------------------------------------------------------------------- */

__global__ void __launch_bounds__(256) norm_l2_forward_kernel(bf16 *out /* (T,ldo) */, float *rstd /* (T,nh) */,
                                                              const bf16 *inp /* (T,ldi) */, int64_t rows, int nh,
                                                              int D, int ldi, int ldo, bool vec) {
    const int64_t r = (int64_t)blockIdx.x * NORM_WARPS + threadIdx.x / CUDA_WARP;
    if (r >= rows) return;
    const int lane = threadIdx.x % CUDA_WARP;
    const int64_t t = r / nh;
    const int h = (int)(r % nh);
    const bf16 *x = inp + t * ldi + (int64_t)h * D;
    bf16 *y = out + t * ldo + (int64_t)h * D;
    float ss = 0.0f;
    for (int c = lane * CUDA_VEC; c < D; c += CUDA_WARP * CUDA_VEC) {
        float f[CUDA_VEC];
        cuda_load8n(f, x + c, min(CUDA_VEC, D - c), vec);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) ss += f[i] * f[i];
    }
    const float rs = 1.0f / sqrtf(cuda_warp_sum(ss) + L2NORM_EPS);
    if (lane == 0) rstd[r] = rs;
    for (int c = lane * CUDA_VEC; c < D; c += CUDA_WARP * CUDA_VEC) {
        const int n = min(CUDA_VEC, D - c);
        float f[CUDA_VEC];
        cuda_load8n(f, x + c, n, vec);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) f[i] *= rs;
        cuda_store8n(y + c, f, n, vec);
    }
}

/* dinp = rstd (dout - (dout . y) y) */
__global__ void __launch_bounds__(256) norm_l2_backward_kernel(
    bf16 *dinp /* (T,ldi) = */, const bf16 *dout /* (T,ldo) */, const bf16 *out /* (T,ldo) */,
    const float *rstd /* (T,nh) */, int64_t rows, int nh, int D, int ldi, int ldo, bool vec) {
    const int64_t r = (int64_t)blockIdx.x * NORM_WARPS + threadIdx.x / CUDA_WARP;
    if (r >= rows) return;
    const int lane = threadIdx.x % CUDA_WARP;
    const int64_t t = r / nh;
    const int h = (int)(r % nh);
    const bf16 *dy = dout + t * ldo + (int64_t)h * D, *y = out + t * ldo + (int64_t)h * D;
    bf16 *dx = dinp + t * ldi + (int64_t)h * D;
    float dot = 0.0f;
    for (int c = lane * CUDA_VEC; c < D; c += CUDA_WARP * CUDA_VEC) {
        const int n = min(CUDA_VEC, D - c);
        float g[CUDA_VEC], yv[CUDA_VEC];
        cuda_load8n(g, dy + c, n, vec);
        cuda_load8n(yv, y + c, n, vec);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) dot += g[i] * yv[i];
    }
    dot = cuda_warp_sum(dot);
    const float rs = rstd[r];
    for (int c = lane * CUDA_VEC; c < D; c += CUDA_WARP * CUDA_VEC) {
        const int n = min(CUDA_VEC, D - c);
        float g[CUDA_VEC], yv[CUDA_VEC];
        cuda_load8n(g, dy + c, n, vec);
        cuda_load8n(yv, y + c, n, vec);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) g[i] = rs * (g[i] - dot * yv[i]);
        cuda_store8n(dx + c, g, n, vec);
    }
}

/* ---- L2 norm, group kernels: one row = LPR lanes x 8 columns (D == 8 LPR, 16-byte path) ---- */

template <int LPR>
__global__ void __launch_bounds__(NORM_GROUP_THREADS) norm_l2_group_forward_kernel(
    bf16 *out /* (T,ldo) */, float *rstd /* (T,nh) */, const bf16 *inp /* (T,ldi) */, int64_t rows, int nh, int ldi,
    int ldo) {
    constexpr int D = LPR * CUDA_VEC;
    const int l = threadIdx.x % LPR, c = l * CUDA_VEC;
    const int64_t r = (int64_t)blockIdx.x * (NORM_GROUP_THREADS / LPR) + threadIdx.x / LPR;
    const bool live = r < rows;
    const int64_t rr = live ? r : 0, t = rr / nh;
    const int h = (int)(rr % nh);
    float f[CUDA_VEC];
    cuda_load8(f, inp + t * ldi + (int64_t)h * D + c);
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) ss += f[i] * f[i];
    const float rs = 1.0f / sqrtf(norm_group_sum<LPR>(ss) + L2NORM_EPS);
    if (!live) return;
    if (l == 0) rstd[r] = rs;
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) f[i] *= rs;
    cuda_store8(out + t * ldo + (int64_t)h * D + c, f);
}

template <int LPR>
__global__ void __launch_bounds__(NORM_GROUP_THREADS) norm_l2_group_backward_kernel(
    bf16 *dinp /* (T,ldi) = */, const bf16 *dout /* (T,ldo) */, const bf16 *out /* (T,ldo) */,
    const float *rstd /* (T,nh) */, int64_t rows, int nh, int ldi, int ldo) {
    constexpr int D = LPR * CUDA_VEC;
    const int l = threadIdx.x % LPR, c = l * CUDA_VEC;
    const int64_t r = (int64_t)blockIdx.x * (NORM_GROUP_THREADS / LPR) + threadIdx.x / LPR;
    const bool live = r < rows;
    const int64_t rr = live ? r : 0, t = rr / nh;
    const int h = (int)(rr % nh);
    float g[CUDA_VEC], yv[CUDA_VEC];
    cuda_load8(g, dout + t * ldo + (int64_t)h * D + c);
    cuda_load8(yv, out + t * ldo + (int64_t)h * D + c);
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) dot += g[i] * yv[i];
    dot = norm_group_sum<LPR>(dot);
    if (!live) return;
    const float rs = rstd[r];
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) g[i] = rs * (g[i] - dot * yv[i]);
    cuda_store8(dinp + t * ldi + (int64_t)h * D + c, g);
}

/* launches the group kernel of LPR lanes for D (64, 128, 256); false when D has none */
static bool norm_l2_group(bool backward, bf16 *y_or_dinp, float *rstd_out, const bf16 *x_or_dout, const bf16 *out,
                          const float *rstd, int64_t rows, int nh, int D, int ldi, int ldo) {
    const unsigned blocks = (unsigned)cuda_ceil_div(rows * D / CUDA_VEC, NORM_GROUP_THREADS);
    const cudaStream_t st = cuda_stream();
#define NORM_L2_LAUNCH(LPR)                                                                                        \
    (backward ? norm_l2_group_backward_kernel<LPR><<<blocks, NORM_GROUP_THREADS, 0, st>>>(y_or_dinp, x_or_dout, out, \
                                                                                          rstd, rows, nh, ldi, ldo)  \
              : norm_l2_group_forward_kernel<LPR><<<blocks, NORM_GROUP_THREADS, 0, st>>>(y_or_dinp, rstd_out,        \
                                                                                         x_or_dout, rows, nh, ldi,   \
                                                                                         ldo))
    switch (D) {
    case 64: NORM_L2_LAUNCH(8); break;
    case 128: NORM_L2_LAUNCH(16); break;
    case 256: NORM_L2_LAUNCH(32); break;
    default: return false;
    }
#undef NORM_L2_LAUNCH
    CUDA_LAUNCH_CHECK();
    return true;
}

extern "C" void cuda_l2norm_forward(void *out, float *rstd, const void *inp, int64_t T, int nh, int D, int ldi,
                                    int ldo) {
    RS_CHECK(T >= 0 && nh > 0 && D > 0, "T %lld nh %d D %d", (long long)T, nh, D);
    RS_CHECK(ldi >= nh * D && ldo >= nh * D, "ldi %d ldo %d < nh*D = %d", ldi, ldo, nh * D);
    const int64_t rows = T * nh;
    if (!rows) return;
    const bool vec = D % CUDA_VEC == 0 && cuda_vec_ok(inp, D, ldi) && cuda_vec_ok(out, D, ldo);
    if (vec && norm_l2_group(false, (bf16 *)out, rstd, (const bf16 *)inp, NULL, NULL, rows, nh, D, ldi, ldo)) return;
    norm_l2_forward_kernel<<<norm_rows_blocks(rows), 256, 0, cuda_stream()>>>((bf16 *)out, rstd, (const bf16 *)inp,
                                                                             rows, nh, D, ldi, ldo, vec);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_l2norm_backward(void *dinp, const void *dout, const void *out, const float *rstd, int64_t T,
                                     int nh, int D, int ldi, int ldo) {
    RS_CHECK(T >= 0 && nh > 0 && D > 0, "T %lld nh %d D %d", (long long)T, nh, D);
    RS_CHECK(ldi >= nh * D && ldo >= nh * D, "ldi %d ldo %d < nh*D = %d", ldi, ldo, nh * D);
    const int64_t rows = T * nh;
    if (!rows) return;
    const bool vec = D % CUDA_VEC == 0 && cuda_vec_ok(dinp, D, ldi) && cuda_vec_ok(dout, D, ldo) &&
                     cuda_vec_ok(out, D, ldo);
    if (vec && norm_l2_group(true, (bf16 *)dinp, NULL, (const bf16 *)dout, (const bf16 *)out, rstd, rows, nh, D, ldi,
                             ldo))
        return;
    norm_l2_backward_kernel<<<norm_rows_blocks(rows), 256, 0, cuda_stream()>>>(
        (bf16 *)dinp, (const bf16 *)dout, (const bf16 *)out, rstd, rows, nh, D, ldi, ldo, vec);
    CUDA_LAUNCH_CHECK();
}

/* ---- gated RMSNorm (GDN output) --------------------------------------------------------------- */

__global__ void __launch_bounds__(256) norm_gated_forward_kernel(
    bf16 *out /* (T,nv*dv) */, float *rstd /* (T,nv) */, const bf16 *xs /* (T,nv*dv) */, const bf16 *zs /* (T,ldz) */,
    const bf16 *w /* (dv) */, int64_t rows, int nv, int dv, int ldz, float eps, bool vec) {
    const int64_t r = (int64_t)blockIdx.x * NORM_WARPS + threadIdx.x / CUDA_WARP;
    if (r >= rows) return;
    const int lane = threadIdx.x % CUDA_WARP;
    const int64_t t = r / nv;
    const int h = (int)(r % nv);
    const bf16 *x = xs + r * dv, *z = zs + t * ldz + (int64_t)h * dv;
    bf16 *y = out + r * dv;
    float ss = 0.0f;
    for (int c = lane * CUDA_VEC; c < dv; c += CUDA_WARP * CUDA_VEC) {
        float f[CUDA_VEC];
        cuda_load8n(f, x + c, min(CUDA_VEC, dv - c), vec);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) ss += f[i] * f[i];
    }
    const float rs = 1.0f / sqrtf(cuda_warp_sum(ss) / dv + eps);
    if (lane == 0) rstd[r] = rs;
    for (int c = lane * CUDA_VEC; c < dv; c += CUDA_WARP * CUDA_VEC) {
        const int n = min(CUDA_VEC, dv - c);
        float f[CUDA_VEC], zv[CUDA_VEC], wv[CUDA_VEC];
        cuda_load8n(f, x + c, n, vec);
        cuda_load8n(zv, z + c, n, vec);
        cuda_load8n(wv, w + c, n, vec);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) f[i] = wv[i] * (f[i] * rs) * cuda_siluf(zv[i]);
        cuda_store8n(y + c, f, n, vec);
    }
}

/* n = x rstd: dz = dout w n silu'(z); dw += dout n silu(z); dn = dout w silu(z); dx = rstd (dn - n mean(dn n)) */
__global__ void __launch_bounds__(256) norm_gated_backward_kernel(
    bf16 *dxs /* (T,nv*dv) = */, bf16 *dzs /* (T,ldz) = */, float *part /* (gridDim.x, dv) */,
    const bf16 *dout /* (T,nv*dv) */, const bf16 *xs /* (T,nv*dv) */, const bf16 *zs /* (T,ldz) */,
    const bf16 *w /* (dv) */, const float *rstd /* (T,nv) */, int64_t rows, int64_t rows_per_block, int nv, int dv,
    int ldz, bool vec) {
    extern __shared__ float norm_slices[]; /* (warps, dv) */
    const int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP, nw = blockDim.x / CUDA_WARP;
    float *acc = norm_slices + (int64_t)warp * dv;
    for (int c = lane * CUDA_VEC; c < dv; c += CUDA_WARP * CUDA_VEC)
        for (int i = 0; i < CUDA_VEC && c + i < dv; i++) acc[c + i] = 0.0f;
    const int64_t r0 = (int64_t)blockIdx.x * rows_per_block;
    const int64_t r1 = min(rows, r0 + rows_per_block);
    for (int64_t r = r0 + warp; r < r1; r += nw) {
        const int64_t t = r / nv;
        const int h = (int)(r % nv);
        const bf16 *x = xs + r * dv, *z = zs + t * ldz + (int64_t)h * dv, *dy = dout + r * dv;
        bf16 *dx = dxs + r * dv, *dz = dzs + t * ldz + (int64_t)h * dv;
        const float rs = rstd[r];
        float dot = 0.0f;
        for (int c = lane * CUDA_VEC; c < dv; c += CUDA_WARP * CUDA_VEC) {
            const int n = min(CUDA_VEC, dv - c);
            float xv[CUDA_VEC], zv[CUDA_VEC], g[CUDA_VEC], wv[CUDA_VEC];
            cuda_load8n(xv, x + c, n, vec);
            cuda_load8n(zv, z + c, n, vec);
            cuda_load8n(g, dy + c, n, vec);
            cuda_load8n(wv, w + c, n, vec);
#pragma unroll
            for (int i = 0; i < CUDA_VEC; i++) dot += (g[i] * wv[i] * cuda_siluf(zv[i])) * (xv[i] * rs);
        }
        const float mean_dot = cuda_warp_sum(dot) / dv;
        for (int c = lane * CUDA_VEC; c < dv; c += CUDA_WARP * CUDA_VEC) {
            const int n = min(CUDA_VEC, dv - c);
            float xv[CUDA_VEC], zv[CUDA_VEC], g[CUDA_VEC], wv[CUDA_VEC], dxv[CUDA_VEC], dzv[CUDA_VEC];
            cuda_load8n(xv, x + c, n, vec);
            cuda_load8n(zv, z + c, n, vec);
            cuda_load8n(g, dy + c, n, vec);
            cuda_load8n(wv, w + c, n, vec);
#pragma unroll
            for (int i = 0; i < CUDA_VEC; i++) {
                const float nn = xv[i] * rs, sz = cuda_siluf(zv[i]);
                const float dn = g[i] * wv[i] * sz;
                dzv[i] = g[i] * wv[i] * nn * cuda_silu_gradf(zv[i]);
                dxv[i] = rs * (dn - nn * mean_dot);
                if (c + i < dv) acc[c + i] += g[i] * (nn * sz);
            }
            cuda_store8n(dz + c, dzv, n, vec);
            cuda_store8n(dx + c, dxv, n, vec);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < dv; c += blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < nw; k++) s += norm_slices[(int64_t)k * dv + c];
        part[(int64_t)blockIdx.x * dv + c] = s;
    }
}

/* ---- gated RMSNorm, group kernels: one row = LPR lanes x 8 columns (dv == 8 LPR, 16-byte path) ---- */

template <int LPR>
__global__ void __launch_bounds__(NORM_GROUP_THREADS) norm_gated_group_forward_kernel(
    bf16 *out /* (T,nv*dv) */, float *rstd /* (T,nv) */, const bf16 *xs /* (T,nv*dv) */, const bf16 *zs /* (T,ldz) */,
    const bf16 *w /* (dv) */, int64_t rows, int nv, int ldz, float eps) {
    constexpr int dv = LPR * CUDA_VEC;
    const int l = threadIdx.x % LPR;
    const int64_t r = (int64_t)blockIdx.x * (NORM_GROUP_THREADS / LPR) + threadIdx.x / LPR;
    const bool live = r < rows; /* every lane takes part in the shuffles */
    const int64_t rr = live ? r : 0, t = rr / nv;
    const int h = (int)(rr % nv), c = l * CUDA_VEC;
    float f[CUDA_VEC], zv[CUDA_VEC], wv[CUDA_VEC];
    const uint4 zr = *reinterpret_cast<const uint4 *>(zs + t * ldz + (int64_t)h * dv + c); /* in flight with x */
    cuda_load8(f, xs + rr * dv + c);
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) ss += f[i] * f[i];
    const float rs = 1.0f / sqrtf(norm_group_sum<LPR>(ss) / dv + eps);
    if (!live) return;
    if (l == 0) rstd[r] = rs;
    cuda_unpack8(zv, zr);
    cuda_load8(wv, w + c);
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) f[i] = wv[i] * (f[i] * rs) * (zv[i] * cuda_sigmoid_fast(zv[i]));
    cuda_store8(out + r * dv + c, f);
}

/* the backward of norm_gated_backward_kernel, rows [r0, r1) of the block walked by its groups */
template <int LPR>
__global__ void __launch_bounds__(NORM_GROUP_THREADS) norm_gated_group_backward_kernel(
    bf16 *dxs /* (T,nv*dv) = */, bf16 *dzs /* (T,ldz) = */, float *part /* (gridDim.x, dv) */,
    const bf16 *dout /* (T,nv*dv) */, const bf16 *xs /* (T,nv*dv) */, const bf16 *zs /* (T,ldz) */,
    const bf16 *w /* (dv) */, const float *rstd /* (T,nv) */, int64_t rows, int64_t rows_per_block, int nv, int ldz) {
    constexpr int dv = LPR * CUDA_VEC, G = NORM_GROUP_THREADS / LPR;
    __shared__ float sh[G][dv];
    const int l = threadIdx.x % LPR, grp = threadIdx.x / LPR, c = l * CUDA_VEC;
    float wv[CUDA_VEC], acc[CUDA_VEC];
    cuda_load8(wv, w + c);
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) acc[i] = 0.0f;
    const int64_t r0 = (int64_t)blockIdx.x * rows_per_block;
    const int64_t r1 = min(rows, r0 + rows_per_block);
    /* the trip count is the same for every group of a warp (r1 - r0 rows, G groups): lanes of a warp
     * leave together, so the shuffles always see the whole warp. The next row's x, z, dout and rstd
     * are loaded before this row's math (one row's loads in flight left the kernel latency-bound). */
    uint4 xn, zn, gn;
    float rsn;
    auto load_row = [&](int64_t rb) {
        const int64_t r = rb + grp, rr = r < r1 ? r : r0, t = rr / nv;
        const int h = (int)(rr % nv);
        xn = *reinterpret_cast<const uint4 *>(xs + rr * dv + c);
        zn = *reinterpret_cast<const uint4 *>(zs + t * ldz + (int64_t)h * dv + c);
        gn = *reinterpret_cast<const uint4 *>(dout + rr * dv + c);
        rsn = rstd[rr];
    };
    if (r0 < r1) load_row(r0);
    for (int64_t rb = r0; rb < r1; rb += G) {
        const int64_t r = rb + grp;
        const bool live = r < r1;
        const int64_t rr = live ? r : r0, t = rr / nv;
        const int h = (int)(rr % nv);
        float xv[CUDA_VEC], zv[CUDA_VEC], g[CUDA_VEC];
        cuda_unpack8(xv, xn);
        cuda_unpack8(zv, zn);
        cuda_unpack8(g, gn);
        const float rs = rsn;
        if (rb + G < r1) load_row(rb + G);
        if (rb + 2 * G + grp < r1 && l % 8 == 0) { /* the row after: into L2, one lane per 128 bytes */
            const int64_t rp = rb + 2 * G + grp, tp = rp / nv;
            cuda_prefetch_l2(xs + rp * dv + c);
            cuda_prefetch_l2(zs + tp * ldz + (rp % nv) * dv + c);
            cuda_prefetch_l2(dout + rp * dv + c);
        }
        float dot = 0.0f, sg[CUDA_VEC], sz[CUDA_VEC]; /* one sigmoid per element: silu' = s (1 + z (1 - s)) */
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) {
            sg[i] = cuda_sigmoid_fast(zv[i]);
            sz[i] = zv[i] * sg[i];
            dot += (g[i] * wv[i] * sz[i]) * (xv[i] * rs);
        }
        const float mean_dot = norm_group_sum<LPR>(dot) / dv;
        if (!live) continue;
        float dxv[CUDA_VEC], dzv[CUDA_VEC];
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) {
            const float nn = xv[i] * rs;
            const float dn = g[i] * wv[i] * sz[i];
            dzv[i] = g[i] * wv[i] * nn * (sg[i] * (1.0f + zv[i] * (1.0f - sg[i])));
            dxv[i] = rs * (dn - nn * mean_dot);
            acc[i] += g[i] * (nn * sz[i]);
        }
        cuda_store8(dzs + t * ldz + (int64_t)h * dv + c, dzv);
        cuda_store8(dxs + r * dv + c, dxv);
    }
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) sh[grp][c + i] = acc[i];
    __syncthreads();
    for (int k = threadIdx.x; k < dv; k += NORM_GROUP_THREADS) {
        float s = 0.0f;
        for (int q = 0; q < G; q++) s += sh[q][k];
        part[(int64_t)blockIdx.x * dv + k] = s;
    }
}

/* launches the group kernel of LPR lanes for dv (64, 128, 256); false when dv has none */
static bool norm_gated_group_forward(bf16 *out, float *rstd, const bf16 *x, const bf16 *z, const bf16 *w, int64_t rows,
                                     int nv, int dv, int ldz, float eps) {
    const unsigned blocks = (unsigned)cuda_ceil_div(rows * dv / CUDA_VEC, NORM_GROUP_THREADS);
    switch (dv) {
    case 64: norm_gated_group_forward_kernel<8><<<blocks, NORM_GROUP_THREADS, 0, cuda_stream()>>>(out, rstd, x, z, w, rows, nv, ldz, eps); break;
    case 128: norm_gated_group_forward_kernel<16><<<blocks, NORM_GROUP_THREADS, 0, cuda_stream()>>>(out, rstd, x, z, w, rows, nv, ldz, eps); break;
    case 256: norm_gated_group_forward_kernel<32><<<blocks, NORM_GROUP_THREADS, 0, cuda_stream()>>>(out, rstd, x, z, w, rows, nv, ldz, eps); break;
    default: return false;
    }
    CUDA_LAUNCH_CHECK();
    return true;
}

static bool norm_gated_group_backward(bf16 *dx, bf16 *dz, float *dw, const bf16 *dout, const bf16 *x, const bf16 *z,
                                      const bf16 *w, const float *rstd, int64_t rows, int nv, int dv, int ldz) {
    if (dv != 64 && dv != 128 && dv != 256) return false;
    const int blocks = cuda_partial_blocks(rows, 4 * (NORM_GROUP_THREADS * CUDA_VEC / dv));
    const int64_t rpb = cuda_ceil_div(rows, blocks);
    float *part = (float *)cuda_scratch((size_t)blocks * dv * sizeof(float), "gated_rmsnorm_backward");
    switch (dv) {
    case 64: norm_gated_group_backward_kernel<8><<<blocks, NORM_GROUP_THREADS, 0, cuda_stream()>>>(dx, dz, part, dout, x, z, w, rstd, rows, rpb, nv, ldz); break;
    case 128: norm_gated_group_backward_kernel<16><<<blocks, NORM_GROUP_THREADS, 0, cuda_stream()>>>(dx, dz, part, dout, x, z, w, rstd, rows, rpb, nv, ldz); break;
    default: norm_gated_group_backward_kernel<32><<<blocks, NORM_GROUP_THREADS, 0, cuda_stream()>>>(dx, dz, part, dout, x, z, w, rstd, rows, rpb, nv, ldz); break;
    }    CUDA_LAUNCH_CHECK();
    cuda_partials_add(dw, part, blocks, dv);
    return true;
}

extern "C" void cuda_gated_rmsnorm_forward(void *out, float *rstd, const void *x, const void *z, const void *w,
                                           int64_t T, int nv, int dv, int ldz, float eps) {
    RS_CHECK(T >= 0 && nv > 0 && dv > 0, "T %lld nv %d dv %d", (long long)T, nv, dv);
    RS_CHECK(ldz >= nv * dv, "ldz %d < nv*dv = %d", ldz, nv * dv);
    const int64_t rows = T * nv;
    if (!rows) return;
    const bool vec = dv % CUDA_VEC == 0 && cuda_vec_ok(out, dv, dv) && cuda_vec_ok(x, dv, dv) &&
                     cuda_vec_ok(z, dv, ldz) && cuda_vec_ok(w, dv, dv);
    if (vec && norm_gated_group_forward((bf16 *)out, rstd, (const bf16 *)x, (const bf16 *)z, (const bf16 *)w, rows, nv,
                                        dv, ldz, eps))
        return;
    norm_gated_forward_kernel<<<norm_rows_blocks(rows), 256, 0, cuda_stream()>>>(
        (bf16 *)out, rstd, (const bf16 *)x, (const bf16 *)z, (const bf16 *)w, rows, nv, dv, ldz, eps, vec);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_gated_rmsnorm_backward(void *dx, void *dz, float *dw, const void *dout, const void *x,
                                            const void *z, const void *w, const float *rstd, int64_t T, int nv, int dv,
                                            int ldz) {
    RS_CHECK(T >= 0 && nv > 0 && dv > 0, "T %lld nv %d dv %d", (long long)T, nv, dv);
    RS_CHECK(ldz >= nv * dv, "ldz %d < nv*dv = %d", ldz, nv * dv);
    const int64_t rows = T * nv;
    if (!rows) return;
    const bool vec = dv % CUDA_VEC == 0 && cuda_vec_ok(dx, dv, dv) && cuda_vec_ok(dz, dv, ldz) &&
                     cuda_vec_ok(dout, dv, dv) && cuda_vec_ok(x, dv, dv) && cuda_vec_ok(z, dv, ldz) &&
                     cuda_vec_ok(w, dv, dv);
    if (vec && norm_gated_group_backward((bf16 *)dx, (bf16 *)dz, dw, (const bf16 *)dout, (const bf16 *)x,
                                         (const bf16 *)z, (const bf16 *)w, rstd, rows, nv, dv, ldz))
        return;
    size_t smem;
    const int nw = norm_bwd_warps(dv, &smem);
    const int blocks = cuda_partial_blocks(rows, 4 * nw);
    const int64_t rpb = cuda_ceil_div(rows, blocks);
    float *part = (float *)cuda_scratch((size_t)blocks * dv * sizeof(float), "gated_rmsnorm_backward");
    norm_allow_smem(norm_gated_backward_kernel, smem);
    norm_gated_backward_kernel<<<blocks, nw * CUDA_WARP, smem, cuda_stream()>>>(
        (bf16 *)dx, (bf16 *)dz, part, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)z, (const bf16 *)w, rstd, rows,
        rpb, nv, dv, ldz, vec);
    CUDA_LAUNCH_CHECK();
    cuda_partials_add(dw, part, blocks, dv);
}
