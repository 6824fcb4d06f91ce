/*
 * model_acts.c — lists every activation buffer of one micro-batch on one rank and sums what each
 * checkpoint policy keeps (model_acts.h): the one table model.c allocates from, cp_init binds the CP
 * buffers from, and `ringscan plan` reports. Callers: lib/model/model.c, lib/cp/cp_layout.c,
 * lib/plan/plan.c, tests/unit/test_model_acts.c.
 *
 * The per-layer lists follow each block's forward (model_block.c); a buffer is here because the backward
 * reads it. Three kinds: whole rows (T), what a mixer's core reads across tokens (GDN: q|k normed, v, z,
 * beta, g, the core output, the delta rule's kept buffer by checkpoint.gdn_keep and, at cp > 1, each
 * fragment's entry state, transition and conv halo; attention: q, k|v as the ring sends it, the gate, the
 * output and its fp32 LSE); per-token rows, kept whole under none and one shared chunk of chunk_rows rows
 * under full and remat, whose backward recomputes each chunk (but the input side, ln1 and the in_proj outputs,
 * under checkpoint.input_rows whole: every row in the recompute's scratch, so the backward reruns no in_proj);
 * and chunk scratch, never kept. The head keeps the last block's output and one loss row chunk (fp32 logits of
 * at most LOSS_CHUNK_BYTES).
 *
 * Transient terms: the recompute of layer l materialises that layer's unkept buffers and nothing of other
 * layers; the backward holds the residual-stream gradient, one chunk's gradients and per mixer kind the
 * whole-rows gradients; the delta rule's workspace and kept / dkept bytes are the backend's own figures
 * (BackendSizes: asked, never re-derived here); attention keeps no T x T matrix.
 *
 * The CP buffers (cp.h: the ring's K|V receive buffers and fp32 accumulators, the scan's gathered
 * transitions, fold and halo tails) are listed too, by ActCpId, so plan's "CP ring" / "CP scan" rows are
 * what cp_init allocates. The reasoning per buffer: docs/design/model.md.
 */
#include "model_acts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/runtime.h"
#include "core/error.h"
#include "cp/cp.h"

/* fp32 logits of one row chunk of the fused lm_head + CE. Each chunk's dw GEMM reads and writes the
 * whole fp32 (V, C) gradient, so few large chunks: at 2 GiB and V = 151,936, 3,533 rows a chunk (10 at
 * T = 32k). Smaller chunks make the lm_head markedly slower for little memory (docs/performance.md). */
#define LOSS_CHUNK_BYTES (2LL << 30)



typedef struct {
    ActTable *t;
    int32_t   cap;
    int       policy;  /* the config's checkpoint.activations: the sizes model.c allocates */
    int64_t   T, R;    /* rows of a whole buffer and of a chunk */
    int       first_kept; /* layers from this one on keep under `policy` what none keeps (checkpoint.keep_layers) */
} ActBuild;

static void acts_add_grad(ActTable *t, int32_t *cap, const char *name, ActGradPhase phase, int64_t bytes) {
    if (t->ng == *cap) {
        *cap = *cap ? *cap * 2 : 32;
        t->g = RS_REALLOC(t->g, (size_t)*cap * sizeof *t->g);
    }
    ActGradBuffer *b = &t->g[t->ng++];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->phase = phase;
    b->bytes = bytes;
    t->grad_phase[phase] += bytes;
}

