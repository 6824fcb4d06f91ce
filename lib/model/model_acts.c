/*
 * model_acts.c — lists every activation buffer of one micro-batch on one rank
 * and sums what each checkpoint policy keeps (see model_acts.h).
 *
 * The per-layer lists follow the forward of each block exactly; a buffer is
 * here because the backward reads it. A layer's buffers are of three kinds
 * (model_block.c): whole rows (T), what the mixer's core reads across tokens;
 * per-token ("token:" below), one row's work that the backward reads: kept
 * whole (T rows, each layer its own) under none, so the backward reruns
 * nothing, and one chunk (R = chunk_rows rows) shared by the layers of a kind
 * under full and remat, whose backward recomputes each chunk; and chunk
 * scratch ("chunk:"), R rows under every policy, never kept:
 *
 *   every block   x (block input, whole); token: ln1 + rstd1, h (residual
 *                 after the mixer), ln2 + rstd2, gate_up (pre-activation of
 *                 the SwiGLU), act (silu(gate)·up, the input of down_proj)
 *   GDN mixer     whole: qk_norm + its rstd (L2-normalised q, k), v (after
 *                 conv + SiLU), z (the output gate's input), beta, g (fp32),
 *                 core (delta-rule output), kept (per fragment, what the
 *                 delta-rule forward keeps for its backward by
 *                 checkpoint.gdn_keep: wy = cuda W, U, gate cumsum, cpu Tinv;
 *                 states = also the chunk states h, vn (cuda); none = no
 *                 buffer; backend.h gdn_kept_bytes), so the backward skips
 *                 that work; with cp > 1, per zigzag fragment (2 per sample),
 *                 the entry state [nv, dk, dv] fp32, the transition M
 *                 [nv, dk, dk] fp32 (the backward's fold needs it) and the
 *                 conv halo [Kc-1, Cc]; token: proj [q|k|v|z|b|a] before
 *                 the conv, normed (gated RMSNorm output) + its rstd; chunk:
 *                 conv (after conv+SiLU), halo (the previous chunk's last
 *                 Kc-1 pre-conv rows)
 *   attention     whole: attn_q (normed + rotated q), attn_kv (normed +
 *                 rotated k | v, contiguous per token: the buffer the ring
 *                 sends), gate, qk_rstd, attn_out + attn_lse (fp32); token:
 *                 proj [q|gate|k|v] before the norms, gated (the input of
 *                 o_proj)
 *   head          final_in (the last block's output, whole); one loss row
 *                 chunk of final_norm + rstd and d_final (its gradient,
 *                 written by the fused lm_head + cross-entropy during the
 *                 forward, whose final-norm backward follows at once)
 *
 * Assumptions of the transient terms (to be checked against measured peaks):
 *   - the recompute of layer l materialises that layer's buffers that the
 *     policy did not keep, and nothing of other layers;
 *   - the backward holds the residual-stream gradient [T, H] and one chunk's
 *     gradients for the whole pass, and per mixer kind (GDN, attention) the
 *     whole-rows gradients listed in model_acts_build; the kinds share one
 *     arena;
 *   - cuda: the delta rule's workspace (acts_gdn_workspace_bytes: one piece's
 *     backward, GDN_PIECE_ROWS tokens at most, or with cp > 1 a fragment's
 *     transition); cpu: the backward's per-chunk states and their gradients,
 *     ceil(T/64) x nv x dk x dv each;
 *   - the delta-rule backward reads its WY factors from "gdn_kept" (under
 *     remat / full the recompute writes them into the scratch);
 *   - attention keeps no T x T matrix (flash-style blocks);
 *   - the loss works on row chunks of at most LOSS_CHUNK_BYTES (2 GiB) of fp32 logits.
 *
 * The CP communication buffers (lib/cp/cp.h: ring attention's K|V receive
 * buffers and fp32 accumulators, the GDN scan's gathered transitions, fold
 * and halo tails) are listed here too, by the names cp_init allocates, so
 * `plan`'s "CP ring"/"CP scan" rows are the allocations.
 */
#include "model_acts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"

/* fp32 logits of one row chunk of the fused lm_head + CE. Each chunk's dw GEMM reads and writes the
 * whole fp32 (V, C) gradient, so few large chunks: at 2 GiB and V = 151,936, 3,533 rows a chunk (10 at
 * T = 32k). Smaller chunks make the lm_head markedly slower for little memory (docs/performance.md). */
