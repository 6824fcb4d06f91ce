/*
 * cuda_memory.cu — the cuda backend's memory entries (lib/backend/backend.h:
 * alloc, free, memset_zero, copy, to_device, to_host, host_alloc, host_free,
 * to_device_async, copy_2d, add_2d,
 * add_f32, act_from_f32, act_to_f32) and the allocation accounting behind cuda_memory_stats.
 *
 * Ordering: everything runs on the compute stream. alloc zero-fills and waits
 * (allocation happens at start-up, and the memory is then valid for every
 * stream); to_device waits too, so the caller may reuse or free its host
 * buffer as soon as the call returns (pinned or not); to_host waits and then
 * checks the device error word (cuda_common.h), so a kernel's bad input stops
 * the run at the next host read. copy and memset_zero are asynchronous.
 *
 * Decisions where backend.h is silent:
 *   - copy is device -> device and refuses overlapping ranges (the cpu copy is
 *     memmove; a cudaMemcpy over an overlap is undefined): fatal, not silent.
 *   - act_from_f32 rounds to nearest even (__float2bfloat16_rn); act_to_f32 is
 *     exact.
 *
 * Accounting: every live allocation of cuda_alloc is kept in a small open
 * hash table (pointer -> bytes), so the live and peak totals are exact; the
 * backend's own buffers (cuBLASLt workspace, scratch) are counted apart.
 *
 * copy_2d is a kernel (the raw bits, 16 bytes a thread where the rows allow), not cudaMemcpy2DAsync.
 * add_2d (bf16 += bf16, summed in fp32, rounded once) and add_f32 (fp32 +=) are the two adds of the
 * CP layer (the conv halo's gradient at its owner; ring attention's dK|dV partials).
 *
 * Callers: through backend_cuda (lib/model*.c, lib/cp*.c, lib/train*.c), tests/cuda.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_setup.h"
#include "cuda_common.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"

/* ---- accounting ---- */

typedef struct {
    void  *p;
    size_t bytes;
} MemEntry;

static MemEntry *mem_table;
static size_t    mem_cap, mem_used; /* slots holding a pointer or a tombstone */
static int64_t   mem_live, mem_peak;
#define MEM_TOMBSTONE ((void *)1)

static size_t mem_slot(void *p, size_t cap) { return (size_t)(((uintptr_t)p >> 8) * 0x9E3779B97F4A7C15ull) & (cap - 1); }

static void mem_insert(void *p, size_t bytes);

static void mem_grow(void) {
    MemEntry *old = mem_table;
    size_t old_cap = mem_cap;
    mem_cap = mem_cap ? mem_cap * 2 : 256;
    mem_table = (MemEntry *)RS_CALLOC(mem_cap, sizeof *mem_table);
    mem_used = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].p && old[i].p != MEM_TOMBSTONE) mem_insert(old[i].p, old[i].bytes);
    free(old);
}

static void mem_insert(void *p, size_t bytes) {
    if (2 * (mem_used + 1) > mem_cap) mem_grow();
    size_t i = mem_slot(p, mem_cap);
    while (mem_table[i].p) i = (i + 1) & (mem_cap - 1);
    mem_table[i].p = p;
    mem_table[i].bytes = bytes;
    mem_used++;
}

static size_t mem_remove(void *p) {
    if (!mem_cap) return 0;
    size_t i = mem_slot(p, mem_cap);
    while (mem_table[i].p) {
        if (mem_table[i].p == p) {
            size_t b = mem_table[i].bytes;
            mem_table[i].p = MEM_TOMBSTONE; /* keeps the probe chains of the others intact */
            return b;
        }
        i = (i + 1) & (mem_cap - 1);
    }
    RS_FATAL("cuda_free(%p): not a live allocation of cuda_alloc", p);
}

extern "C" void cuda_memory_stats(BackendMemStats *s) {
    cuda_backend_ensure();
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    s->allocated = mem_live;
    s->peak_allocated = mem_peak;
    s->internal = cuda_internal_bytes();
    s->device_used = (int64_t)(total_b - free_b);
    s->device_total = (int64_t)total_b;
}

/* ---- the entries ---- */

