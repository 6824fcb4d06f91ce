/*
 * cuda_attention_cudnn_glue.cu — the small kernels around cuDNN's attention
 * calls (cuda_attention_cudnn.h): the check of the caller's hint against the
 * rows (lib/backend/attn_hint.h's fold on the GPU, a difference recorded in the
 * device error word: nothing is read back), the route's workspace (grown
 * through cuda_internal_alloc, counted), the LSE layout transposes between
 * cuDNN's Stats (nh, Tq) and our lse (Tq, nh) (kernels/cuda/attention/cudnn_graph.h's index
 * maps), the variable-length route's sequence lengths and ragged offsets from
 * the rows, and the fp32 += bf16 add of cuDNN's dq/dk/dv into our accumulators.
 * All on the compute stream.
 *
 * Callers: kernels/cuda/cuda_attention_cudnn.c.
 */
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "attention/cudnn_graph.h"
#include "cuda_attention_cudnn.h"
#include "cuda_common.h"
#include "cuda_device.cuh"

/* The device's own summary of a call's rows, by lib/backend/attn_hint.h's fold: each thread folds a strided share of
 * the Tq + Tk rows, each block joins its threads' in shared memory and then into the call's summary `acc` in
 * global memory (atomics: the join is min / max / and, so the order does not matter). */
static __global__ void cudnn_hint_rows_kernel(AttnHint *acc, const int32_t *pos_q, const int32_t *doc_q, int64_t Tq,
                                              const int32_t *pos_k, const int32_t *doc_k, int64_t Tk) {
    __shared__ AttnHint s;
    const int32_t q0 = Tq ? pos_q[0] : 0, k0 = Tk ? pos_k[0] : 0;
    if (threadIdx.x == 0) s = attn_hint_begin(q0, k0);
    __syncthreads();
    AttnHint h = attn_hint_begin(q0, k0);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < Tq + Tk; i += stride) {
        const int is_k = i >= Tq;
        const int64_t r = is_k ? i - Tq : i;
        attn_hint_add(&h, is_k, r, pos_q, doc_q, Tq, pos_k, doc_k, Tk);
    }
    atomicMin(&s.doc_min, h.doc_min), atomicMax(&s.doc_max, h.doc_max);
    atomicAnd(&s.q_consec, h.q_consec), atomicAnd(&s.k_consec, h.k_consec);
    atomicMin(&s.pos_q_min, h.pos_q_min), atomicMax(&s.pos_k_max, h.pos_k_max);
    atomicAnd(&s.rising, h.rising), atomicAnd(&s.same_pos, h.same_pos);
    atomicAdd(&s.runs, h.runs), atomicMax(&s.run_max, h.run_max), atomicAnd(&s.runs_clean, h.runs_clean);
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicMin(&acc->doc_min, s.doc_min), atomicMax(&acc->doc_max, s.doc_max);
        atomicAnd(&acc->q_consec, s.q_consec), atomicAnd(&acc->k_consec, s.k_consec);
        atomicMin(&acc->pos_q_min, s.pos_q_min), atomicMax(&acc->pos_k_max, s.pos_k_max);
        atomicAnd(&acc->rising, s.rising), atomicAnd(&acc->same_pos, s.same_pos);
        atomicAdd(&acc->runs, s.runs), atomicMax(&acc->run_max, s.run_max);
        atomicAnd(&acc->runs_clean, s.runs_clean);
    }
}

/* compares the device's summary with the caller's hint (passed by value), records the first field that
 * differs in the error word, and leaves `acc` empty for the next call */
static __global__ void cudnn_hint_compare_kernel(AttnHint *acc, AttnHint hint, const int32_t *pos_q, int64_t Tq,
                                                 const int32_t *pos_k, int64_t Tk, int *err) {
    AttnHint rows = *acc;
    rows.pos_q0 = Tq ? pos_q[0] : 0, rows.pos_k0 = Tk ? pos_k[0] : 0;
    const int f = attn_hint_differs(&hint, &rows);
    if (f >= 0) cuda_raise(err, CUDA_ERR_ATTN_HINT, f, attn_hint_field(&rows, f));
    *acc = attn_hint_begin(0, 0);
}

