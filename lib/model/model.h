/*
 * model.h — the hybrid model on a backend: parameters, gradients, AdamW
 * state, activation buffers, and one micro-batch's forward + backward.
 *
 * Memory comes from the two size tables: parameters, gradients and AdamW
 * moments are flat buffers laid out by model_params.h (one allocation each);
 * activations are allocated from model_acts.h for the configured checkpoint
 * policy — a buffer the policy keeps gets memory per layer, the others share
 * one scratch arena that the next layer (or the recompute) overwrites. So
 * `plan`'s activation numbers are the allocations, not a second estimate.
 *
 * Gradient rule (llm.c's): parameter gradients accumulate (+=) so that
 * micro-batches add up and the trainer zeroes them once per step; activation
 * gradients are written, except the residual stream's, which is accumulated
 * by the norms' backward.
 *
 * Callers: lib/run/train.c (training), tests/parity/parity_step.c (one step
 * against the PyTorch reference).
 */
#ifndef RS_MODEL_H
#define RS_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "config/config.h"
#include "cp/cp.h"
#include "model_acts.h"
#include "model_params.h"

/* One micro-batch on this rank: `samples` samples of `T_sample` local tokens,
 * concatenated into T = samples x T_sample rows, each sample's rows in the CP
 * layout (cp.h: [fragment r | fragment 2P-1-r], or the whole sample when
 * cp = 1). Metadata per backend.h, global (pos is the place in the sample). */
typedef struct {
    int64_t  T;
    int32_t  samples;
    int64_t  T_sample;
    int32_t *tokens;  /* (T) */
    int32_t *targets; /* (T) next token, or -1: no prediction */
    int32_t *pos;     /* (T) global position in the sample */
    int32_t *doc_pos; /* (T) tokens of the same document before this one */
    /* the same pos / doc_pos in host memory (== pos, doc_pos on cpu): the CP schedule is planned there */
    const int32_t *pos_host, *doc_pos_host;
    int      micro;   /* which micro-batch of the step, 0 .. train.grad_accum - 1 (its loss and metadata slot) */
} Batch;

/* Offsets (elements) of one layer's parameters in the flat buffers; -1 when
 * the layer kind has no such tensor. */
typedef struct {
    LayerKind kind;
    int64_t   in_ln, post_ln, gate_up, down;
    int64_t   in_proj, out_proj;               /* GDN: linear_attn.*; attention: self_attn.in_proj, o_proj */
    int64_t   conv, dt_bias, A_log, gdn_norm;  /* GDN */
    int64_t   dt_bias32, A_log32;              /* GDN: the same tensors' fp32 values in Model.f32 */
    int64_t   dt_bias_n;                       /* dt_bias's elements: nv (GDN) or nv*dk (KDA) */
    int64_t   f_b, g_b;                        /* KDA: linear_attn.f_b_proj, g_b_proj (out_proj: o_proj, gdn_norm:
                                                * o_norm) */
    int       kda;                             /* a KDA layer (model.linear_attention kda) */
    int64_t   q_norm, k_norm;                  /* attention */
} LayerParams;

/* One layer's activation buffers (see model_acts.c for what each holds).
 * Whole-rows buffers (T rows) hold what the mixer's core reads; chunk buffers (R =
 * acts.chunk_rows rows) hold one row chunk's scratch and are shared by the layers of
 * a kind. The per-token buffers ("token", what the backward reads of a chunk's
 * per-token work) are chunk buffers under full and remat; under none they are the
 * layer's own, whole, and their pointers are cursors: they address the rows from
 * `at` on, moved chunk by chunk (model_block.c block_rows_at), so the code that
 * works on a chunk reads them the same way under every policy. Pointers of the other
 * layer kind are NULL. */
