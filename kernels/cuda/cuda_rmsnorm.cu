/*
 * cuda_rmsnorm.cu — RMSNorm on the cuda backend, forward and backward (lib/backend/backend.h rmsnorm_*; the
 * math and layouts of kernels/cpu/cpu_norm.c, the oracle): y = x rstd (zero_centred ? 1 + w : w),
 * rstd = 1/sqrt(mean(x^2) + eps), rows of D, nh rows per token inside strided rows (ldi, ldo); backward
 * dinp += rstd (dxhat - xhat mean(dxhat xhat)), dxhat = dout s, and dw += dout xhat.
 *
 * Kernels by row width (16-byte rows unless said): the forward's group kernel (D = 64 .. 2048: a row is D/8
 * lanes, at most 32, each holding its vectors of x, so x is read once and no lane idles at head dims); the
 * backward's register kernel (D <= 1536: a warp per row, all of a lane's x, dout and dinp vectors loaded
 * before the first is used, dw slices in shared memory laid out without bank conflicts) and group kernel
 * (D = 64, 128: q_norm, k_norm; dw sums in registers); the row kernels of the general case (any D and
 * stride: a warp per row, scalar where the rows are not 16-byte aligned). Statistics and intermediates are
 * fp32; sums in a fixed order.
 *
 * dw is deterministic, with no float atomics: each block owns a fixed range of rows (the block count
 * depends on the sizes only), sums its warps' (groups') terms in order into its row of partials in the
 * kernel scratch, and cuda_partials_add adds the blocks in a fixed order.
 *
 * Callers: through backend_cuda (lib/model/model_block.c, lib/model/model_step.c), tests/cuda/test_cuda_norm.cu.
 */
#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"
#include "cuda_norm.cuh"

/* ---- RMSNorm --------------------------------------------------------------------------------- */

__global__ void __launch_bounds__(256) norm_rms_forward_kernel(bf16 *out /* (T,ldo) */, float *rstd /* (T,nh) */,
                                                               const bf16 *inp /* (T,ldi) */, const bf16 *w /* (D) */,
                                                               int64_t rows, int nh, int D, int ldi, int ldo, float eps,
                                                               int zc, bool vec) {
    const int64_t r = (int64_t)blockIdx.x * NORM_WARPS + threadIdx.x / CUDA_WARP;
    if (r >= rows) return; /* whole warps leave together */
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
    ss = cuda_warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / D + eps);
    if (lane == 0) rstd[r] = rs;
    for (int c = lane * CUDA_VEC; c < D; c += CUDA_WARP * CUDA_VEC) {
        const int n = min(CUDA_VEC, D - c);
        float f[CUDA_VEC], wv[CUDA_VEC], o[CUDA_VEC];
        cuda_load8n(f, x + c, n, vec);
        cuda_load8n(wv, w + c, n, vec);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) o[i] = f[i] * rs * (zc ? 1.0f + wv[i] : wv[i]);
        cuda_store8n(y + c, o, n, vec);
    }
}

