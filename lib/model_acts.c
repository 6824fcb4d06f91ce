/*
 * model_acts.c — lists every activation buffer of one micro-batch on one rank
 * and sums what each checkpoint policy keeps (see model_acts.h).
 *
 * The per-layer lists follow the forward of each block exactly; a buffer is
 * here because the backward reads it:
 *
 *   every block   x (block input), ln1 + rstd1, h (residual after the mixer),
 *                 ln2 + rstd2, gate_up (pre-activation of the SwiGLU), act
 *                 (silu(gate)·up, the input of down_proj)
 *   GDN mixer     proj [q|k|v|z|b|a] before the conv, conv (after conv+SiLU),
 *                 qk_norm + its rstd (L2-normalised q, k), beta, g (fp32),
 *                 core (delta-rule output), normed (gated RMSNorm output) +
 *                 its rstd, kept (per fragment, what the delta-rule forward
 *                 keeps for its backward by checkpoint.gdn_keep: wy =
 *                 cuda W, U, gate cumsum, cpu Tinv; states = also the
 *                 chunk states h, vn (cuda); none = no buffer; backend.h
 *                 gdn_kept_bytes), so the backward skips that work; with cp > 1, per zigzag fragment (2 per sample),
 *                 the entry state [nv, dk, dv] fp32, the transition M
 *                 [nv, dk, dk] fp32 (the backward's fold needs it) and the
 *                 conv halo [Kc-1, Cc]
 *   attention     proj [q|gate|k|v] before the norms, attn_q (normed +
 *                 rotated q), attn_kv (normed + rotated k | v, contiguous per
 *                 token: the buffer the ring sends), qk_rstd, attn_out +
 *                 attn_lse (fp32), gated (the input of o_proj)
 *   head          final_in (the last block's output), final_norm + rstd,
 *                 d_final (its gradient, written by the fused lm_head +
 *                 cross-entropy during the forward)
 *
 * Assumptions of the transient terms (to be checked against measured peaks):
 *   - the recompute of layer l materialises that layer's buffers that the
 *     policy did not keep, and nothing of other layers;
 *   - the backward holds the residual-stream gradient [T, H] for the whole
 *     pass, and per phase (MLP, GDN mixer, attention mixer) the gradient
 *     buffers listed in model_acts_build; phases share one arena;
 *   - the GDN backward recomputes the per-chunk states and holds them and
 *     their gradients, ceil(T/64) x nv x dk x dv each, in the activation type
 *     (the gradients only where the states are kept: cuda, gdn_keep states);
 *   - the delta-rule backward reads its WY factors from "gdn_kept" (under
 *     remat / full the recompute writes them into the scratch);
 *   - attention keeps no T x T matrix (flash-style blocks);
 *   - the loss works on row chunks of at most LOSS_CHUNK_BYTES (2 GiB) of fp32 logits.
 *
 * The CP communication buffers (lib/cp.h: ring attention's K|V receive
 * buffers and fp32 accumulators, the GDN scan's gathered transitions, fold
 * and halo tails) are listed here too, by the names cp_init allocates, so
 * `plan`'s "CP ring"/"CP scan" rows are the allocations.
 */
#include "model_acts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* fp32 logits of one row chunk of the fused lm_head + CE. Each chunk's dw GEMM reads and writes the
 * whole fp32 (V, C) gradient, so few large chunks: at 2 GiB and V = 151,936, 3,533 rows a chunk (10 at
 * T = 32k). On an H100 the 1B step's lm_head took 142 ms with 256 MiB (75 chunks), 94 with 1 GiB (19),
 * 82 with 2 GiB (docs/benchmarks.md, "Whole step v0.4"). */
#define LOSS_CHUNK_BYTES (2LL << 30)

/* bytes one delta-rule call of n tokens keeps for its backward (backend.h gdn_kept_bytes; model.c
 * checks the backend's figure against this): cuda W (n,nv,dk) and U (n,nv,dv) bf16 and the gate
 * cumsum (n,nv) fp32, with states (checkpoint.gdn_keep: states) also h (ceil(n/64)+1,nv,dk,dv) and vn
 * (n,nv,dv) bf16, each on 256 bytes; cpu Tinv (n,nv,64) fp32 either way */