typedef struct {
    void  *x;        /* (T,H) block input */
    /* token buffers, (R, ...) from row `at` */
    void  *ln1;      /* (R,H) */
    float *rstd1;    /* (R) */
    void  *h;        /* (R,H) residual after the mixer */
    void  *ln2;      /* (R,H) */
    float *rstd2;    /* (R) */
    void  *gate_up;  /* (R,2I) */
    void  *act;      /* (R,I); a chunk's but in a layer that keeps it (checkpoint.mlp_act kept): else its backward
                      * writes it again (swiglu_backward) */
    /* Gated DeltaNet */
    void  *gdn_proj;      /* (R, Cc+Vd+2nv) [q|k|v|z|b|a] before the conv (token); KDA (R, Cc+2dv+nv)
                           * [q|k|v|f_a|g_a|b] */
    void  *gdn_conv;      /* (R, Cc) after conv + SiLU (chunk); KDA only (GDN: gdn_conv_split), NULL otherwise */
    void  *gdn_halo;      /* (Kc-1, Cc) the previous chunk's last pre-conv rows (chunk) */
    void  *gdn_normed;    /* (R, Vd) gated RMSNorm output (token) */
    float *gdn_norm_rstd; /* (R, nv) (token) */
    void  *gdn_qk_norm;   /* (T, 2Kd) L2-normalised [q|k] */
    float *gdn_qk_rstd;   /* (T, 2nk) */
    void  *gdn_v;         /* (T, Vd) v after conv + SiLU */
    void  *gdn_z;         /* (T, Vd) the output gate's input z (KDA: g_b(g_a(ln1))) */
    float *gdn_beta;      /* (T, nv) */
    float *gdn_g;         /* (T, nv); KDA (T, nv, dk) */
    void  *gdn_core;      /* (T, Vd) delta-rule output */
    float *gdn_cp_states; /* (frags, nv, dk, dv) CP entry state of each local fragment, cp > 1 */
    float *gdn_cp_M;      /* (frags, nv, dk, dk) each local fragment's transition M, cp > 1 */
    void  *gdn_conv_halo; /* (frags, Kc-1, Cc) each local fragment's conv halo, cp > 1 */
    void  *kda_f;         /* KDA: (R, nv dk) the decay gate's input f = f_b(f_a(ln1)) (token) */
    void  *kda_unit;      /* KDA: (R, Vd) the output norm before its sigmoid gate (token) */
    void  *gdn_kept;      /* (frags) x be->gdn_kept_bytes(frag_len, nv, dk, dv, states): what each fragment's
                           * delta-rule forward (or the recompute) keeps for the layer's backward
                           * (checkpoint.gdn_keep; NULL under none) */
    /* softmax attention */
    void  *attn_proj;     /* (R, 2qd+2kvd) [q|gate|k|v] before the norms (token) */
    void  *attn_gated;    /* (R, qd) (token) */
    void  *attn_q;        /* (T, qd) normed + rotated q */
    void  *attn_kv;       /* (T, 2kvd) normed + rotated k | v */
    void  *attn_gate;     /* (T, qd) the output gate's input */
    float *attn_qk_rstd;  /* (T, nh+nkv): q rows then k rows */
    void  *attn_out;      /* (T, qd) */
    float *attn_lse;      /* (T, nh) */
    void  *kept;          /* the first of the layer's kept buffers, which follow it (Model.kept_len bytes) */
    int64_t at;           /* the first row the token pointers address (0 but under none) */
    int     backward;     /* model_block_backward runs on this layer: a token row computed now is a recompute */
} LayerActs;

/* Work counters of one step, for checking the checkpoint policies (the per-layer
 * attention, ring and scan counters are Cp's). */
typedef struct {
    int64_t block_recomputes; /* block forwards rerun in backward */
    int64_t chunk_recomputes; /* per-token forwards run again in a layer's backward, one per chunk and kind:
                               * ln1 (+ in_proj; also of conv halo rows), h, the MLP; 0 under none */
    int64_t offload_bytes_to_host, offload_bytes_to_device; /* checkpoint.offload: kept bytes moved */
} ModelCounters;