static AttnHint *cudnn_hint_acc;

extern "C" void cuda_cudnn_hint_check(const AttnHint *hint, const int32_t *pos_q, const int32_t *doc_pos_q,
                                      int64_t Tq, const int32_t *pos_k, const int32_t *doc_pos_k, int64_t Tk) {
    if (!cudnn_hint_acc) {
        const AttnHint empty = attn_hint_begin(0, 0);
        cudnn_hint_acc = (AttnHint *)cuda_internal_alloc(sizeof(AttnHint));
        CUDA_CHECK(cudaMemcpy(cudnn_hint_acc, &empty, sizeof empty, cudaMemcpyHostToDevice)); /* once */
    }
    const int64_t n = Tq + Tk;
    const int threads = 256;
    const unsigned blocks = (unsigned)(n / (threads * 16) + 1 < 264 ? n / (threads * 16) + 1 : 264);
    cudnn_hint_rows_kernel<<<blocks, threads, 0, cuda_stream()>>>(cudnn_hint_acc, pos_q, doc_pos_q, Tq, pos_k,
                                                                 doc_pos_k, Tk);
    CUDA_LAUNCH_CHECK();
    cudnn_hint_compare_kernel<<<1, 1, 0, cuda_stream()>>>(cudnn_hint_acc, *hint, pos_q, Tq, pos_k, Tk,
                                                          cuda_error_word());
    CUDA_LAUNCH_CHECK();
}

static void *cudnn_ws;
static size_t cudnn_ws_bytes;

extern "C" void *cuda_cudnn_workspace(size_t bytes) {
    if (bytes > cudnn_ws_bytes) {
        if (cudnn_ws) {
            CUDA_CHECK(cudaStreamSynchronize(cuda_stream())); /* growth only: the old one may be in use */
            cuda_internal_free(cudnn_ws, cudnn_ws_bytes);
        }
        cudnn_ws = cuda_internal_alloc(bytes);
        cudnn_ws_bytes = bytes;
    }
    return cudnn_ws;
}

extern "C" size_t cuda_cudnn_workspace_room(void) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b + cudnn_ws_bytes;
}

static __global__ void cudnn_transpose_kernel(float *dst, const float *src, int64_t Tq, int nh, int to_lse) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= Tq * nh) return;
    const int64_t t = i / nh;
    const int h = (int)(i % nh);
    if (to_lse) dst[cdg_lse_at(t, h, nh)] = src[cdg_stats_at(t, h, Tq)];
    else dst[cdg_stats_at(t, h, Tq)] = src[cdg_lse_at(t, h, nh)];
}

extern "C" void cuda_cudnn_stats_to_lse(float *lse, const float *stats, int64_t Tq, int nh) {
    const int64_t n = Tq * nh;
    if (!n) return;
    cudnn_transpose_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(lse, stats, Tq, nh, 1);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_cudnn_lse_to_stats(float *stats, const float *lse, int64_t Tq, int nh) {
    const int64_t n = Tq * nh;
    if (!n) return;
    cudnn_transpose_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(stats, lse, Tq, nh, 0);
    CUDA_LAUNCH_CHECK();
}

static __global__ void cudnn_add_bf16_kernel(float *dst, const __nv_bfloat16 *src, int64_t rows, int cols, int ld_dst,
                                             int ld_src) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    const int64_t r = i / cols;
    const int c = (int)(i % cols);
    dst[r * ld_dst + c] += __bfloat162float(src[r * ld_src + c]);
}

extern "C" void cuda_cudnn_add_bf16(float *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src) {
    const int64_t n = rows * cols;
    if (!n) return;
    cudnn_add_bf16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(
        dst, (const __nv_bfloat16 *)src, rows, cols, ld_dst, ld_src);
    CUDA_LAUNCH_CHECK();
}

