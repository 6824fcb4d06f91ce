/*
 * cudnn_graph.c — cuDNN's forward and backward attention graphs over our
 * row layouts, their consistency check, the per-call route and the LSE layout
 * maps (cudnn_graph.h says what each graph computes and why a call goes
 * where it goes). No cuDNN here: only the tables that
 * kernels/cuda/cuda_attention_cudnn.c lowers.
 */
#include "cudnn_graph.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"

/* ---- building ---- */

static int cdg_tensor(CdgGraph *g, int64_t uid, int dtype, const int64_t dim[4], const int64_t stride[4], int virt,
                      int by_value, const char *name) {
    RS_CHECK(g->nt < CDG_MAX_TENSORS, "cdg: more than %d tensors", CDG_MAX_TENSORS);
    CdgTensor *t = &g->t[g->nt];
    memset(t, 0, sizeof *t);
    t->uid = uid;
    t->dtype = dtype;
    memcpy(t->dim, dim, sizeof t->dim);
    memcpy(t->stride, stride, sizeof t->stride);
    t->is_virtual = (uint8_t)virt;
    t->by_value = (uint8_t)by_value;
    t->name = name;
    return g->nt++;
}

static int cdg_virtual(CdgGraph *g, int dtype, const int64_t dim[4], const int64_t stride[4], const char *name) {
    return cdg_tensor(g, CDG_UID_VIRTUAL + g->nt, dtype, dim, stride, 1, 0, name);
}

static int cdg_scalar(CdgGraph *g, int64_t uid, const char *name) {
    static const int64_t one[4] = {1, 1, 1, 1};
    return cdg_tensor(g, uid, CDA_DATA_FLOAT, one, one, 0, 1, name);
}

/* tensor i (when it exists) is ragged by the offsets of uid off (0: not ragged) */
static int cdg_ragged(CdgGraph *g, int i, int64_t off) {
    if (i >= 0) g->t[i].ragged_uid = off;
    return i;
}

static void cdg_op(CdgGraph *g, CdgOpKind kind, int mode, int comp, int64_t axis, int x, int b, int t, int y,
                   const char *name) {
    RS_CHECK(g->nop < CDG_MAX_OPS, "cdg: more than %d operations", CDG_MAX_OPS);
    g->op[g->nop++] = (CdgOp){kind, mode, comp, axis, x, b, t, y, name, -1, -1, -1};
}

/* y = f(x [, b]) elementwise, fp32 compute; y a new virtual tensor of x's shape unless given */
static int cdg_pw(CdgGraph *g, int mode, int x, int b, int y, const char *name) {
    if (y < 0) y = cdg_virtual(g, CDA_DATA_FLOAT, g->t[x].dim, g->t[x].stride, name);
    cdg_op(g, CDG_POINTWISE, mode, CDA_DATA_FLOAT, -1, x, b, -1, y, name);
    return y;
}

static int cdg_reduce(CdgGraph *g, int mode, int x, int y, const int64_t dim[4], const int64_t stride[4],
                      const char *name) {
    if (y < 0) y = cdg_virtual(g, CDA_DATA_FLOAT, dim, stride, name);
    cdg_op(g, CDG_REDUCTION, mode, CDA_DATA_FLOAT, -1, x, -1, -1, y, name);
    return y;
}

/* C = A B; with variable length, each sequence's product cut to its M x N (over K) by the length tensors
 * m, n, k (-1: that dimension not cut), as cudnn-frontend's SDPA graphs give them */
static int cdg_matmul_cut(CdgGraph *g, int a, int b, int c, int m, int n, int k, const char *name) {
    cdg_op(g, CDG_MATMUL, 0, CDA_DATA_FLOAT, -1, a, b, -1, c, name);
    CdgOp *o = &g->op[g->nop - 1];
    o->mo = m, o->no = n, o->ko = k;
    return c;
}

