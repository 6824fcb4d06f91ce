/*
 * test_attn_cudnn_graph.c — the cpu-testable half of the cuDNN attention route
 * (kernels/cuda/attention/cudnn_graph.c, issue 19): run by build/test_ops under pytest, no
 * GPU and no cuDNN needed.
 *
 *   attn_cudnn_abi_values     the ABI numbers written out in attention/cudnn_graph.h and
 *                             kernels/cuda/cuda_cudnn_abi.h equal cuDNN's own
 *                             (cudnn_graph.h), wherever that header is installed (skipped where not)
 *   attn_cudnn_graph_layouts  every graph (forward/backward, MHA/GQA, causal or not, both backward
 *                             forms, dense and strided rows, T not a multiple of any tile) passes the
 *                             consistency check, and each bound tensor's (b, h, row, col) element lies
 *                             where our row layout keeps it: element (t, h, d) at t*ld + h*hd + d
 *   attn_cudnn_graph_varlen   the variable-length graphs (packed documents: batch of sequences, forward
 *                             and backward, MHA and GQA, hd 64..256, dense and strided rows) pass the check;
 *                             every bound row tensor is ragged by the offsets whose row stride
 *                             (cdg_varlen_mults) is the tensor's own, with (head, row, col) strides of our
 *                             row layout; Stats and softmax_sum are laid (rows, nh) (our lse); every
 *                             product is cut by the lengths; one padding and one causal select per graph;
 *                             the backward's gradients mirror their inputs (dQ and dq_accum Q's strides
 *                             and offset tensor, dK K's, dV V's, dO O's, the per-head dK, dV dK's strides
 *                             times the group size): cuDNN 9.14 placed compact dK, dV with offsets of
 *                             their own wrongly (issue 38)
 *   attn_cudnn_graph_must_fail  the check catches an operation moved before its producer, a
 *                             mismatched product, a shared uid, a ragged offset tensor missing or of the
 *                             wrong shape, and a length override of the wrong type
 *   attn_cudnn_route          on ring-shaped metadata (zigzag fragments, random document cuts), every
 *                             call routed to cuDNN has exactly our mask (same document, causal by pos)
 *                             under cuDNN's (all keys, top-left causal, or top-left causal within each
 *                             document run for variable length), and the ring's plain steps (the causal
 *                             diagonal, the dense rectangle) do go to cuDNN; packed documents of a
 *                             one-GPU call go to variable length (2 documents, 16 of random lengths, one
 *                             long and many short, a document of one row), with buckets that hold every
 *                             run; not when a run does not begin its document, the query rows are not
 *                             the key rows, the call is not causal, or the buckets are too uneven
 *   attn_cudnn_graph_evaluate the graphs evaluated op by op in double precision by cuDNN's semantics
 *                             (ragged rows, lengths cutting each product, broadcasting, grouped reductions,
 *                             reshape views; te_run): the one-document causal graph (cuDNN runs it today:
 *                             the evaluator's own check) and the variable-length ones over packed documents
 *                             (GQA 4/2, MQA 4/1, MHA with the first document begun before the call, a
 *                             padding sequence of length 0; strided q) with the lengths and offsets the
 *                             device computes: out, Stats (as our lse), dq, dk, dv equal the cpu oracle's
 *   attn_cudnn_lse_convention cuDNN's Stats (rowmax + natural log of the row sum of exp, in (nh, Tq)),
 *                             computed in float64 from the definition, mapped by cdg_stats_to_lse_host,
 *                             equals the cpu oracle's lse within 1e-6; the two maps invert each other
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/cudnn_graph.h"
#include "cpu_kernels.h"
#include "cuda_cudnn_abi.h"
#include "test_util.h"

#if defined(__has_include)
#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define TEST_HAVE_CUDNN_HEADER 1
#endif
#endif

TEST(attn_cudnn_abi_values) {
#ifdef TEST_HAVE_CUDNN_HEADER
    struct {
        const char *name;
        long ours, theirs;
    } v[] = {
        {"DATA_FLOAT", CDA_DATA_FLOAT, CUDNN_DATA_FLOAT},
        {"DATA_INT32", CDA_DATA_INT32, CUDNN_DATA_INT32},
        {"DATA_BFLOAT16", CDA_DATA_BFLOAT16, CUDNN_DATA_BFLOAT16},
        {"DATA_BOOLEAN", CDA_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN},
        {"DATA_INT64", CDA_DATA_INT64, CUDNN_DATA_INT64},
        {"POINTWISE_CMP_LT", CDA_POINTWISE_CMP_LT, CUDNN_POINTWISE_CMP_LT},
        {"POINTWISE_LOGICAL_AND", CDA_POINTWISE_LOGICAL_AND, CUDNN_POINTWISE_LOGICAL_AND},
        {"ATTR_TENSOR_RAGGED_OFFSET_DESC", CDA_ATTR_TENSOR_RAGGED_OFFSET_DESC, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC},
        {"ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC", CDA_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC,
         CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC},
        {"ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC", CDA_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
         CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC},
        {"ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC", CDA_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC,
         CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC},
        {"POINTWISE_ADD", CDA_POINTWISE_ADD, CUDNN_POINTWISE_ADD},
        {"POINTWISE_MUL", CDA_POINTWISE_MUL, CUDNN_POINTWISE_MUL},
        {"POINTWISE_DIV", CDA_POINTWISE_DIV, CUDNN_POINTWISE_DIV},
        {"POINTWISE_SUB", CDA_POINTWISE_SUB, CUDNN_POINTWISE_SUB},
        {"POINTWISE_EXP", CDA_POINTWISE_EXP, CUDNN_POINTWISE_EXP},
        {"POINTWISE_LOG", CDA_POINTWISE_LOG, CUDNN_POINTWISE_LOG},
        {"POINTWISE_IDENTITY", CDA_POINTWISE_IDENTITY, CUDNN_POINTWISE_IDENTITY},
        {"POINTWISE_CMP_GE", CDA_POINTWISE_CMP_GE, CUDNN_POINTWISE_CMP_GE},
        {"POINTWISE_GEN_INDEX", CDA_POINTWISE_GEN_INDEX, CUDNN_POINTWISE_GEN_INDEX},
        {"POINTWISE_BINARY_SELECT", CDA_POINTWISE_BINARY_SELECT, CUDNN_POINTWISE_BINARY_SELECT},
        {"REDUCE_TENSOR_ADD", CDA_REDUCE_TENSOR_ADD, CUDNN_REDUCE_TENSOR_ADD},
        {"REDUCE_TENSOR_MAX", CDA_REDUCE_TENSOR_MAX, CUDNN_REDUCE_TENSOR_MAX},
        {"STATUS_SUCCESS", CDA_STATUS_SUCCESS, CUDNN_STATUS_SUCCESS},
        {"BACKEND_POINTWISE_DESCRIPTOR", CDA_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_BACKEND_POINTWISE_DESCRIPTOR},
        {"BACKEND_ENGINE_DESCRIPTOR", CDA_BACKEND_ENGINE_DESCRIPTOR, CUDNN_BACKEND_ENGINE_DESCRIPTOR},
        {"BACKEND_ENGINECFG_DESCRIPTOR", CDA_BACKEND_ENGINECFG_DESCRIPTOR, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR},
        {"BACKEND_ENGINEHEUR_DESCRIPTOR", CDA_BACKEND_ENGINEHEUR_DESCRIPTOR, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR},
        {"BACKEND_EXECUTION_PLAN_DESCRIPTOR", CDA_BACKEND_EXECUTION_PLAN_DESCRIPTOR, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR},
        {"BACKEND_OPERATION_POINTWISE_DESCRIPTOR", CDA_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR},
        {"BACKEND_OPERATIONGRAPH_DESCRIPTOR", CDA_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR},
        {"BACKEND_VARIANT_PACK_DESCRIPTOR", CDA_BACKEND_VARIANT_PACK_DESCRIPTOR, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR},
        {"BACKEND_TENSOR_DESCRIPTOR", CDA_BACKEND_TENSOR_DESCRIPTOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR},
        {"BACKEND_MATMUL_DESCRIPTOR", CDA_BACKEND_MATMUL_DESCRIPTOR, CUDNN_BACKEND_MATMUL_DESCRIPTOR},
        {"BACKEND_OPERATION_MATMUL_DESCRIPTOR", CDA_BACKEND_OPERATION_MATMUL_DESCRIPTOR, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR},
        {"BACKEND_REDUCTION_DESCRIPTOR", CDA_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_BACKEND_REDUCTION_DESCRIPTOR},
        {"BACKEND_OPERATION_REDUCTION_DESCRIPTOR", CDA_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR},
        {"BACKEND_OPERATION_RESHAPE_DESCRIPTOR", CDA_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR},
        {"TYPE_HANDLE", CDA_TYPE_HANDLE, CUDNN_TYPE_HANDLE},
        {"TYPE_DATA_TYPE", CDA_TYPE_DATA_TYPE, CUDNN_TYPE_DATA_TYPE},
        {"TYPE_BOOLEAN", CDA_TYPE_BOOLEAN, CUDNN_TYPE_BOOLEAN},
        {"TYPE_INT64", CDA_TYPE_INT64, CUDNN_TYPE_INT64},
        {"TYPE_FLOAT", CDA_TYPE_FLOAT, CUDNN_TYPE_FLOAT},
        {"TYPE_VOID_PTR", CDA_TYPE_VOID_PTR, CUDNN_TYPE_VOID_PTR},
        {"TYPE_HEUR_MODE", CDA_TYPE_HEUR_MODE, CUDNN_TYPE_HEUR_MODE},
        {"TYPE_NUMERICAL_NOTE", CDA_TYPE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE},
        {"TYPE_POINTWISE_MODE", CDA_TYPE_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE},
        {"TYPE_BACKEND_DESCRIPTOR", CDA_TYPE_BACKEND_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR},
        {"TYPE_REDUCTION_OPERATOR_TYPE", CDA_TYPE_REDUCTION_OPERATOR_TYPE, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE},
        {"ATTR_POINTWISE_MODE", CDA_ATTR_POINTWISE_MODE, CUDNN_ATTR_POINTWISE_MODE},
        {"ATTR_POINTWISE_MATH_PREC", CDA_ATTR_POINTWISE_MATH_PREC, CUDNN_ATTR_POINTWISE_MATH_PREC},
        {"ATTR_POINTWISE_AXIS", CDA_ATTR_POINTWISE_AXIS, CUDNN_ATTR_POINTWISE_AXIS},
        {"ATTR_ENGINEHEUR_MODE", CDA_ATTR_ENGINEHEUR_MODE, CUDNN_ATTR_ENGINEHEUR_MODE},
        {"ATTR_ENGINEHEUR_OPERATION_GRAPH", CDA_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH},
        {"ATTR_ENGINEHEUR_RESULTS", CDA_ATTR_ENGINEHEUR_RESULTS, CUDNN_ATTR_ENGINEHEUR_RESULTS},
        {"ATTR_ENGINECFG_ENGINE", CDA_ATTR_ENGINECFG_ENGINE, CUDNN_ATTR_ENGINECFG_ENGINE},
        {"ATTR_EXECUTION_PLAN_HANDLE", CDA_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_ATTR_EXECUTION_PLAN_HANDLE},
        {"ATTR_EXECUTION_PLAN_ENGINE_CONFIG", CDA_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG},
        {"ATTR_EXECUTION_PLAN_WORKSPACE_SIZE", CDA_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE},
        {"ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR", CDA_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR},
        {"ATTR_OPERATION_POINTWISE_XDESC", CDA_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_ATTR_OPERATION_POINTWISE_XDESC},
        {"ATTR_OPERATION_POINTWISE_BDESC", CDA_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_BDESC},
        {"ATTR_OPERATION_POINTWISE_YDESC", CDA_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC},
        {"ATTR_OPERATION_POINTWISE_TDESC", CDA_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC},
        {"ATTR_OPERATIONGRAPH_HANDLE", CDA_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_ATTR_OPERATIONGRAPH_HANDLE},
        {"ATTR_OPERATIONGRAPH_OPS", CDA_ATTR_OPERATIONGRAPH_OPS, CUDNN_ATTR_OPERATIONGRAPH_OPS},
        {"ATTR_TENSOR_BYTE_ALIGNMENT", CDA_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT},
        {"ATTR_TENSOR_DATA_TYPE", CDA_ATTR_TENSOR_DATA_TYPE, CUDNN_ATTR_TENSOR_DATA_TYPE},
        {"ATTR_TENSOR_DIMENSIONS", CDA_ATTR_TENSOR_DIMENSIONS, CUDNN_ATTR_TENSOR_DIMENSIONS},
        {"ATTR_TENSOR_STRIDES", CDA_ATTR_TENSOR_STRIDES, CUDNN_ATTR_TENSOR_STRIDES},
        {"ATTR_TENSOR_UNIQUE_ID", CDA_ATTR_TENSOR_UNIQUE_ID, CUDNN_ATTR_TENSOR_UNIQUE_ID},
        {"ATTR_TENSOR_IS_VIRTUAL", CDA_ATTR_TENSOR_IS_VIRTUAL, CUDNN_ATTR_TENSOR_IS_VIRTUAL},
        {"ATTR_TENSOR_IS_BY_VALUE", CDA_ATTR_TENSOR_IS_BY_VALUE, CUDNN_ATTR_TENSOR_IS_BY_VALUE},
        {"ATTR_VARIANT_PACK_UNIQUE_IDS", CDA_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS},
        {"ATTR_VARIANT_PACK_DATA_POINTERS", CDA_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS},
        {"ATTR_VARIANT_PACK_WORKSPACE", CDA_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_ATTR_VARIANT_PACK_WORKSPACE},
        {"ATTR_ENGINE_NUMERICAL_NOTE", CDA_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE},
        {"ATTR_MATMUL_COMP_TYPE", CDA_ATTR_MATMUL_COMP_TYPE, CUDNN_ATTR_MATMUL_COMP_TYPE},
        {"ATTR_OPERATION_MATMUL_ADESC", CDA_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_ADESC},
        {"ATTR_OPERATION_MATMUL_BDESC", CDA_ATTR_OPERATION_MATMUL_BDESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC},
        {"ATTR_OPERATION_MATMUL_CDESC", CDA_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_CDESC},
        {"ATTR_OPERATION_MATMUL_DESC", CDA_ATTR_OPERATION_MATMUL_DESC, CUDNN_ATTR_OPERATION_MATMUL_DESC},
        {"ATTR_REDUCTION_OPERATOR", CDA_ATTR_REDUCTION_OPERATOR, CUDNN_ATTR_REDUCTION_OPERATOR},
        {"ATTR_REDUCTION_COMP_TYPE", CDA_ATTR_REDUCTION_COMP_TYPE, CUDNN_ATTR_REDUCTION_COMP_TYPE},
        {"ATTR_OPERATION_REDUCTION_XDESC", CDA_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_ATTR_OPERATION_REDUCTION_XDESC},
        {"ATTR_OPERATION_REDUCTION_YDESC", CDA_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_ATTR_OPERATION_REDUCTION_YDESC},
        {"ATTR_OPERATION_REDUCTION_DESC", CDA_ATTR_OPERATION_REDUCTION_DESC, CUDNN_ATTR_OPERATION_REDUCTION_DESC},
        {"ATTR_OPERATION_RESHAPE_XDESC", CDA_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_ATTR_OPERATION_RESHAPE_XDESC},
        {"ATTR_OPERATION_RESHAPE_YDESC", CDA_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_ATTR_OPERATION_RESHAPE_YDESC},
        {"HEUR_MODE_FALLBACK", CDA_HEUR_MODE_FALLBACK, CUDNN_HEUR_MODE_FALLBACK},
        {"HEUR_MODE_A", CDA_HEUR_MODE_A, CUDNN_HEUR_MODE_A},
        {"NUMERICAL_NOTE_NONDETERMINISTIC", CDA_NUMERICAL_NOTE_NONDETERMINISTIC, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        EXPECT(v[i].ours == v[i].theirs, "CUDNN_%s: ours %ld, cudnn_graph.h %ld", v[i].name, v[i].ours, v[i].theirs);
    printf("attn_cudnn_abi_values: %zu values equal cudnn_graph.h (cuDNN %d.%d.%d)\n", sizeof v / sizeof v[0],
           CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
#else
    printf("attn_cudnn_abi_values: cudnn_graph.h not installed here: skipped\n");
#endif
}

/* the offset of element idx of tensor t */
static int64_t tg_offset(const CdgTensor *t, const int64_t idx[4]) {
    int64_t off = 0;
    for (int i = 0; i < 4; i++) off += idx[i] * t->stride[i];
    return off;
}

