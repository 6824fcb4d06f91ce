/*
 * cuda_common.h (kda_emu) — the host emulation's stand-in for kernels/cuda/cuda_common.h: the CUDA the KDA kernels use,
 * and the GDN kernels with them (tests/cuda/gdn_emu, which adds its own cuda_ptx.h and cuda.h beside these headers),
 * on the host. A launch runs its blocks one after another, each as blockDim fibers (tests/cuda/emu_fiber.h) sharing one
 * dynamic shared-memory buffer (kda_smem, filled with garbage between blocks) and the function-static __shared__
 * arrays; __syncthreads is a barrier of the block, the warp shuffles and ballots exchange through per-warp slots
 * between two barriers of the warp (so a shuffle or barrier reached by part of a warp or block stops the program as a
 * deadlock, as it is undefined on the GPU). Device memory is host memory; copies and memsets happen at once. bf16 is a
 * 16-bit struct with round-to-nearest-even conversions. Blocks of 1, 2 or 3 dimensions (threadIdx from the linear
 * thread id; warps are 32 consecutive linear ids, as on the device). Only what kernels/cuda/kda/, kernels/cuda/gdn/
 * and their tests use; it runs no inline PTX: the tensor-core pieces the kernels use come from cuda_gdn_mma.h beside it
 * (the warp GEMM of kernels/cuda/cuda_gdn_mma.h, each lane computing its own accumulator elements). Build and run:
 * build.sh (tests/test_cuda_kda_emu.py), tests/cuda/gdn_emu/oracle_build.sh (tests/test_cuda_gdn_emu.py).
 */
#ifndef RS_CUDA_COMMON_H
#define RS_CUDA_COMMON_H
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <tuple>
#include <type_traits>
#include <vector>
#include <utility>
#include <algorithm>
#include "core/error.h"
#include "../../emu_fiber.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(x) __attribute__((aligned(x)))
#define __restrict__
#define __grid_constant__

struct __nv_bfloat16 { uint16_t x; };
typedef __nv_bfloat16 bf16;
struct __nv_bfloat16_raw { uint16_t x; operator __nv_bfloat16() const { return __nv_bfloat16{x}; } };
static inline float __bfloat162float(bf16 b) { uint32_t u = (uint32_t)b.x << 16; float f; memcpy(&f, &u, 4); return f; }
static inline bf16 __float2bfloat16_rn(float f) {
    uint32_t u; memcpy(&u, &f, 4); bf16 b;
    if ((u & 0x7fffffff) > 0x7f800000) { b.x = (uint16_t)((u >> 16) | 0x40); return b; }
    u += 0x7fff + ((u >> 16) & 1); b.x = (uint16_t)(u >> 16); return b;
}
static inline bf16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __fadd_rn(float a, float b) { return a + b; } /* fp32, round to nearest */
struct __nv_bfloat162 { bf16 x, y; };
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
static inline __nv_bfloat162 __hneg2(__nv_bfloat162 h) { /* the sign bits flipped, as the device's */
    h.x.x ^= 0x8000;
    h.y.x ^= 0x8000;
    return h;
}

struct float2 { float x, y; };
static inline float2 make_float2(float a, float b) { return float2{a, b}; }
static inline float2 __bfloat1622float2(__nv_bfloat162 h) {
    return make_float2(__bfloat162float(h.x), __bfloat162float(h.y));
}
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
static inline int4 make_int4(int a, int b, int c, int d) { return int4{a, b, c, d}; }
static inline long long clock64(void) { return 0; } /* the kernels' cycle counters (profile only): no clock here */
/* the 16-byte vector types (the kernels load 16 bytes through them): may_alias, as the device's loads through a cast
 * pointer do not break the emulation's strict-aliasing assumptions */