typedef struct {
    const Config  *cfg;
    const Backend *be;
    Comm          *comm;     /* NULL: one process (dp = cp = 1) */
    Cp             cp;       /* the CP layout, batch metadata, buffers and counters */
    ParamTable     ptab;
    LayerParams   *lp;       /* (L) */
    int64_t        embed, final_norm_w, lm_head; /* offsets; lm_head == embed when tied */
    /* flat buffers (ptab.buffer_numel elements each), but with parallel.shard the fp32 master weights and
     * AdamW moments, which then hold this rank's piece of every bucket (model_shard.c; shard_numel elements) */
    float *params;  /* master weights */
    void  *weights; /* what the kernels read: == params on cpu without sharding, else a copy (bf16 on cuda) */
    float *grads;
    float *adam_m, *adam_v;
    const float *f32; /* fp32 values the kernels read besides `weights` (A_log, dt_bias at LayerParams.*32): == params
                       * without sharding; with it == weights on cpu, the compact `gates` on cuda */
    float *gates;     /* with sharding on cuda: every GDN layer's A_log and dt_bias in fp32 (gates_numel), refreshed
                       * after each optimizer step; else NULL */
    int64_t gates_numel;
    /* where the backward adds parameter gradients (model_shard.c): G(off) = grad_cur + (off - grad_cur_start)
     * for the layer in hand; without parallel.shard: gradients the flat `grads` buffer. With it `grads` is
     * NULL: embed_tokens' and the head's buckets have buffers of their own (grad_head), the layers share
     * two (grad_slot: layer l in slot l % 2), each reduce-scattered as soon as its layer's backward is done
     * (every micro-batch) and its summed piece added into grad_shard (shard_numel: the rank's pieces) */
    float  *grad_cur;
    int64_t grad_cur_start;
    float  *grad_head[2], *grad_slot[2], *grad_shard;
    int64_t grad_slot_numel;
    int     slot_layer[2];      /* the layer whose reduce-scatter slot s holds in flight; -1: none */
    CommHandle slot_h[2];
    /* where the kernels read the weights (model_shard.c): W(off) = w_cur + (off - w_cur_start) elements for the
     * layer in hand; without parallel.shard: weights w_cur = weights, w_cur_start = 0. With it `weights` is
     * NULL: embed_tokens' and the head's buckets are whole (w_head), the layers' compute copy is the rank's
     * pieces only (w_shard, the shard layout, shard_numel elements of which the layers' are used), and layer l
     * is all-gathered whole into slot l % 2 (w_slot, w_slot_numel elements) one layer ahead: posted before
     * layer l - 1's forward (layer l + 1's backward), waited before its own; a slot still holding its layer
     * (the last two of the forward, the first two of the backward) is not gathered again until a step */
    void   *w_cur;
    int64_t w_cur_start;
    void   *w_head[2], *w_slot[2], *w_shard;
    int64_t w_slot_numel;
    int     w_slot_layer[2];    /* the layer slot k holds or is gathering; -1: none */
    CommHandle w_slot_h[2];
    int     shard;       /* Shard as it runs (model_shard_stage) */
    int     shard_rank;  /* this rank's piece of each bucket: the world rank (0 without sharding) */
    int64_t shard_numel; /* elements of params, adam_m, adam_v: buffer_numel / ptab.pieces */
    /* activations */
    ActTable   acts;
    int64_t    T;           /* rows per micro-batch */
    LayerActs *la;          /* (L) */
    void      *final_in, *final_norm, *d_final;
    float     *final_rstd, *loss_workspace;
    float     *losses;      /* (train.grad_accum, T) per-token losses, one slot per micro-batch */
    void      *act_arena;   /* every kept buffer (checkpoint.offload host: the head's and two layer slots) */
    void      *host_arena;  /* checkpoint.offload host: every layer's kept buffers, layer l at kept_at[l] */
    int64_t   *kept_at, *kept_len; /* (L) bytes: layer l's place in host_arena, its kept bytes */
    void      *copyq;       /* checkpoint.offload host: the backend's copy queue (NULL: no offload) */
    int64_t    bytes_host;         /* host_arena's bytes */
    int64_t    bytes_kept_device;  /* act_arena's bytes (== bytes_kept without offload) */
    void      *scratch;     /* buffers the policy does not keep, shared by layers */
    int64_t    bytes_kept, bytes_scratch, bytes_grads;
    /* gradient scratch of one layer's backward: whole rows */
    void  *d_resid;                      /* (T,H) the residual stream's */
    void  *d_core, *d_z, *d_qk, *d_v;    /* GDN (T, Vd | Vd | 2Kd | Vd) */
    float *d_beta, *d_g;                 /* GDN (T, nv); KDA d_g (T, nv, dk) */
    void  *d_attn_out, *d_gate, *d_q, *d_kv; /* attention (T, qd | qd | qd | 2kvd) */
    /* ... and one chunk's (R rows) */
    void  *d_ln, *d_act, *d_gate_up, *d_mix, *d_proj, *d_conv, *d_halo; /* d_conv: KDA only, NULL otherwise */
    void  *d_kda_f, *d_kda_unit;         /* KDA (R, nv dk | Vd); NULL otherwise */
    ModelCounters count;
} Model;

/* Builds the parameter table, allocates every buffer for micro-batches of
 * `T` rows (= data.micro_batch x seq_len / cp) and initialises the weights
 * from run.seed as the spec says (docs/design/model.md). `comm`
 * (groups set up) may be NULL for one process with dp = cp = 1. */
void model_init(Model *m, const Config *cfg, const Backend *be, Comm *comm, int64_t T);
void model_free(Model *m);