static const CdgTensor *tg_bound(const CdgGraph *g, int64_t uid) {
    int i = cdg_find(g, uid);
    EXPECT(i >= 0, "bound tensor uid %lld missing", (long long)uid);
    return i >= 0 ? &g->t[i] : NULL;
}

/* every (h, t, d) of a (T, heads x hd) tensor laid as {1, heads, T, hd} (or, transposed, {1, heads, hd, T}) */
static void tg_check_rows(const CdgTensor *t, const char *what, int64_t T, int heads, int hd, int ld, int transposed) {
    if (!t) return;
    int64_t bad = 0;
    EXPECT(t->dim[0] == 1 && t->dim[1] == heads && t->dim[transposed ? 3 : 2] == T && t->dim[transposed ? 2 : 3] == hd,
           "%s: dims (%lld,%lld,%lld,%lld)", what, (long long)t->dim[0], (long long)t->dim[1], (long long)t->dim[2],
           (long long)t->dim[3]);
    for (int h = 0; h < heads; h++)
        for (int64_t r = 0; r < T; r += (T > 70 ? 7 : 1))
            for (int d = 0; d < hd; d += 3) {
                int64_t idx[4] = {0, h, transposed ? d : r, transposed ? r : d};
                if (tg_offset(t, idx) != r * ld + (int64_t)h * hd + d) bad++;
            }
    EXPECT(!bad, "%s: %lld elements away from t*ld + h*hd + d", what, (long long)bad);
}