/* dxhat = dout s, xhat = x rstd: dinp += rstd (dxhat - xhat mean(dxhat xhat)); dw += dout xhat */
__global__ void __launch_bounds__(256) norm_rms_backward_kernel(
    bf16 *dinp /* (T,ldi) += */, float *part /* (gridDim.x, D) */, const bf16 *dout /* (T,ldo) */,
    const bf16 *inp /* (T,ldi) */, const bf16 *w /* (D) */, const float *rstd /* (T,nh) */, int64_t rows,
    int64_t rows_per_block, int nh, int D, int ldi, int ldo, int zc, bool vec) {
    extern __shared__ float norm_slices[]; /* (warps, D) */
    const int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP, nw = blockDim.x / CUDA_WARP;
    float *acc = norm_slices + (int64_t)warp * D;
    for (int c = lane * CUDA_VEC; c < D; c += CUDA_WARP * CUDA_VEC)
        for (int i = 0; i < CUDA_VEC && c + i < D; i++) acc[c + i] = 0.0f;
    const int64_t r0 = (int64_t)blockIdx.x * rows_per_block;
    const int64_t r1 = min(rows, r0 + rows_per_block);
    for (int64_t r = r0 + warp; r < r1; r += nw) {
        const int64_t t = r / nh;
        const int h = (int)(r % nh);
        const bf16 *x = inp + t * ldi + (int64_t)h * D, *dy = dout + t * ldo + (int64_t)h * D;
        bf16 *dx = dinp + t * ldi + (int64_t)h * D;
        const float rs = rstd[r];
        float dot = 0.0f;
        for (int c = lane * CUDA_VEC; c < D; c += CUDA_WARP * CUDA_VEC) {
            const int n = min(CUDA_VEC, D - c);
            float xv[CUDA_VEC], g[CUDA_VEC], wv[CUDA_VEC];
            cuda_load8n(xv, x + c, n, vec);
            cuda_load8n(g, dy + c, n, vec);
            cuda_load8n(wv, w + c, n, vec);
#pragma unroll
            for (int i = 0; i < CUDA_VEC; i++) dot += (g[i] * (zc ? 1.0f + wv[i] : wv[i])) * (xv[i] * rs);
        }
        const float mean_dot = cuda_warp_sum(dot) / D;
        for (int c = lane * CUDA_VEC; c < D; c += CUDA_WARP * CUDA_VEC) {
            const int n = min(CUDA_VEC, D - c);
            float xv[CUDA_VEC], g[CUDA_VEC], wv[CUDA_VEC], d[CUDA_VEC];
            cuda_load8n(xv, x + c, n, vec);
            cuda_load8n(g, dy + c, n, vec);
            cuda_load8n(wv, w + c, n, vec);
            cuda_load8n(d, dx + c, n, vec);
#pragma unroll
            for (int i = 0; i < CUDA_VEC; i++) {
                const float s = zc ? 1.0f + wv[i] : wv[i];
                d[i] += rs * (g[i] * s - xv[i] * rs * mean_dot);
                if (c + i < D) acc[c + i] += g[i] * (xv[i] * rs);
            }
            cuda_store8n(dx + c, d, n, vec);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < nw; k++) s += norm_slices[(int64_t)k * D + c];
        part[(int64_t)blockIdx.x * D + c] = s;
    }
}

/* The same backward for 16-byte rows of D <= NORM_BWD_VMAX * 256 (the hidden size 1536: 6 vectors a
 * lane): a lane loads all of its row's x, dout and dinp vectors before using the first (the loop above
 * keeps one load in flight and reads x and dout twice); the same sums in the same order. w is read at
 * its use (L1-resident), which keeps the kernel at two 256-thread blocks an SM. The dw slices are laid
 * out by norm_slice_at, so that the 32 lanes' adds of one column offset hit 32 banks (lane-major 8-column
 * runs were 8-way conflicts on every add). */
#define NORM_BWD_VMAX 6
#define NORM_SLICE_COLS (CUDA_WARP * CUDA_VEC) /* 256 columns: one vector of each lane */

/* where column c = k 256 + lane 8 + i sits in a warp's slice (slices of ceil(D/256) 256 floats) */
__device__ __forceinline__ int norm_slice_at(int c) {
    return (c & ~(NORM_SLICE_COLS - 1)) + (c % CUDA_VEC) * CUDA_WARP + (c % NORM_SLICE_COLS) / CUDA_VEC;
}