static int64_t acts_gdn_kept_bytes(int cuda, int states, int64_t n, int64_t nv, int64_t dk, int64_t dv) {
    if (!cuda) return n * nv * GDN_CHUNK * 4;
    const int64_t tv = n * nv, ns = (n + GDN_CHUNK - 1) / GDN_CHUNK + 1;
#define ACTS_R256(x) (((x) + 255) / 256 * 256)
    int64_t b = ACTS_R256(tv * dk * 2) + ACTS_R256(tv * dv * 2) + ACTS_R256(tv * 4);
    if (states) b += ACTS_R256(ns * nv * dk * dv * 2) + ACTS_R256(tv * dv * 2);
#undef ACTS_R256
    return b;
}

typedef struct {
    ActTable *t;
    int32_t   cap;
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

static void acts_add_cp(ActTable *t, const char *name, ActCpKind kind, int count, int64_t bytes) {
    RS_CHECK(t->ncp < ACT_CP_MAX, "raise ACT_CP_MAX");
    ActCpBuffer *b = &t->cp[t->ncp++];
    snprintf(b->name, sizeof b->name, "%s", name);
    b->kind = kind;
    b->count = count;
    b->bytes = bytes;
    t->cp_bytes[kind] += count * bytes;
}

static void acts_add(ActBuild *ab, int layer, const char *name, int64_t rows, int64_t cols, int elt, uint32_t keep) {
    ActTable *t = ab->t;
    if (t->n == ab->cap) {
        ab->cap = ab->cap ? ab->cap * 2 : 64;
        t->b = RS_REALLOC(t->b, (size_t)ab->cap * sizeof *t->b);
    }
    ActBuffer *b = &t->b[t->n++];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->layer = layer;
    b->rows = rows;
    b->cols = cols;
    b->elt = elt;
    b->bytes = rows * cols * elt;
    b->keep = keep;
}

void model_acts_build(ActTable *t, const Config *cfg) {
    const ModelConfig *m = &cfg->model;
    memset(t, 0, sizeof *t);
    ActBuild ab = {t, 0};
    int64_t cp = cfg->parallel.cp;
    int64_t T = cfg->data.micro_batch * cfg->data.seq_len / cp;
    int e = cfg->device.kind == DEVICE_KIND_CUDA ? 2 : 4; /* activation element */
    const int f = 4;                                      /* fp32 statistics */
    int64_t H = m->hidden_size, I = m->intermediate_size;
    int64_t nk = m->linear_num_key_heads, nv = m->linear_num_value_heads;
    int64_t dk = m->linear_key_head_dim, dv = m->linear_value_head_dim;
    int64_t Kd = nk * dk, Vd = nv * dv, Cc = 2 * Kd + Vd;
    int64_t nh = m->num_attention_heads, nkv = m->num_key_value_heads, hd = m->head_dim;
    t->tokens = T;
    t->elt = e;

    int64_t frags = cfg->data.micro_batch * (cp > 1 ? 2 : 1); /* zigzag fragments per micro-batch */
    int64_t max_states = 0;
    for (int l = 0; l < m->num_hidden_layers; l++) {
        int first = t->n;
        acts_add(&ab, l, "x", T, H, e, ACT_KEEP_ALL);
        acts_add(&ab, l, "ln1", T, H, e, ACT_KEEP_NONE);
        acts_add(&ab, l, "rstd1", T, 1, f, ACT_KEEP_NONE);
        if (config_layer_kind(cfg, l) == LAYER_KIND_LINEAR) {
            acts_add(&ab, l, "gdn_proj", T, Cc + Vd + 2 * nv, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_conv", T, Cc, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_qk_norm", T, 2 * Kd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_qk_rstd", T, 2 * nk, f, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_beta", T, nv, f, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_g", T, nv, f, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_core", T, Vd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_normed", T, Vd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_norm_rstd", T, nv, f, ACT_KEEP_NONE);
            if (cfg->checkpoint.gdn_keep != GDN_KEEP_NONE)
                acts_add(&ab, l, "gdn_kept", frags,
                         acts_gdn_kept_bytes(cfg->device.kind == DEVICE_KIND_CUDA,
                                             cfg->checkpoint.gdn_keep == GDN_KEEP_STATES, T / frags, nv, dk, dv),
                         1, ACT_KEEP_NONE);
            if (cp > 1) {
                acts_add(&ab, l, "gdn_cp_states", frags, nv * dk * dv, f, ACT_KEEP_NONE | ACT_KEEP_REMAT);
                acts_add(&ab, l, "gdn_cp_M", frags, nv * dk * dk, f, ACT_KEEP_NONE | ACT_KEEP_REMAT);
                acts_add(&ab, l, "gdn_conv_halo", frags, (m->linear_conv_kernel_dim - 1) * Cc, e,
                         ACT_KEEP_NONE | ACT_KEEP_REMAT);
            }
            int64_t s = (T + GDN_CHUNK - 1) / GDN_CHUNK * nv * dk * dv * e;
            const int kept_states =
                cfg->device.kind == DEVICE_KIND_CUDA && cfg->checkpoint.gdn_keep == GDN_KEEP_STATES;
            if ((kept_states ? 1 : 2) * s > max_states) max_states = (kept_states ? 1 : 2) * s;
        } else {
            acts_add(&ab, l, "attn_proj", T, 2 * nh * hd + 2 * nkv * hd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "attn_q", T, nh * hd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "attn_kv", T, 2 * nkv * hd, e, ACT_KEEP_NONE);
            acts_add(&ab, l, "attn_qk_rstd", T, nh + nkv, f, ACT_KEEP_NONE);
            acts_add(&ab, l, "attn_out", T, nh * hd, e, ACT_KEEP_NONE | ACT_KEEP_REMAT);
            acts_add(&ab, l, "attn_lse", T, nh, f, ACT_KEEP_NONE | ACT_KEEP_REMAT);
            acts_add(&ab, l, "attn_gated", T, nh * hd, e, ACT_KEEP_NONE);
        }
        acts_add(&ab, l, "h", T, H, e, ACT_KEEP_NONE);
        acts_add(&ab, l, "ln2", T, H, e, ACT_KEEP_NONE);
        acts_add(&ab, l, "rstd2", T, 1, f, ACT_KEEP_NONE);
        acts_add(&ab, l, "mlp_gate_up", T, 2 * I, e, ACT_KEEP_NONE);
        acts_add(&ab, l, "mlp_act", T, I, e, ACT_KEEP_NONE);

        /* per-layer transients */
        for (int p = 0; p < ACT_POLICY_COUNT; p++) {
            int64_t missing = 0;
            for (int i = first; i < t->n; i++)
                if (!(t->b[i].keep & (1u << p))) missing += t->b[i].bytes;
            if (missing > t->recompute[p]) t->recompute[p] = missing;
        }
    }
    acts_add(&ab, -1, "final_in", T, H, e, ACT_KEEP_ALL);
    acts_add(&ab, -1, "final_norm", T, H, e, ACT_KEEP_ALL);
    acts_add(&ab, -1, "final_rstd", T, 1, f, ACT_KEEP_ALL);
    acts_add(&ab, -1, "d_final", T, H, e, ACT_KEEP_ALL);
    acts_add(&ab, -1, "tokens_targets", T, 2, 4, ACT_KEEP_ALL);

    for (int i = 0; i < t->n; i++)
        for (int p = 0; p < ACT_POLICY_COUNT; p++)
            if (t->b[i].keep & (1u << p)) t->kept[p] += t->b[i].bytes;

    /* gradient scratch, by phase (activation type; gates fp32) */
    int32_t gcap = 0;
    int64_t Pg = Cc + Vd + 2 * nv, Pa = 2 * nh * hd + 2 * nkv * hd;
    acts_add_grad(t, &gcap, "d_resid", ACT_GRAD_PERSISTENT, T * H * e);
    acts_add_grad(t, &gcap, "d_ln", ACT_GRAD_PERSISTENT, T * H * e);
    acts_add_grad(t, &gcap, "d_act", ACT_GRAD_MLP, T * I * e);
    acts_add_grad(t, &gcap, "d_gate_up", ACT_GRAD_MLP, T * 2 * I * e);
    acts_add_grad(t, &gcap, "d_proj", ACT_GRAD_GDN, T * Pg * e);
    acts_add_grad(t, &gcap, "d_conv", ACT_GRAD_GDN, T * Cc * e);
    acts_add_grad(t, &gcap, "d_qk", ACT_GRAD_GDN, T * 2 * Kd * e);
    acts_add_grad(t, &gcap, "d_core", ACT_GRAD_GDN, T * Vd * e);
    acts_add_grad(t, &gcap, "d_normed", ACT_GRAD_GDN, T * Vd * e);
    acts_add_grad(t, &gcap, "d_beta", ACT_GRAD_GDN, T * nv * f);
    acts_add_grad(t, &gcap, "d_g", ACT_GRAD_GDN, T * nv * f);
    acts_add_grad(t, &gcap, "d_proj", ACT_GRAD_ATTN, T * Pa * e);
    acts_add_grad(t, &gcap, "d_q", ACT_GRAD_ATTN, T * nh * hd * e);
    acts_add_grad(t, &gcap, "d_kv", ACT_GRAD_ATTN, T * 2 * nkv * hd * e);
    acts_add_grad(t, &gcap, "d_attn_out", ACT_GRAD_ATTN, T * nh * hd * e);
    acts_add_grad(t, &gcap, "d_gated", ACT_GRAD_ATTN, T * nh * hd * e);
    int64_t largest = 0;
    for (int ph = ACT_GRAD_MLP; ph < ACT_GRAD_PHASES; ph++)
        if (t->grad_phase[ph] > largest) largest = t->grad_phase[ph];
    t->grad_working = t->grad_phase[ACT_GRAD_PERSISTENT] + largest;
    t->gdn_states = max_states;
    int64_t rows = LOSS_CHUNK_BYTES / (4 * m->vocab_size);
    if (rows < 64) rows = 64;
    if (rows > T) rows = T;
    t->loss_chunk_rows = rows;
    t->loss_workspace = rows * m->vocab_size * 4;
    for (int p = 0; p < ACT_POLICY_COUNT; p++)
        t->peak[p] = t->kept[p] + t->recompute[p] + t->grad_working + t->gdn_states;

    /* CP communication buffers (lib/cp.h), allocated once and used by one layer at a time */
    int64_t qd = nh * hd, kv = 2 * nkv * hd, Kc = m->linear_conv_kernel_dim;
    int n_full = 0;
    for (int l = 0; l < m->num_hidden_layers; l++) n_full += config_layer_kind(cfg, l) == LAYER_KIND_FULL;
    if (n_full > 0) {
        if (cp > 1) acts_add_cp(t, "kv_recv", ACT_CP_RING, 2, T * kv * e);
        acts_add_cp(t, "run_out", ACT_CP_RING, 1, T * qd * f);
        acts_add_cp(t, "run_lse", ACT_CP_RING, 1, T * nh * f);
        acts_add_cp(t, "lse_empty", ACT_CP_RING, 1, T * nh * f);
        acts_add_cp(t, "blk_out", ACT_CP_RING, 1, T * qd * e);
        acts_add_cp(t, "blk_lse", ACT_CP_RING, 1, T * nh * f);
        acts_add_cp(t, "dq_acc", ACT_CP_RING, 1, T * qd * f);
        acts_add_cp(t, "dkv_local", ACT_CP_RING, 1, T * kv * f);
        if (cp > 1) acts_add_cp(t, "dkv_buf", ACT_CP_RING, 2, T * kv * f);
    }
    if (cp > 1 && n_full < m->num_hidden_layers) {
        int64_t pair = frags * nv * dk * (dk + dv) * f, tail = frags * (Kc - 1) * Cc * e;
        acts_add_cp(t, "scan_send", ACT_CP_SCAN, 1, pair);
        acts_add_cp(t, "scan_recv", ACT_CP_SCAN, 1, cp * pair);
        acts_add_cp(t, "fold", ACT_CP_SCAN, 2, nv * dk * dv * f);
        acts_add_cp(t, "dstate", ACT_CP_SCAN, 1, frags * nv * dk * dv * f);
        acts_add_cp(t, "halo_send", ACT_CP_SCAN, 1, tail);
        acts_add_cp(t, "halo_recv", ACT_CP_SCAN, 1, cp * tail);
    }
}

void model_acts_free(ActTable *t) {
    free(t->b);
    free(t->g);
    memset(t, 0, sizeof *t);
}