/* top-left causal: S[.., i, j] kept where i >= j, else -inf */
static int cdg_causal(CdgGraph *g, int s, int neg_inf) {
    const int64_t *d = g->t[s].dim, *st = g->t[s].stride;
    int row = cdg_virtual(g, CDA_DATA_INT32, d, st, "row index");
    int col = cdg_virtual(g, CDA_DATA_INT32, d, st, "column index");
    int keep = cdg_virtual(g, CDA_DATA_BOOLEAN, d, st, "row >= column");
    int out = cdg_virtual(g, CDA_DATA_FLOAT, d, st, "masked scores");
    cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_GEN_INDEX, CDA_DATA_FLOAT, 2, s, -1, -1, row, "gen row index");
    cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_GEN_INDEX, CDA_DATA_FLOAT, 3, s, -1, -1, col, "gen column index");
    cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_CMP_GE, CDA_DATA_BOOLEAN, -1, row, col, -1, keep, "row >= column");
    cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_BINARY_SELECT, CDA_DATA_FLOAT, -1, s, neg_inf, keep, out, "causal select");
    return out;
}

/* the padding mask of variable length: S[b, .., i, j] kept where i < seq_q[b] and j < seq_kv[b], else -inf
 * (int32 indices, boolean compares, as cudnn-frontend's padding_mask) */
static int cdg_padding(CdgGraph *g, int s, int neg_inf, int seq_q, int seq_kv) {
    const int64_t *d = g->t[s].dim, *st = g->t[s].stride;
    int row = cdg_virtual(g, CDA_DATA_INT32, d, st, "padding row index");
    int col = cdg_virtual(g, CDA_DATA_INT32, d, st, "padding column index");
    int rk = cdg_virtual(g, CDA_DATA_BOOLEAN, d, st, "row < seq_len_q");
    int ck = cdg_virtual(g, CDA_DATA_BOOLEAN, d, st, "column < seq_len_kv");
    int keep = cdg_virtual(g, CDA_DATA_BOOLEAN, d, st, "inside the sequence");
    int out = cdg_virtual(g, CDA_DATA_FLOAT, d, st, "padded scores");
    cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_GEN_INDEX, CDA_DATA_INT32, 2, s, -1, -1, row, "gen padding row index");
    cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_GEN_INDEX, CDA_DATA_INT32, 3, s, -1, -1, col, "gen padding column index");
    cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_CMP_LT, CDA_DATA_BOOLEAN, -1, row, seq_q, -1, rk, "row < seq_len_q");
    cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_CMP_LT, CDA_DATA_BOOLEAN, -1, col, seq_kv, -1, ck, "column < seq_len_kv");
    cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_LOGICAL_AND, CDA_DATA_BOOLEAN, -1, rk, ck, -1, keep, "row and column in");
    cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_BINARY_SELECT, CDA_DATA_FLOAT, -1, s, neg_inf, keep, out, "padding select");
    return out;
}

void cdg_varlen_mults(int64_t mult[CDG_NOFF], const CdgKey *k) {
    mult[0] = k->ldq, mult[1] = k->ldk, mult[2] = k->ldo, mult[3] = k->nh;
}

