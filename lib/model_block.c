/*
 * model_block.c — forward and backward of one decoder block (pre-norm mixer,
 * residual, pre-norm SwiGLU MLP, residual) for both layer kinds, over the
 * backend's kernels. research/qwen3_next_spec.md §2–4 is the math; the
 * buffers are model.h's LayerActs.
 *
 *   GDN mixer: proj = ln1 W_in^T gives [q|k|v|z|b|a]; conv+SiLU over [q|k|v];
 *     L2 norm of q, k; beta = sigmoid(b), g = -exp(A_log) softplus(a+dt_bias);
 *     the chunked delta rule; gated RMSNorm with silu(z); out_proj.
 *   attention mixer: proj = ln1 W_in^T gives [q|gate|k|v]; q_norm, k_norm
 *     (zero-centred, per head); v copied beside k ([k|v] per token, the buffer
 *     the ring sends); partial RoPE at global positions; ring attention
 *     (cp_ring.c: causal, documents; with cp = 1 one step, no communication);
 *     sigmoid(gate) output gate; o_proj.
 *
 * Context parallelism (cp.h) enters in three places only: the GDN conv's
 * halo, the GDN entry states (the prefix scan) and the attention ring. Every
 * other op is per token and runs on the local rows as they are.
 *
 * Recompute modes (the checkpoint policy, model_step.c decides):
 *   BLOCK_FORWARD      the normal forward, writing the block output;
 *   BLOCK_RECOMPUTE    the full policy's recompute: everything again,
 *                      attention included, no output written;
 *   BLOCK_REMAT        the remat policy's recompute: attention's output and
 *                      LSE, the GDN entry states, transitions and conv halo
 *                      are kept, so neither attention nor any communication
 *                      (ring pass, scan all-gather, halo exchange) reruns.
 *
 * Callers: model_step.c.
 */
#include "model_block.h"

#include <string.h>

#include "error.h"

/* dims of the model, read once per call */
typedef struct {
    int64_t T;
    int     H, I, nk, nv, dk, dv, Kd, Vd, Cc, Kc, Pg; /* GDN: Pg = width of [q|k|v|z|b|a] */
    int     nh, nkv, hd, qd, kvd, Pa, rd;          /* attention: Pa = width of [q|gate|k|v] */
    float   eps, theta;
    int     es;                                     /* activation element size */
} Dims;

static Dims block_dims(const Model *m, int64_t T) {
    const ModelConfig *c = &m->cfg->model;
    Dims d;
    d.T = T;
    d.H = (int)c->hidden_size;
    d.I = (int)c->intermediate_size;
    d.nk = (int)c->linear_num_key_heads;
    d.nv = (int)c->linear_num_value_heads;
    d.dk = (int)c->linear_key_head_dim;
    d.dv = (int)c->linear_value_head_dim;
    d.Kd = d.nk * d.dk;
    d.Vd = d.nv * d.dv;
    d.Cc = 2 * d.Kd + d.Vd;
    d.Kc = (int)c->linear_conv_kernel_dim;
    d.Pg = d.Cc + d.Vd + 2 * d.nv;
    d.nh = (int)c->num_attention_heads;
    d.nkv = (int)c->num_key_value_heads;
    d.hd = (int)c->head_dim;
    d.qd = d.nh * d.hd;
    d.kvd = d.nkv * d.hd;
    d.Pa = 2 * d.qd + 2 * d.kvd;
    d.rd = (int)config_rotary_dim(m->cfg);
    d.eps = (float)c->rms_norm_eps;
    d.theta = (float)c->rope_theta;
    d.es = m->be->act_size;
    return d;
}

/* element offset into an activation-type buffer */
#define AT(p, off) ((void *)((char *)(p) + (int64_t)(off) * d.es))
/* compute-type weights and fp32 gradients / master values of a parameter */
#define W(off) ((const void *)((const char *)m->weights + (int64_t)(off) * d.es))
#define G(off) (m->grads + (off))
#define P32(off) (m->params + (off))

/* ---- Gated DeltaNet mixer ---------------------------------------------- */