__global__ void __launch_bounds__(256, 2) norm_rms_backward_reg_kernel(
    bf16 *dinp /* (T,ldi) += */, float *part /* (gridDim.x, D) */, const bf16 *dout /* (T,ldo) */,
    const bf16 *inp /* (T,ldi) */, const bf16 *w /* (D) */, const float *rstd /* (T,nh) */, int64_t rows,
    int64_t rows_per_block, int nh, int D, int ldi, int ldo, int zc) {
    extern __shared__ float norm_slices[]; /* (warps, Ds): Ds = D rounded up to 256 */
    const int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP, nw = blockDim.x / CUDA_WARP;
    const int Ds = (D + NORM_SLICE_COLS - 1) / NORM_SLICE_COLS * NORM_SLICE_COLS;
    float *acc = norm_slices + (int64_t)warp * Ds;
#pragma unroll
    for (int k = 0; k < NORM_BWD_VMAX; k++) {
        const int c = lane * CUDA_VEC + k * NORM_SLICE_COLS;
        if (c < D)
#pragma unroll
            for (int i = 0; i < CUDA_VEC; i++) acc[k * NORM_SLICE_COLS + i * CUDA_WARP + lane] = 0.0f;
    }
    const int64_t r0 = (int64_t)blockIdx.x * rows_per_block;
    const int64_t r1 = min(rows, r0 + rows_per_block);
    for (int64_t r = r0 + warp; r < r1; r += nw) {
        const int64_t t = r / nh;
        const int h = (int)(r % nh);
        const bf16 *x = inp + t * ldi + (int64_t)h * D, *dy = dout + t * ldo + (int64_t)h * D;
        bf16 *dx = dinp + t * ldi + (int64_t)h * D;
        uint4 xr[NORM_BWD_VMAX], gr[NORM_BWD_VMAX], dr[NORM_BWD_VMAX];
#pragma unroll
        for (int k = 0; k < NORM_BWD_VMAX; k++) {
            const int c = lane * CUDA_VEC + k * NORM_SLICE_COLS;
            if (c < D) {
                xr[k] = *reinterpret_cast<const uint4 *>(x + c);
                gr[k] = *reinterpret_cast<const uint4 *>(dy + c);
                dr[k] = *reinterpret_cast<const uint4 *>(dx + c);
            }
        }
        const float rs = rstd[r];
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_BWD_VMAX; k++) {
            const int c = lane * CUDA_VEC + k * NORM_SLICE_COLS;
            if (c < D) {
                float xv[CUDA_VEC], g[CUDA_VEC], wv[CUDA_VEC];
                cuda_unpack8(xv, xr[k]);
                cuda_unpack8(g, gr[k]);
                cuda_load8(wv, w + c);
#pragma unroll
                for (int i = 0; i < CUDA_VEC; i++) dot += (g[i] * (zc ? 1.0f + wv[i] : wv[i])) * (xv[i] * rs);
            }
        }
        const float mean_dot = cuda_warp_sum(dot) / D;
#pragma unroll
        for (int k = 0; k < NORM_BWD_VMAX; k++) {
            const int c = lane * CUDA_VEC + k * NORM_SLICE_COLS;
            if (c < D) {
                float xv[CUDA_VEC], g[CUDA_VEC], wv[CUDA_VEC], d[CUDA_VEC];
                cuda_unpack8(xv, xr[k]);
                cuda_unpack8(g, gr[k]);
                cuda_load8(wv, w + c);
                cuda_unpack8(d, dr[k]);
#pragma unroll
                for (int i = 0; i < CUDA_VEC; i++) {
                    const float sc = zc ? 1.0f + wv[i] : wv[i];
                    d[i] += rs * (g[i] * sc - xv[i] * rs * mean_dot);
                    acc[k * NORM_SLICE_COLS + i * CUDA_WARP + lane] += g[i] * (xv[i] * rs);
                }
                cuda_store8(dx + c, d);
            }
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        const int at = norm_slice_at(c);
        float sum = 0.0f;
        for (int k = 0; k < nw; k++) sum += norm_slices[(int64_t)k * Ds + at];
        part[(int64_t)blockIdx.x * D + c] = sum;
    }
}