void cdg_build(CdgGraph *g, const CdgKey *k) {
    memset(g, 0, sizeof *g);
    const int vl = k->batch > 0;
    const int64_t B = vl ? k->batch : 1, Tq = k->Tq, Tk = k->Tk, nh = k->nh, nkv = k->nkv, hd = k->hd;
    const int64_t ldq = k->ldq, ldk = k->ldk, ldo = k->ldo;
    const int64_t dQ[4] = {B, nh, Tq, hd}, sQ[4] = {Tq * ldq, hd, ldq, 1};
    const int64_t dKT[4] = {B, nkv, hd, Tk}, sKT[4] = {Tk * ldk, hd, 1, ldk};
    const int64_t dV[4] = {B, nkv, Tk, hd}, sV[4] = {Tk * ldk, hd, ldk, 1};
    const int64_t sO[4] = {Tq * ldo, hd, ldo, 1};
    const int64_t dS[4] = {B, nh, Tq, Tk}, sS[4] = {nh * Tq * Tk, Tq * Tk, Tk, 1};
    const int64_t dR[4] = {B, nh, Tq, 1}, sR[4] = {nh * Tq, Tq, 1, 1};
    const int64_t dST[4] = {B, nh, Tk, Tq}, sST[4] = {nh * Tq * Tk, Tq * Tk, 1, Tk};
    /* Stats and softmax_sum: (nh, Tq) for one sequence; ragged (rows, nh), our lse's layout, for variable length */
    const int64_t sStats[4] = {vl ? Tq * nh : nh * Tq, vl ? 1 : Tq, vl ? nh : 1, 1};

    /* variable length: the lengths and the offsets first (their users name them) */
    int seq_q = -1, seq_kv = -1;
    int64_t off[CDG_NOFF] = {0};
    if (vl) {
        const int64_t dL[4] = {B, 1, 1, 1}, dO1[4] = {B + 1, 1, 1, 1}, s1[4] = {1, 1, 1, 1};
        static const char *const names[CDG_NOFF] = {"offsets q|dq", "offsets k|v|dk|dv", "offsets out|dout",
                                                    "offsets Stats"};
        seq_q = cdg_tensor(g, CDG_UID_SEQ_Q, CDA_DATA_INT32, dL, s1, 0, 0, "seq_len_q");
        seq_kv = cdg_tensor(g, CDG_UID_SEQ_KV, CDA_DATA_INT32, dL, s1, 0, 0, "seq_len_kv");
        for (int i = 0; i < CDG_NOFF; i++) {
            off[i] = CDG_UID_OFF_Q + i;
            cdg_tensor(g, off[i], CDA_DATA_INT64, dO1, s1, 0, 0, names[i]);
        }
    }
    const int64_t oQ = off[0], oKV = off[1], oO = off[2], oSt = off[3];

    int q = cdg_ragged(g, cdg_tensor(g, CDG_UID_Q, CDA_DATA_BFLOAT16, dQ, sQ, 0, 0, "Q"), oQ);
    int kt = cdg_ragged(g, cdg_tensor(g, CDG_UID_K, CDA_DATA_BFLOAT16, dKT, sKT, 0, 0, "K^T"), oKV);
    int scale = cdg_scalar(g, CDG_UID_SCALE, "scale");
    int neg_inf = k->causal || vl ? cdg_scalar(g, CDG_UID_NEG_INF, "-inf") : -1;
    int stats = cdg_ragged(g, cdg_tensor(g, CDG_UID_STATS, CDA_DATA_FLOAT, dR, sStats, 0, 0, "Stats"), oSt);

    if (!k->bwd) {
        int v = cdg_ragged(g, cdg_tensor(g, CDG_UID_V, CDA_DATA_BFLOAT16, dV, sV, 0, 0, "V"), oKV);
        int o = cdg_ragged(g, cdg_tensor(g, CDG_UID_O, CDA_DATA_BFLOAT16, dQ, sO, 0, 0, "O"), oO);
        int s = cdg_matmul_cut(g, q, kt, cdg_virtual(g, CDA_DATA_FLOAT, dS, sS, "S = Q K^T"), seq_q, seq_kv, -1,
                               "bmm1 Q K^T");
        s = cdg_pw(g, CDA_POINTWISE_MUL, s, scale, -1, "S * scale");
        if (vl) s = cdg_padding(g, s, neg_inf, seq_q, seq_kv);
        if (k->causal) s = cdg_causal(g, s, neg_inf);
        int m = cdg_reduce(g, CDA_REDUCE_TENSOR_MAX, s, -1, dR, sR, "rowmax");
        int e = cdg_pw(g, CDA_POINTWISE_SUB, s, m, -1, "S - max");
        e = cdg_pw(g, CDA_POINTWISE_EXP, e, -1, -1, "exp");
        int l = cdg_reduce(g, CDA_REDUCE_TENSOR_ADD, e, -1, dR, sR, "rowsum");
        int logl = cdg_pw(g, CDA_POINTWISE_LOG, l, -1, -1, "log rowsum");
        cdg_pw(g, CDA_POINTWISE_ADD, m, logl, stats, "Stats = max + log rowsum");
        int p = cdg_virtual(g, CDA_DATA_BFLOAT16, dS, sS, "P");
        cdg_pw(g, CDA_POINTWISE_DIV, e, l, p, "P = exp / rowsum");
        cdg_matmul_cut(g, p, v, o, seq_q, -1, seq_kv, "bmm2 P V");
        return;
    }

    const int64_t qd = nh * hd, kvd = nkv * hd;
    const int64_t dVT[4] = {B, nkv, hd, Tk}, sVT[4] = {Tk * ldk, hd, 1, ldk};
    int vt = cdg_ragged(g, cdg_tensor(g, CDG_UID_V, CDA_DATA_BFLOAT16, dVT, sVT, 0, 0, "V^T"), oKV);
    int o = cdg_ragged(g, cdg_tensor(g, CDG_UID_O, CDA_DATA_BFLOAT16, dQ, sO, 0, 0, "O"), oO);
    int dout = cdg_ragged(g, cdg_tensor(g, CDG_UID_DO, CDA_DATA_BFLOAT16, dQ, sO, 0, 0, "dO"), oO);
    /* the gradients: dense workspace rows for one sequence; variable length, their inputs' own layout and
     * offsets (cudnn_graph.h: cuDNN 9.14's ragged backward places dK, dV by K's offsets or strides) */
    const int64_t sDQc[4] = {Tq * qd, hd, qd, 1}, sDKVc[4] = {Tk * kvd, hd, kvd, 1};
    const int64_t *sDQ = vl ? sQ : sDQc, *sDKV = vl ? sV : sDKVc;
    int dq = cdg_ragged(g, cdg_tensor(g, CDG_UID_DQ, CDA_DATA_BFLOAT16, dQ, sDQ, 0, 0, "dQ"), oQ);
    int dk = cdg_ragged(g, cdg_tensor(g, CDG_UID_DK, CDA_DATA_BFLOAT16, dV, sDKV, 0, 0, "dK"), oKV);
    int dv = cdg_ragged(g, cdg_tensor(g, CDG_UID_DV, CDA_DATA_BFLOAT16, dV, sDKV, 0, 0, "dV"), oKV);
    int one = cdg_scalar(g, CDG_UID_ONE, "1");
    int ssum = cdg_ragged(g, cdg_tensor(g, CDG_UID_SOFTMAX_SUM, CDA_DATA_FLOAT, dR, sStats, 0, 0, "softmax_sum"), oSt);

    /* D = rowsum(dO * O) (cuDNN's own virtual layout for the product, as cudnn-frontend gives it) */
    const int64_t sDOO[4] = {nh * Tq * hd, Tq * hd, nh * hd, 1};
    int doo = cdg_pw(g, CDA_POINTWISE_MUL, dout, o, cdg_virtual(g, CDA_DATA_FLOAT, dQ, sDOO, "dO * O"), "dO * O");
    int dsum = cdg_reduce(g, CDA_REDUCE_TENSOR_ADD, doo, -1, dR, sR, "rowsum dO * O");
    cdg_pw(g, CDA_POINTWISE_MUL, dsum, one, ssum, "softmax_sum = D * 1");

    /* P = exp(S * scale - Stats), masked (variable length: the padding before Stats, as cudnn-frontend) */
    int s = cdg_matmul_cut(g, q, kt, cdg_virtual(g, CDA_DATA_FLOAT, dS, sS, "S = Q K^T"), seq_q, seq_kv, -1,
                           "bmm Q K^T");
    s = cdg_pw(g, CDA_POINTWISE_MUL, s, scale, -1, "S * scale");
    if (vl) s = cdg_padding(g, s, neg_inf, seq_q, seq_kv);
    s = cdg_pw(g, CDA_POINTWISE_SUB, s, stats, -1, "S - Stats");
    if (k->causal) s = cdg_causal(g, s, neg_inf);
    int p = cdg_pw(g, CDA_POINTWISE_EXP, s, -1, -1, "P = exp");

    /* dV = P^T dO (GQA: all nh heads, then each group summed; variable length: the per-head products bound,
     * ragged by dV's offsets, which cuDNN multiplies by the group size, in dV's strides times the group size:
     * cudnn-frontend's dV_fullhead) */
    int pt = cdg_virtual(g, CDA_DATA_BFLOAT16, dST, sST, "P^T");
    cdg_op(g, CDG_RESHAPE, 0, CDA_DATA_FLOAT, -1, p, -1, -1, pt, "reshape P^T");
    const int64_t dF[4] = {B, nh, Tk, hd}, sF[4] = {nh * Tk * hd, Tk * hd, hd, 1};
    const int64_t grp = nh / nkv, sFull[4] = {Tk * ldk * grp, hd, ldk * grp, 1};
    if (nh == nkv) cdg_matmul_cut(g, pt, dout, dv, seq_kv, -1, seq_q, "bmm P^T dO");
    else {
        int full = vl ? cdg_ragged(g, cdg_tensor(g, CDG_UID_DV_FULL, CDA_DATA_BFLOAT16, dF, sFull, 0, 0, "dV all heads"),
                                   oKV)
                      : cdg_virtual(g, CDA_DATA_BFLOAT16, dF, sF, "dV all heads");
        int f = cdg_matmul_cut(g, pt, dout, full, seq_kv, -1, seq_q, "bmm P^T dO");
        cdg_reduce(g, CDA_REDUCE_TENSOR_ADD, f, dv, dV, sDKV, "dV group sum");
    }

    /* dS = (dO V^T - D) * P * scale */
    int dp = cdg_matmul_cut(g, dout, vt, cdg_virtual(g, CDA_DATA_FLOAT, dS, sS, "dP = dO V^T"), seq_q, seq_kv, -1,
                            "bmm dO V^T");
    dp = cdg_pw(g, CDA_POINTWISE_SUB, dp, ssum, -1, "dP - D");
    dp = cdg_pw(g, CDA_POINTWISE_MUL, dp, p, -1, "(dP - D) * P");
    int ds = cdg_pw(g, CDA_POINTWISE_MUL, dp, scale, -1, "dS = ... * scale");

    /* dK = dS^T Q */
    int dst = cdg_virtual(g, CDA_DATA_BFLOAT16, dST, sST, "dS^T");
    cdg_op(g, CDG_RESHAPE, 0, CDA_DATA_FLOAT, -1, ds, -1, -1, dst, "reshape dS^T");
    if (nh == nkv) cdg_matmul_cut(g, dst, q, dk, seq_kv, -1, seq_q, "bmm dS^T Q");
    else {
        const int64_t sFK[4] = {nh * Tk * hd, Tk * hd, hd, 1};
        int full = vl ? cdg_ragged(g, cdg_tensor(g, CDG_UID_DK_FULL, CDA_DATA_BFLOAT16, dF, sFull, 0, 0, "dK all heads"),
                                   oKV)
                      : cdg_virtual(g, CDA_DATA_BFLOAT16, dF, sFK, "dK all heads");
        int f = cdg_matmul_cut(g, dst, q, full, seq_kv, -1, seq_q, "bmm dS^T Q");
        cdg_reduce(g, CDA_REDUCE_TENSOR_ADD, f, dk, dV, sDKV, "dK group sum");
    }

    /* dQ = dS K (K from K^T by a reshape, ragged like K) */
    int kr = cdg_ragged(g, cdg_virtual(g, CDA_DATA_BFLOAT16, dV, sV, "K"), oKV);
    cdg_op(g, CDG_RESHAPE, 0, CDA_DATA_FLOAT, -1, kt, -1, -1, kr, "reshape K");
    if (k->deterministic) cdg_matmul_cut(g, ds, kr, dq, seq_q, -1, seq_kv, "bmm dS K");
    else {
        const int64_t sA[4] = {nh * Tq * hd, Tq * hd, hd, 1};
        /* variable length: dQ's strides and offsets (cudnn-frontend's THD dQ_accum) */
        int acc = cdg_ragged(g, cdg_tensor(g, CDG_UID_DQ_ACCUM, CDA_DATA_FLOAT, dQ, vl ? sDQ : sA, 0, 0, "dq_accum"), oQ);
        cdg_matmul_cut(g, ds, kr, acc, seq_q, -1, seq_kv, "bmm dS K");
        cdg_op(g, CDG_POINTWISE, CDA_POINTWISE_IDENTITY, CDA_DATA_FLOAT, -1, acc, -1, -1, dq, "dQ = dq_accum");
    }
}

