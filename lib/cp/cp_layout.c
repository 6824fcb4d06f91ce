/*
 * cp_layout.c — the zigzag layout, the CP context's buffers, and the
 * micro-batch's gathered metadata (see cp.h).
 *
 * Fragment g of a sample (g = 0 .. nglobal-1, in sample order) covers tokens
 * [g·s, (g+1)·s) with s = frag_len. With P > 1, g < P is held by rank g as its
 * local fragment 0 and g >= P by rank 2P-1-g as its local fragment 1; with
 * P = 1 the single fragment is the whole sample.
 *
 * Callers: lib/model/model.c (cp_init, cp_free), lib/model/model_step.c
 * (cp_batch_begin), lib/run/train.c and tests/parity/parity_step.c
 * (cp_read_sample), cp_gdn.c and cp_ring.c (the layout and batch facts).
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cp.h"
#include "core/error.h"
#include "model/model_acts.h"
#include "plan/plan.h"

void cp_layout_init(CpLayout *L, int64_t T, int P, int rank) {
    memset(L, 0, sizeof *L);
    RS_CHECK(P >= 1 && rank >= 0 && rank < P, "cp rank %d of %d", rank, P);
    RS_CHECK(T % (P == 1 ? 1 : 2 * P) == 0, "seq_len %lld is not divisible by 2 x cp = %d (config validation "
             "should have refused it)", (long long)T, 2 * P);
    L->P = P;
    L->rank = rank;
    L->T = T;
    L->T_local = T / P;
    L->nglobal = P == 1 ? 1 : 2 * P;
    L->nlocal = P == 1 ? 1 : 2;
    L->frag_len = P == 1 ? T : T / (2 * P);
    L->frag_global[0] = rank;
    L->frag_global[1] = P == 1 ? -1 : 2 * P - 1 - rank;
}

int cp_layout_owner(const CpLayout *L, int g, int *f) {
    RS_CHECK(g >= 0 && g < L->nglobal, "fragment %d of %d", g, L->nglobal);
    int first = g < L->P || L->P == 1;
    if (f) *f = first ? 0 : 1;
    return first ? (L->P == 1 ? 0 : g) : 2 * L->P - 1 - g;
}

int cp_read_sample(const CpLayout *L, CpReadSpan read, void *ctx, int64_t g, int32_t *tokens, int32_t *targets,
                   int32_t *pos, int32_t *doc_pos) {
    for (int f = 0; f < L->nlocal; f++) {
        int64_t t0 = (int64_t)L->frag_global[f] * L->frag_len, o = (int64_t)f * L->frag_len;
        int rc = read(ctx, g, t0, L->frag_len, tokens + o, targets + o, pos + o, doc_pos + o);
        if (rc) return rc;
    }
    return 0;
}

/* ---- the context ---------------------------------------------------------------------- */


/* CpCounters is a struct of per-layer arrays only: walk it as an array of them. */
#define CP_COUNTERS (sizeof(CpCounters) / sizeof(int64_t *))
_Static_assert(sizeof(CpCounters) % sizeof(int64_t *) == 0, "CpCounters holds only int64_t * arrays");
static int64_t **cp_counter_arrays(Cp *cp) { return (int64_t **)(void *)&cp->count; }
/* the JSON names of CpCounters' fields, in field order */
static const char *const cp_counter_names[] = {
    "attn_forwards",       "attn_kernel_calls",   "ring_hops_fwd",  "ring_passes_fwd", "ring_passes_bwd",
    "scan_allgathers_fwd", "scan_allgathers_bwd", "halo_exchanges", "gdn_forwards",
};
_Static_assert(sizeof cp_counter_names / sizeof cp_counter_names[0] == CP_COUNTERS,
               "a CpCounters field without its JSON name");

static int64_t cp_align(int64_t n) { return (n + CP_ALIGN - 1) / CP_ALIGN * CP_ALIGN; }

/* Points the Cp field of b->id (ActCpId) at p, p + bytes, ... */
static void cp_bind(Cp *cp, const ActCpBuffer *b, char *p) {
    static const struct { size_t off; int count; } fields[ACT_CP_IDS] = {
#define F(ID, field, c) [ID] = {offsetof(Cp, field), c}
        F(ACT_CP_KV_RECV, kv_recv, 2), F(ACT_CP_KV_KEPT, kv_kept, 1), F(ACT_CP_RUN_OUT, run_out, 1),
        F(ACT_CP_RUN_LSE, run_lse, 1), F(ACT_CP_LSE_EMPTY, lse_empty, 1), F(ACT_CP_BLK_OUT, blk_out, 1),
        F(ACT_CP_BLK_LSE, blk_lse, 1), F(ACT_CP_DQ_ACC, dq_acc, 1), F(ACT_CP_DKV_LOCAL, dkv_local, 1),
        F(ACT_CP_DKV_BUF, dkv_buf, 2), F(ACT_CP_SCAN_SEND, scan_send, 1), F(ACT_CP_SCAN_RECV, scan_recv, 1),
        F(ACT_CP_FOLD, fold, 2), F(ACT_CP_DSTATE, dstate, 1), F(ACT_CP_GDN_DKEPT, gdn_dkept, 1),
        F(ACT_CP_HALO_SEND, halo_send, 1), F(ACT_CP_HALO_RECV, halo_recv, 1),
#undef F
    };
    RS_CHECK(b->id >= 0 && b->id < ACT_CP_IDS && fields[b->id].count > 0, "CP buffer id %d has no field in Cp", b->id);
    RS_CHECK(fields[b->id].count == b->count, "CP buffer %s: %d copies listed, %d in Cp", act_cp_names[b->id],
             b->count, fields[b->id].count);
    for (int k = 0; k < b->count; k++) ((void **)((char *)cp + fields[b->id].off))[k] = p + k * cp_align(b->bytes);
}

