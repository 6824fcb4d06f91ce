/*
 * cudnn_graph.h — cuDNN's fused attention (SDPA) as plain data, for the optional cuDNN route of the
 * block attention entries (device.attention_kernel): the tensors and operations of cuDNN's forward and
 * backward attention graphs laid over our row layouts, which calls cuDNN can take (the route), the
 * workspace layout and the LSE layout maps. Pure C with no cuDNN and no CUDA:
 * kernels/cuda/cuda_attention_cudnn.c lowers a graph into cuDNN backend descriptors;
 * tests/unit/test_attn_cudnn_graph.c checks shapes, strides, producer order and routes on the cpu.
 *
 * cuDNN 9's backend API has no single SDPA operation with a causal mask before 9.21; its fused attention
 * engines match a graph of primitive operations (matmul, pointwise, reduction, reshape), the "composite"
 * pattern cudnn-frontend emits, rebuilt here operation by operation. Every 4-d tensor is (batch 1, heads,
 * rows, cols) over our (T, ld) row matrices by strides (q {1, nh, Tq, hd} with strides {Tq ld, hd, ld, 1},
 * K^T {1, nkv, hd, Tk} with {Tk ld, hd, 1, ld}): no copies of q, k, v, out or dout.
 * Forward: S = Q K^T scale, [causal], Stats = rowmax + log rowsum (our LSE, laid out (nh, Tq)), O = P V.
 * Backward (given the FINAL merged out and lse): D = rowsum(dO O), P from S and Stats, dV = P^T dO,
 * dS = (dO V^T - D) P scale, dK = dS^T Q, dQ = dS K; GQA sums dK, dV over each group. dQ goes through an
 * fp32 accumulator the engine adds key blocks into in any order (not bitwise reproducible) or, for
 * cudnn_det, one dS K product per query block, whose workspace grows with Tq x Tk. Outputs are bf16.
 *
 * Route: a call goes to cuDNN only when its mask is exactly "all keys" or "top-left causal": one document
 * over all rows, and either not causal, or every key position <= every query position (the ring's dense
 * rectangles), or q and k positions consecutive from one start (a causal diagonal), or the query rows'
 * positions the key rows' and rising (a ring rank's own two fragments in one call). Every other call runs
 * our kernel. The route reads the caller's AttnHint (lib/backend/attn_hint.h), so choosing never waits for
 * the GPU. Design: docs/design/attention-kernels.md.
 *
 * Callers: kernels/cuda/cuda_attention_cudnn.c, kernels/cuda/cuda_backend_table.c (cdg_route_fast), lib/plan/plan.c
 * (cdg_workspace), tests/unit/test_attn_cudnn_graph.c, tests/unit/test_attn_hint.c, tests/cp/cp_check.c.
 */
#ifndef RS_ATTN_CUDNN_GRAPH_H
#define RS_ATTN_CUDNN_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "backend/attn_hint.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the cuDNN 9 ABI values the graph uses (cudnn_graph.h; the unit test compares them with the header
 * wherever it is installed). Written out so that ringscan builds without cuDNN's headers. ---- */
enum {
    CDA_DATA_FLOAT = 0, CDA_DATA_INT32 = 4, CDA_DATA_BFLOAT16 = 9, CDA_DATA_BOOLEAN = 11,
    CDA_POINTWISE_ADD = 0, CDA_POINTWISE_MUL = 1, CDA_POINTWISE_DIV = 6, CDA_POINTWISE_SUB = 9,
    CDA_POINTWISE_EXP = 13, CDA_POINTWISE_LOG = 15, CDA_POINTWISE_IDENTITY = 21, CDA_POINTWISE_CMP_GE = 303,
    CDA_POINTWISE_GEN_INDEX = 501, CDA_POINTWISE_BINARY_SELECT = 601,
    CDA_REDUCE_TENSOR_ADD = 0, CDA_REDUCE_TENSOR_MAX = 3,
};

enum { CDG_MAX_TENSORS = 48, CDG_MAX_OPS = 40 };

typedef enum { CDG_MATMUL, CDG_POINTWISE, CDG_REDUCTION, CDG_RESHAPE } CdgOpKind;

typedef struct {
    int64_t uid;
    int32_t dtype;            /* CDA_DATA_* */
    int64_t dim[4], stride[4];
    uint8_t is_virtual;       /* lives only inside the fused kernel */
    uint8_t by_value;         /* a host scalar passed at execution (scale, -inf, 1) */
    const char *name;
} CdgTensor;

typedef struct {
    CdgOpKind kind;
    int32_t mode;             /* pointwise: CDA_POINTWISE_*; reduction: CDA_REDUCE_TENSOR_* */
    int32_t comp;             /* compute type / math precision: CDA_DATA_* */
    int64_t axis;             /* GEN_INDEX: the dimension indexed; else -1 */
    int x, b, t, y;           /* tensor indexes, -1 unused; matmul: A = x, B = b, C = y; select: y = t ? x : b */
    const char *name;
} CdgOp;

typedef struct {
    CdgTensor t[CDG_MAX_TENSORS];
    int nt;
    CdgOp op[CDG_MAX_OPS];
    int nop;
} CdgGraph;