struct __attribute__((may_alias, aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((may_alias, aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((may_alias, aligned(8))) uint2 { unsigned x, y; }; /* 8-byte loads of four bf16 */
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct uint3e { unsigned x, y, z; };
extern dim3 blockIdx, gridDim, blockDim;
extern uint3e threadIdx; /* the fiber running (emu_launch sets it at every switch) */

typedef int cudaError_t;
typedef void *cudaStream_t;
#define cudaSuccess 0
enum { cudaMemcpyDeviceToDevice, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
       cudaFuncAttributeMaxDynamicSharedMemorySize, cudaDevAttrMaxSharedMemoryPerBlockOptin,
       cudaDevAttrMultiProcessorCount, cudaFuncAttributePreferredSharedMemoryCarveout,
       cudaSharedmemCarveoutMaxShared = 100 };
#define EMU_SMEM_MAX 232448
static inline int cudaMemcpyAsync(void *d, const void *s, size_t n, int, cudaStream_t) { memmove(d, s, n); return 0; }
static inline int cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) { memset(d, v, n); return 0; }
static inline int cudaStreamSynchronize(cudaStream_t) { return 0; }
static inline int cudaGetDevice(int *d) { *d = 0; return 0; }
/* the device's SM count: 16, or KDA_EMU_SMS (the emulation's own setting, for tests). kda.cu's state passes take the
 * smallest BV of 16, 32, 64 columns per block with nv ncol / BV <= SMs (else 64): with 16 the d = 128, nv = 2 case
 * runs 16 and the nv = 4 cases 32; tests/test_cuda_kda_emu.py runs the d = 64 case again with 4 (32) and 2 (64) */
static inline int cudaDeviceGetAttribute(int *v, int attr, int) {
    const char *e = getenv("KDA_EMU_SMS");
    *v = attr == cudaDevAttrMultiProcessorCount ? (e ? atoi(e) : 16) : EMU_SMEM_MAX;
    return 0;
}
template <class T> static inline int cudaMalloc(T **p, size_t n) {
    *p = (T *)aligned_alloc(256, (n + 255) / 256 * 256);
    return 0;
}
static inline int cudaFree(void *p) { free(p); return 0; }
static inline int cudaGetLastError(void) { return 0; }
template <class K> static inline int cudaFuncSetAttribute(K, int attr, int bytes) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize && bytes > EMU_SMEM_MAX) {
        fprintf(stderr, "emu: smem %d > max\n", bytes);
        abort();
    }
    return 0;
}
#define CUDA_CHECK(call) do { (void)(call); } while (0)
#define CUDA_LAUNCH_CHECK() do {} while (0)

extern "C" {
cudaStream_t cuda_stream(void);
void *cuda_scratch(size_t bytes, const char *what);
void *cuda_internal_alloc(size_t bytes);
void cuda_internal_free(void *p, size_t bytes);
int cuda_error_take(long long *index, int *value);
}
enum { CUDA_ERR_NONE = 0 };

/* ---- warps and blocks ---- */
struct EmuBlock {
    EmuBarrier bar;
    EmuBarrier wbar[32];
    uint64_t slot[32][32];
    int nthreads;
};
extern EmuBlock *emu_blk;
extern unsigned char kda_smem[];
/* the running thread's linear id in its block (x fastest), which the warps are cut from */
static inline int emu_tid(void) {
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}
static inline void __syncthreads(void) { emu_barrier_wait(&emu_blk->bar); }
template <class T> static inline T emu_xchg(T v, int src) {
    const int w = emu_tid() / 32, l = emu_tid() % 32;
    uint64_t u = 0; memcpy(&u, &v, sizeof(T));
    emu_blk->slot[w][l] = u;
    emu_barrier_wait(&emu_blk->wbar[w]);
    uint64_t r = emu_blk->slot[w][src];
    emu_barrier_wait(&emu_blk->wbar[w]);
    T out; memcpy(&out, &r, sizeof(T)); return out;
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) { return emu_xchg(v, emu_tid() % 32 ^ o); }
template <class T> static inline T __shfl_sync(unsigned, T v, int src) { return emu_xchg(v, src & 31); }
template <class T> static inline T __shfl_up_sync(unsigned, T v, int o) {
    const int l = emu_tid() % 32;
    return emu_xchg(v, l >= o ? l - o : l);
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, int o) {
    const int l = emu_tid() % 32;
    return emu_xchg(v, l + o < 32 ? l + o : l);
}
/* __reduce_{add,min,max}_sync over the 32 lanes (int), every lane gets the result */
template <class F> static inline int emu_reduce(int v, F f) {
    const int w = emu_tid() / 32;
    emu_blk->slot[w][emu_tid() % 32] = (uint64_t)(uint32_t)v;
    emu_barrier_wait(&emu_blk->wbar[w]);
    int r = (int)(uint32_t)emu_blk->slot[w][0];
    for (int i = 1; i < 32; i++) r = f(r, (int)(uint32_t)emu_blk->slot[w][i]);
    emu_barrier_wait(&emu_blk->wbar[w]);
    return r;
}
static inline int __reduce_add_sync(unsigned, int v) {
    return emu_reduce(v, [](int a, int b) { return (int)((unsigned)a + (unsigned)b); });
}
static inline int __reduce_min_sync(unsigned, int v) {
    return emu_reduce(v, [](int a, int b) { return std::min(a, b); });
}
static inline int __reduce_max_sync(unsigned, int v) {
    return emu_reduce(v, [](int a, int b) { return std::max(a, b); });
}
static inline unsigned __ballot_sync(unsigned, int p) {
    const int w = emu_tid() / 32;
    emu_blk->slot[w][emu_tid() % 32] = p ? 1 : 0;
    emu_barrier_wait(&emu_blk->wbar[w]);
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (unsigned)emu_blk->slot[w][i] << i;
    emu_barrier_wait(&emu_blk->wbar[w]);
    return r;
}
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_barrier_wait(&emu_blk->wbar[emu_tid() / 32]); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
using std::min; using std::max;
static inline int64_t min(int64_t a, long b) { return a < b ? a : (int64_t)b; }

struct EmuCfg { dim3 g, b; size_t smem; };
static inline EmuCfg emu_cfg(dim3 g, dim3 b, size_t smem = 0, cudaStream_t = 0) { return EmuCfg{g, b, smem}; }

static inline void emu_enter_thread(int t) {
    if (blockDim.y == 1 && blockDim.z == 1) threadIdx = uint3e{(unsigned)t, 0, 0};
    else threadIdx = uint3e{t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
}
/* a launch argument as the kernel's parameter type (a NULL that arrives as an integer 0 included) */
template <class P, class A> static inline P emu_arg(A a) {
    if constexpr (std::is_pointer_v<P> && std::is_integral_v<A>) {
        if (a != 0) { fprintf(stderr, "emu: an integer launch argument for a pointer\n"); abort(); }
        return nullptr;
    } else {
        return a;
    }
}
template <class... P, class... A> static void emu_launch(void (*k)(P...), EmuCfg c, A... a) {
    std::tuple<P...> args(emu_arg<P>(a)...);
    if (c.smem > EMU_SMEM_MAX) { fprintf(stderr, "emu: launch smem %zu\n", c.smem); abort(); }
    const int nt = (int)(c.b.x * c.b.y * c.b.z);
    if (nt % 32 || nt > 1024) { fprintf(stderr, "emu: block shape\n"); abort(); }
    gridDim = c.g; blockDim = c.b;
    EmuBlock B;
    emu_blk = &B;
    struct Call { void (*k)(P...); std::tuple<P...> *args; } call{k, &args};
    for (unsigned z = 0; z < c.g.z; z++)
        for (unsigned y = 0; y < c.g.y; y++)
            for (unsigned x = 0; x < c.g.x; x++) {
                blockIdx = dim3(x, y, z);
                memset(kda_smem, 0xcd, EMU_SMEM_MAX); /* garbage between blocks */
                emu_barrier_init(&B.bar, nt);
                for (int w = 0; w < nt / 32; w++) emu_barrier_init(&B.wbar[w], 32);
                emu_fiber_run(nt, emu_enter_thread, [](void *p, int) {
                    Call *cl = (Call *)p;
                    std::apply(cl->k, *cl->args);
                }, &call);
            }
    emu_blk = nullptr;
}
#endif