/* Each sample's rows are its local fragments (cp.h): one chunked-delta-rule and one conv call
 * per fragment, fragment i = s x nlocal + f. With cp > 1 a fragment's conv halo and entry
 * state come from the CP group (cp_gdn.c); with cp = 1 the one fragment is the whole sample,
 * which starts from nothing. */

static CpGdnDims block_gdn_cp_dims(const Dims *d) {
    return (CpGdnDims){.nk = d->nk, .nv = d->nv, .dk = d->dk, .dv = d->dv, .Cc = d->Cc, .Kc = d->Kc};
}

/* the kept buffer holds the chunk states too (checkpoint.gdn_keep: states) */
static int block_gdn_kept_states(const Model *m) { return m->cfg->checkpoint.gdn_keep == GDN_KEEP_STATES; }

/* What fragment i's delta-rule forward keeps for the backward (checkpoint.gdn_keep; backend.h
 * gdn_kept_bytes, model_acts.c "gdn_kept"): written by the forward that the layer's backward follows
 * (BLOCK_FORWARD under the none policy; the recompute under remat / full, into the shared scratch), read
 * by the backward, which then skips that work. NULL under gdn_keep none (no buffer: both recompute). */
static void *block_gdn_kept(const Model *m, const LayerActs *a, int64_t i, int64_t n, const Dims *d) {
    if (m->cfg->checkpoint.gdn_keep == GDN_KEEP_NONE) return NULL;
    const size_t one = m->be->gdn_kept_bytes(n, d->nv, d->dk, d->dv, block_gdn_kept_states(m));
    return (char *)a->gdn_kept + i * (int64_t)one;
}

static void block_gdn_forward(Model *m, int l, const Batch *b, int mode) {
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    Dims d = block_dims(m, b->T);
    Cp *cp = &m->cp;
    const CpLayout *L = &cp->L;
    const int multi = L->P > 1;
    const CpGdnDims cd = block_gdn_cp_dims(&d);
    const int64_t tail = (int64_t)(d.Kc - 1) * d.Cc, state = (int64_t)d.nv * d.dk * d.dv, n = L->frag_len;
    /* the remat recompute keeps what came from the CP group: no halo exchange, no scan */
    const int communicate = multi && mode != BLOCK_REMAT;
    /* under remat / full the first forward's kept buffer would be overwritten before any backward reads it */
    const int keep = mode != BLOCK_FORWARD || m->cfg->checkpoint.activations == ACT_POLICY_NONE;
    be->matmul_forward(a->gdn_proj, a->ln1, W(p->in_proj), d.T, d.H, d.Pg, d.H, d.Pg, 0);
    if (communicate) cp_gdn_halo_forward(cp, l, a->gdn_conv_halo, a->gdn_proj, d.Pg, &cd);
    for (int s = 0; s < b->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t r0 = cp_frag_row(cp, s, f), i = (int64_t)s * L->nlocal + f;
            be->conv1d_silu_forward(AT(a->gdn_conv, r0 * d.Cc), AT(a->gdn_proj, r0 * d.Pg),
                                    multi ? AT(a->gdn_conv_halo, i * tail) : NULL, W(p->conv), b->doc_pos + r0, n,
                                    d.Cc, d.Kc, d.Pg, d.Cc);
        }
    be->l2norm_forward(a->gdn_qk_norm, a->gdn_qk_rstd, a->gdn_conv, d.T, 2 * d.nk, d.dk, d.Cc, 2 * d.Kd);
    be->gdn_gates_forward(a->gdn_beta, a->gdn_g, AT(a->gdn_proj, d.Cc + d.Vd), AT(a->gdn_proj, d.Cc + d.Vd + d.nv),
                          P32(p->A_log), P32(p->dt_bias), d.T, d.nv, d.Pg);
    if (communicate)
        cp_gdn_scan_forward(cp, l, a->gdn_cp_states, a->gdn_cp_M, AT(a->gdn_qk_norm, d.Kd), AT(a->gdn_conv, 2 * d.Kd),
                            a->gdn_g, a->gdn_beta, 2 * d.Kd, d.Cc, &cd);
    for (int s = 0; s < b->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t o = cp_frag_row(cp, s, f), i = (int64_t)s * L->nlocal + f;
            be->gdn_chunk_forward(AT(a->gdn_core, o * d.Vd), NULL, AT(a->gdn_qk_norm, o * 2 * d.Kd),
                                  AT(a->gdn_qk_norm, o * 2 * d.Kd + d.Kd), AT(a->gdn_conv, o * d.Cc + 2 * d.Kd),
                                  a->gdn_g + o * d.nv, a->gdn_beta + o * d.nv,
                                  multi ? a->gdn_cp_states + i * state : NULL, b->doc_pos + o, n, d.nk, d.nv, d.dk,
                                  d.dv, 2 * d.Kd, d.Cc, d.Vd, keep ? block_gdn_kept(m, a, i, n, &d) : NULL,
                                  block_gdn_kept_states(m));
            cp->count.gdn_forwards[l]++;
        }
    be->gated_rmsnorm_forward(a->gdn_normed, a->gdn_norm_rstd, a->gdn_core, AT(a->gdn_proj, d.Cc), W(p->gdn_norm),
                              d.T, d.nv, d.dv, d.Pg, d.eps);
    be->copy(a->h, a->x, (size_t)(d.T * d.H * d.es));
    be->matmul_forward(a->h, a->gdn_normed, W(p->out_proj), d.T, d.Vd, d.H, d.Vd, d.H, 1);
}

