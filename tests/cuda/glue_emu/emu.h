/*
 * emu.h (glue_emu) — a host emulation of the CUDA that the glue kernels use (kernels/cuda/cuda_conv.cu's run kernels,
 * cuda_gdn_conv_split.cu's fused GDN conv + split, cuda_rmsnorm.cu, cuda_norm.cu's gated RMSNorm group kernels,
 * cuda_elementwise.cu's sigmoid gate and SwiGLU, cuda_device.cuh's helpers and stage-2 reduction): bf16 with
 * round-to-nearest-even, the vector types, one fiber per CUDA thread of a block (tests/cuda/emu_fiber.h; blocks run one
 * at a time), block barriers, warp shuffles through per-warp slots and barriers, function-static __shared__ arrays, the
 * fast intrinsics as their exact forms, the L2 prefetch as nothing. Enough for the kernels' indexing, tails, masks,
 * synchronisation and reductions to be checked against the cpu oracle in CI without a GPU; the GPU run
 * (build/test_cuda) proves the rest.
 *
 * Callers: emu_conv.cpp, emu_norm.cpp, emu_ew.cpp (this directory), through build.sh.
 */
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#include "../emu_fiber.h"

struct bf16 { uint16_t x; };
typedef bf16 __nv_bfloat16;
inline float bf2f(bf16 b) { uint32_t u = (uint32_t)b.x << 16; float f; memcpy(&f, &u, 4); return f; }
inline bf16 f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return bf16{(uint16_t)((u >> 16) | 0x40)};
    u += 0x7FFF + ((u >> 16) & 1);
    return bf16{(uint16_t)(u >> 16)};
}
#define __bfloat162float bf2f
#define __float2bfloat16_rn f2bf
struct float2 { float x, y; };
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
struct __nv_bfloat162 { bf16 x, y; };
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{bf2f(h.x), bf2f(h.y)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{f2bf(a), f2bf(b)}; }
inline uint2 make_uint2(uint32_t a, uint32_t b) { return uint2{a, b}; }
inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
struct dim3 { unsigned x = 1, y = 1, z = 1; };

extern dim3 threadIdx; /* the fiber running: emu_launch sets them at every switch */
extern int emu_lane, emu_warp;
extern dim3 blockIdx, blockDim, gridDim;
extern float emu_dyn_smem[1 << 16];
struct EmuWarp { EmuBarrier bar; float slot[32]; };
struct EmuBlock { EmuBarrier bar; std::vector<EmuWarp> warps; };
extern EmuBlock *emu_block;

inline void __syncthreads() { emu_barrier_wait(&emu_block->bar); }
template <class F> F __shfl_xor_sync(unsigned, F v, int o) {
    EmuWarp &w = emu_block->warps[emu_warp];
    w.slot[emu_lane] = v;
    emu_barrier_wait(&w.bar);
    F r = w.slot[emu_lane ^ o];
    emu_barrier_wait(&w.bar);
    return r;
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __expf expf
#define __fdividef(a, b) ((a) / (b))
template <class A, class B> inline auto min(A a, B b) -> decltype(a + b) { return a < b ? a : b; }
enum { CUDA_ERR_DOC_POS = 3 };
inline void cuda_raise(int *, int, int64_t, int) { fprintf(stderr, "emu: a kernel raised an input error\n"); }

/* runs f() as the blockDim threads of every block of the grid, one block at a time */
template <class F> void emu_launch(dim3 grid, dim3 block, F f) {
    gridDim = grid;
    blockDim = block;
    const unsigned nt = block.x * block.y;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            blockIdx.x = bx, blockIdx.y = by;
            EmuBlock b;
            emu_barrier_init(&b.bar, (int)nt);
            b.warps.resize((nt + 31) / 32);
            for (unsigned w = 0; w < b.warps.size(); w++)
                emu_barrier_init(&b.warps[w].bar, (int)std::min(32u, nt - 32 * w));
            emu_block = &b;
            emu_fiber_run((int)nt, [](int i) {
                threadIdx.x = i % blockDim.x, threadIdx.y = i / blockDim.x;
                emu_lane = i % 32, emu_warp = i / 32;
            }, [](void *p, int) { (*(F *)p)(); }, &f);
        }
}
inline dim3 emu_dim(unsigned x, unsigned y = 1) { dim3 d; d.x = x, d.y = y; return d; }
inline int64_t emu_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* the conv run backward's grid as the launchers make it (cuda_conv_run.cuh's conv_run_backward_grid; the constants
 * passed from the kernel source: CONV_PART_BYTES, CUDA_MAX_PARTIALS, CONV_RUN_ROWS, CONV_RUN_BWD_MIN): gy row blocks
 * of `rows` runs of *run tokens */
static inline int64_t emu_conv_bwd_grid(int64_t T, int64_t C, int Kc, int64_t part_bytes, int64_t max_parts, int rows,
                                        int min_run, int64_t *run) {
    int64_t gy = part_bytes / (C * Kc * 4);
    gy = gy < 1 ? 1 : gy > max_parts ? max_parts : gy;
    const int64_t gmr = emu_cdiv(T, (int64_t)rows * min_run);
    if (gy > gmr) gy = gmr;
    *run = emu_cdiv(T, gy * rows);
    return emu_cdiv(T, *run * rows);
}

/* relative L2 error, as tests/unit's test_rel_err_f; NaN anywhere is an infinite error */
inline double emu_rel(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (a[i] != a[i]) return INFINITY;
        const double d = (double)a[i] - b[i];
        num += d * d, den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
/* elements of a and b whose bits differ (a size mismatch counts as all of them) */
template <class X> inline int64_t emu_bits_differ(const std::vector<X> &a, const std::vector<X> &b) {
    if (a.size() != b.size()) return (int64_t)(a.size() > b.size() ? a.size() : b.size());
    int64_t n = 0;
    for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], sizeof(X)) != 0;
    return n;
}
extern int emu_failures;
/* prints "ok" or "FAIL" for one comparison against its bound */
inline void emu_check(const char *what, double err, double bound) {
    const bool ok = err <= bound;
    if (!ok) emu_failures++;
    printf("%s %s: rel err %.3g (bound %.3g)\n", ok ? "ok  " : "FAIL", what, err, bound);
}
#define EMU_BF16 4e-3 /* tests/cuda/cuda_test.h CT_BOUND_BF16_OUT */
#define EMU_F32 1e-5  /* CT_BOUND_F32 */
#define EMU_GLOBALS                                                                                                  \
    dim3 threadIdx;                                                                                                  \
    int emu_lane, emu_warp;                                                                                          \
    dim3 blockIdx, blockDim, gridDim;                                                                                \
    float emu_dyn_smem[1 << 16];                                                                                     \
    EmuBlock *emu_block;                                                                                             \
    int emu_failures;