#define LOSS_CHUNK_BYTES (2LL << 30)

/* chunk scratch (forward buffers and gradients) when checkpoint.chunk_rows is 0: 1 GiB gives the 1B
 * model (H 1536, I 4096) 8,192-row chunks on cuda, GEMMs of 8,192 x 1,536..8,224 */
#define ACT_CHUNK_BYTES (1LL << 30)

/* bytes one delta-rule call of n tokens keeps for its backward (backend.h gdn_kept_bytes; model.c
 * checks the backend's figure against this): cuda W (n,nv,dk) and U (n,nv,dv) bf16 and the gate
 * cumsum (n,nv) fp32, with states (checkpoint.gdn_keep: states) also h (ceil(n/64)+1,nv,dk,dv) and vn
 * (n,nv,dv) bf16, each on 256 bytes; cpu Tinv (n,nv,64) fp32 either way */
#define ACTS_R256(x) (((x) + 255) / 256 * 256)
static int64_t acts_gdn_kept_piece(int states, int64_t n, int64_t nv, int64_t dk, int64_t dv) {
    const int64_t tv = n * nv, ns = (n + GDN_CHUNK - 1) / GDN_CHUNK + 1;
    int64_t b = ACTS_R256(tv * dk * 2) + ACTS_R256(tv * dv * 2) + ACTS_R256(tv * 4);
    if (states) b += ACTS_R256(ns * nv * dk * dv * 2) + ACTS_R256(tv * dv * 2);
    return b;
}

/* cuda runs a call of more than GDN_PIECE_ROWS tokens in pieces (backend.h): each piece's part, then the
 * fp32 states entering pieces 1.. */
static int64_t acts_gdn_kept_bytes(int cuda, int states, int64_t n, int64_t nv, int64_t dk, int64_t dv) {
    if (!cuda) return n * nv * GDN_CHUNK * 4;
    int64_t b = 0, np = 0;
    for (int64_t r0 = 0; r0 < n || np == 0; r0 += GDN_PIECE_ROWS, np++)
        b += acts_gdn_kept_piece(states, n - r0 < GDN_PIECE_ROWS ? n - r0 : GDN_PIECE_ROWS, nv, dk, dv);
    return b + (np - 1) * nv * dk * dv * 4;
}

/* bytes the staged backward of one delta-rule call of n tokens carries between its stages (backend.h
 * gdn_dkept_bytes; cp_init checks the backend's figure against this): cuda per piece dv_loc and dv2 (n,nv,dv)
 * and the chunk state gradients (ceil(n/64)+1,nv,dk,dv), bf16, each on 256 bytes; cpu dS_final (nv,dk,dv) fp32 */
static int64_t acts_gdn_dkept_bytes(int cuda, int64_t n, int64_t nv, int64_t dk, int64_t dv) {
    if (!cuda) return nv * dk * dv * 4;
    int64_t b = 0;
    for (int64_t r0 = 0; r0 < n; r0 += GDN_PIECE_ROWS) {
        const int64_t m = n - r0 < GDN_PIECE_ROWS ? n - r0 : GDN_PIECE_ROWS, tv = m * nv;
        const int64_t ns = (m + GDN_CHUNK - 1) / GDN_CHUNK + 1;
        b += 2 * ACTS_R256(tv * dv * 2) + ACTS_R256(ns * nv * dk * dv * 2);
    }
    return b;
}

/* The cuda delta rule's workspace (kernels/cuda/gdn/gdn.cu gdn_carve, grown to its largest call and kept):
 * the backward of one piece (n = min(fragment, GDN_PIECE_ROWS) tokens) or, with cp > 1, the transition /
 * dstate of a whole fragment (the scan's), with its 1/8 headroom on 2 MiB. Segmented state passes (few
 * heads: fewer than 132 / 4 blocks of 32 columns) get an allowance of 64 segments. */