static void tg_one(const CdgKey *k) {
    CdgGraph g;
    cdg_build(&g, k);
    char err[256];
    int rc = cdg_check(&g, err, sizeof err);
    EXPECT(rc == 0, "graph (bwd %d, causal %d, det %d, %d/%d/%d): %s", k->bwd, k->causal, k->deterministic, k->nh,
           k->nkv, k->hd, err);
    tg_check_rows(tg_bound(&g, CDG_UID_Q), "Q", k->Tq, k->nh, k->hd, k->ldq, 0);
    tg_check_rows(tg_bound(&g, CDG_UID_K), "K^T", k->Tk, k->nkv, k->hd, k->ldk, 1);
    tg_check_rows(tg_bound(&g, CDG_UID_V), k->bwd ? "V^T" : "V", k->Tk, k->nkv, k->hd, k->ldk, k->bwd);
    tg_check_rows(tg_bound(&g, CDG_UID_O), "O", k->Tq, k->nh, k->hd, k->ldo, 0);
    const CdgTensor *st = tg_bound(&g, CDG_UID_STATS);
    if (st) {
        int64_t bad = 0;
        for (int h = 0; h < k->nh; h++)
            for (int64_t t = 0; t < k->Tq; t++) {
                int64_t idx[4] = {0, h, t, 0};
                bad += tg_offset(st, idx) != cdg_stats_at(t, h, k->Tq);
            }
        EXPECT(!bad, "Stats: %lld entries away from (nh, Tq)", (long long)bad);
    }
    int causal_ops = 0, nondet = cdg_find(&g, CDG_UID_DQ_ACCUM) >= 0;
    for (int i = 0; i < g.nop; i++) causal_ops += g.op[i].mode == CDA_POINTWISE_BINARY_SELECT && g.op[i].kind == CDG_POINTWISE;
    EXPECT(causal_ops == (k->causal ? 1 : 0), "causal selects: %d", causal_ops);
    if (k->bwd) {
        tg_check_rows(tg_bound(&g, CDG_UID_DO), "dO", k->Tq, k->nh, k->hd, k->ldo, 0);
        tg_check_rows(tg_bound(&g, CDG_UID_DQ), "dQ", k->Tq, k->nh, k->hd, k->nh * k->hd, 0);
        tg_check_rows(tg_bound(&g, CDG_UID_DK), "dK", k->Tk, k->nkv, k->hd, k->nkv * k->hd, 0);
        tg_check_rows(tg_bound(&g, CDG_UID_DV), "dV", k->Tk, k->nkv, k->hd, k->nkv * k->hd, 0);
        EXPECT(nondet == !k->deterministic, "dq_accum present %d, deterministic %d", nondet, k->deterministic);
    }
}

TEST(attn_cudnn_graph_layouts) {
    const int shapes[][3] = {{4, 4, 128}, {16, 2, 128}, {4, 1, 256}, {8, 2, 64}};
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int strided = 0; strided < 2; strided++)
            for (int mode = 0; mode < 6; mode++) {
                const int nh = shapes[s][0], nkv = shapes[s][1], hd = shapes[s][2];
                CdgKey k = {.Tq = 333, .Tk = mode & 1 ? 333 : 197, .nh = nh, .nkv = nkv, .hd = hd,
                            .ldq = nh * hd + (strided ? 8 + nh * hd : 0), .ldk = 2 * nkv * hd + (strided ? 8 : 0),
                            .ldo = nh * hd + (strided ? 16 : 0), .causal = mode & 1, .bwd = mode >= 2,
                            .deterministic = mode >= 4};
                tg_one(&k);
                n++;
            }
    printf("attn_cudnn_graph_layouts: %d graphs checked\n", n);
}

/* a variable-length graph's bound row tensor: (batch, heads, smax, hd) [transposed: (.., hd, smax)] with our
 * row layout's strides inside a sequence, ragged by the offsets of uid off */
static void tg_check_ragged(const CdgTensor *t, const char *what, const CdgKey *k, int heads, int64_t ld, int64_t off,
                            int transposed) {
    if (!t) return;
    const int rdim = transposed ? 3 : 2, cdim = transposed ? 2 : 3;
    EXPECT(t->dim[0] == k->batch && t->dim[1] == heads && t->dim[rdim] == k->Tq && t->dim[cdim] == k->hd,
           "%s: dims (%lld,%lld,%lld,%lld)", what, (long long)t->dim[0], (long long)t->dim[1], (long long)t->dim[2],
           (long long)t->dim[3]);
    EXPECT(t->stride[1] == k->hd && t->stride[rdim] == ld && t->stride[cdim] == 1,
           "%s: strides (%lld,%lld,%lld,%lld), want head hd, row %lld, col 1", what, (long long)t->stride[0],
           (long long)t->stride[1], (long long)t->stride[2], (long long)t->stride[3], (long long)ld);
    EXPECT(t->ragged_uid == off, "%s: ragged by uid %lld, want %lld", what, (long long)t->ragged_uid, (long long)off);
}

static void tg_varlen(const CdgKey *k) {
    CdgGraph g;
    cdg_build(&g, k);
    char err[256];
    EXPECT(cdg_check(&g, err, sizeof err) == 0, "varlen graph (bwd %d, batch %d, %d/%d/%d): %s", k->bwd, k->batch,
           k->nh, k->nkv, k->hd, err);
    int64_t mult[CDG_NOFF];
    cdg_varlen_mults(mult, k);
    for (int i = 0; i < CDG_NOFF; i++) {
        const CdgTensor *o = tg_bound(&g, CDG_UID_OFF_Q + i);
        EXPECT(o && o->dtype == CDA_DATA_INT64 && o->dim[0] == k->batch + 1, "offset tensor %d", i);
    }
    EXPECT(mult[0] == k->ldq && mult[1] == k->ldk && mult[2] == k->ldo && mult[3] == k->nh, "cdg_varlen_mults");
    tg_check_ragged(tg_bound(&g, CDG_UID_Q), "Q", k, k->nh, k->ldq, CDG_UID_OFF_Q, 0);
    tg_check_ragged(tg_bound(&g, CDG_UID_K), "K^T", k, k->nkv, k->ldk, CDG_UID_OFF_KV, 1);
    tg_check_ragged(tg_bound(&g, CDG_UID_V), k->bwd ? "V^T" : "V", k, k->nkv, k->ldk, CDG_UID_OFF_KV, k->bwd);
    tg_check_ragged(tg_bound(&g, CDG_UID_O), "O", k, k->nh, k->ldo, CDG_UID_OFF_O, 0);
    const int64_t stats_uids[2] = {CDG_UID_STATS, CDG_UID_SOFTMAX_SUM};
    for (int i = 0; i < (k->bwd ? 2 : 1); i++) {
        const CdgTensor *st = tg_bound(&g, stats_uids[i]);
        if (!st) continue;
        /* element (b, h, t, 0) at offset[b] + t nh + h: (rows, nh), our lse's layout, cdg_lse_at */
        EXPECT(st->dim[0] == k->batch && st->dim[1] == k->nh && st->dim[2] == k->Tq && st->dim[3] == 1 &&
                   st->stride[1] == 1 && st->stride[2] == k->nh && st->ragged_uid == CDG_UID_OFF_STATS &&
                   cdg_lse_at(5, 3, k->nh) == 5 * st->stride[2] + 3 * st->stride[1],
               "%s: not ragged (rows, nh)", st->name);
    }
    int selects = 0, padding = 0, cut = 0, mm = 0;
    for (int i = 0; i < g.nop; i++) {
        const CdgOp *o = &g.op[i];
        selects += o->kind == CDG_POINTWISE && o->mode == CDA_POINTWISE_BINARY_SELECT;
        padding += o->kind == CDG_POINTWISE && o->mode == CDA_POINTWISE_LOGICAL_AND;
        if (o->kind == CDG_MATMUL) mm++, cut += o->mo >= 0 && (o->no >= 0 || o->ko >= 0);
    }
    EXPECT(selects == 2 && padding == 1, "selects %d (want padding + causal), padding masks %d", selects, padding);
    EXPECT(cut == mm, "%d of %d products cut by the lengths", cut, mm);
    if (k->bwd) {
        tg_check_ragged(tg_bound(&g, CDG_UID_DO), "dO", k, k->nh, k->ldo, CDG_UID_OFF_O, 0);
        tg_check_ragged(tg_bound(&g, CDG_UID_DQ), "dQ", k, k->nh, k->ldq, CDG_UID_OFF_Q, 0);
        tg_check_ragged(tg_bound(&g, CDG_UID_DQ_ACCUM), "dq_accum", k, k->nh, k->ldq, CDG_UID_OFF_Q, 0);
        tg_check_ragged(tg_bound(&g, CDG_UID_DK), "dK", k, k->nkv, k->ldk, CDG_UID_OFF_KV, 0);
        tg_check_ragged(tg_bound(&g, CDG_UID_DV), "dV", k, k->nkv, k->ldk, CDG_UID_OFF_KV, 0);
        /* the gradients mirror their inputs (issue 38: the form NVIDIA's ragged backward tests use, dQ dK dV
         * with Q's, K's and V's strides and offset tensors; compact dK, dV with offset tensors of their own were
         * written wrongly by cuDNN 9.14): (head, row, col) strides and ragged offsets the same, K^T's and V^T's
         * read transposed; the accumulator dQ's; the per-head dK, dV dK's strides times the group size */
        static const int64_t pair[5][3] = {{CDG_UID_DQ, CDG_UID_Q, 0},         {CDG_UID_DK, CDG_UID_K, 1},
                                           {CDG_UID_DV, CDG_UID_V, 1},         {CDG_UID_DO, CDG_UID_O, 0},
                                           {CDG_UID_DQ_ACCUM, CDG_UID_DQ, 0}};
        for (int i = 0; i < 5; i++) {
            const CdgTensor *gt = tg_bound(&g, pair[i][0]), *in = tg_bound(&g, pair[i][1]);
            if (!gt || !in) continue;
            const int tr = (int)pair[i][2];
            const int64_t in_row = in->stride[tr ? 3 : 2], in_col = in->stride[tr ? 2 : 3];
            EXPECT(gt->ragged_uid == in->ragged_uid && gt->stride[1] == in->stride[1] && gt->stride[2] == in_row &&
                       gt->stride[3] == in_col,
                   "%s does not mirror %s: ragged by %lld (want %lld), strides (h %lld, row %lld, col %lld), want "
                   "(%lld, %lld, %lld)", gt->name, in->name, (long long)gt->ragged_uid, (long long)in->ragged_uid,
                   (long long)gt->stride[1], (long long)gt->stride[2], (long long)gt->stride[3],
                   (long long)in->stride[1], (long long)in_row, (long long)in_col);
        }
        const int full = cdg_find(&g, CDG_UID_DK_FULL) >= 0 && cdg_find(&g, CDG_UID_DV_FULL) >= 0;
        EXPECT(full == (k->nh != k->nkv), "per-head dK, dV bound %d with %d/%d heads", full, k->nh, k->nkv);
        if (full) { /* dK's offsets, which cuDNN scales by the group size, in dK's row stride times the group size */
            const int64_t grp = k->nh / k->nkv;
            tg_check_ragged(tg_bound(&g, CDG_UID_DK_FULL), "dK all heads", k, k->nh, k->ldk * grp, CDG_UID_OFF_KV, 0);
            tg_check_ragged(tg_bound(&g, CDG_UID_DV_FULL), "dV all heads", k, k->nh, k->ldk * grp, CDG_UID_OFF_KV, 0);
        }
    }
}