int cdg_find(const CdgGraph *g, int64_t uid) {
    for (int i = 0; i < g->nt; i++)
        if (g->t[i].uid == uid) return i;
    return -1;
}

/* ---- checking ---- */

#define CDG_FAIL(...)                          \
    do {                                       \
        snprintf(err, n, __VA_ARGS__);         \
        return -1;                             \
    } while (0)

static int64_t cdg_numel(const CdgTensor *t) {
    int64_t e = 1;
    for (int i = 0; i < 4; i++) e *= t->dim[i];
    return e;
}

/* x broadcasts to y: every dim equal or 1 */
static int cdg_broadcasts(const CdgTensor *x, const CdgTensor *y) {
    for (int i = 0; i < 4; i++)
        if (x->dim[i] != y->dim[i] && x->dim[i] != 1) return 0;
    return 1;
}

static int cdg_check_shapes(const CdgGraph *g, const CdgOp *o, char *err, size_t n) {
    const CdgTensor *x = &g->t[o->x], *y = &g->t[o->y];
    const CdgTensor *b = o->b >= 0 ? &g->t[o->b] : NULL, *t = o->t >= 0 ? &g->t[o->t] : NULL;
    switch (o->kind) {
    case CDG_MATMUL:
        if (!b) CDG_FAIL("%s: matmul without B", o->name);
        for (int i = 0; i < 3; i++) {
            const int ov = i == 0 ? o->mo : i == 1 ? o->no : o->ko;
            if (ov < 0) continue;
            const CdgTensor *L = &g->t[ov];
            if (L->dtype != CDA_DATA_INT32 || L->is_virtual || L->by_value || L->dim[0] != y->dim[0] || L->dim[1] != 1 ||
                L->dim[2] != 1 || L->dim[3] != 1)
                CDG_FAIL("%s: override %s is not an int32 (batch,1,1,1) bound tensor", o->name, L->name);
        }
        if (x->dim[3] != b->dim[2] || y->dim[2] != x->dim[2] || y->dim[3] != b->dim[3] || y->dim[1] != x->dim[1] ||
            x->dim[1] % b->dim[1] || x->dim[0] != b->dim[0] || y->dim[0] != x->dim[0])
            CDG_FAIL("%s: (%lld,%lld,%lld) x (%lld,%lld,%lld) -> (%lld,%lld,%lld) is not a batched product", o->name,
                     (long long)x->dim[1], (long long)x->dim[2], (long long)x->dim[3], (long long)b->dim[1],
                     (long long)b->dim[2], (long long)b->dim[3], (long long)y->dim[1], (long long)y->dim[2],
                     (long long)y->dim[3]);
        break;
    case CDG_POINTWISE:
        if (o->mode == CDA_POINTWISE_GEN_INDEX) {
            if (o->axis < 0 || o->axis > 3 || memcmp(x->dim, y->dim, sizeof x->dim))
                CDG_FAIL("%s: bad index generation", o->name);
            break;
        }
        if (!cdg_broadcasts(x, y) || (b && !cdg_broadcasts(b, y)) || (t && !cdg_broadcasts(t, y)))
            CDG_FAIL("%s: an input does not broadcast to the output", o->name);
        if (o->mode == CDA_POINTWISE_BINARY_SELECT && (!t || t->dtype != CDA_DATA_BOOLEAN || !b))
            CDG_FAIL("%s: a select needs a boolean condition and two values", o->name);
        break;
    case CDG_REDUCTION:
        for (int i = 0; i < 4; i++)
            if (y->dim[i] != x->dim[i] && y->dim[i] != 1 && (y->dim[i] < 1 || x->dim[i] % y->dim[i]))
                CDG_FAIL("%s: dim %d %lld -> %lld is not a reduction", o->name, i, (long long)x->dim[i],
                         (long long)y->dim[i]);
        break;
    case CDG_RESHAPE:
        if (cdg_numel(x) != cdg_numel(y)) CDG_FAIL("%s: element counts differ", o->name);
        break;
    }
    return 0;
}