void cp_init(Cp *cp, Comm *comm, const Backend *be, const Config *cfg) {
    memset(cp, 0, sizeof *cp);
    int P = (int)cfg->parallel.cp;
    int32_t samples = (int32_t)cfg->data.micro_batch;
    RS_CHECK(comm || P == 1, "parallel.cp = %d needs MPI ranks", P);
    cp->comm = comm;
    cp->be = be;
    cp->ring_calls = (RingCalls)cfg->parallel.ring_calls;
    cp_layout_init(&cp->L, cfg->data.seq_len, P, comm ? comm->cp_rank : 0);
    cp->layers = (int)cfg->model.num_hidden_layers;
    cp->kv_slot = RS_MALLOC((size_t)cp->layers * sizeof(int));
    cp->kv_kept_ok = RS_CALLOC((size_t)cp->layers, 1);
    int n_full = 0;
    for (int l = 0; l < cp->layers; l++) cp->kv_slot[l] = config_layer_kind(cfg, l) == LAYER_KIND_FULL ? n_full++ : -1;
    cp->ring_keep_kv = P == 2 && cfg->parallel.ring_keep_kv && n_full > 0; /* model_acts.c lists kv_kept then */
    cp->gdn_method = cp_gdn_method(cfg);
    cp->gdn_fwd_hybrid = RS_CALLOC((size_t)cp->layers, 1);
    if (P > 1) /* one fragment's backward stages (the backend's format); the arena holds them where the method
                  stages its backward (model_acts.c counts them), cp_gdn_set_method allocates them otherwise */
        cp->gdn_dkept_one = (cfg->model.linear_attention == LINEAR_ATTN_KDA ? be->kda_dkept_bytes : be->gdn_dkept_bytes)(
            cp->L.frag_len, (int)cfg->model.linear_num_value_heads, (int)cfg->model.linear_key_head_dim,
            (int)cfg->model.linear_value_head_dim);

    ActTable t;
    const Config kept = plan_resolve(cfg); /* keep_layers, chunk_rows, input_rows: plan's figures, as the model's */
    model_acts_build(&t, &kept);
    /* the ALWAYS buffers, then the ring forward's and backward's own over the same bytes (model_acts.h) */
    const int64_t fwd = t.cp_phase[ACT_CP_FORWARD], bwd = t.cp_phase[ACT_CP_BACKWARD];
    const int64_t total = t.cp_phase[ACT_CP_ALWAYS] + (fwd > bwd ? fwd : bwd);
    RS_CHECK(total == t.cp_bytes[ACT_CP_RING] + t.cp_bytes[ACT_CP_SCAN], "CP buffers: %lld bytes, plan counts %lld",
             (long long)total, (long long)(t.cp_bytes[ACT_CP_RING] + t.cp_bytes[ACT_CP_SCAN]));
    cp->arena = total ? be->alloc((size_t)total) : NULL;
    char *at[ACT_CP_PHASES];
    at[ACT_CP_ALWAYS] = cp->arena;
    at[ACT_CP_FORWARD] = at[ACT_CP_BACKWARD] = (char *)cp->arena + t.cp_phase[ACT_CP_ALWAYS];
    for (int i = 0; i < t.ncp; i++) {
        cp_bind(cp, &t.cp[i], at[t.cp[i].phase]);
        at[t.cp[i].phase] += t.cp[i].count * cp_align(t.cp[i].bytes);
        if (t.cp[i].id == ACT_CP_GDN_DKEPT) { /* the backend's format; model_acts.c counts it per fragment */
            cp->gdn_dkept_frags = cp_gdn_method_staged(cp->gdn_method, cfg);
            const int64_t need = (int64_t)samples * cp->gdn_dkept_frags * (int64_t)cp->gdn_dkept_one;
            RS_CHECK(need <= t.cp[i].bytes, "gdn_dkept: the %s backend needs %lld bytes, model_acts.c counts %lld",
                     be->name, (long long)need, (long long)t.cp[i].bytes);
        }
    }
    model_acts_free(&t);

    CpBatch *B = &cp->batch;
    if (cp->lse_empty) { /* written once: every ring forward starts its running LSE from it */
        int64_t n = (int64_t)samples * cp->L.T_local * cfg->model.num_attention_heads;
        float *neg = RS_MALLOC((size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) neg[i] = -INFINITY;
        be->to_device(cp->lse_empty, neg, (size_t)n * sizeof(float));
        free(neg);
    }
    B->samples = samples;
    B->rows = (int64_t)samples * cp->L.T_local;
    B->slots = (int)cfg->train.grad_accum;
    size_t meta = (size_t)B->slots * 2 * (size_t)P * (size_t)B->rows * sizeof(int32_t);
    B->host_all = be->host_alloc(meta);
    B->dev_all = be->alloc(meta);
    B->frag_resets = RS_CALLOC((size_t)samples * cp->L.nglobal, 1);
    B->frag_starts_doc = RS_CALLOC((size_t)samples * cp->L.nglobal, 1);

    int64_t **c = cp_counter_arrays(cp);
    for (size_t i = 0; i < CP_COUNTERS; i++) c[i] = RS_CALLOC((size_t)cp->layers, sizeof(int64_t));
}

void cp_free(Cp *cp) {
    if (cp->arena) cp->be->free(cp->arena);
    if (cp->gdn_dkept_own) cp->be->free(cp->gdn_dkept_own);
    free(cp->gdn_fwd_hybrid);
    cp->be->host_free(cp->batch.host_all);
    cp->be->free(cp->batch.dev_all);
    free(cp->batch.frag_resets);
    free(cp->batch.frag_starts_doc);
    free(cp->kv_slot);
    free(cp->kv_kept_ok);
    int64_t **c = cp_counter_arrays(cp);
    for (size_t i = 0; i < CP_COUNTERS; i++) free(c[i]);
    memset(cp, 0, sizeof *cp);
}

json_t *cp_counters_json(const Cp *cp) {
    int64_t *const *c = (int64_t *const *)(const void *)&cp->count;
    json_t *o = json_object();
    for (size_t i = 0; i < CP_COUNTERS; i++) {
        json_t *a = json_array();
        for (int l = 0; l < cp->layers; l++) json_array_append_new(a, json_integer(c[i][l]));
        json_object_set_new(o, cp_counter_names[i], a);
    }
    return o;
}

void cp_counters_reset(Cp *cp) {
    int64_t **c = cp_counter_arrays(cp);
    for (size_t i = 0; i < CP_COUNTERS; i++) memset(c[i], 0, (size_t)cp->layers * sizeof(int64_t));
}

/* ---- the micro-batch's metadata --------------------------------------------------------- */

void cp_batch_begin(Cp *cp, int micro, const int32_t *pos, const int32_t *doc_pos) {
    const CpLayout *L = &cp->L;
    CpBatch *B = &cp->batch;
    const Backend *be = cp->be;
    RS_CHECK(micro >= 0 && micro < B->slots, "micro-batch %d of a step of %d", micro, B->slots);
    const size_t local = (size_t)B->rows * sizeof(int32_t), n = (size_t)L->P * B->rows;
    B->pos = B->host_all + (size_t)micro * 2 * n;
    B->doc_pos = B->pos + n;
    B->pos_dev = B->dev_all + (size_t)micro * 2 * n;
    B->doc_pos_dev = B->pos_dev + n;
    if (L->P > 1) { /* one all-gather of [pos | doc_pos] per rank, unpacked rank-major */
        int32_t *send = RS_MALLOC(2 * local), *recv = RS_MALLOC((size_t)L->P * 2 * local);
        memcpy(send, pos, local);
        memcpy(send + B->rows, doc_pos, local);
        comm_allgather(cp->comm, cp->comm->cp_comm, send, recv, (int64_t)(2 * local));
        for (int r = 0; r < L->P; r++) {
            memcpy(B->pos + (size_t)r * B->rows, recv + (size_t)r * 2 * B->rows, local);
            memcpy(B->doc_pos + (size_t)r * B->rows, recv + ((size_t)r * 2 + 1) * B->rows, local);
        }
        free(send);
        free(recv);
    } else {
        memcpy(B->pos, pos, local);
        memcpy(B->doc_pos, doc_pos, local);
    }
    be->to_device_async(B->pos_dev, B->pos, 2 * n * sizeof(int32_t));

    /* per global fragment: does a document start inside it, and at its first token? */
    for (int s = 0; s < B->samples; s++)
        for (int g = 0; g < L->nglobal; g++) {
            int f, r = cp_layout_owner(L, g, &f);
            const int32_t *dp = B->doc_pos + (size_t)r * B->rows + s * L->T_local + (int64_t)f * L->frag_len;
            int resets = 0;
            for (int64_t t = 0; t < L->frag_len && !resets; t++) resets = dp[t] == 0;
            B->frag_resets[s * L->nglobal + g] = (uint8_t)resets;
            B->frag_starts_doc[s * L->nglobal + g] = (uint8_t)(dp[0] == 0);
        }
}