TEST(attn_cudnn_graph_varlen) {
    const int shapes[][3] = {{16, 2, 128}, {4, 4, 128}, {16, 2, 256}, {8, 8, 64}, {4, 1, 256}};
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int strided = 0; strided < 2; strided++)
            for (int mode = 0; mode < 4; mode++) {
                const int nh = shapes[s][0], nkv = shapes[s][1], hd = shapes[s][2];
                CdgKey k = {.Tq = mode & 2 ? 16384 : 64, .nh = nh, .nkv = nkv, .hd = hd,
                            .ldq = nh * hd + (strided ? 2 * nkv * hd : 0), .ldk = 2 * nkv * hd + (strided ? 8 : 0),
                            .ldo = nh * hd + (strided ? 16 : 0), .causal = 1, .bwd = mode & 1,
                            .batch = mode & 2 ? 16 : 2};
                k.Tk = k.Tq;
                tg_varlen(&k);
                n++;
            }
    printf("attn_cudnn_graph_varlen: %d variable-length graphs checked\n", n);
}

TEST(attn_cudnn_graph_must_fail) {
    CdgKey k = {.Tq = 256, .Tk = 256, .nh = 16, .nkv = 2, .hd = 128, .ldq = 2048, .ldk = 512, .ldo = 2048,
                .causal = 1, .bwd = 1};
    CdgGraph g;
    char err[256];
    cdg_build(&g, &k);
    EXPECT(cdg_check(&g, err, sizeof err) == 0, "the unmodified graph: %s", err);
    CdgOp first = g.op[0];
    memmove(&g.op[0], &g.op[1], sizeof(CdgOp) * (size_t)(g.nop - 1));
    g.op[g.nop - 1] = first; /* D's product now runs after its readers */
    int rc = cdg_check(&g, err, sizeof err);
    EXPECT(rc != 0, "an operation after its readers passed");
    printf("moved producer: %s\n", err);
    cdg_build(&g, &k);
    g.t[cdg_find(&g, CDG_UID_Q)].dim[3] = 64; /* Q K^T with mismatched inner sizes */
    rc = cdg_check(&g, err, sizeof err);
    EXPECT(rc != 0, "a mismatched product passed");
    printf("mismatched product: %s\n", err);
    cdg_build(&g, &k);
    g.t[cdg_find(&g, CDG_UID_DK)].uid = CDG_UID_DV;
    rc = cdg_check(&g, err, sizeof err);
    EXPECT(rc != 0, "a shared uid passed");
    printf("shared uid: %s\n", err);

    CdgKey v = k;
    v.batch = 8, v.Tq = v.Tk = 1024;
    cdg_build(&g, &v);
    EXPECT(cdg_check(&g, err, sizeof err) == 0, "the unmodified variable-length graph: %s", err);
    g.t[cdg_find(&g, CDG_UID_DK)].ragged_uid = CDG_UID_VIRTUAL + 999; /* offsets that do not exist */
    rc = cdg_check(&g, err, sizeof err);
    EXPECT(rc != 0, "a missing ragged offset tensor passed");
    printf("missing offsets: %s\n", err);
    cdg_build(&g, &v);
    g.t[cdg_find(&g, CDG_UID_OFF_O)].dim[0] = v.batch; /* B entries, not B + 1 */
    rc = cdg_check(&g, err, sizeof err);
    EXPECT(rc != 0, "offsets of batch entries passed");
    printf("short offsets: %s\n", err);
    cdg_build(&g, &v);
    g.t[cdg_find(&g, CDG_UID_SEQ_KV)].dtype = CDA_DATA_INT64; /* lengths must be int32 */
    rc = cdg_check(&g, err, sizeof err);
    EXPECT(rc != 0, "int64 lengths passed");
    printf("int64 lengths: %s\n", err);
}

/* ---- route ---- */

/* positions of global tokens [lo, hi) of a sample cut into documents at the given starts */
static void tr_meta(int32_t *pos, int32_t *doc_pos, int64_t lo, int64_t hi, const int64_t *starts, int ns) {
    for (int64_t g = lo; g < hi; g++) {
        int64_t s0 = 0;
        for (int i = 0; i < ns; i++)
            if (starts[i] <= g) s0 = starts[i];
        pos[g - lo] = (int32_t)g;
        doc_pos[g - lo] = (int32_t)(g - s0);
    }
}

/* our mask (same document, causal by pos) against cuDNN's for the route (variable length: row i and key j
 * in the same run of the query rows, j <= i); returns mismatching pairs */
static int64_t tr_mask_mismatch(CdgRoute r, const int32_t *pq, const int32_t *dq, int64_t Tq, const int32_t *pk,
                                const int32_t *dk, int64_t Tk, int causal) {
    int64_t bad = 0;
    static int32_t run[1 << 16];
    for (int64_t i = 0; i < Tq && i < (1 << 16); i++)
        run[i] = i == 0 ? 0 : run[i - 1] + (pq[i] - dq[i] != pq[i - 1] - dq[i - 1]);
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t j = 0; j < Tk; j++) {
            int ours = pq[i] - dq[i] == pk[j] - dk[j] && (!causal || pk[j] <= pq[i]);
            int theirs = r == CDG_ROUTE_DENSE ? 1 : r == CDG_ROUTE_VARLEN ? j <= i && run[i] == run[j] : j <= i;
            bad += ours != theirs;
        }
    return bad;
}

/* a one-GPU call's rows [0, T) of documents of the given lengths (summing to T), positions from p0 */
static void tr_packed(int32_t *pos, int32_t *doc_pos, int64_t T, const int64_t *len, int nd, int32_t p0) {
    int64_t t = 0;
    for (int d = 0; d < nd; d++)
        for (int64_t i = 0; i < len[d]; i++, t++) pos[t] = p0 + (int32_t)t, doc_pos[t] = (int32_t)i;
    EXPECT(t == T, "tr_packed: lengths sum to %lld, want %lld", (long long)t, (long long)T);
}