/* Forward and backward of one micro-batch. Adds the parameter gradients into
 * m->grads, scaled by grad_scale (1 / predicted tokens of the whole step), and
 * leaves the per-token losses in the micro-batch's slot of m->losses. The
 * host does not wait for the backend (cuda: the work is queued). With
 * `sync_grads` (the step's last micro-batch, world > 1) the gradients are
 * summed over the world (dp x cp) in per-layer buckets, each posted as soon
 * as the backward has finished its layer and waited at the end (by the
 * compute stream on cuda), so the all-reduce overlaps the rest of the
 * backward. */
void model_forward_backward(Model *m, const Batch *b, float grad_scale, int sync_grads);
/* the forward alone: the micro-batch's per-token losses into its slot of m->losses (read them with
 * model_loss_sum or to_host), no gradient, no backward state kept for later (ringscan eval) */
void model_forward(Model *m, const Batch *b);

/* The sum of the per-token losses of micro-batches 0 .. micro_batches-1 of the step on this
 * rank, in token order: the step's one read of the backend (cuda: it waits for the queued work). */
double model_loss_sum(Model *m, int micro_batches);

/* checkpoint.offload: host (model_offload.c); each call does nothing without offload.
 * stash: layer l's kept range to the host after its forward; claim: the compute waits until
 * layer l's slot has gone to the host (before its first write); fetch: layer l's range back
 * (after layer l+2's backward); ready: the compute waits for it (before layer l's recompute). */
void model_offload_init(Model *m);
void model_offload_free(Model *m);
void model_offload_stash(Model *m, int layer);
void model_offload_claim(Model *m, int layer);
void model_offload_fetch(Model *m, int layer);
void model_offload_ready(Model *m, int layer);

/* The parameters in the weight-decay group `g` decay under this config? */
int model_param_decays(const Config *cfg, ParamGroup g);

/* ---- the optimizer and parallel.shard (model_shard.c) ----
 * set_full: from `host` (fp32, ptab.buffer_numel, the flat layout), which 0: every weight (this rank's master
 * piece, or all of it, the compute copy and the fp32 gates); 1, 2: AdamW m, v (the piece). get_full: the full fp32 master weights (which 0) or
 * AdamW m (1) or v (2) into `host` on every rank (with sharding an all-gather over the world; blocking).
 * grad_sum_squares: the squared norm of the step's summed gradient, over the world (the host waits).
 * optimizer_step: AdamW over the rank's pieces (all, without sharding), then with sharding the all-gather
 * of the updated compute copy (and the gates) over the world; the compute stream waits for it on cuda. */
void   model_set_full(Model *m, int which, const float *host);
void   model_get_full(Model *m, int which, float *host);
double model_grad_sum_squares(Model *m);
void   model_optimizer_step(Model *m, double lr, float clip_scale, int step);
/* The gradient buffers (see Model.grad_cur): zero_grads at a step's start; grad_at: where the gradient of
 * flat element `off` of the head's or embed_tokens' bucket is; grad_layer_begin / end around layer l's
 * backward (begin points grad_cur at its storage, with shard gradients after draining the slot's previous
 * layer; end posts its reduce-scatter); grad_finish after the backward (shard gradients: drains the slots,
 * and with `reduce` reduce-scatters the head buckets into grad_shard); grad_piece: bucket b's summed
 * gradient over this rank's piece (model_shard_piece's flat [a, a + n)), valid after the step's backward. */
void   model_zero_grads(Model *m);
float *model_grad_at(Model *m, int64_t off);
void   model_grad_layer_begin(Model *m, int l);
void   model_grad_layer_end(Model *m, int l);
void   model_grad_finish(Model *m, int reduce);
float *model_grad_piece(Model *m, int b);
/* parallel.shard: weights (nothing without it but pointing w_cur at the whole copy): weights_fetch posts
 * layer l's all-gather into slot l % 2 (nothing when l is out of range or the slot holds it already);
 * weights_ready waits for it (posting it first if needed) and points w_cur at it. weight_at: the compute
 * copy of flat element `off` of embed_tokens' or the head's bucket (any element without the stage). */
void        model_weights_fetch(Model *m, int l);
void        model_weights_ready(Model *m, int l);
const void *model_weight_at(const Model *m, int64_t off);
/* Bucket b's piece of this rank: flat elements [*a, *a + *n), its first shard element *sh (without
 * sharding: the whole bucket, *sh = *a) */
void   model_shard_piece(const Model *m, int b, int64_t *a, int64_t *n, int64_t *sh);
/* the bucket of parameter tensor i (ParamTable.bucket_start) */
int    model_param_bucket(const Model *m, int i);

#endif