static int64_t acts_align(int64_t n) { return (n + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN; }

const char *const act_cp_names[ACT_CP_IDS] = {
    [ACT_CP_KV_RECV] = "kv_recv",
    [ACT_CP_KV_KEPT] = "kv_kept",
    [ACT_CP_RUN_OUT] = "run_out",
    [ACT_CP_RUN_LSE] = "run_lse",
    [ACT_CP_LSE_EMPTY] = "lse_empty",
    [ACT_CP_BLK_OUT] = "blk_out",
    [ACT_CP_BLK_LSE] = "blk_lse",
    [ACT_CP_DQ_ACC] = "dq_acc",
    [ACT_CP_DKV_LOCAL] = "dkv_local",
    [ACT_CP_DKV_BUF] = "dkv_buf",
    [ACT_CP_SCAN_SEND] = "scan_send",
    [ACT_CP_SCAN_RECV] = "scan_recv",
    [ACT_CP_FOLD] = "fold",
    [ACT_CP_DSTATE] = "dstate",
    [ACT_CP_GDN_DKEPT] = "gdn_dkept",
    [ACT_CP_HALO_SEND] = "halo_send",
    [ACT_CP_HALO_RECV] = "halo_recv",
};

static void acts_add_cp(ActTable *t, ActCpId id, ActCpKind kind, ActCpPhase phase, int count, int64_t bytes) {
    RS_CHECK(t->ncp < ACT_CP_MAX, "raise ACT_CP_MAX");
    ActCpBuffer *b = &t->cp[t->ncp++];
    b->id = id;
    b->kind = kind;
    b->phase = phase;
    b->count = count;
    b->bytes = bytes;
    t->cp_phase[phase] += count * ((bytes + CP_ALIGN - 1) / CP_ALIGN * CP_ALIGN);
}

/* A buffer of `rows` under the policies in `keep` and `other_rows` under the rest (the config's policy
 * picks rows / bytes). */
static ActBuffer *acts_add_sized(ActBuild *ab, int layer, const char *name, int64_t rows, int64_t other_rows,
                                 int64_t cols, int elt, uint32_t keep) {
    ActTable *t = ab->t;
    if (t->n == ab->cap) {
        ab->cap = ab->cap ? ab->cap * 2 : 64;
        t->b = RS_REALLOC(t->b, (size_t)ab->cap * sizeof *t->b);
    }
    ActBuffer *b = &t->b[t->n++];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    /* a kept layer (checkpoint.keep_layers): what none keeps, the config's policy keeps too, whole */
    if (keep & (1u << ab->policy)) t->pure_kept += rows * cols * elt;
    if (layer >= ab->first_kept && (keep & ACT_KEEP_NONE)) keep |= 1u << ab->policy;
    b->layer = layer;
    b->cols = cols;
    b->elt = elt;
    b->keep = keep;
    for (int p = 0; p < ACT_POLICY_COUNT; p++) b->policy_bytes[p] = (keep & (1u << p) ? rows : other_rows) * cols * elt;
    b->rows = keep & (1u << ab->policy) ? rows : other_rows;
    b->bytes = b->policy_bytes[ab->policy];
    return b;
}

/* one size under every policy */
static void acts_add(ActBuild *ab, int layer, const char *name, int64_t rows, int64_t cols, int elt, uint32_t keep) {
    acts_add_sized(ab, layer, name, rows, rows, cols, elt, keep);
}

/* a per-token buffer: whole and kept under none, one chunk (never kept) under full and remat */
static void acts_add_token(ActBuild *ab, int layer, const char *name, int64_t cols, int elt) {
    acts_add_sized(ab, layer, name, ab->T, ab->R, cols, elt, ACT_KEEP_NONE)->chunk = 1;
}

/* a per-token buffer of the input side (ln1 and the in_proj's outputs): as acts_add_token, but under
 * checkpoint.input_rows whole T rows under full and remat too, not kept (the recompute's scratch) */
static void acts_add_input(ActBuild *ab, int layer, const char *name, int64_t cols, int elt) {
    const int whole = ab->t->inputs_whole;
    acts_add_sized(ab, layer, name, ab->T, whole ? ab->T : ab->R, cols, elt, ACT_KEEP_NONE)->chunk = !whole;
}

/* chunk scratch: `rows` (R, or the conv halo's) under every policy, never kept */
static void acts_add_chunk(ActBuild *ab, int layer, const char *name, int64_t rows, int64_t cols, int elt) {
    acts_add_sized(ab, layer, name, rows, rows, cols, elt, 0)->chunk = 1;
}

/* Rows per chunk of a layer's per-token work (checkpoint.chunk_rows, or the rule: the largest multiple
 * of 64 whose chunk scratch under full / remat, forward buffers plus gradients at `row_bytes` a row, fits
 * ACT_CHUNK_BYTES_RULE; never more than a fragment, whose rows the chunks cut). The same rows under none, where
 * the forward buffers are kept whole: there R sets the rows of each per-token kernel call and of the
 * scratch that stays (the conv output, the gradients). */
static int64_t acts_chunk_rows(const Config *cfg, int64_t frag_len, int64_t row_bytes) {
    int64_t r = cfg->checkpoint.chunk_rows;
    if (r == 0) {
        r = ACT_CHUNK_BYTES_RULE / row_bytes / GDN_CHUNK * GDN_CHUNK;
        if (r < GDN_CHUNK) r = GDN_CHUNK;
    }
    return r < frag_len ? r : frag_len;
}

void model_acts_build(ActTable *t, const Config *cfg) {
    const ModelConfig *m = &cfg->model;
    memset(t, 0, sizeof *t);
    char why[512];
    /* the delta rule's kept, dkept and workspace bytes: the backend's own figures (the cpu's, or the registered
     * device's); plan of a cuda run in a binary without the cuda backend stops here, saying so */
    t->sizes = runtime_sizes((int)cfg->device.kind, why, sizeof why);
    if (!t->sizes) error_exit(RS_EXIT_USAGE, __FILE__, __LINE__, NULL, "%s", why);
    const BackendSizes *sz = t->sizes;
    RS_CHECK(cfg->checkpoint.input_rows != INPUT_ROWS_AUTO, "checkpoint.input_rows auto reached the activation table "
             "unresolved: the caller resolves it with plan_resolve (lib/plan/plan.h) first");
    const int whole = cfg->checkpoint.input_rows == INPUT_ROWS_WHOLE;
    ActBuild ab = {t, 0, cfg->checkpoint.activations, 0, 0, 0};
    t->inputs_whole = whole;
    RS_CHECK(cfg->checkpoint.mlp_act != MLP_ACT_AUTO, "checkpoint.mlp_act auto reached the activation table "
             "unresolved: the caller resolves it with plan_resolve (lib/plan/plan.h) first");
    t->act_kept = cfg->checkpoint.mlp_act == MLP_ACT_KEPT;
    const int L = (int)m->num_hidden_layers;
    /* checkpoint.keep_layers: the last N layers keep what none keeps (auto: plan's rule, the one figure plan
     * and the model use); under none every layer does */
    const int64_t keep_layers = cfg->checkpoint.activations == ACT_POLICY_NONE ? L : cfg->checkpoint.keep_layers;
    RS_CHECK(keep_layers != CONFIG_AUTO, "checkpoint.keep_layers auto reached the activation table unresolved: the "
             "caller resolves it with plan_resolve (lib/plan/plan.h) first");
    RS_CHECK(keep_layers >= 0 && keep_layers <= L, "checkpoint.keep_layers %lld of %d layers",
             (long long)keep_layers, L);
    t->keep_layers = (int32_t)keep_layers;
    t->first_kept = L - (int32_t)keep_layers;
    ab.first_kept = cfg->checkpoint.activations == ACT_POLICY_NONE ? L : t->first_kept;
    int64_t cp = cfg->parallel.cp;
    int64_t T = cfg->data.micro_batch * cfg->data.seq_len / cp;
    int e = cfg->device.kind == DEVICE_KIND_CUDA ? 2 : 4; /* activation element */
    const int f = 4;                                      /* fp32 statistics */
    int64_t H = m->hidden_size, I = m->intermediate_size;
    int64_t nk = m->linear_num_key_heads, nv = m->linear_num_value_heads;
    int64_t dk = m->linear_key_head_dim, dv = m->linear_value_head_dim;
    int64_t Kd = nk * dk, Vd = nv * dv, Cc = 2 * Kd + Vd, Kc = m->linear_conv_kernel_dim;
    int64_t nh = m->num_attention_heads, nkv = m->num_key_value_heads, hd = m->head_dim;
    int64_t qd = nh * hd, kvd = nkv * hd;
    /* KDA layers (model.linear_attention kda, docs/design/kda.md): in_proj [q|k|v|f_a|g_a|b] (the low-rank gates of
     * rank dv), the decay gate f (nv dk per token) before the gates, the output norm before its sigmoid gate
     * ("kda_unit"), and g per key channel */
    const int kda = m->linear_attention == LINEAR_ATTN_KDA;
    const int64_t Gw = kda ? nv * dk : nv; /* g's and dg's width */
    int64_t Pg = kda ? Cc + 2 * dv + nv : Cc + Vd + 2 * nv, Pa = 2 * qd + 2 * kvd;
    if (kda) RS_CHECK(sz->kda_kept_bytes && sz->kda_dkept_bytes, "model.linear_attention kda on a backend without KDA "
                      "kernels (config_validate refuses it)");
    size_t (*kept_bytes)(int64_t, int, int, int, int) = kda ? sz->kda_kept_bytes : sz->gdn_kept_bytes;
    size_t (*dkept_bytes)(int64_t, int, int, int) = kda ? sz->kda_dkept_bytes : sz->gdn_dkept_bytes;
    t->tokens = T;
    t->elt = e;

    int64_t frags = cfg->data.micro_batch * (cp > 1 ? 2 : 1); /* zigzag fragments per micro-batch */
    /* chunk scratch per row: the block's own buffers (the wider mixer's) and the gradients; the input side (ln1,
     * rstd1, the in_proj outputs, KDA's f) only under input_rows chunk */
    /* the conv output gdn_conv and its gradient d_conv: KDA only (GDN fuses the conv with the split after it) */
    const int64_t in_row = whole ? 0 : 1;
    int64_t block_row = (2 * H + in_row * H + 3 * I) * e + (1 + in_row) * f,
            gdn_row = (in_row * Pg + Vd + (kda ? Cc + in_row * Gw + Vd : 0)) * e + nv * f;
    int64_t attn_row = (in_row * Pa + qd) * e;
    int64_t mix = Vd > qd ? Vd : qd, pw = Pg > Pa ? Pg : Pa;
    int64_t grad_row = (H + 3 * I + mix + pw + (kda ? Cc + Gw + Vd : 0)) * e;
    t->chunk_row_bytes = block_row + (gdn_row > attn_row ? gdn_row : attn_row) + grad_row;
    const int64_t R = acts_chunk_rows(cfg, T / frags, t->chunk_row_bytes);
    t->chunk_rows = R;
    t->frag_rows = T / frags;
    ab.T = T;
    ab.R = R;

    int64_t max_states = 0;
    for (int l = 0; l < m->num_hidden_layers; l++) {
        int first = t->n;
        acts_add(&ab, l, "x", T, H, e, ACT_KEEP_ALL);
        /* the layer's whole-rows buffers: what its mixer's core (the delta rule and its scan, the ring) reads */
        if (config_layer_kind(cfg, l) == LAYER_KIND_LINEAR) {
            acts_add(&ab, l, "gdn_qk_norm", T, 2 * Kd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_qk_rstd", T, 2 * nk, f, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_v", T, Vd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_z", T, Vd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_beta", T, nv, f, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_g", T, Gw, f, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_core", T, Vd, e, ACT_KEEP_NONE);
            if (cfg->checkpoint.gdn_keep != GDN_KEEP_NONE)
                acts_add(&ab, l, "gdn_kept", frags,
                         (int64_t)kept_bytes(T / frags, (int)nv, (int)dk, (int)dv,
                                             model_acts_gdn_kept_kind(t, cfg, l)),
                         1, ACT_KEEP_NONE);
            if (cp > 1) {
                acts_add(&ab, l, "gdn_cp_states", frags, nv * dk * dv, f, ACT_KEEP_NONE | ACT_KEEP_REMAT);
                acts_add(&ab, l, "gdn_cp_M", frags, nv * dk * dk, f, ACT_KEEP_NONE | ACT_KEEP_REMAT);
                acts_add(&ab, l, "gdn_conv_halo", frags, (Kc - 1) * Cc, e, ACT_KEEP_NONE | ACT_KEEP_REMAT);
            }
            const int kept_kind =
                cfg->device.kind == DEVICE_KIND_CUDA && cfg->checkpoint.gdn_keep == GDN_KEEP_STATES;
            /* cuda: the delta rule's workspace; cpu: its backward's per-chunk states and their gradients */
            size_t (*ws_bytes)(int64_t, int, int, int, int, int) =
                kda && sz->kda_workspace_bytes ? sz->kda_workspace_bytes : sz->gdn_workspace_bytes;
            int64_t s = cfg->device.kind == DEVICE_KIND_CUDA
                            ? (int64_t)ws_bytes(T / frags, (int)cp, (int)nv, (int)dk, (int)dv, kept_kind)
                            : 2 * ((T + GDN_CHUNK - 1) / GDN_CHUNK) * nv * dk * dv * e;
            if (s > max_states) max_states = s;
        } else {
            acts_add(&ab, l, "attn_q", T, qd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "attn_kv", T, 2 * kvd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "attn_gate", T, qd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "attn_qk_rstd", T, nh + nkv, f, ACT_KEEP_NONE);
            acts_add(&ab, l, "attn_out", T, qd, e, ACT_KEEP_NONE | ACT_KEEP_REMAT);
            acts_add(&ab, l, "attn_lse", T, nh, f, ACT_KEEP_NONE | ACT_KEEP_REMAT);
        }
        /* the per-token buffers the backward reads (whole under none, a chunk's under full / remat) and
         * the chunk scratch */
        acts_add_input(&ab, l, "ln1", H, e);
        acts_add_input(&ab, l, "rstd1", 1, f);
        if (config_layer_kind(cfg, l) == LAYER_KIND_LINEAR) {
            acts_add_input(&ab, l, "gdn_proj", Pg, e);
            if (kda) acts_add_chunk(&ab, l, "gdn_conv", R, Cc, e); /* GDN: gdn_conv_split, no conv output */
            acts_add_chunk(&ab, l, "gdn_halo", Kc - 1, Cc, e);
            acts_add_token(&ab, l, "gdn_normed", Vd, e);
            acts_add_token(&ab, l, "gdn_norm_rstd", nv, f);
            if (kda) {
                acts_add_input(&ab, l, "kda_f", Gw, e);
                acts_add_token(&ab, l, "kda_unit", Vd, e);
            }
        } else {
            acts_add_input(&ab, l, "attn_proj", Pa, e);
            acts_add_token(&ab, l, "attn_gated", qd, e);
        }
        acts_add_token(&ab, l, "h", H, e);
        acts_add_token(&ab, l, "ln2", H, e);
        acts_add_token(&ab, l, "rstd2", 1, f);
        acts_add_token(&ab, l, "mlp_gate_up", 2 * I, e);
        /* the down projection's input: kept as a per-token buffer under checkpoint.mlp_act kept; else one chunk,
         * written in the forward just before its GEMM and again in the backward by swiglu_backward from gate_up */
        if (t->act_kept) acts_add_token(&ab, l, "mlp_act", I, e);
        else acts_add_chunk(&ab, l, "mlp_act", R, I, e);

        /* per-layer transients (and the chunk scratch among them), and the largest layer's kept bytes
         * (checkpoint.offload's device slot) */
        for (int p = 0; p < ACT_POLICY_COUNT; p++) {
            int64_t missing = 0, chunk = 0, kept = 0;
            for (int i = first; i < t->n; i++) {
                const ActBuffer *b = &t->b[i];
                if (b->keep & (1u << p)) {
                    kept += acts_align(b->policy_bytes[p]);
                    continue;
                }
                missing += b->policy_bytes[p];
                if (b->chunk) chunk += b->policy_bytes[p];
            }
            if (missing > t->recompute[p]) t->recompute[p] = missing;
            if (chunk > t->chunk_scratch[p]) t->chunk_scratch[p] = chunk;
            if (kept > t->layer_kept_max[p]) t->layer_kept_max[p] = kept;
            if (l < m->num_hidden_layers - 2) t->offload_host[p] += kept; /* the last two stay */
        }
    }
    /* the head: the last block's output, then the final norm, the fused lm_head + CE and the final norm's
     * backward row chunk by row chunk (model_step.c), so only final_in has every row */
    int64_t rows = LOSS_CHUNK_BYTES / (4 * m->vocab_size);
    if (rows < 64) rows = 64;
    if (rows > T) rows = T;
    t->loss_chunk_rows = rows;
    t->loss_workspace = rows * m->vocab_size * 4;
    acts_add(&ab, -1, "final_in", T, H, e, ACT_KEEP_ALL);
    acts_add(&ab, -1, "final_norm", rows, H, e, ACT_KEEP_ALL);
    acts_add(&ab, -1, "final_rstd", rows, 1, f, ACT_KEEP_ALL);
    acts_add(&ab, -1, "d_final", rows, H, e, ACT_KEEP_ALL);
    acts_add(&ab, -1, "tokens_targets", T, 2, 4, ACT_KEEP_ALL);

    for (int i = 0; i < t->n; i++)
        for (int p = 0; p < ACT_POLICY_COUNT; p++)
            if (t->b[i].keep & (1u << p)) {
                t->kept[p] += t->b[i].policy_bytes[p];
                if (t->b[i].layer < 0) t->head_kept[p] += acts_align(t->b[i].policy_bytes[p]);
            }

    /* gradient scratch: the residual stream's and the chunk's (persistent), the mixers' whole rows
     * (activation type; gates fp32) */
    int32_t gcap = 0;
    acts_add_grad(t, &gcap, "d_resid", ACT_GRAD_PERSISTENT, T * H * e);
    acts_add_grad(t, &gcap, "d_ln", ACT_GRAD_PERSISTENT, R * H * e);
    acts_add_grad(t, &gcap, "d_act", ACT_GRAD_PERSISTENT, R * I * e);
    acts_add_grad(t, &gcap, "d_gate_up", ACT_GRAD_PERSISTENT, R * 2 * I * e);
    acts_add_grad(t, &gcap, "d_mix", ACT_GRAD_PERSISTENT, R * mix * e);
    acts_add_grad(t, &gcap, "d_proj", ACT_GRAD_PERSISTENT, R * pw * e);
    acts_add_grad(t, &gcap, "d_halo", ACT_GRAD_PERSISTENT, (Kc - 1) * Cc * e);
    if (kda) { /* d_conv: GDN's conv backward takes the split's gradient in registers (gdn_conv_split_backward) */
        acts_add_grad(t, &gcap, "d_conv", ACT_GRAD_PERSISTENT, R * Cc * e);
        acts_add_grad(t, &gcap, "d_kda_f", ACT_GRAD_PERSISTENT, R * Gw * e);
        acts_add_grad(t, &gcap, "d_kda_unit", ACT_GRAD_PERSISTENT, R * Vd * e);
    }
    acts_add_grad(t, &gcap, "d_core", ACT_GRAD_GDN, T * Vd * e);
    acts_add_grad(t, &gcap, "d_z", ACT_GRAD_GDN, T * Vd * e);
    acts_add_grad(t, &gcap, "d_qk", ACT_GRAD_GDN, T * 2 * Kd * e);
    acts_add_grad(t, &gcap, "d_v", ACT_GRAD_GDN, T * Vd * e);
    acts_add_grad(t, &gcap, "d_beta", ACT_GRAD_GDN, T * nv * f);
    acts_add_grad(t, &gcap, "d_g", ACT_GRAD_GDN, T * Gw * f);
    acts_add_grad(t, &gcap, "d_attn_out", ACT_GRAD_ATTN, T * qd * e);
    acts_add_grad(t, &gcap, "d_gate", ACT_GRAD_ATTN, T * qd * e);
    acts_add_grad(t, &gcap, "d_q", ACT_GRAD_ATTN, T * qd * e);
    acts_add_grad(t, &gcap, "d_kv", ACT_GRAD_ATTN, T * 2 * kvd * e);
    int64_t largest = 0;
    for (int ph = ACT_GRAD_PERSISTENT + 1; ph < ACT_GRAD_PHASES; ph++)
        if (t->grad_phase[ph] > largest) largest = t->grad_phase[ph];
    t->grad_working = t->grad_phase[ACT_GRAD_PERSISTENT] + largest;
    for (int p = 0; p < ACT_POLICY_COUNT; p++) /* the chunk's gradients: the persistent ones but d_resid */
        t->chunk_scratch[p] += t->grad_phase[ACT_GRAD_PERSISTENT] - T * H * e;
    t->gdn_states = max_states;
    for (int p = 0; p < ACT_POLICY_COUNT; p++) {
        t->peak[p] = t->kept[p] + t->recompute[p] + t->grad_working + t->gdn_states;
        /* offload: two layers' slots and the head on the device, the kept bytes of every layer but
         * the last two (which never leave their slots) on the host */
        t->offload_device[p] = 2 * t->layer_kept_max[p] + t->head_kept[p];
        t->peak_offload[p] = t->offload_device[p] + t->recompute[p] + t->grad_working + t->gdn_states;
    }

    /* CP communication buffers (lib/cp/cp.h), allocated once and used by one layer at a time */
    int64_t kv = 2 * kvd;
    int n_full = 0;
    for (int l = 0; l < m->num_hidden_layers; l++) n_full += config_layer_kind(cfg, l) == LAYER_KIND_FULL;
    if (n_full > 0) {
        if (cp == 2 && cfg->parallel.ring_keep_kv) /* each layer's received block, kept to its backward */
            acts_add_cp(t, ACT_CP_KV_KEPT, ACT_CP_RING, ACT_CP_ALWAYS, 1, n_full * T * kv * e);
        else if (cp > 1) acts_add_cp(t, ACT_CP_KV_RECV, ACT_CP_RING, ACT_CP_ALWAYS, 2, T * kv * e);
        acts_add_cp(t, ACT_CP_RUN_OUT, ACT_CP_RING, ACT_CP_FORWARD, 1, T * qd * f);
        acts_add_cp(t, ACT_CP_RUN_LSE, ACT_CP_RING, ACT_CP_FORWARD, 1, T * nh * f);
        acts_add_cp(t, ACT_CP_LSE_EMPTY, ACT_CP_RING, ACT_CP_ALWAYS, 1, T * nh * f); /* written once, at cp_init */
        acts_add_cp(t, ACT_CP_BLK_OUT, ACT_CP_RING, ACT_CP_FORWARD, 1, T * qd * e);
        acts_add_cp(t, ACT_CP_BLK_LSE, ACT_CP_RING, ACT_CP_FORWARD, 1, T * nh * f);
        acts_add_cp(t, ACT_CP_DQ_ACC, ACT_CP_RING, ACT_CP_BACKWARD, 1, T * qd * f);
        acts_add_cp(t, ACT_CP_DKV_LOCAL, ACT_CP_RING, ACT_CP_BACKWARD, 1, T * kv * f);
        if (cp > 1) acts_add_cp(t, ACT_CP_DKV_BUF, ACT_CP_RING, ACT_CP_BACKWARD, 2, T * kv * f);
    }
    int64_t ring_always = t->cp_phase[ACT_CP_ALWAYS];
    if (cp > 1 && n_full < m->num_hidden_layers) {
        int64_t pair = frags * nv * dk * (dk + dv) * f, tail = frags * (Kc - 1) * Cc * e;
        acts_add_cp(t, ACT_CP_SCAN_SEND, ACT_CP_SCAN, ACT_CP_ALWAYS, 1, pair);
        acts_add_cp(t, ACT_CP_SCAN_RECV, ACT_CP_SCAN, ACT_CP_ALWAYS, 1, cp * pair);
        acts_add_cp(t, ACT_CP_FOLD, ACT_CP_SCAN, ACT_CP_ALWAYS, 2, nv * dk * dv * f);
        acts_add_cp(t, ACT_CP_DSTATE, ACT_CP_SCAN, ACT_CP_ALWAYS, 1, frags * nv * dk * dv * f);
        const int staged = cp_gdn_method_staged(cp_gdn_method(cfg), cfg); /* fragments per sample in stages */
        if (staged) /* the chain's backward stages of both local fragments, the hybrid's of the first */
            acts_add_cp(t, ACT_CP_GDN_DKEPT, ACT_CP_SCAN, ACT_CP_ALWAYS, 1,
                        cfg->data.micro_batch * staged * (int64_t)dkept_bytes(T / frags, (int)nv, (int)dk, (int)dv));
        acts_add_cp(t, ACT_CP_HALO_SEND, ACT_CP_SCAN, ACT_CP_ALWAYS, 1, tail);
        acts_add_cp(t, ACT_CP_HALO_RECV, ACT_CP_SCAN, ACT_CP_ALWAYS, 1, cp * tail);
    }
    const int64_t fb = t->cp_phase[ACT_CP_FORWARD] > t->cp_phase[ACT_CP_BACKWARD] ? t->cp_phase[ACT_CP_FORWARD]
                                                                                  : t->cp_phase[ACT_CP_BACKWARD];
    t->cp_bytes[ACT_CP_RING] = ring_always + fb;
    t->cp_bytes[ACT_CP_SCAN] = t->cp_phase[ACT_CP_ALWAYS] - ring_always;
}

int model_acts_layer_keeps(const ActTable *t, int layer) { return layer >= t->first_kept; }

int model_gdn_kept_kind(int gdn_keep, int kda, int kept_whole) {
    return (gdn_keep == GDN_KEEP_STATES ? GDN_KEPT_STATES : 0) |
           (gdn_keep != GDN_KEEP_NONE && !kda && !kept_whole ? GDN_KEPT_TINV : 0);
}

int model_acts_gdn_kept_kind(const ActTable *t, const Config *cfg, int layer) {
    return model_gdn_kept_kind(cfg->checkpoint.gdn_keep, cfg->model.linear_attention == LINEAR_ATTN_KDA,
                               model_acts_layer_keeps(t, layer));
}

int model_acts_layer_inputs_whole(const ActTable *t, int layer) {
    return t->inputs_whole || model_acts_layer_keeps(t, layer);
}

int model_acts_layer_keeps_act(const ActTable *t, int layer) { return t->act_kept && model_acts_layer_keeps(t, layer); }

void model_acts_free(ActTable *t) {
    free(t->b);
    free(t->g);
    memset(t, 0, sizeof *t);
}