/* routes the packed call, checks the route, the buckets against its runs, and cuDNN's mask against ours */
static void tr_varlen_case(const char *what, const int32_t *pos, const int32_t *dp, int64_t T, int nd, int want) {
    const char *why;
    const AttnHint m = attn_hint_rows(pos, dp, T, pos, dp, T);
    const CdgRoute r = cdg_route(&m, T, T, 16, 2, 128, 1, &why);
    EXPECT((r == CDG_ROUTE_VARLEN) == want, "%s: route %d (%s), want variable length %d", what, (int)r, why, want);
    if (r != CDG_ROUTE_VARLEN) return;
    int32_t b;
    int64_t smax, longest = 0, cur = 0;
    for (int64_t i = 0; i < T; i++) {
        cur = i && pos[i] - dp[i] == pos[i - 1] - dp[i - 1] ? cur + 1 : 1;
        if (cur > longest) longest = cur;
    }
    EXPECT(cdg_varlen_shape(&m, T, &b, &smax) == 0 && m.runs == nd && b >= nd && smax >= longest && m.run_max == longest,
           "%s: runs %d (want %d), run_max %d (longest %lld), buckets %d x %lld", what, m.runs, nd, m.run_max,
           (long long)longest, b, (long long)smax);
    int64_t mm = tr_mask_mismatch(r, pos, dp, T, pos, dp, T, 1);
    EXPECT(mm == 0, "%s: %lld (query, key) pairs masked differently from ours", what, (long long)mm);
}

TEST(attn_cudnn_route) {
    enum { N = 48 }; /* fragment length; P = 2: fragments 0..3, rank 0 holds 0 and 3 */
    int32_t pq[N], dq[N], pk[N], dk[N];
    int64_t n_cudnn = 0, n_ours = 0, bad = 0;
    const char *why;
    test_rng_seed(19);
    for (int trial = 0; trial < 400; trial++) {
        int64_t starts[4];
        int ns = trial % 4; /* 0: one document */
        for (int i = 0; i < ns; i++) starts[i] = 1 + (int64_t)(test_uniform() * (4 * N - 1));
        int a = (int)(test_uniform() * 4), b = (int)(test_uniform() * 4), causal = trial % 5 != 4;
        if (a < b) { int t = a; a = b; b = t; }
        tr_meta(pq, dq, (int64_t)a * N, (int64_t)(a + 1) * N, starts, ns);
        tr_meta(pk, dk, (int64_t)b * N, (int64_t)(b + 1) * N, starts, ns);
        const AttnHint m = attn_hint_rows(pq, dq, N, pk, dk, N);
        CdgRoute r = cdg_route(&m, N, N, 16, 2, 128, causal, &why);
        if (r == CDG_ROUTE_OURS) { n_ours++; continue; }
        n_cudnn++;
        int64_t mm = tr_mask_mismatch(r, pq, dq, N, pk, dk, N, causal);
        if (mm && bad++ < 3) EXPECT(0, "trial %d (q frag %d, k frag %d, %d docs, causal %d) -> %s: %lld pairs differ",
                                    trial, a, b, ns + 1, causal, why, (long long)mm);
    }
    printf("attn_cudnn_route: %lld calls to cuDNN, %lld to ours, masks equal on every cuDNN call\n",
           (long long)n_cudnn, (long long)n_ours);
    EXPECT(n_cudnn > 100 && n_ours > 50, "too few of one route: cuDNN %lld, ours %lld", (long long)n_cudnn,
           (long long)n_ours);

    /* the ring's plain steps must go to cuDNN; a diagonal with a document start inside to variable length */
    tr_meta(pq, dq, 0, N, NULL, 0);
    AttnHint m = attn_hint_rows(pq, dq, N, pq, dq, N);
    EXPECT(cdg_route(&m, N, N, 16, 16, 128, 1, &why) == CDG_ROUTE_CAUSAL, "one-document diagonal: %s", why);
    tr_meta(pq, dq, 3 * N, 4 * N, NULL, 0);
    tr_meta(pk, dk, 0, N, NULL, 0);
    m = attn_hint_rows(pq, dq, N, pk, dk, N);
    EXPECT(cdg_route(&m, N, N, 16, 2, 256, 1, &why) == CDG_ROUTE_DENSE, "dense rectangle: %s", why);
    int64_t cut[1] = {N / 2};
    tr_meta(pq, dq, 0, N, cut, 1);
    m = attn_hint_rows(pq, dq, N, pq, dq, N);
    EXPECT(cdg_route(&m, N, N, 16, 2, 128, 1, &why) == CDG_ROUTE_VARLEN, "diagonal with a document start: %s", why);
    EXPECT(cdg_route(&m, N, N, 16, 2, 128, 0, &why) == CDG_ROUTE_OURS, "non-causal with a document start: %s", why);
    tr_meta(pq, dq, 0, N, NULL, 0);
    m = attn_hint_rows(pq, dq, N, pq, dq, N);
    EXPECT(cdg_route(&m, N, N, 16, 2, 100, 1, &why) == CDG_ROUTE_OURS, "hd 100: %s", why);
    EXPECT(cdg_route(&m, 1, 1, 16, 2, 128, 1, &why) == CDG_ROUTE_OURS, "1 x 1: %s", why);

    /* packed documents of one call (q rows = k rows): variable length */
    enum { T = 4000 };
    static int32_t pos[T], dp[T], pos2[T], dp2[T];
    int64_t len[200];
    len[0] = 1700, len[1] = T - 1700;
    tr_packed(pos, dp, T, len, 2, 0);
    tr_varlen_case("2 documents", pos, dp, T, 2, 1);
    int nd = 0;
    for (int64_t t = 0; t < T; nd++) { /* 16 of random lengths (the last takes the rest) */
        len[nd] = nd == 15 ? T - t : 1 + (int64_t)(test_uniform() * 2 * T / 16);
        if (t + len[nd] > T) len[nd] = T - t;
        t += len[nd];
    }
    tr_packed(pos, dp, T, len, nd, 0);
    tr_varlen_case("16 random documents", pos, dp, T, nd, 1);
    len[0] = 2000;
    for (nd = 1; nd <= 25; nd++) len[nd] = 80;
    tr_packed(pos, dp, T, len, nd, 64);
    tr_varlen_case("one long and many short", pos, dp, T, nd, 1);
    len[0] = 1000, len[1] = 1, len[2] = T - 1001;
    tr_packed(pos, dp, T, len, 3, 0);
    tr_varlen_case("a document of one row", pos, dp, T, 3, 1);
    /* the call begins inside its first document: that run's doc_pos does not start at 0 */
    for (int64_t t = 0; t < T; t++) dp2[t] = dp[t] + (t < 1000 ? 300 : 0), pos2[t] = pos[t] + 300;
    tr_varlen_case("first document begun before the call", pos2, dp2, T, 3, 1);
    /* a run after the first that does not begin its document: ours */
    memcpy(pos2, pos, sizeof pos), memcpy(dp2, dp, sizeof dp);
    for (int64_t t = 1001; t < T; t++) dp2[t] += 5;
    tr_varlen_case("a run not beginning its document", pos2, dp2, T, 3, 0);
    /* not causal, or the keys other rows: ours */
    AttnHint h = attn_hint_rows(pos, dp, T, pos, dp, T);
    EXPECT(cdg_route(&h, T, T, 16, 2, 128, 0, &why) == CDG_ROUTE_OURS, "packed, not causal: %s", why);
    memcpy(pos2, pos, sizeof pos), memcpy(dp2, dp, sizeof dp);
    dp2[2500] = 1; /* key row 2500 in another document than query row 2500 */
    h = attn_hint_rows(pos, dp, T, pos2, dp2, T);
    EXPECT(cdg_route(&h, T, T, 16, 2, 128, 1, &why) == CDG_ROUTE_OURS, "keys of other documents: %s", why);
    /* too uneven for the buckets: one document of 3/4 of the rows and 1000 of one row */
    static int64_t many[1100];
    many[0] = 3 * T / 4;
    for (nd = 1; nd <= 1000; nd++) many[nd] = 1;
    tr_packed(pos, dp, T, many, nd, 0);
    tr_varlen_case("one long and 1000 of one row", pos, dp, T, nd, 0);
    /* more documents x heads than CDG_VARLEN_MAX_BATCH_HEADS: ours (16384 rows of 6-row documents: 2731 runs,
     * a batch of 4096, x 16 heads; x 8 heads is 32768: variable length) */
    {
        const int64_t T2 = 16384;
        int32_t *p2 = malloc((size_t)T2 * 4), *d2 = malloc((size_t)T2 * 4);
        for (int64_t t = 0; t < T2; t++) p2[t] = (int32_t)t, d2[t] = (int32_t)(t % 6);
        h = attn_hint_rows(p2, d2, T2, p2, d2, T2);
        EXPECT(h.runs == 2731, "6-row documents: %d runs", h.runs);
        EXPECT(cdg_route(&h, T2, T2, 16, 2, 128, 1, &why) == CDG_ROUTE_OURS, "4096 sequences x 16 heads: %s", why);
        EXPECT(cdg_route(&h, T2, T2, 8, 8, 128, 1, &why) == CDG_ROUTE_VARLEN, "4096 sequences x 8 heads: %s", why);
        free(p2), free(d2);
    }
    /* GQA beyond CDG_VARLEN_GQA_MAX_ROWS rows: ours (its per-head dK, dV are not counted there); MHA: variable
     * length */
    const int64_t big = CDG_VARLEN_GQA_MAX_ROWS + 64;
    int32_t *bp = malloc((size_t)big * 4), *bd = malloc((size_t)big * 4);
    for (int64_t t = 0; t < big; t++) bp[t] = (int32_t)t, bd[t] = (int32_t)(t % 8192);
    h = attn_hint_rows(bp, bd, big, bp, bd, big);
    EXPECT(cdg_route(&h, big, big, 16, 2, 128, 1, &why) == CDG_ROUTE_OURS, "GQA over %lld rows: %s", (long long)big,
           why);
    EXPECT(cdg_route(&h, big, big, 16, 16, 128, 1, &why) == CDG_ROUTE_VARLEN, "MHA over %lld rows: %s", (long long)big,
           why);
    h = attn_hint_rows(bp, bd, CDG_VARLEN_GQA_MAX_ROWS, bp, bd, CDG_VARLEN_GQA_MAX_ROWS); /* 16 documents of 8k */
    EXPECT(cdg_route(&h, CDG_VARLEN_GQA_MAX_ROWS, CDG_VARLEN_GQA_MAX_ROWS, 16, 2, 128, 1, &why) == CDG_ROUTE_VARLEN,
           "GQA over %d rows (16 documents of 8k): %s", CDG_VARLEN_GQA_MAX_ROWS, why);
    int32_t b16;
    int64_t s16;
    EXPECT(cdg_varlen_shape(&h, CDG_VARLEN_GQA_MAX_ROWS, &b16, &s16) == 0 && b16 == 16 && s16 == 8192,
           "16 documents of 8k: buckets %d x %lld", b16, (long long)s16);
    free(bp), free(bd);
}