/* ---- variable length ---- */

enum { VARLEN_THREADS = 1024, VARLEN_NOFF = 6 };

typedef struct {
    int64_t *off[VARLEN_NOFF];
    int64_t mult[VARLEN_NOFF];
} VarlenOut;

/* 1 when row i begins a document run */
static __device__ int varlen_starts(const int32_t *pos, const int32_t *doc_pos, int64_t i) {
    return i == 0 || pos[i] - doc_pos[i] != pos[i - 1] - doc_pos[i - 1];
}

/* One block: each thread counts the run starts in its contiguous share of the rows, a block scan numbers them,
 * each start's number b records its row in off[0][b] (scaled afterwards); then every b < batch gets its
 * length and offsets. */
static __global__ void cudnn_varlen_rows_kernel(int32_t *seq, VarlenOut o, int noff, const int32_t *pos,
                                                const int32_t *doc_pos, int64_t T, int batch, int64_t smax) {
    __shared__ int64_t scan[VARLEN_THREADS];
    __shared__ int64_t nruns;
    const int tid = threadIdx.x;
    const int64_t per = (T + VARLEN_THREADS - 1) / VARLEN_THREADS, lo = tid * per, hi = lo + per < T ? lo + per : T;
    int64_t mine = 0;
    for (int64_t i = lo; i < hi; i++) mine += varlen_starts(pos, doc_pos, i);
    scan[tid] = mine;
    __syncthreads();
    for (int d = 1; d < VARLEN_THREADS; d *= 2) { /* inclusive scan (Hillis-Steele) */
        const int64_t add = tid >= d ? scan[tid - d] : 0;
        __syncthreads();
        scan[tid] += add;
        __syncthreads();
    }
    if (tid == VARLEN_THREADS - 1) nruns = scan[tid];
    int64_t b = scan[tid] - mine; /* this thread's first run number */
    int64_t *start = o.off[0];    /* run starts in rows, scaled below */
    for (int64_t i = lo; i < hi; i++)
        if (varlen_starts(pos, doc_pos, i)) {
            if (b < batch) start[b] = i;
            b++;
        }
    __syncthreads();
    const int64_t n = nruns < batch ? nruns : batch;
    for (int64_t j = tid; j < batch; j += VARLEN_THREADS) {
        const int64_t s = j < n ? start[j] : T, e = j + 1 < n ? start[j + 1] : T;
        seq[j] = (int32_t)(e - s < smax ? e - s : smax); /* longer only under a wrong hint (reported) */
    }
    __syncthreads(); /* every length read its starts before they are scaled */
    for (int64_t j = tid; j <= batch; j += VARLEN_THREADS) {
        const int64_t s = j < n ? start[j] : T;
        for (int i = noff - 1; i >= 0; i--) o.off[i][j] = s * o.mult[i];
    }
}

extern "C" void cuda_cudnn_varlen_rows(int32_t *seq, int64_t *const *off, const int64_t *mult, int noff,
                                       const int32_t *pos, const int32_t *doc_pos, int64_t T, int batch,
                                       int64_t smax) {
    RS_CHECK(noff >= 1 && noff <= VARLEN_NOFF && batch >= 1 && T >= 1, "cuda_cudnn_varlen_rows: %d offsets, batch %d, "
             "%lld rows", noff, batch, (long long)T);
    VarlenOut o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < noff; i++) o.off[i] = off[i], o.mult[i] = mult[i];
    cudnn_varlen_rows_kernel<<<1, VARLEN_THREADS, 0, cuda_stream()>>>(seq, o, noff, pos, doc_pos, T, batch, smax);
    CUDA_LAUNCH_CHECK();
}

static __global__ void cudnn_copy_f32_kernel(float *dst, const float *src, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

extern "C" void cuda_cudnn_copy_f32(float *dst, const float *src, int64_t n) {
    if (n <= 0) return;
    cudnn_copy_f32_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_stream()>>>(dst, src, n);
    CUDA_LAUNCH_CHECK();
}