/* The same backward for 16-byte rows of D = 8 LPR < 256 (the attention heads' q_norm, k_norm at 128): a row
 * is a group of LPR lanes (a warp-wide row would leave half the warp idle), each lane keeps its 8 columns
 * of the dw sums in registers across the rows its group walks, and the next row's x, dout, dinp and rstd
 * are loaded before this row's math; the block's groups are then added in order. */
template <int LPR>
__global__ void __launch_bounds__(NORM_GROUP_THREADS) norm_rms_group_backward_kernel(
    bf16 *dinp /* (T,ldi) += */, float *part /* (gridDim.x, D) */, const bf16 *dout /* (T,ldo) */,
    const bf16 *inp /* (T,ldi) */, const bf16 *w /* (D) */, const float *rstd /* (T,nh) */, int64_t rows,
    int64_t rows_per_block, int nh, int ldi, int ldo, int zc) {
    constexpr int D = LPR * CUDA_VEC, G = NORM_GROUP_THREADS / LPR;
    __shared__ float sh[G][D];
    const int l = threadIdx.x % LPR, grp = threadIdx.x / LPR, c = l * CUDA_VEC;
    float sc[CUDA_VEC], acc[CUDA_VEC];
    cuda_load8(sc, w + c);
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) {
        sc[i] = zc ? 1.0f + sc[i] : sc[i];
        acc[i] = 0.0f;
    }
    const int64_t r0 = (int64_t)blockIdx.x * rows_per_block;
    const int64_t r1 = min(rows, r0 + rows_per_block);
    /* every group of a warp makes the same number of trips (r1 - r0 rows, G groups): the shuffles see the
     * whole warp */
    uint4 xn, gn, dn;
    float rsn;
    auto load_row = [&](int64_t rb) {
        const int64_t r = rb + grp, rr = r < r1 ? r : r0, t = rr / nh;
        const int h = (int)(rr % nh);
        xn = *reinterpret_cast<const uint4 *>(inp + t * ldi + (int64_t)h * D + c);
        gn = *reinterpret_cast<const uint4 *>(dout + t * ldo + (int64_t)h * D + c);
        dn = *reinterpret_cast<const uint4 *>(dinp + t * ldi + (int64_t)h * D + c);
        rsn = rstd[rr];
    };
    if (r0 < r1) load_row(r0);
    for (int64_t rb = r0; rb < r1; rb += G) {
        const int64_t r = rb + grp;
        const bool live = r < r1;
        const int64_t rr = live ? r : r0, t = rr / nh;
        const int h = (int)(rr % nh);
        float xv[CUDA_VEC], g[CUDA_VEC], d[CUDA_VEC];
        cuda_unpack8(xv, xn);
        cuda_unpack8(g, gn);
        cuda_unpack8(d, dn);
        const float rs = rsn;
        if (rb + G < r1) load_row(rb + G);
        if (rb + 2 * G + grp < r1 && l % 8 == 0) { /* the row after: into L2, one lane per 128 bytes */
            const int64_t rp = rb + 2 * G + grp, op = rp / nh * ldi + (rp % nh) * D + c;
            cuda_prefetch_l2(inp + op);
            cuda_prefetch_l2(dinp + op);
            cuda_prefetch_l2(dout + rp / nh * ldo + (rp % nh) * D + c);
        }
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) dot += (g[i] * sc[i]) * (xv[i] * rs);
        const float mean_dot = norm_group_sum<LPR>(dot) / D;
        if (!live) continue;
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) {
            d[i] += rs * (g[i] * sc[i] - xv[i] * rs * mean_dot);
            acc[i] += g[i] * (xv[i] * rs);
        }
        cuda_store8(dinp + t * ldi + (int64_t)h * D + c, d);
    }
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) sh[grp][c + i] = acc[i];
    __syncthreads();
    for (int k = threadIdx.x; k < D; k += NORM_GROUP_THREADS) {
        float sum = 0.0f;
        for (int q = 0; q < G; q++) sum += sh[q][k];
        part[(int64_t)blockIdx.x * D + k] = sum;
    }
}

