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
 * positions the key rows' and rising (a ring rank's own two fragments in one call); or, with several
 * documents, "top-left causal within each document" (CDG_ROUTE_VARLEN, below). Every other call runs our
 * kernel. The route reads the caller's AttnHint (lib/backend/attn_hint.h), so choosing never waits for the
 * GPU. Design: docs/design/attention-kernels.md.
 *
 * Variable length (packed documents): a causal call whose q rows are its k rows (a one-GPU call, a ring
 * rank's diagonal piece), positions consecutive, split into document runs that each begin their document
 * is cuDNN's padded, ragged form: a batch of B sequences, sequence b = run b, its length in seq_len tensors
 * (B,1,1,1) that mask rows and columns past it (GEN_INDEX < seq_len, LOGICAL_AND, select -inf) and cut each
 * product (the matmuls' M/N/K overrides), and its first element in every bound tensor given by a ragged
 * offset tensor (B+1 int64 element offsets: run start x row stride), so q, k, v, out, dout stay in place.
 * Stats is ragged too, laid (rows, nh): our lse itself; softmax_sum and the dq accumulator are ragged in the
 * workspace, and with GQA the per-head dK, dV before the group sum are bound ragged workspace tensors (the
 * form cudnn-frontend emits with max_total_seq_len; cuDNN scales their offsets by the group size itself).
 * The backward's gradients mirror their inputs exactly: dQ (and the dq accumulator) has Q's strides and Q's
 * offset tensor, dK and dV have K's and V's (our k|v row stride, in workspace rows as wide as k's rows), dO
 * has O's, the per-head dK, dV dK's strides times the group size; the only form NVIDIA's ragged backward tests
 * use (cudnn-frontend test/python/sdpa/fp16.py). Compact dK, dV rows with offset tensors of their own gave
 * wrong dK, dV and illegal addresses on cuDNN 9.14 (issue 38: its engine places them by K's offsets or
 * strides; test_attn_cudnn_graph.c's attn_cudnn_graph_varlen checks the mirroring).
 * The plan key holds B and the longest length as powers of two (CdgKey.batch, Tq = Tk): a training run's
 * batches share a few plans instead of one each; sequences past the call's runs have length 0. The device
 * computes lengths and offsets from the call's pos/doc_pos (cuda_attention_cudnn_glue.cu), the host only
 * the bucket (the hint's runs and run_max). A call whose buckets would launch far more empty tiles than rows
 * (cdg_varlen_shape's limit) runs ours. The backward graph is built and checked here, but the cuda entries
 * send only the forward of such a call to cuDNN (cuda_attention_cudnn.c cd_route: the backward was wrong on
 * the GPU); its backward runs ours.
 *
 * Callers: kernels/cuda/cuda_attention_cudnn.c, kernels/cuda/cuda_backend_table.c (cdg_route_fast),
 * kernels/cuda/runtime_cuda.c (cdg_workspace, for lib/plan/plan.c), tests/unit/test_attn_cudnn_graph.c, tests/unit/test_attn_hint.c, tests/cp/cp_check.c.
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
    CDA_DATA_FLOAT = 0, CDA_DATA_INT32 = 4, CDA_DATA_BFLOAT16 = 9, CDA_DATA_INT64 = 10, CDA_DATA_BOOLEAN = 11,
    CDA_POINTWISE_ADD = 0, CDA_POINTWISE_MUL = 1, CDA_POINTWISE_DIV = 6, CDA_POINTWISE_SUB = 9,
    CDA_POINTWISE_EXP = 13, CDA_POINTWISE_LOG = 15, CDA_POINTWISE_IDENTITY = 21, CDA_POINTWISE_CMP_GE = 303,
    CDA_POINTWISE_CMP_LT = 304, CDA_POINTWISE_LOGICAL_AND = 400, CDA_POINTWISE_GEN_INDEX = 501,
    CDA_POINTWISE_BINARY_SELECT = 601,
    CDA_REDUCE_TENSOR_ADD = 0, CDA_REDUCE_TENSOR_MAX = 3,
};

enum { CDG_MAX_TENSORS = 72, CDG_MAX_OPS = 56 };

typedef enum { CDG_MATMUL, CDG_POINTWISE, CDG_REDUCTION, CDG_RESHAPE } CdgOpKind;

typedef struct {
    int64_t uid;
    int32_t dtype;            /* CDA_DATA_* */
    int64_t dim[4], stride[4];
    uint8_t is_virtual;       /* lives only inside the fused kernel */
    uint8_t by_value;         /* a host scalar passed at execution (scale, -inf, 1) */
    int64_t ragged_uid;       /* variable length: the uid of the tensor of its sequences' element offsets; 0 none */
    const char *name;
} CdgTensor;

typedef struct {
    CdgOpKind kind;
    int32_t mode;             /* pointwise: CDA_POINTWISE_*; reduction: CDA_REDUCE_TENSOR_* */
    int32_t comp;             /* compute type / math precision: CDA_DATA_* */
    int64_t axis;             /* GEN_INDEX: the dimension indexed; else -1 */
    int x, b, t, y;           /* tensor indexes, -1 unused; matmul: A = x, B = b, C = y; select: y = t ? x : b */
    const char *name;
    int mo, no, ko;           /* matmul: the tensors of per-sequence M, N, K (variable length); -1 none */
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
    CDG_UID_SCALE, CDG_UID_NEG_INF, CDG_UID_ONE, CDG_UID_SOFTMAX_SUM, CDG_UID_DQ_ACCUM,
    /* variable length: sequence lengths (int32 (B,1,1,1)), ragged offsets (int64 (B+1,1,1,1), element offsets
     * of each sequence's first row in: q, dq and the dq accumulator; k, v, dk, dv (and GQA's per-head dK, dV,
     * which cuDNN scales by the group size); out and dout; Stats and softmax_sum (rows, nh)), and GQA's
     * per-head dK, dV (rows of ldk x group) */
    CDG_UID_SEQ_Q, CDG_UID_SEQ_KV, CDG_UID_OFF_Q, CDG_UID_OFF_KV, CDG_UID_OFF_O, CDG_UID_OFF_STATS,
    CDG_UID_DK_FULL, CDG_UID_DV_FULL, CDG_UID_VIRTUAL = 100
} CdgUid;

/* the ragged offset tensors in the order of CdgUid (cdg_varlen_mults gives each one's row stride); the
 * forward and the backward bind the same four */
enum { CDG_NOFF = 4 };

/* One graph: everything that changes its tensors (the plan cache's key). */
typedef struct {
    int64_t Tq, Tk;
    int32_t nh, nkv, hd;
    int32_t ldq, ldk, ldo;    /* row strides (elements) of q, of k and v, of out and dout */
    int32_t causal;           /* 1: top-left causal; 0: every key */
    int32_t bwd;              /* 0: forward; 1: backward */
    int32_t deterministic;    /* backward: dQ without the fp32 accumulator (see the header) */
    int32_t batch;            /* 0: one sequence (Tq, Tk rows); > 0: variable length, this many sequences of at
                               * most Tq = Tk rows each, causal (top-left) within each */
} CdgKey;

/* The graph of key k (forward or backward by k->bwd). Bound tensors: forward Q, K, V, O (bf16), Stats
 * (fp32 (nh, Tq) dense), scale and -inf; backward also dO, dQ (bf16 (Tq, nh*hd) dense), dK, dV (bf16 (Tk,
 * nkv*hd) dense each), softmax_sum (fp32 (nh, Tq)), dq_accum (fp32 (nh, Tq, hd); not deterministic) and 1.
 * Variable length (batch > 0, causal, not deterministic): the same over (batch, heads, Tq, .) with every bound
 * row tensor ragged; Stats, softmax_sum (fp32 (rows, nh)); dQ (bf16) and dq_accum (fp32) in rows of ldq, dK and
 * dV (bf16) in rows of ldk, each ragged by its input's offsets; the lengths, the offsets, and with GQA dK_full,
 * dV_full (bf16, rows of ldk x nh / nkv). */
void cdg_build(CdgGraph *g, const CdgKey *k);
/* Consistency of a graph: every virtual tensor written once before it is read, every bound tensor read or
 * written, matmul and broadcast shapes, unique uids; ragged offsets and length overrides name int64 (B+1,1,1,1)
 * and int32 (B,1,1,1) bound tensors built before their users. 0, or -1 with a message in err. */
int  cdg_check(const CdgGraph *g, char *err, size_t n);
/* the index of the tensor with this uid, -1 if none */
int  cdg_find(const CdgGraph *g, int64_t uid);

/* ---- the route ---- */
typedef enum { CDG_ROUTE_OURS, CDG_ROUTE_DENSE, CDG_ROUTE_CAUSAL, CDG_ROUTE_VARLEN, CDG_ROUTE_COUNT } CdgRoute;

/* GQA's variable-length backward keeps per-head dK and dV (4 rows nh hd bytes each, cudnn-frontend's figure):
 * GQA calls of more rows run ours, so the longest calls (the 1M configs' ring calls) keep their workspace */
enum { CDG_VARLEN_GQA_MAX_ROWS = 131072 };
/* at most this many sequences x heads per variable-length call (a launch dimension of cuDNN's kernels may
 * hold their product: conservative, well below 65535; more and smaller documents run ours) */
enum { CDG_VARLEN_MAX_BATCH_HEADS = 32768 };
/* 1 when a call of this many rows and heads may take the variable-length route (the GQA bound above) */
int cdg_varlen_rows_ok(int64_t rows, int nh, int nkv);
/* 1 when a variable-length call's backward may run on cuDNN too (head dims <= 128). At hd 256 cuDNN 9.14's
 * ragged backward gives wrong dQ, dK, dV (relative errors 0.23-0.53 in test_cuda's
 * manual_cuda_attention_cudnn_varlen_bwd_hd256, the forward right): that backward runs ours, taking the
 * forward's LSE as it is (kernels/cuda/cuda_attention_cudnn.c cd_route; lib/plan counts no workspace for it) */
int cdg_varlen_backward_ok(int hd);

/* The variable-length plan's buckets for a call of T rows with the hint's runs and run_max: *batch = runs
 * rounded up to a power of two (>= 2), *smax = run_max rounded up to a power of two (>= 64). 0, or -1 when
 * batch x smax exceeds 16 max(T, 4096) (more empty tiles than the call is worth: ours runs it). */
int cdg_varlen_shape(const AttnHint *h, int64_t T, int32_t *batch, int64_t *smax);
/* the row stride (elements) that each ragged offset tensor (CDG_UID_OFF_Q + i) multiplies a run's start by */
void cdg_varlen_mults(int64_t mult[CDG_NOFF], const CdgKey *k);

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
 * each); variable length: the gradients in their inputs' row strides (dq accumulator 4 Tq ldq, dq 2 Tq ldq,
 * dk and dv interleaved in one region of 2 Tk ldk, dv nkv hd after dk, as the model's k and v: the variable-
 * length backward takes only calls whose v is k + nkv hd, ldk >= 2 nkv hd). ---- */
typedef struct {
    int64_t stats, softmax_sum, dq_accum, dq, dk, dv; /* offsets; -1 where the call has no such region */
    int64_t seq, off[CDG_NOFF], dk_full, dv_full;     /* variable length (batch > 0): the lengths (4 batch), the
                                                       * offset tensors (8 (batch + 1) each), GQA's per-head dk, dv
                                                       * (bf16 rows of ldk nh / nkv: 2 Tk ldk nh / nkv each) */
    int64_t bytes;                                    /* the end of the last region */
} CdgWorkspace;

/* batch: 0 for the one-sequence graphs (ldq, ldk unused: their gradients are dense); the variable-length plan's
 * batch (cdg_varlen_shape) for its call of Tq = Tk rows (its real rows: every region is sized by rows, not by
 * the bucket) with q's row stride ldq and k's (and v's) ldk */
void cdg_workspace(CdgWorkspace *w, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int bwd,
                   int deterministic, int batch);

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