int cdg_check(const CdgGraph *g, char *err, size_t n) {
    uint8_t written[CDG_MAX_TENSORS] = {0}, used[CDG_MAX_TENSORS] = {0};
    for (int i = 0; i < g->nt; i++) {
        for (int j = 0; j < i; j++)
            if (g->t[i].uid == g->t[j].uid) CDG_FAIL("tensors %s and %s share uid %lld", g->t[j].name, g->t[i].name,
                                                     (long long)g->t[i].uid);
        if (g->t[i].by_value && cdg_numel(&g->t[i]) != 1) CDG_FAIL("scalar %s has more than one element", g->t[i].name);
        if (g->t[i].is_virtual != (g->t[i].uid >= CDG_UID_VIRTUAL))
            CDG_FAIL("tensor %s: virtual tensors, and only they, take uids from %d", g->t[i].name, CDG_UID_VIRTUAL);
        for (int d = 0; d < 4; d++)
            if (g->t[i].dim[d] < 1 || g->t[i].stride[d] < 1) CDG_FAIL("tensor %s: dim or stride %d < 1", g->t[i].name, d);
        if (g->t[i].ragged_uid) {
            int r = -1;
            for (int j = 0; j < i; j++)
                if (g->t[j].uid == g->t[i].ragged_uid) r = j;
            if (r < 0) CDG_FAIL("tensor %s: its ragged offsets are not a tensor built before it", g->t[i].name);
            const CdgTensor *R = &g->t[r];
            if (R->dtype != CDA_DATA_INT64 || R->is_virtual || R->by_value || R->dim[0] != g->t[i].dim[0] + 1 ||
                R->dim[1] != 1 || R->dim[2] != 1 || R->dim[3] != 1)
                CDG_FAIL("tensor %s: ragged offsets %s are not int64 (batch+1,1,1,1) bound", g->t[i].name, R->name);
            used[r] = 1;
        }
    }
    for (int k = 0; k < g->nop; k++) {
        const CdgOp *o = &g->op[k];
        const int ins[3] = {o->x, o->b, o->t};
        if (o->x < 0 || o->y < 0 || o->x >= g->nt || o->y >= g->nt || o->b >= g->nt || o->t >= g->nt ||
            o->mo >= g->nt || o->no >= g->nt || o->ko >= g->nt)
            CDG_FAIL("operation %s: tensor index out of range", o->name);
        if (o->kind != CDG_MATMUL && (o->mo >= 0 || o->no >= 0 || o->ko >= 0))
            CDG_FAIL("operation %s: length overrides on a non-matmul", o->name);
        const int ovs[3] = {o->mo, o->no, o->ko};
        for (int i = 0; i < 3; i++)
            if (ovs[i] >= 0) used[ovs[i]] = 1;
        for (int i = 0; i < 3; i++) {
            if (ins[i] < 0) continue;
            const CdgTensor *t = &g->t[ins[i]];
            if (t->is_virtual && !written[ins[i]]) CDG_FAIL("operation %s reads %s before it is written", o->name, t->name);
            used[ins[i]] = 1;
        }
        if (written[o->y]) CDG_FAIL("operation %s writes %s a second time", o->name, g->t[o->y].name);
        if (g->t[o->y].by_value) CDG_FAIL("operation %s writes the scalar %s", o->name, g->t[o->y].name);
        written[o->y] = used[o->y] = 1;
        if (cdg_check_shapes(g, o, err, n)) return -1;
    }
    for (int i = 0; i < g->nt; i++) {
        if (!used[i]) CDG_FAIL("tensor %s is neither read nor written", g->t[i].name);
        if (g->t[i].is_virtual) {
            int read = 0;
            for (int k = 0; k < g->nop; k++)
                read |= g->op[k].x == i || g->op[k].b == i || g->op[k].t == i;
            if (!read) CDG_FAIL("virtual tensor %s is written but never read", g->t[i].name);
        }
    }
    return 0;
}