/* uids of the tensors a call binds (the variant pack); virtual tensors count up from CDG_UID_VIRTUAL */
typedef enum {
    CDG_UID_Q = 1, CDG_UID_K, CDG_UID_V, CDG_UID_O, CDG_UID_STATS, CDG_UID_DO, CDG_UID_DQ, CDG_UID_DK, CDG_UID_DV,
    CDG_UID_SCALE, CDG_UID_NEG_INF, CDG_UID_ONE, CDG_UID_SOFTMAX_SUM, CDG_UID_DQ_ACCUM, CDG_UID_VIRTUAL = 100
} CdgUid;

/* One graph: everything that changes its tensors (the plan cache's key). */
typedef struct {
    int64_t Tq, Tk;
    int32_t nh, nkv, hd;
    int32_t ldq, ldk, ldo;    /* row strides (elements) of q, of k and v, of out and dout */
    int32_t causal;           /* 1: top-left causal; 0: every key */
    int32_t bwd;              /* 0: forward; 1: backward */
    int32_t deterministic;    /* backward: dQ without the fp32 accumulator (see the header) */
} CdgKey;

/* The graph of key k (forward or backward by k->bwd). Bound tensors: forward Q, K, V, O (bf16), Stats
 * (fp32 (nh, Tq) dense), scale and -inf; backward also dO, dQ (bf16 (Tq, nh*hd) dense), dK, dV (bf16 (Tk,
 * nkv*hd) dense each), softmax_sum (fp32 (nh, Tq)), dq_accum (fp32 (nh, Tq, hd); not deterministic) and 1. */
void cdg_build(CdgGraph *g, const CdgKey *k);
/* Consistency of a graph: every virtual tensor written once before it is read, every bound tensor read or
 * written, matmul and broadcast shapes, unique uids. 0, or -1 with a message in err. */
int  cdg_check(const CdgGraph *g, char *err, size_t n);
/* the index of the tensor with this uid, -1 if none */
int  cdg_find(const CdgGraph *g, int64_t uid);

/* ---- the route ---- */
typedef enum { CDG_ROUTE_OURS, CDG_ROUTE_DENSE, CDG_ROUTE_CAUSAL } CdgRoute;

/* cuDNN dense, cuDNN top-left causal, or ours, from the caller's summary of the call's rows (lib/backend/attn_hint.h;
 * computed on the host: no read-back); why: a short reason, for messages */
CdgRoute cdg_route(const AttnHint *h, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int causal, const char **why);
/* 1 when cdg_route sends the call to cuDNN: the route's Backend attention_fast (kernels/cuda/cuda_backend_table.c; on
 * the cpu, tests/cp/cp_check.c's ring check of lib/cp/cp_ring.c's auto choice) */
int      cdg_route_fast(const AttnHint *h, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int causal);

/* ---- the workspace of one call beyond cuDNN's own plan workspace (kernels/cuda/cuda_attention_cudnn.c
 * carves it; lib/plan/plan.c counts it): byte offsets from the end of cuDNN's part, each region on
 * 256 bytes. Forward: Stats (4 Tq nh). Backward: Stats and softmax_sum (4 Tq nh each), cudnn (not
 * deterministic) the fp32 dq accumulator (4 Tq nh hd), the bf16 dq (2 Tq nh hd), dk and dv (2 Tk nkv hd
 * each). ---- */
typedef struct {
    int64_t stats, softmax_sum, dq_accum, dq, dk, dv; /* offsets; -1 where the call has no such region */
    int64_t bytes;                                    /* the end of the last region */
} CdgWorkspace;

void cdg_workspace(CdgWorkspace *w, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int bwd, int deterministic);

/* cuDNN's own plan workspace for the deterministic backward (cudnn_det): one bf16 value per (query, key, head),
 * Tq Tk nh 2 bytes, what every deterministic engine cuDNN 9.14 offered asked at hd 128 (32 GiB at 32k rows and 16
 * heads). The real figure is read off the plan
 * when it is built (cuda_attention_cudnn.c); this estimate is what `ringscan plan` counts for cudnn_det. */
int64_t cdg_det_plan_bytes(int64_t Tq, int64_t Tk, int nh);

/* ---- the LSE layouts: cuDNN's Stats (nh, Tq) and our lse (Tq, nh) hold the same values (also used by the
 * transposes of kernels/cuda/cuda_attention_cudnn_glue.cu, hence host and device) ---- */
#ifdef __CUDACC__
#define CDG_HOST_DEVICE __host__ __device__
#else
#define CDG_HOST_DEVICE
#endif
static inline CDG_HOST_DEVICE int64_t cdg_stats_at(int64_t t, int h, int64_t Tq) { return (int64_t)h * Tq + t; }
static inline CDG_HOST_DEVICE int64_t cdg_lse_at(int64_t t, int h, int nh) { return t * nh + h; }
void cdg_stats_to_lse_host(float *lse /* (Tq,nh) */, const float *stats /* (nh,Tq) */, int64_t Tq, int nh);
void cdg_lse_to_stats_host(float *stats /* (nh,Tq) */, const float *lse /* (Tq,nh) */, int64_t Tq, int nh);

#ifdef __cplusplus
}
#endif

#endif