static int64_t acts_gdn_workspace_bytes(int kept_states, int64_t frag, int cp, int64_t nv, int64_t dk, int64_t dv) {
    const int64_t n = frag < GDN_PIECE_ROWS ? frag : GDN_PIECE_ROWS;
    int64_t common[2], t[2] = {n, frag};
    for (int i = 0; i < 2; i++) {
        const int64_t T = t[i], tv = T * nv;
        common[i] = ACTS_R256(3 * 4 * ((T + 1023) / 1024)) + ACTS_R256(8 * 4) + ACTS_R256((T + 1) * 4) +
                    ACTS_R256((T + 1) * 16) + ACTS_R256((2 * 65 + 1) * 4) + ACTS_R256(tv * 4) + ACTS_R256(tv * dk * 2) +
                    ACTS_R256(tv * dv * 2);
    }
    const int64_t tv = n * nv, ns = (n + GDN_CHUNK - 1) / GDN_CHUNK + 1, hs = ACTS_R256(ns * nv * dk * dv * 2);
    int64_t bwd = common[0] + (kept_states ? 0 : ACTS_R256(tv * dv * 2) + hs) + hs + ACTS_R256(tv * dv * 2) +
                  2 * ACTS_R256(tv * dk * 4) + ACTS_R256(2 * tv * 4);
    if (4 * nv * dv / 32 <= 132) bwd += 2 * (2 * ACTS_R256(64 * nv * dk * dv * 4) + ACTS_R256(64 * nv * dk * dk * 4));
    const int64_t most = cp > 1 && common[1] > bwd ? common[1] : bwd;
    return (most + most / 8 + (2 << 20) - 1) / (2 << 20) * (2 << 20);
}
#undef ACTS_R256