static void block_gdn_backward(Model *m, int l, const Batch *b) {
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    Dims d = block_dims(m, b->T);
    Cp *cp = &m->cp;
    const CpLayout *L = &cp->L;
    const int multi = L->P > 1;
    const CpGdnDims cd = block_gdn_cp_dims(&d);
    const int64_t tail = (int64_t)(d.Kc - 1) * d.Cc, state = (int64_t)d.nv * d.dk * d.dv, n = L->frag_len;
    /* d_resid holds dL/dh */
    be->matmul_backward(m->d_normed, G(p->out_proj), m->d_resid, a->gdn_normed, W(p->out_proj), d.T, d.Vd, d.H, d.Vd,
                        d.H, 0);
    be->gated_rmsnorm_backward(m->d_core, AT(m->d_proj, d.Cc), G(p->gdn_norm), m->d_normed, a->gdn_core,
                               AT(a->gdn_proj, d.Cc), W(p->gdn_norm), a->gdn_norm_rstd, d.T, d.nv, d.dv, d.Pg);
    if (multi) /* the gradient arriving at each fragment's final state, from the fragments after it */
        cp_gdn_scan_backward(cp, l, cp->dstate, a->gdn_cp_M, m->d_core, a->gdn_qk_norm, AT(a->gdn_qk_norm, d.Kd),
                             a->gdn_g, a->gdn_beta, 2 * d.Kd, d.Vd, &cd);
    for (int s = 0; s < b->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t o = cp_frag_row(cp, s, f), i = (int64_t)s * L->nlocal + f;
            be->gdn_chunk_backward(AT(m->d_qk, o * 2 * d.Kd), AT(m->d_qk, o * 2 * d.Kd + d.Kd),
                                   AT(m->d_conv, o * d.Cc + 2 * d.Kd), m->d_g + o * d.nv, m->d_beta + o * d.nv, NULL,
                                   AT(m->d_core, o * d.Vd), multi ? cp->dstate + i * state : NULL,
                                   AT(a->gdn_qk_norm, o * 2 * d.Kd), AT(a->gdn_qk_norm, o * 2 * d.Kd + d.Kd),
                                   AT(a->gdn_conv, o * d.Cc + 2 * d.Kd), a->gdn_g + o * d.nv, a->gdn_beta + o * d.nv,
                                   multi ? a->gdn_cp_states + i * state : NULL, b->doc_pos + o, n, d.nk, d.nv, d.dk,
                                   d.dv, 2 * d.Kd, d.Cc, d.Vd, block_gdn_kept(m, a, i, n, &d),
                                   block_gdn_kept_states(m));
        }
    be->gdn_gates_backward(AT(m->d_proj, d.Cc + d.Vd), AT(m->d_proj, d.Cc + d.Vd + d.nv), G(p->A_log), G(p->dt_bias),
                           m->d_beta, m->d_g, AT(a->gdn_proj, d.Cc + d.Vd), AT(a->gdn_proj, d.Cc + d.Vd + d.nv),
                           P32(p->A_log), P32(p->dt_bias), d.T, d.nv, d.Pg);
    be->l2norm_backward(m->d_conv, m->d_qk, a->gdn_qk_norm, a->gdn_qk_rstd, d.T, 2 * d.nk, d.dk, d.Cc, 2 * d.Kd);
    for (int s = 0; s < b->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t r0 = cp_frag_row(cp, s, f), i = (int64_t)s * L->nlocal + f;
            be->conv1d_silu_backward(AT(m->d_proj, r0 * d.Pg), multi ? AT(cp->halo_send, i * tail) : NULL, G(p->conv),
                                     AT(m->d_conv, r0 * d.Cc), AT(a->gdn_proj, r0 * d.Pg),
                                     multi ? AT(a->gdn_conv_halo, i * tail) : NULL, W(p->conv), b->doc_pos + r0, n,
                                     d.Cc, d.Kc, d.Pg, d.Cc);
        }
    if (multi) /* each fragment's halo gradient goes back to the fragment before it */
        cp_gdn_halo_backward(cp, l, m->d_proj, d.Pg, cp->halo_send, &cd);
    be->matmul_backward(m->d_ln, G(p->in_proj), m->d_proj, a->ln1, W(p->in_proj), d.T, d.H, d.Pg, d.H, d.Pg, 0);
}