/* ---- the graphs evaluated ---- */

/* A reference evaluator of a CdgGraph in double precision, by cuDNN's semantics as cudnn-frontend documents
 * them: bound row tensors at their strides, ragged ones from their sequence's offset (a row past its length
 * neither read, 0, nor written), each product cut to its M x N over K by the length overrides (virtual results
 * outside are 0), pointwise broadcasting, reductions over the dimensions where the result is 1 (or grouped:
 * heads h -> h / g), a reshape a view of the same memory. GQA's per-head dK, dV are ragged by dK's offsets
 * times the group size (cudnn-frontend's "implicit multiplier"). */
typedef struct {
    double *mem;
    const int64_t *rag; /* ragged offsets (batch + 1) or NULL */
    int64_t rag_mult;   /* the implicit multiplier of rag (1, or the group size for the per-head dK, dV) */
    int dense;          /* a virtual tensor's own memory, laid densely by its dims (cuDNN keeps virtual
                         * tensors inside its kernel; their strides only say how a reshape views them) */
} TeBuf;

typedef struct {
    const CdgGraph *g;
    TeBuf b[CDG_MAX_TENSORS];
    const int32_t *seq; /* lengths (variable length) */
} TeEval;

static int te_rowdim(const CdgTensor *t) { return t->stride[2] == 1 && t->dim[3] > 1 ? 3 : 2; }

/* the offset of element idx of tensor i, or -1 where a ragged row lies past its sequence */
static int64_t te_at(const TeEval *e, int i, const int64_t idx[4]) {
    const CdgTensor *t = &e->g->t[i];
    const TeBuf *b = &e->b[i];
    int64_t off = 0;
    if (b->dense) return ((idx[0] * t->dim[1] + idx[1]) * t->dim[2] + idx[2]) * t->dim[3] + idx[3];
    if (b->rag) {
        if (e->seq && idx[te_rowdim(t)] >= e->seq[idx[0]]) return -1;
        off = b->rag[idx[0]] * b->rag_mult;
    } else off = idx[0] * t->stride[0];
    for (int d = 1; d < 4; d++) off += idx[d] * t->stride[d];
    return off;
}

static double te_get(const TeEval *e, int i, const int64_t idx_y[4], const CdgTensor *y) {
    const CdgTensor *t = &e->g->t[i];
    if (t->by_value) return e->b[i].mem[0];
    int64_t idx[4];
    for (int d = 0; d < 4; d++) idx[d] = t->dim[d] == 1 ? 0 : idx_y[d] * t->dim[d] / y->dim[d];
    const int64_t off = te_at(e, i, idx);
    return off < 0 ? 0.0 : e->b[i].mem[off];
}

static void te_set(const TeEval *e, int i, const int64_t idx[4], double v) {
    const int64_t off = te_at(e, i, idx);
    if (off >= 0) e->b[i].mem[off] = v;
}

static int64_t te_len(const TeEval *e, int lt, int64_t b, int64_t full) {
    return lt >= 0 ? e->seq[b] : full;
}