extern "C" void *cuda_alloc(size_t bytes) {
    cuda_backend_ensure();
    void *p = NULL;
    size_t b = bytes ? bytes : 1; /* a distinct, freeable pointer also for 0 bytes, like calloc */
    cudaError_t e = cudaMalloc(&p, b);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        error_exit(RS_EXIT_FAIL, __FILE__, __LINE__,
                   "hint: `ringscan plan CONFIG` shows the memory by category; lower data.micro_batch or "
                   "data.seq_len, or use checkpoint.activations: remat",
                   "cudaMalloc of %zu bytes failed: %s (ringscan holds %.2f GiB; device: %.2f GiB free of %.2f GiB)",
                   b, cudaGetErrorString(e), (double)mem_live / (1 << 30), (double)free_b / (1 << 30),
                   (double)total_b / (1 << 30));
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, b, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    mem_insert(p, b);
    mem_live += (int64_t)b;
    if (mem_live > mem_peak) mem_peak = mem_live;
    return p;
}

extern "C" void cuda_free(void *p) {
    if (!p) return;
    mem_live -= (int64_t)mem_remove(p);
    CUDA_CHECK(cudaFree(p));
}

extern "C" void cuda_memset_zero(void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_stream()));
}

extern "C" void cuda_copy(void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
    const char *d = (const char *)dst, *s = (const char *)src;
    RS_CHECK(d + bytes <= s || s + bytes <= d, "cuda_copy: ranges overlap (dst %p, src %p, %zu bytes)", dst, src,
             bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
}

extern "C" void cuda_to_device(void *dst, const void *host, size_t bytes) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

extern "C" void *cuda_host_alloc(size_t bytes) {
    cuda_backend_ensure();
    void *p = NULL;
    CUDA_CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault));
    memset(p, 0, bytes);
    return p;
}

extern "C" void cuda_host_free(void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

/* page-locked `host` (host_alloc): a true asynchronous copy, the host does not wait */
extern "C" void cuda_to_device_async(void *dst, const void *host, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, cuda_stream()));
}

extern "C" void cuda_to_host(void *host, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, cuda_stream()));
    cuda_error_check(); /* waits for the stream */
}

/* dst[r, c..c+8) = src[r, c..c+8), the raw bf16 bits: one thread per 8 columns of a row, 16 bytes where
 * both rows allow (cudaMemcpy2DAsync moved the glue's narrow strided blocks well below the bandwidth) */
__global__ void __launch_bounds__(256) memory_copy_2d_kernel(bf16 *dst /* (rows,ld_dst) */,
                                                             const bf16 *src /* (rows,ld_src) */, int64_t rows,
                                                             int cols, int ld_dst, int ld_src, bool vec) {
    const int nc = (cols + CUDA_VEC - 1) / CUDA_VEC;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * nc) return;
    const int64_t r = idx / nc;
    const int c = (int)(idx % nc) * CUDA_VEC, n = min(CUDA_VEC, cols - c);
    const bf16 *s = src + r * ld_src + c;
    bf16 *d = dst + r * ld_dst + c;
    if (vec && n == CUDA_VEC) {
        *reinterpret_cast<uint4 *>(d) = *reinterpret_cast<const uint4 *>(s);
        return;
    }
    for (int i = 0; i < n; i++) d[i] = s[i];
}

extern "C" void cuda_copy_2d(void *dst /* (rows,ld_dst) */, const void *src /* (rows,ld_src) */, int64_t rows, int cols,
                             int ld_dst, int ld_src) {
    RS_CHECK(rows >= 0 && cols >= 0 && ld_dst >= cols && ld_src >= cols, "copy_2d: rows %lld cols %d ld %d %d",
             (long long)rows, cols, ld_dst, ld_src);
    if (!rows || !cols) return;
    const bool vec = cuda_vec_ok(dst, cols, ld_dst) && cuda_vec_ok(src, cols, ld_src);
    memory_copy_2d_kernel<<<(unsigned)cuda_ceil_div(rows * cuda_ceil_div(cols, CUDA_VEC), 256), 256, 0,
                            cuda_stream()>>>((bf16 *)dst, (const bf16 *)src, rows, cols, ld_dst, ld_src, vec);
    CUDA_LAUNCH_CHECK();
}

/* ---- adds ---- */

/* dst[r, c..c+8) += src[r, c..c+8), one thread per 8 columns of a row */
__global__ void __launch_bounds__(256) memory_add_2d_kernel(bf16 *dst /* (rows,ld_dst) */,
                                                            const bf16 *src /* (rows,ld_src) */, int64_t rows,
                                                            int cols, int ld_dst, int ld_src, bool vec) {
    const int nc = (cols + CUDA_VEC - 1) / CUDA_VEC;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * nc) return;
    const int64_t r = idx / nc;
    const int c = (int)(idx % nc) * CUDA_VEC, n = min(CUDA_VEC, cols - c);
    float a[CUDA_VEC], b[CUDA_VEC];
    cuda_load8n(a, dst + r * ld_dst + c, n, vec);
    cuda_load8n(b, src + r * ld_src + c, n, vec);
