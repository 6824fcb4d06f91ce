/*
 * attention.cuh — what the files of the cuda attention share (kernels/cuda/attention/): the tile size,
 * AttnParams (everything a kernel reads, passed by value), the bitmask helpers the kernels walk live
 * tiles with, and the host helpers of tiles.cu (workspace, argument checks, the tile-pair plan, tensor
 * maps). The entries and the design: forward.cu, backward.cu, merge.cu, tiles.cu.
 */
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h> /* CUtensorMap and its enums (the encoder is fetched through the runtime) */

#include "cuda_common.h"
#include "cuda_ptx.h"

#define ATTN_TILE    64  /* rows of a query tile and of a key tile; the granularity of skipping */
#define ATTN_LOG2E   1.4426950408889634f
#define ATTN_LN2     0.6931471805599453f
#define AWG_THREADS  384 /* forward and backward blocks: warpgroup 0 produces (TMA loads), 1 and 2 consume */

/* Everything a kernel needs; passed by value. Pointers to bf16 are `const bf16 *` of the head's
 * column 0 of row 0; row r of a tensor with leading dimension ld starts ld elements after row r-1. */
typedef struct {
    const bf16 *q;       /* (Tq,ldq) nh heads of hd */
    const bf16 *k, *v;   /* (Tk,ldk) nkv heads of hd */
    const bf16 *out;     /* (Tq,ldo) final output (backward) */
    const bf16 *dout;    /* (Tq,ldo) */
    bf16 *out_w;         /* (Tq,ldo) output (forward) */
    float *lse_w;        /* (Tq,nh) output (forward) */
    float *dq;           /* (Tq,ldq) += */
    float *dk, *dv;      /* (Tk,ldk) += */
    const int32_t *pos_q, *doc_pos_q; /* (Tq) */
    const int32_t *pos_k, *doc_pos_k; /* (Tk) */
    const uint32_t *q_live, *q_part;  /* (nq,nkw) bitmasks over key tiles, one row per query tile */
    const uint32_t *k_live, *k_part;  /* (nk,nqw) bitmasks over query tiles, one row per key tile */
    const float *lse2, *D;            /* (nh,Tq_pad) backward row statistics */
    uint32_t *dq_sem;                 /* (nh,nq) backward: last key block (+1) that added to a dq tile */
    uint32_t *kv_sem;                 /* (nkv,nk,2) backward, GQA: heads that added to a (key block, consumer) of dk, dv */
    uint32_t *kb_started;             /* (nh,nk) backward throttle: 1 once the block of (head, key block) has begun */
    int dq_order;                     /* backward: 1 = dq adds in key-block order (reproducible), 0 = plain atomics */
    int Tq, Tk, Tq_pad;
    int nh, nkv, group;
    int ldq, ldk, ldo;
    int nq, nk, nqw, nkw;
    int causal;
    float scale, scale_log2; /* hd^-1/2 and hd^-1/2 log2(e) */
} AttnParams;

/* the first set bit >= `from` of a bitmask row of `nwords` words, or -1; uniform over the block */
static __device__ __forceinline__ int attn_next_live(const uint32_t *row, int nwords, int from) {
    int w = from >> 5;
    if (w >= nwords) return -1;
    uint32_t bits = __ldg(row + w) & (0xffffffffu << (from & 31));
    while (!bits) {
        if (++w >= nwords) return -1;
        bits = __ldg(row + w);
    }
    return (w << 5) + __ffs(bits) - 1;
}

static __device__ __forceinline__ int attn_bit(const uint32_t *row, int i) { return (__ldg(row + (i >> 5)) >> (i & 31)) & 1; }

static __device__ __forceinline__ float attn_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
static __device__ __forceinline__ float attn_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* the highest set bit below `before` in a bitmask row, or -1 */
static __device__ __forceinline__ int attn_prev_live(const uint32_t *row, int before) {
    if (before <= 0) return -1;
    int w = (before - 1) >> 5;
    const int b = before - 32 * w; /* 1..32 bits of word w count */
    uint32_t m = __ldg(row + w) & (b == 32 ? 0xffffffffu : (1u << b) - 1u);
    for (;;) {
        if (m) return 32 * w + 31 - __clz(m);
        if (--w < 0) return -1;
        m = __ldg(row + w);
    }
}

/* ---- host helpers (tiles.cu) ---- */

/* the attention workspace: grown stream-ordered on cuda_stream(), never shrunk */
void *attn_workspace(size_t bytes);
/* n rounded up to 256 bytes */
size_t attn_align(size_t n);
int attn_aligned16(const void *p);
/* every argument of a forward / backward entry checked (RS_CHECK names `who`) */
void attn_check_args(const char *who, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo);
/* the backward's semaphore words: dq_sem (nh,nq), kv_sem (nkv,nk,2), kb_started (nh,nk) */
size_t attn_sem_count(const AttnParams *p);
/* fills the tile counts and bitmasks of p (and its semaphores when `bwd`) and launches the metadata kernels;
 * returns the workspace's lse2 / D area (bwd) or NULL */
float *attn_plan(AttnParams *p, int bwd);
AttnParams attn_params(const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q,
                       const int32_t *pos_k, const int32_t *doc_pos_k, int64_t Tq, int64_t Tk, int nh, int nkv, int hd,
                       int ldq, int ldk, int ldo, int causal);
/* a 2-d tensor map of bf16 (esize 2) or fp32 (esize 4) over `rows` rows of `cols` columns from `base` (row
 * stride ld elements): boxes of 128 bytes of columns (128-byte swizzle) by box_rows rows; rows past the end
 * read as zeros (and are dropped by a reduce) */
void attn_tmap_e(CUtensorMap *m, const void *base, int64_t rows, int cols, int ld, int box_rows, int esize);
void attn_tmap(CUtensorMap *m, const void *base, int64_t rows, int cols, int ld, int box_rows);

/* raise a kernel's dynamic shared-memory limit once */
template <typename K>
static void attn_smem_limit(K kernel, int bytes, int *done) {
    if (!*done) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        *done = 1;
    }
}