/* RMSNorm forward for 16-byte rows of D = LPR 8 NV: a row is a group of LPR lanes (LPR < 32 for D = 64,
 * 128: no idle lanes), each lane loads its NV vectors before using the first and keeps them for the
 * output: x is read once. The same sums in the same order as norm_rms_forward_kernel. */
template <int LPR, int NV>
__global__ void __launch_bounds__(256) norm_rms_group_forward_kernel(
    bf16 *out /* (T,ldo) */, float *rstd /* (T,nh) */, const bf16 *inp /* (T,ldi) */, const bf16 *w /* (D) */,
    int64_t rows, int nh, int ldi, int ldo, float eps, int zc) {
    constexpr int D = LPR * CUDA_VEC * NV;
    const int l = threadIdx.x % LPR;
    const int64_t r = (int64_t)blockIdx.x * (256 / LPR) + threadIdx.x / LPR;
    const bool live = r < rows; /* every lane takes part in the shuffles */
    const int64_t rr = live ? r : 0, t = rr / nh;
    const int h = (int)(rr % nh);
    const bf16 *x = inp + t * ldi + (int64_t)h * D;
    uint4 xr[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) xr[k] = *reinterpret_cast<const uint4 *>(x + (l + k * LPR) * CUDA_VEC);
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        float f[CUDA_VEC];
        cuda_unpack8(f, xr[k]);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) ss += f[i] * f[i];
    }
    const float rs = 1.0f / sqrtf(norm_group_sum<LPR>(ss) / D + eps);
    if (!live) return;
    if (l == 0) rstd[r] = rs;
    bf16 *y = out + t * ldo + (int64_t)h * D;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int c = (l + k * LPR) * CUDA_VEC;
        float f[CUDA_VEC], wv[CUDA_VEC];
        cuda_unpack8(f, xr[k]);
        cuda_load8(wv, w + c);
#pragma unroll
        for (int i = 0; i < CUDA_VEC; i++) f[i] = f[i] * rs * (zc ? 1.0f + wv[i] : wv[i]);
        cuda_store8(y + c, f);
    }
}

/* launches the group forward for D (64, 128, 256, or 256 NV up to 8 vectors a lane); false when D has none */
static bool norm_rms_group_forward(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int64_t rows, int nh, int D,
                                   int ldi, int ldo, float eps, int zc) {
    const int nvec = D / CUDA_VEC, lpr = nvec < CUDA_WARP ? nvec : CUDA_WARP;
    const unsigned blocks = (unsigned)cuda_ceil_div(rows, 256 / lpr);
    const cudaStream_t st = cuda_stream();
#define NORM_RMS_GROUP(L, V)                                                                                        \
    norm_rms_group_forward_kernel<L, V><<<blocks, 256, 0, st>>>(out, rstd, inp, w, rows, nh, ldi, ldo, eps, zc)
    switch (nvec) {
    case 8: NORM_RMS_GROUP(8, 1); break;
    case 16: NORM_RMS_GROUP(16, 1); break;
    case 32: NORM_RMS_GROUP(32, 1); break;
    case 64: NORM_RMS_GROUP(32, 2); break;
    case 96: NORM_RMS_GROUP(32, 3); break;
    case 128: NORM_RMS_GROUP(32, 4); break;
    case 160: NORM_RMS_GROUP(32, 5); break;
    case 192: NORM_RMS_GROUP(32, 6); break;
    case 256: NORM_RMS_GROUP(32, 8); break;
    default: return false;
    }
#undef NORM_RMS_GROUP
    CUDA_LAUNCH_CHECK();
    return true;
}