#pragma unroll
    for (int i = 0; i < CUDA_VEC; i++) a[i] += b[i];
    cuda_store8n(dst + r * ld_dst + c, a, n, vec);
}

/* dst[i] += src[i], 4 per thread */
__global__ void __launch_bounds__(256) memory_add_f32_kernel(float *dst, const float *src, int64_t n, bool vec) {
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= n) return;
    if (vec && i + 4 <= n) {
        float4 a = *reinterpret_cast<float4 *>(dst + i);
        const float4 b = *reinterpret_cast<const float4 *>(src + i);
        a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
        *reinterpret_cast<float4 *>(dst + i) = a;
        return;
    }
    for (int64_t j = i; j < n && j < i + 4; j++) dst[j] += src[j];
}

extern "C" void cuda_add_2d(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src) {
    RS_CHECK(rows >= 0 && cols >= 0 && ld_dst >= cols && ld_src >= cols, "add_2d: rows %lld cols %d ld %d %d",
             (long long)rows, cols, ld_dst, ld_src);
    if (!rows || !cols) return;
    const bool vec = cuda_vec_ok(dst, cols, ld_dst) && cuda_vec_ok(src, cols, ld_src);
    memory_add_2d_kernel<<<(unsigned)cuda_ceil_div(rows * cuda_ceil_div(cols, CUDA_VEC), 256), 256, 0,
                           cuda_stream()>>>((bf16 *)dst, (const bf16 *)src, rows, cols, ld_dst, ld_src, vec);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_add_f32(float *dst, const float *src, int64_t n) {
    RS_CHECK(n >= 0, "add_f32: n = %lld", (long long)n);
    if (!n) return;
    const bool vec = cuda_ptr_align(dst) >= 16 && cuda_ptr_align(src) >= 16;
    memory_add_f32_kernel<<<(unsigned)cuda_ceil_div(n, 4 * 256), 256, 0, cuda_stream()>>>(dst, src, n, vec);
    CUDA_LAUNCH_CHECK();
}

/* ---- bf16 <-> fp32 ---- */

/* thread i converts elements [8i, 8i+8) */
__global__ void __launch_bounds__(256) memory_from_f32_kernel(bf16 *dst /* (n) */, const float *src /* (n) */,
                                                              int64_t n, bool vec) {
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * CUDA_VEC;
    if (i >= n) return;
    if (vec && i + CUDA_VEC <= n) {
        float4 a = *reinterpret_cast<const float4 *>(src + i), b = *reinterpret_cast<const float4 *>(src + i + 4);
        float f[CUDA_VEC] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        cuda_store8(dst + i, f);
        return;
    }
    for (int64_t j = i; j < n && j < i + CUDA_VEC; j++) dst[j] = __float2bfloat16_rn(src[j]);
}

__global__ void __launch_bounds__(256) memory_to_f32_kernel(float *dst /* (n) */, const bf16 *src /* (n) */,
                                                            int64_t n, bool vec) {
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * CUDA_VEC;
    if (i >= n) return;
    if (vec && i + CUDA_VEC <= n) {
        float f[CUDA_VEC];
        cuda_load8(f, src + i);
        *reinterpret_cast<float4 *>(dst + i) = make_float4(f[0], f[1], f[2], f[3]);
        *reinterpret_cast<float4 *>(dst + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
        return;
    }
    for (int64_t j = i; j < n && j < i + CUDA_VEC; j++) dst[j] = __bfloat162float(src[j]);
}

extern "C" void cuda_act_from_f32(void *dst, const float *src, int64_t n) {
    RS_CHECK(n >= 0, "n = %lld", (long long)n);
    if (!n) return;
    bool vec = cuda_ptr_align(dst) >= 16 && cuda_ptr_align(src) >= 16;
    memory_from_f32_kernel<<<(unsigned)cuda_ceil_div(n, 256 * CUDA_VEC), 256, 0, cuda_stream()>>>((bf16 *)dst, src,
                                                                                                  n, vec);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_act_to_f32(float *dst, const void *src, int64_t n) {
    RS_CHECK(n >= 0, "n = %lld", (long long)n);
    if (!n) return;
    bool vec = cuda_ptr_align(dst) >= 16 && cuda_ptr_align(src) >= 16;
    memory_to_f32_kernel<<<(unsigned)cuda_ceil_div(n, 256 * CUDA_VEC), 256, 0, cuda_stream()>>>(
        dst, (const bf16 *)src, n, vec);
    CUDA_LAUNCH_CHECK();
}