static void te_run(TeEval *e) {
    const CdgGraph *g = e->g;
    for (int i = 0; i < g->nt; i++) { /* virtual tensors: their own memory */
        const CdgTensor *t = &g->t[i];
        if (!t->is_virtual) continue;
        int64_t n = 1;
        for (int d = 0; d < 4; d++) n *= t->dim[d];
        e->b[i].mem = test_alloc(n * (int64_t)sizeof(double));
        e->b[i].rag_mult = 1, e->b[i].dense = 1;
    }
    for (int k = 0; k < g->nop; k++) {
        const CdgOp *o = &g->op[k];
        const CdgTensor *y = &g->t[o->y];
        int64_t idx[4];
        if (o->kind == CDG_RESHAPE) {
            const CdgTensor *x = &g->t[o->x];
            if (!e->b[o->x].dense) { /* a view of bound memory: the same memory and offsets */
                e->b[o->y] = e->b[o->x];
                continue;
            }
            /* of a virtual tensor: y's element is x's at the same offset by their declared strides */
            int64_t ext = 1;
            for (int d = 0; d < 4; d++) ext += (x->dim[d] - 1) * x->stride[d];
            double *flat = test_alloc(ext * (int64_t)sizeof(double));
            for (idx[0] = 0; idx[0] < x->dim[0]; idx[0]++)
                for (idx[1] = 0; idx[1] < x->dim[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < x->dim[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < x->dim[3]; idx[3]++) {
                            int64_t so = 0;
                            for (int d = 0; d < 4; d++) so += idx[d] * x->stride[d];
                            flat[so] = e->b[o->x].mem[te_at(e, o->x, idx)];
                        }
            for (idx[0] = 0; idx[0] < y->dim[0]; idx[0]++)
                for (idx[1] = 0; idx[1] < y->dim[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < y->dim[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < y->dim[3]; idx[3]++) {
                            int64_t so = 0;
                            for (int d = 0; d < 4; d++) so += idx[d] * y->stride[d];
                            te_set(e, o->y, idx, so < ext ? flat[so] : 0.0);
                        }
            continue;
        }
        if (o->kind == CDG_MATMUL) {
            const CdgTensor *a = &g->t[o->x], *bt = &g->t[o->b];
            const int64_t grp = a->dim[1] / bt->dim[1];
            for (idx[0] = 0; idx[0] < y->dim[0]; idx[0]++) {
                const int64_t M = te_len(e, o->mo, idx[0], y->dim[2]), N = te_len(e, o->no, idx[0], y->dim[3]);
                const int64_t K = te_len(e, o->ko, idx[0], a->dim[3]);
                for (idx[1] = 0; idx[1] < y->dim[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < y->dim[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < y->dim[3]; idx[3]++) {
                            double acc = 0;
                            const int in = idx[2] < M && idx[3] < N;
                            for (int64_t kk = 0; in && kk < K; kk++) {
                                const int64_t ia[4] = {idx[0], idx[1], idx[2], kk};
                                const int64_t ib[4] = {idx[0], idx[1] / grp, kk, idx[3]};
                                const int64_t oa = te_at(e, o->x, ia), ob = te_at(e, o->b, ib);
                                acc += (oa < 0 ? 0 : e->b[o->x].mem[oa]) * (ob < 0 ? 0 : e->b[o->b].mem[ob]);
                            }
                            if (in || y->is_virtual) te_set(e, o->y, idx, acc);
                        }
            }
            continue;
        }
        if (o->kind == CDG_REDUCTION) {
            const CdgTensor *x = &g->t[o->x];
            for (idx[0] = 0; idx[0] < y->dim[0]; idx[0]++) /* start values */
                for (idx[1] = 0; idx[1] < y->dim[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < y->dim[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < y->dim[3]; idx[3]++)
                            te_set(e, o->y, idx, o->mode == CDA_REDUCE_TENSOR_MAX ? -INFINITY : 0.0);
            for (idx[0] = 0; idx[0] < x->dim[0]; idx[0]++)
                for (idx[1] = 0; idx[1] < x->dim[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < x->dim[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < x->dim[3]; idx[3]++) {
                            int64_t iy[4];
                            for (int d = 0; d < 4; d++) iy[d] = y->dim[d] == 1 ? 0 : idx[d] * y->dim[d] / x->dim[d];
                            const int64_t oy = te_at(e, o->y, iy);
                            if (oy < 0) continue;
                            const double v = te_get(e, o->x, idx, x), cur = e->b[o->y].mem[oy];
                            e->b[o->y].mem[oy] = o->mode == CDA_REDUCE_TENSOR_MAX ? (v > cur ? v : cur) : cur + v;
                        }
            continue;
        }
        for (idx[0] = 0; idx[0] < y->dim[0]; idx[0]++) /* pointwise */
            for (idx[1] = 0; idx[1] < y->dim[1]; idx[1]++)
                for (idx[2] = 0; idx[2] < y->dim[2]; idx[2]++)
                    for (idx[3] = 0; idx[3] < y->dim[3]; idx[3]++) {
                        if (o->mode == CDA_POINTWISE_GEN_INDEX) {
                            te_set(e, o->y, idx, (double)idx[o->axis]);
                            continue;
                        }
                        const double x = te_get(e, o->x, idx, y);
                        const double b = o->b >= 0 ? te_get(e, o->b, idx, y) : 0;
                        double v = 0;
                        switch (o->mode) {
                        case CDA_POINTWISE_ADD: v = x + b; break;
                        case CDA_POINTWISE_SUB: v = x - b; break;
                        case CDA_POINTWISE_MUL: v = x * b; break;
                        case CDA_POINTWISE_DIV: v = x / b; break;
                        case CDA_POINTWISE_EXP: v = exp(x); break;
                        case CDA_POINTWISE_LOG: v = log(x); break;
                        case CDA_POINTWISE_IDENTITY: v = x; break;
                        case CDA_POINTWISE_CMP_GE: v = x >= b; break;
                        case CDA_POINTWISE_CMP_LT: v = x < b; break;
                        case CDA_POINTWISE_LOGICAL_AND: v = x != 0 && b != 0; break;
                        case CDA_POINTWISE_BINARY_SELECT: v = te_get(e, o->t, idx, y) != 0 ? x : b; break;
                        default: EXPECT(0, "evaluator: pointwise mode %d", o->mode);
                        }
                        te_set(e, o->y, idx, v);
                    }
    }
}

/* rows [0, T) of packed documents of the given lengths: the lengths and offsets the device computes
 * (cuda_cudnn_varlen_rows), from the rows as the hint defines runs */
static void te_varlen_rows(int32_t *seq, int64_t off[CDG_NOFF][64], const int64_t mult[CDG_NOFF], const int32_t *pos,
                           const int32_t *dp, int64_t T, int batch) {
    int64_t start[64], n = 0;
    for (int64_t i = 0; i < T; i++)
        if (i == 0 || pos[i] - dp[i] != pos[i - 1] - dp[i - 1]) start[n++] = i;
    for (int b = 0; b <= batch; b++) {
        const int64_t s = b < n ? start[b] : T, e = b + 1 < n ? start[b + 1] : T;
        if (b < batch) seq[b] = (int32_t)(e - s);
        for (int i = 0; i < CDG_NOFF; i++) off[i][b] = s * mult[i];
    }
}

/* one graph pair (forward, backward) over rows of documents of the given lengths (the first begun `before`
 * rows before the call), evaluated against the cpu oracle; varlen: the variable-length graphs (else the
 * one-sequence causal ones, which run on cuDNN today: the evaluator's own check) */
static void te_case(const char *name, int NH, int NKV, const int64_t *lens, int nd, int before, int varlen) {
    enum { HD = 8 };
    const int QD = NH * HD, KVD = NKV * HD, LDQ = QD + 8, LDK = 2 * KVD, LDO = QD;
    int64_t T = 0;
    for (int d = 0; d < nd; d++) T += lens[d];
    int32_t *pos = test_alloc(T * 4), *dp = test_alloc(T * 4);
    for (int64_t t = 0, d = 0, i = 0; t < T; t++, i++) {
        if (i == lens[d]) d++, i = 0;
        pos[t] = (int32_t)(t + 7), dp[t] = (int32_t)(i + (d == 0 ? before : 0));
    }
    double *q = test_alloc(T * LDQ * 8), *kv = test_alloc(T * LDK * 8), *dout = test_alloc(T * LDO * 8);
    float *qf = test_alloc(T * LDQ * 4), *kvf = test_alloc(T * LDK * 4), *doutf = test_alloc(T * LDO * 4);
    test_rng_seed(38);
    test_fill_normal(qf, T * LDQ, 1.5);
    test_fill_normal(kvf, T * LDK, 1.0);
    test_fill_normal(doutf, T * LDO, 1.0);
    for (int64_t i = 0; i < T * LDQ; i++) q[i] = qf[i];
    for (int64_t i = 0; i < T * LDK; i++) kv[i] = kvf[i];
    for (int64_t i = 0; i < T * LDO; i++) dout[i] = doutf[i];
    const AttnHint h = attn_hint_rows(pos, dp, T, pos, dp, T);
    float *out_ref = test_alloc(T * LDO * 4), *lse_ref = test_alloc(T * NH * 4);
    cpu_attention_forward(out_ref, lse_ref, qf, kvf, kvf + KVD, pos, dp, pos, dp, &h, T, T, NH, NKV, HD, LDQ, LDK, LDO, 1);
    float *gq_ref = test_alloc(T * LDQ * 4), *gkv_ref = test_alloc(T * LDK * 4);
    cpu_attention_backward(gq_ref, gkv_ref, gkv_ref + KVD, doutf, out_ref, lse_ref, qf, kvf, kvf + KVD, pos, dp, pos, dp,
                           &h, T, T, NH, NKV, HD, LDQ, LDK, LDO, 1);
    int32_t batch = 0;
    int64_t smax = T;
    const CdgRoute r = cdg_route(&h, T, T, NH, NKV, HD, 1, NULL);
    if (varlen)
        EXPECT(r == CDG_ROUTE_VARLEN && !cdg_varlen_shape(&h, T, &batch, &smax), "%s: not variable length", name);
    else EXPECT(r == CDG_ROUTE_CAUSAL, "%s: not cuDNN's causal", name);
    for (int bwd = 0; bwd < 2; bwd++) {
        CdgKey k = {.Tq = smax, .Tk = smax, .nh = NH, .nkv = NKV, .hd = HD, .ldq = LDQ, .ldk = LDK, .ldo = LDO,
                    .causal = 1, .bwd = bwd, .batch = batch};
        CdgGraph g;
        cdg_build(&g, &k);
        TeEval e;
        memset(&e, 0, sizeof e);
        e.g = &g;
        int32_t seq[64];
        static int64_t off[CDG_NOFF][64];
        int64_t mult[CDG_NOFF];
        cdg_varlen_mults(mult, &k);
        if (varlen) te_varlen_rows(seq, off, mult, pos, dp, T, batch), e.seq = seq;
        double *stats = test_alloc(T * NH * 8), *out = test_alloc(T * LDO * 8), *ssum = test_alloc(T * NH * 8);
        /* the gradients: dense rows for one sequence; variable length, their inputs' row strides (cudnn_graph.h) */
        const int64_t GQ = varlen ? LDQ : QD, GK = varlen ? LDK : KVD, GF = varlen ? (int64_t)LDK * (NH / NKV) : QD;
        /* variable length: dk and dv interleaved in one region as k and v are (cdg_workspace) */
        double *dq = test_alloc(T * GQ * 8), *dk = test_alloc(T * GK * 8);
        double *dv = varlen ? dk + KVD : test_alloc(T * GK * 8);
        double *acc = test_alloc(T * GQ * 8), *dkf = test_alloc(T * GF * 8), *dvf = test_alloc(T * GF * 8);
        double scale = 1.0 / sqrt((double)HD), neg_inf = -INFINITY, one = 1.0;
        double seqd[64];
        for (int b = 0; b < batch; b++) seqd[b] = seq[b];
        for (int i = 0; i < g.nt; i++) {
            const CdgTensor *t = &g.t[i];
            TeBuf *b = &e.b[i];
            b->rag_mult = 1;
            switch (t->uid) {
            case CDG_UID_Q: b->mem = q; break;
            case CDG_UID_K: b->mem = kv; break;
            case CDG_UID_V: b->mem = kv + KVD; break;
            case CDG_UID_O: b->mem = bwd ? NULL : out; break;
            case CDG_UID_DO: b->mem = dout; break;
            case CDG_UID_STATS: b->mem = stats; break;
            case CDG_UID_SOFTMAX_SUM: b->mem = ssum; break;
            case CDG_UID_DQ: b->mem = dq; break;
            case CDG_UID_DK: b->mem = dk; break;
            case CDG_UID_DV: b->mem = dv; break;
            case CDG_UID_DQ_ACCUM: b->mem = acc; break;
            case CDG_UID_DK_FULL: b->mem = dkf, b->rag_mult = NH / NKV; break;
            case CDG_UID_DV_FULL: b->mem = dvf, b->rag_mult = NH / NKV; break;
            case CDG_UID_SCALE: b->mem = &scale; break;
            case CDG_UID_NEG_INF: b->mem = &neg_inf; break;
            case CDG_UID_ONE: b->mem = &one; break;
            case CDG_UID_SEQ_Q: case CDG_UID_SEQ_KV: b->mem = seqd; break;
            default: break;
            }
            if (t->ragged_uid) b->rag = off[t->ragged_uid - CDG_UID_OFF_Q];
        }
        double *outb = NULL;
        if (bwd) { /* the final out and lse: the oracle's */
            outb = test_alloc(T * LDO * 8);
            for (int64_t i = 0; i < T * LDO; i++) outb[i] = out_ref[i];
            for (int64_t t = 0; t < T; t++)
                for (int hh = 0; hh < NH; hh++)
                    stats[varlen ? cdg_lse_at(t, hh, NH) : cdg_stats_at(t, hh, T)] = lse_ref[cdg_lse_at(t, hh, NH)];
            e.b[cdg_find(&g, CDG_UID_O)].mem = outb;
        }
        te_run(&e);
        char what[160];
        if (!bwd) {
            float *of = test_alloc(T * LDO * 4), *lf = test_alloc(T * NH * 4);
            for (int64_t i = 0; i < T * LDO; i++) of[i] = (float)out[i];
            for (int64_t t = 0; t < T; t++) /* varlen: Stats ragged (rows, nh), our lse; else (nh, rows) */
                for (int hh = 0; hh < NH; hh++)
                    lf[cdg_lse_at(t, hh, NH)] = (float)stats[varlen ? cdg_lse_at(t, hh, NH) : cdg_stats_at(t, hh, T)];
            snprintf(what, sizeof what, "%s: evaluated out", name);
            test_check_rel_f(what, of, out_ref, T * LDO, 1e-5);
            snprintf(what, sizeof what, "%s: evaluated Stats as lse", name);
            test_check_rel_f(what, lf, lse_ref, T * NH, 1e-6);
        } else {
            float *gq = test_alloc(T * QD * 4), *gqr = test_alloc(T * QD * 4), *gk = test_alloc(T * KVD * 4);
            float *gkr = test_alloc(T * KVD * 4), *gv = test_alloc(T * KVD * 4), *gvr = test_alloc(T * KVD * 4);
            for (int64_t t = 0; t < T; t++) {
                for (int c = 0; c < QD; c++) gq[t * QD + c] = (float)dq[t * GQ + c], gqr[t * QD + c] = gq_ref[t * LDQ + c];
                for (int c = 0; c < KVD; c++) {
                    gk[t * KVD + c] = (float)dk[t * GK + c], gkr[t * KVD + c] = gkv_ref[t * LDK + c];
                    gv[t * KVD + c] = (float)dv[t * GK + c], gvr[t * KVD + c] = gkv_ref[t * LDK + KVD + c];
                }
            }
            snprintf(what, sizeof what, "%s: evaluated dq (batch %d, smax %lld)", name, batch, (long long)smax);
            test_check_rel_f(what, gq, gqr, T * QD, 1e-5);
            snprintf(what, sizeof what, "%s: evaluated dk", name);
            test_check_rel_f(what, gk, gkr, T * KVD, 1e-5);
            snprintf(what, sizeof what, "%s: evaluated dv", name);
            test_check_rel_f(what, gv, gvr, T * KVD, 1e-5);
        }
    }
}

TEST(attn_cudnn_graph_evaluate) {
    const int64_t one[1] = {150}, packed[4] = {40, 1, 70, 39}, begun[3] = {33, 64, 50};
    te_case("one document, GQA 4/2 (cuDNN's causal graph)", 4, 2, one, 1, 0, 0);
    te_case("4 documents, GQA 4/2", 4, 2, packed, 4, 0, 1);
    te_case("3 documents, the first begun 20 rows before, MHA 4/4", 4, 4, begun, 3, 20, 1);
    te_case("4 documents, MQA 4/1", 4, 1, packed, 4, 0, 1);
}

/* ---- LSE convention ---- */

TEST(attn_cudnn_lse_convention) {
    enum { T = 37, NH = 4, NKV = 2, HD = 16 };
    static float q[T * NH * HD], k[T * NKV * HD], v[T * NKV * HD], out[T * NH * HD], lse[T * NH];
    static float stats[NH * T], back[T * NH], stats2[NH * T];
    int32_t pos[T], dp[T];
    for (int t = 0; t < T; t++) pos[t] = dp[t] = t;
    test_rng_seed(7);
    test_fill_normal(q, T * NH * HD, 1.5);
    test_fill_normal(k, T * NKV * HD, 1.0);
    test_fill_normal(v, T * NKV * HD, 1.0);
    cpu_attention_forward(out, lse, q, k, v, pos, dp, pos, dp, NULL, T, T, NH, NKV, HD, NH * HD, NKV * HD, NH * HD, 1);
    /* cuDNN's Stats from its graph's definition: max + log(sum exp(S * scale - max)), causal top-left */
    double want_max = 0;
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < T; i++) {
            double s[T], mx = -INFINITY, sum = 0;
            for (int j = 0; j <= i; j++) {
                double acc = 0;
                for (int d = 0; d < HD; d++)
                    acc += (double)q[i * NH * HD + h * HD + d] * k[j * NKV * HD + (h / (NH / NKV)) * HD + d];
                s[j] = acc / sqrt((double)HD);
                if (s[j] > mx) mx = s[j];
            }
            for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
            stats[cdg_stats_at(i, h, T)] = (float)(mx + log(sum));
            if (fabs(stats[cdg_stats_at(i, h, T)]) > want_max) want_max = fabs(stats[cdg_stats_at(i, h, T)]);
        }
    cdg_stats_to_lse_host(back, stats, T, NH);
    test_check_rel_f("cuDNN Stats as our lse", back, lse, T * NH, 1e-6);
    cdg_lse_to_stats_host(stats2, back, T, NH);
    EXPECT(!memcmp(stats2, stats, sizeof stats), "lse -> Stats does not invert Stats -> lse");
    EXPECT(want_max > 0.5, "degenerate scores (max |lse| %g)", want_max);
}

#ifdef RS_WITH_CUDA
#include "cuda_attention_cudnn.h"
/* cuDNN itself (no GPU needed) creates and finalizes every tensor and operation descriptor of every graph:
 * data types, dims, strides, modes, axes and attribute types it accepts. The operation graph, heuristics
 * and plans need a GPU (tests/cuda/test_cuda_attention_cudnn.cu). Skipped where cuDNN 9 cannot be loaded. */
TEST(attn_cudnn_lower_cpu) {
    char err[4096];
    if (cuda_attention_cudnn_load("", err, sizeof err)) {
        printf("attn_cudnn_lower_cpu: skipped: %s\n", err);
        return;
    }
    printf("%s\n", cuda_attention_cudnn_describe());
    int n = 0;
    for (int mode = 0; mode < 12; mode++) {
        const int gqa = (mode >> 3) & 1 ? 0 : mode & 4;
        CdgKey k = {.Tq = 1000, .Tk = gqa ? 777 : 1000, .nh = 16, .nkv = gqa ? 2 : 16, .hd = mode >= 8 ? 256 : 128,
                    .causal = mode & 1, .bwd = (mode >> 1) & 1, .deterministic = mode >= 10};
        k.ldq = k.nh * k.hd, k.ldk = 2 * k.nkv * k.hd, k.ldo = k.nh * k.hd;
        cuda_attention_cudnn_lower_only(&k); /* exits with cuDNN's message on a refusal */
        n++;
    }
    /* variable length: ragged offsets, int32 lengths, the padding mask and the products' length overrides */
    for (int mode = 0; mode < 8; mode++) {
        CdgKey k = {.Tq = 16384, .Tk = 16384, .nh = 16, .nkv = mode & 2 ? 16 : 2, .hd = mode & 4 ? 256 : 128,
                    .causal = 1, .bwd = mode & 1, .batch = 16};
        k.ldq = k.nh * k.hd + 2 * k.nkv * k.hd, k.ldk = k.ldq, k.ldo = k.nh * k.hd;
        cuda_attention_cudnn_lower_only(&k);
        n++;
    }
    printf("attn_cudnn_lower_cpu: %d graphs: every descriptor finalized by cuDNN\n", n);
}
#endif