/* ---- route ---- */

CdgRoute cdg_route(const AttnHint *m, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int causal, const char **why) {
    const char *w_ = "";
    CdgRoute r = CDG_ROUTE_OURS;
    if (Tq < 1 || Tk < 1) w_ = "no rows";
    else if (Tq == 1 && Tk == 1) w_ = "one query and one key (cuDNN refuses)";
    else if (hd % 8 || hd > 256 || nkv < 1 || nh % nkv) w_ = "head shape cuDNN does not take";
    else if (m->doc_min != m->doc_max) {
        int32_t b;
        int64_t smax;
        if (!causal) w_ = "document-masked, every key";
        else if (Tq != Tk || !m->q_consec || !m->k_consec || m->pos_q0 != m->pos_k0 || !m->same_pos)
            w_ = "document-masked, the query rows not the key rows";
        else if (!m->runs_clean) w_ = "document-masked, a document run that does not begin its document";
        else if (!cdg_varlen_rows_ok(Tq, nh, nkv)) w_ = "document-masked, GQA over more rows than variable length takes";
        else if (cdg_varlen_shape(m, Tq, &b, &smax)) w_ = "document-masked, too many or too uneven documents";
        else if ((int64_t)b * nh > CDG_VARLEN_MAX_BATCH_HEADS) w_ = "document-masked, too many documents x heads";
        else r = CDG_ROUTE_VARLEN, w_ = "causal within each document (variable length)";
    }
    else if (!causal || m->pos_k_max <= m->pos_q_min) r = CDG_ROUTE_DENSE, w_ = "every key visible";
    else if (m->q_consec && m->k_consec && m->pos_q0 == m->pos_k0) r = CDG_ROUTE_CAUSAL, w_ = "causal diagonal";
    else if (m->same_pos && m->rising) r = CDG_ROUTE_CAUSAL, w_ = "causal over the keys' own rows, positions rising";
    else w_ = "causal with shifted or gapped positions";
    if (why) *why = w_;
    return r;
}