/* ---- softmax attention mixer ------------------------------------------- */

static void block_attention_forward(Model *m, int l, const Batch *b, int mode) {
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    Dims d = block_dims(m, b->T);
    be->matmul_forward(a->attn_proj, a->ln1, W(p->in_proj), d.T, d.H, d.Pa, d.H, d.Pa, 0);
    be->rmsnorm_forward(a->attn_q, a->attn_qk_rstd, a->attn_proj, W(p->q_norm), d.T, d.nh, d.hd, d.Pa, d.qd, d.eps, 1);
    be->rmsnorm_forward(a->attn_kv, a->attn_qk_rstd + d.T * d.nh, AT(a->attn_proj, 2 * d.qd), W(p->k_norm), d.T,
                        d.nkv, d.hd, d.Pa, 2 * d.kvd, d.eps, 1);
    be->copy_2d(AT(a->attn_kv, d.kvd), AT(a->attn_proj, 2 * d.qd + d.kvd), d.T, d.kvd, 2 * d.kvd, d.Pa);
    be->rope_forward(a->attn_q, b->pos, d.T, d.nh, d.hd, d.rd, d.qd, d.theta);
    be->rope_forward(a->attn_kv, b->pos, d.T, d.nkv, d.hd, d.rd, 2 * d.kvd, d.theta);
    /* the remat recompute keeps attention's output and LSE: no attention, no ring */
    if (mode != BLOCK_REMAT) {
        CpAttnDims ad = {.nh = d.nh, .nkv = d.nkv, .hd = d.hd};
        cp_ring_forward(&m->cp, l, a->attn_out, a->attn_lse, a->attn_q, a->attn_kv, &ad);
    }
    be->sigmoid_gate_forward(a->attn_gated, a->attn_out, AT(a->attn_proj, d.qd), d.T, d.qd, d.Pa);
    be->copy(a->h, a->x, (size_t)(d.T * d.H * d.es));
    be->matmul_forward(a->h, a->attn_gated, W(p->out_proj), d.T, d.qd, d.H, d.qd, d.H, 1);
}