typedef struct {
    ActTable *t;
    int32_t   cap;
    int       policy;  /* the config's checkpoint.activations: the sizes model.c allocates */
    int64_t   T, R;    /* rows of a whole buffer and of a chunk */
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

/* chunk scratch: `rows` (R, or the conv halo's) under every policy, never kept */
static void acts_add_chunk(ActBuild *ab, int layer, const char *name, int64_t rows, int64_t cols, int elt) {
    acts_add_sized(ab, layer, name, rows, rows, cols, elt, 0)->chunk = 1;
}

/* Rows per chunk of a layer's per-token work (checkpoint.chunk_rows, or the rule: the largest multiple
 * of 64 whose chunk scratch under full / remat, forward buffers plus gradients at `row_bytes` a row, fits
 * ACT_CHUNK_BYTES; never more than a fragment, whose rows the chunks cut). The same rows under none, where
 * the forward buffers are kept whole: there R sets the rows of each per-token kernel call and of the
 * scratch that stays (the conv output, the gradients). */
static int64_t acts_chunk_rows(const Config *cfg, int64_t frag_len, int64_t row_bytes) {
    int64_t r = cfg->checkpoint.chunk_rows;
    if (r == 0) {
        r = ACT_CHUNK_BYTES / row_bytes / GDN_CHUNK * GDN_CHUNK;
        if (r < GDN_CHUNK) r = GDN_CHUNK;
    }
    return r < frag_len ? r : frag_len;
}

void model_acts_build(ActTable *t, const Config *cfg) {
    const ModelConfig *m = &cfg->model;
    memset(t, 0, sizeof *t);
    ActBuild ab = {t, 0, cfg->checkpoint.activations, 0, 0};
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
    int64_t Pg = Cc + Vd + 2 * nv, Pa = 2 * qd + 2 * kvd;
    t->tokens = T;
    t->elt = e;

    int64_t frags = cfg->data.micro_batch * (cp > 1 ? 2 : 1); /* zigzag fragments per micro-batch */
    /* chunk scratch per row: the block's own buffers (the wider mixer's) and the gradients */
    int64_t block_row = (3 * H + 3 * I) * e + 2 * f, gdn_row = (Pg + Cc + Vd) * e + nv * f, attn_row = (Pa + qd) * e;
    int64_t mix = Vd > qd ? Vd : qd, pw = Pg > Pa ? Pg : Pa;
    int64_t grad_row = (H + 3 * I + mix + pw + Cc) * e;
    t->chunk_row_bytes = block_row + (gdn_row > attn_row ? gdn_row : attn_row) + grad_row;
    const int64_t R = acts_chunk_rows(cfg, T / frags, t->chunk_row_bytes);
    t->chunk_rows = R;
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
            acts_add(&ab, l, "gdn_g", T, nv, f, ACT_KEEP_NONE);
            acts_add(&ab, l, "gdn_core", T, Vd, e, ACT_KEEP_NONE);
            if (cfg->checkpoint.gdn_keep != GDN_KEEP_NONE)
                acts_add(&ab, l, "gdn_kept", frags,
                         acts_gdn_kept_bytes(cfg->device.kind == DEVICE_KIND_CUDA,
                                             cfg->checkpoint.gdn_keep == GDN_KEEP_STATES, T / frags, nv, dk, dv),
                         1, ACT_KEEP_NONE);
            if (cp > 1) {
                acts_add(&ab, l, "gdn_cp_states", frags, nv * dk * dv, f, ACT_KEEP_NONE | ACT_KEEP_REMAT);
                acts_add(&ab, l, "gdn_cp_M", frags, nv * dk * dk, f, ACT_KEEP_NONE | ACT_KEEP_REMAT);
                acts_add(&ab, l, "gdn_conv_halo", frags, (Kc - 1) * Cc, e, ACT_KEEP_NONE | ACT_KEEP_REMAT);
            }
            const int kept_states =
                cfg->device.kind == DEVICE_KIND_CUDA && cfg->checkpoint.gdn_keep == GDN_KEEP_STATES;
            /* cuda: the delta rule's workspace; cpu: its backward's per-chunk states and their gradients */
            int64_t s = cfg->device.kind == DEVICE_KIND_CUDA
                            ? acts_gdn_workspace_bytes(kept_states, T / frags, cp, nv, dk, dv)
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
        acts_add_token(&ab, l, "ln1", H, e);
        acts_add_token(&ab, l, "rstd1", 1, f);
        if (config_layer_kind(cfg, l) == LAYER_KIND_LINEAR) {
            acts_add_token(&ab, l, "gdn_proj", Pg, e);
            acts_add_chunk(&ab, l, "gdn_conv", R, Cc, e);
            acts_add_chunk(&ab, l, "gdn_halo", Kc - 1, Cc, e);
            acts_add_token(&ab, l, "gdn_normed", Vd, e);
            acts_add_token(&ab, l, "gdn_norm_rstd", nv, f);
        } else {
            acts_add_token(&ab, l, "attn_proj", Pa, e);
            acts_add_token(&ab, l, "attn_gated", qd, e);
        }
        acts_add_token(&ab, l, "h", H, e);
        acts_add_token(&ab, l, "ln2", H, e);
        acts_add_token(&ab, l, "rstd2", 1, f);
        acts_add_token(&ab, l, "mlp_gate_up", 2 * I, e);
        acts_add_token(&ab, l, "mlp_act", I, e);

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
    acts_add_grad(t, &gcap, "d_conv", ACT_GRAD_PERSISTENT, R * Cc * e);
    acts_add_grad(t, &gcap, "d_halo", ACT_GRAD_PERSISTENT, (Kc - 1) * Cc * e);
    acts_add_grad(t, &gcap, "d_core", ACT_GRAD_GDN, T * Vd * e);
    acts_add_grad(t, &gcap, "d_z", ACT_GRAD_GDN, T * Vd * e);
    acts_add_grad(t, &gcap, "d_qk", ACT_GRAD_GDN, T * 2 * Kd * e);
    acts_add_grad(t, &gcap, "d_v", ACT_GRAD_GDN, T * Vd * e);
    acts_add_grad(t, &gcap, "d_beta", ACT_GRAD_GDN, T * nv * f);
    acts_add_grad(t, &gcap, "d_g", ACT_GRAD_GDN, T * nv * f);
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
        if (cp == 2 && cfg->parallel.gdn_chain_staged && cfg->checkpoint.gdn_keep == GDN_KEEP_STATES)
            acts_add_cp(t, ACT_CP_GDN_DKEPT, ACT_CP_SCAN, ACT_CP_ALWAYS, 1,
                        frags * acts_gdn_dkept_bytes(cfg->device.kind == DEVICE_KIND_CUDA, T / frags, nv, dk, dv));
        acts_add_cp(t, ACT_CP_HALO_SEND, ACT_CP_SCAN, ACT_CP_ALWAYS, 1, tail);
        acts_add_cp(t, ACT_CP_HALO_RECV, ACT_CP_SCAN, ACT_CP_ALWAYS, 1, cp * tail);
    }
    const int64_t fb = t->cp_phase[ACT_CP_FORWARD] > t->cp_phase[ACT_CP_BACKWARD] ? t->cp_phase[ACT_CP_FORWARD]
                                                                                  : t->cp_phase[ACT_CP_BACKWARD];
    t->cp_bytes[ACT_CP_RING] = ring_always + fb;
    t->cp_bytes[ACT_CP_SCAN] = t->cp_phase[ACT_CP_ALWAYS] - ring_always;
}

void model_acts_free(ActTable *t) {
    free(t->b);
    free(t->g);
    memset(t, 0, sizeof *t);
}