static int64_t cdg_pow2_at_least(int64_t x, int64_t lo) {
    int64_t p = lo;
    while (p < x) p *= 2;
    return p;
}

int cdg_varlen_rows_ok(int64_t rows, int nh, int nkv) { return nh == nkv || rows <= CDG_VARLEN_GQA_MAX_ROWS; }

int cdg_varlen_backward_ok(int hd) { return hd <= 128; }

int cdg_varlen_shape(const AttnHint *h, int64_t T, int32_t *batch, int64_t *smax) {
    const int64_t b = cdg_pow2_at_least(h->runs, 2), s = cdg_pow2_at_least(h->run_max, 64);
    *batch = (int32_t)(b < INT32_MAX ? b : INT32_MAX);
    *smax = s;
    return b * s > 16 * (T > 4096 ? T : 4096) ? -1 : 0;
}

int cdg_route_fast(const AttnHint *h, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int causal) {
    return cdg_route(h, Tq, Tk, nh, nkv, hd, causal, NULL) != CDG_ROUTE_OURS;
}

/* ---- workspace ---- */

static int64_t cdg_region(int64_t *end, int64_t bytes) {
    const int64_t at = *end;
    *end += (bytes + 255) / 256 * 256;
    return at;
}

void cdg_workspace(CdgWorkspace *w, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int bwd,
                   int deterministic, int batch) {
    /* the gradients' elements: dense rows for one sequence, their inputs' row strides for variable length */
    const int64_t qe = Tq * (batch > 0 ? ldq : (int64_t)nh * hd), kve = Tk * (batch > 0 ? ldk : (int64_t)nkv * hd);
    int64_t end = 0;
    *w = (CdgWorkspace){.stats = -1, .softmax_sum = -1, .dq_accum = -1, .dq = -1, .dk = -1, .dv = -1, .seq = -1,
                        .off = {-1, -1, -1, -1}, .dk_full = -1, .dv_full = -1};
    w->stats = cdg_region(&end, Tq * nh * 4);
    if (bwd) {
        w->softmax_sum = cdg_region(&end, Tq * nh * 4);
        if (!deterministic) w->dq_accum = cdg_region(&end, qe * 4);
        w->dq = cdg_region(&end, qe * 2);
        if (batch > 0) { /* dk and dv interleaved in rows of ldk as k and v are (dv nkv hd after dk) */
            w->dk = cdg_region(&end, kve * 2);
            w->dv = w->dk + (int64_t)nkv * hd * 2;
        } else {
            w->dk = cdg_region(&end, kve * 2);
            w->dv = cdg_region(&end, kve * 2);
        }
    }
    if (batch > 0) {
        w->seq = cdg_region(&end, (int64_t)batch * 4);
        for (int i = 0; i < CDG_NOFF; i++) w->off[i] = cdg_region(&end, ((int64_t)batch + 1) * 8);
        if (bwd && nh != nkv) { /* bf16 rows of ldk x the group size (cdg_build's sFull) */
            w->dk_full = cdg_region(&end, Tk * ldk * (nh / nkv) * 2);
            w->dv_full = cdg_region(&end, Tk * ldk * (nh / nkv) * 2);
        }
    }
    w->bytes = end;
}

int64_t cdg_det_plan_bytes(int64_t Tq, int64_t Tk, int nh) { return Tq * Tk * nh * 2; }

/* ---- LSE layouts ---- */

void cdg_stats_to_lse_host(float *lse, const float *stats, int64_t Tq, int nh) {
    for (int64_t t = 0; t < Tq; t++)
        for (int h = 0; h < nh; h++) lse[cdg_lse_at(t, h, nh)] = stats[cdg_stats_at(t, h, Tq)];
}

void cdg_lse_to_stats_host(float *stats, const float *lse, int64_t Tq, int nh) {
    for (int64_t t = 0; t < Tq; t++)
        for (int h = 0; h < nh; h++) stats[cdg_stats_at(t, h, Tq)] = lse[cdg_lse_at(t, h, nh)];
}