extern "C" void cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int64_t T, int nh, int D,
                                     int ldi, int ldo, float eps, int zero_centred) {
    RS_CHECK(T >= 0 && nh > 0 && D > 0, "T %lld nh %d D %d", (long long)T, nh, D);
    RS_CHECK(ldi >= nh * D && ldo >= nh * D, "ldi %d ldo %d < nh*D = %d", ldi, ldo, nh * D);
    const int64_t rows = T * nh;
    if (!rows) return;
    const bool vec = D % CUDA_VEC == 0 && cuda_vec_ok(inp, D, ldi) && cuda_vec_ok(out, D, ldo) && cuda_vec_ok(w, D, D);
    if (vec && norm_rms_group_forward((bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)w, rows, nh, D, ldi, ldo, eps,
                                      zero_centred))
        return;
    norm_rms_forward_kernel<<<norm_rows_blocks(rows), 256, 0, cuda_stream()>>>(
        (bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)w, rows, nh, D, ldi, ldo, eps, zero_centred, vec);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                                      const float *rstd, int64_t T, int nh, int D, int ldi, int ldo, int zero_centred) {
    RS_CHECK(T >= 0 && nh > 0 && D > 0, "T %lld nh %d D %d", (long long)T, nh, D);
    RS_CHECK(ldi >= nh * D && ldo >= nh * D, "ldi %d ldo %d < nh*D = %d", ldi, ldo, nh * D);
    const int64_t rows = T * nh;
    if (!rows) return;
    const bool vec = D % CUDA_VEC == 0 && cuda_vec_ok(inp, D, ldi) && cuda_vec_ok(dinp, D, ldi) &&
                     cuda_vec_ok(dout, D, ldo) && cuda_vec_ok(w, D, D);
    if (vec && (D == 64 || D == 128)) { /* heads: rows of LPR = D/8 lanes */
        const int lpr = D / CUDA_VEC, blocks = cuda_partial_blocks(rows, 4 * (NORM_GROUP_THREADS / lpr));
        const int64_t rpb = cuda_ceil_div(rows, blocks);
        float *part = (float *)cuda_scratch((size_t)blocks * D * sizeof(float), "rmsnorm_backward");
        auto kernel = D == 64 ? norm_rms_group_backward_kernel<8> : norm_rms_group_backward_kernel<16>;
        kernel<<<blocks, NORM_GROUP_THREADS, 0, cuda_stream()>>>((bf16 *)dinp, part, (const bf16 *)dout,
                                                                 (const bf16 *)inp, (const bf16 *)w, rstd, rows, rpb,
                                                                 nh, ldi, ldo, zero_centred);
        CUDA_LAUNCH_CHECK();
        cuda_partials_add(dw, part, blocks, D);
        return;
    }
    const bool reg = vec && D <= NORM_BWD_VMAX * NORM_SLICE_COLS;
    size_t smem;
    /* the register kernel's slices are D rounded up to 256 columns */
    const int nw = norm_bwd_warps(reg ? (int)cuda_ceil_div(D, NORM_SLICE_COLS) * NORM_SLICE_COLS : D, &smem);
    const int blocks = cuda_partial_blocks(rows, 4 * nw);
    const int64_t rpb = cuda_ceil_div(rows, blocks);
    float *part = (float *)cuda_scratch((size_t)blocks * D * sizeof(float), "rmsnorm_backward");
    if (reg) {
        norm_allow_smem(norm_rms_backward_reg_kernel, smem);
        norm_rms_backward_reg_kernel<<<blocks, nw * CUDA_WARP, smem, cuda_stream()>>>(
            (bf16 *)dinp, part, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)w, rstd, rows, rpb, nh, D, ldi,
            ldo, zero_centred);
    } else {
        norm_allow_smem(norm_rms_backward_kernel, smem);
        norm_rms_backward_kernel<<<blocks, nw * CUDA_WARP, smem, cuda_stream()>>>(
            (bf16 *)dinp, part, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)w, rstd, rows, rpb, nh, D, ldi,
            ldo, zero_centred, vec);
    }
    CUDA_LAUNCH_CHECK();
    cuda_partials_add(dw, part, blocks, D);
}