static void block_attention_backward(Model *m, int l, const Batch *b) {
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    Dims d = block_dims(m, b->T);
    be->matmul_backward(m->d_gated, G(p->out_proj), m->d_resid, a->attn_gated, W(p->out_proj), d.T, d.qd, d.H, d.qd,
                        d.H, 0);
    be->memset_zero(m->d_proj, (size_t)(d.T * d.Pa * d.es));
    be->sigmoid_gate_backward(m->d_attn_out, AT(m->d_proj, d.qd), m->d_gated, a->attn_out, AT(a->attn_proj, d.qd),
                              d.T, d.qd, d.Pa);
    CpAttnDims ad = {.nh = d.nh, .nkv = d.nkv, .hd = d.hd};
    cp_ring_backward(&m->cp, l, m->d_q, m->d_kv, m->d_attn_out, a->attn_out, a->attn_lse, a->attn_q, a->attn_kv, &ad);
    be->rope_backward(m->d_q, b->pos, d.T, d.nh, d.hd, d.rd, d.qd, d.theta);
    be->rope_backward(m->d_kv, b->pos, d.T, d.nkv, d.hd, d.rd, 2 * d.kvd, d.theta);
    be->rmsnorm_backward(m->d_proj, G(p->q_norm), m->d_q, a->attn_proj, W(p->q_norm), a->attn_qk_rstd, d.T, d.nh,
                         d.hd, d.Pa, d.qd, 1);
    be->rmsnorm_backward(AT(m->d_proj, 2 * d.qd), G(p->k_norm), m->d_kv, AT(a->attn_proj, 2 * d.qd), W(p->k_norm),
                         a->attn_qk_rstd + d.T * d.nh, d.T, d.nkv, d.hd, d.Pa, 2 * d.kvd, 1);
    be->copy_2d(AT(m->d_proj, 2 * d.qd + d.kvd), AT(m->d_kv, d.kvd), d.T, d.kvd, d.Pa, 2 * d.kvd);
    be->matmul_backward(m->d_ln, G(p->in_proj), m->d_proj, a->ln1, W(p->in_proj), d.T, d.H, d.Pa, d.H, d.Pa, 0);
}

/* ---- the block ----------------------------------------------------------- */

void model_block_forward(Model *m, int l, const Batch *b, void *out, int mode) {
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    Dims d = block_dims(m, b->T);
    if (mode != BLOCK_FORWARD) m->count.block_recomputes++;
    be->rmsnorm_forward(a->ln1, a->rstd1, a->x, W(p->in_ln), d.T, 1, d.H, d.H, d.H, d.eps, 1);
    if (p->kind == LAYER_KIND_LINEAR) block_gdn_forward(m, l, b, mode);
    else block_attention_forward(m, l, b, mode);
    be->rmsnorm_forward(a->ln2, a->rstd2, a->h, W(p->post_ln), d.T, 1, d.H, d.H, d.H, d.eps, 1);
    be->matmul_forward(a->gate_up, a->ln2, W(p->gate_up), d.T, d.H, 2 * d.I, d.H, 2 * d.I, 0);
    be->swiglu_forward(a->act, a->gate_up, d.T, d.I);
    if (out) {
        RS_CHECK(mode == BLOCK_FORWARD, "a recompute must not rewrite the block output");
        be->copy(out, a->h, (size_t)(d.T * d.H * d.es));
        be->matmul_forward(out, a->act, W(p->down), d.T, d.I, d.H, d.I, d.H, 1);
    }
}

void model_block_backward(Model *m, int l, const Batch *b) {
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    Dims d = block_dims(m, b->T);
    /* MLP: d_resid = dL/d(out); out = h + down(swiglu(gate_up(ln2(h)))) */
    be->matmul_backward(m->d_act, G(p->down), m->d_resid, a->act, W(p->down), d.T, d.I, d.H, d.I, d.H, 0);
    be->swiglu_backward(m->d_gate_up, m->d_act, a->gate_up, d.T, d.I);
    be->matmul_backward(m->d_ln, G(p->gate_up), m->d_gate_up, a->ln2, W(p->gate_up), d.T, d.H, 2 * d.I, d.H, 2 * d.I,
                        0);
    be->rmsnorm_backward(m->d_resid, G(p->post_ln), m->d_ln, a->h, W(p->post_ln), a->rstd2, d.T, 1, d.H, d.H, d.H, 1);
    /* mixer: d_resid = dL/dh; h = x + mixer(ln1(x)); the mixer leaves dL/d(ln1) in d_ln */
    if (p->kind == LAYER_KIND_LINEAR) block_gdn_backward(m, l, b);
    else block_attention_backward(m, l, b);
    be->rmsnorm_backward(m->d_resid, G(p->in_ln), m->d_ln, a->x, W(p->in_ln), a->rstd1, d.T, 1, d.H, d.H, d.H, 1);
}
