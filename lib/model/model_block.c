/*
 * model_block.c — forward and backward of one decoder block (pre-norm mixer, residual, pre-norm SwiGLU
 * MLP, residual) for both layer kinds, over the backend's kernels; the buffers are model.h's LayerActs.
 *
 *   GDN mixer: proj = ln1 W_in^T gives [q|k|v|z|b|a]; conv+SiLU over [q|k|v], the L2 norm of q, k and v, z
 *     copied into their whole-rows buffers in the same pass (gdn_conv_split_forward: no conv output; its
 *     backward likewise, no conv gradient);
 *     beta = sigmoid(b), g = -exp(A_log) softplus(a+dt_bias); the chunked delta rule; gated RMSNorm with
 *     silu(z); out_proj.
 *   KDA mixer (model.linear_attention kda, docs/design/kda.md): proj gives [q|k|v|f_a|g_a|b]; f = f_a f_b^T,
 *     z = g_a g_b^T; conv+SiLU over [q|k|v]; L2 norm of q, k; beta = sigmoid(b), g = -exp(A_log)
 *     softplus(f+dt_bias) per key channel; the chunked delta rule with that decay (kda_chunk_*, through the
 *     same CP schedules); RMSNorm (o_norm) times sigmoid(z); o_proj. The GDN code below runs it, branching
 *     where the two differ.
 *   attention mixer: proj = ln1 W_in^T gives [q|gate|k|v]; q_norm, k_norm (zero-centred, per head); v
 *     copied beside k ([k|v] per token, the buffer the ring sends); partial RoPE at global positions; ring
 *     attention (cp_ring.c: causal, documents; with cp = 1 one step, no communication); sigmoid(gate)
 *     output gate; o_proj.
 *
 * Context parallelism (cp.h) enters in three places only: the GDN conv's halo, the GDN entry states and
 * the attention ring. Token-by-token work runs over each local fragment in row chunks
 * (checkpoint.chunk_rows, model_acts.c's rule when 0), so no call or scratch grows with the tokens per
 * GPU; only what a mixer's core reads across tokens has every row. Under checkpoint.activations none the
 * per-token buffers the backward reads are kept whole per layer (block_rows_at points at each chunk's
 * rows); under full and remat they hold one chunk and the backward reruns each chunk's per-token forward
 * first (chunk_recomputes), but under checkpoint.input_rows whole the input side (ln1, the in_proj outputs)
 * has every row from the recompute, so the backward reruns no in_proj. Chunks change only the order of fp32
 * sums (tests/test_long.py). A layer of checkpoint.keep_layers runs as under none whatever the policy
 * (model_acts_layer_keeps).
 *
 * Recompute modes (model_step.c decides): BLOCK_FORWARD the normal forward, writing the block output;
 * BLOCK_RECOMPUTE the full policy's recompute of the whole-rows buffers, attention included; BLOCK_REMAT
 * the remat policy's, which keeps attention's output and LSE, the GDN entry states, transitions and conv
 * halo, so neither attention nor any communication reruns.
 *
 * The math and the memory design: docs/design/model.md. Callers: model_step.c.
 */
#include "model_block.h"

#include <string.h>

#include "core/error.h"

/* dims of the model, read once per call */
typedef struct {
    int64_t T;
    int     H, I, nk, nv, dk, dv, Kd, Vd, Cc, Kc, Pg; /* GDN: Pg = width of [q|k|v|z|b|a] */
    int     kda, Gw, fa, ga, bc;                    /* KDA: Pg = width of [q|k|v|f_a|g_a|b], g's width nv dk (GDN
                                                       nv), the columns of f_a, g_a, b */
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
    d.kda = c->linear_attention == LINEAR_ATTN_KDA;
    d.Pg = d.kda ? d.Cc + 2 * d.dv + d.nv : d.Cc + d.Vd + 2 * d.nv;
    d.Gw = d.kda ? d.nv * d.dk : d.nv;
    d.fa = d.Cc;
    d.ga = d.Cc + d.dv;
    d.bc = d.Cc + 2 * d.dv;
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
#define W(off) ((const void *)((const char *)m->w_cur + ((int64_t)(off) - m->w_cur_start) * d.es))
#define G(off) (m->grad_cur + ((off) - m->grad_cur_start))
#define P32(off) (m->f32 + (off))

/* ---- row chunks ----------------------------------------------------------
 * The layer's per-token work runs over each local fragment (cp.h; the whole sample when cp = 1)
 * in chunks of R = acts.chunk_rows rows, the last one shorter. Chunk k of the micro-batch: */
typedef struct {
    int64_t row;  /* first row in the micro-batch */
    int64_t n;    /* rows */
    int64_t frag; /* local fragment, s x nlocal + f */
    int64_t off;  /* first row within the fragment: 0 opens a fragment */
} Chunk;

static int64_t block_chunks_per_frag(const Model *m) {
    return (m->cp.L.frag_len + m->acts.chunk_rows - 1) / m->acts.chunk_rows;
}
static int64_t block_chunks(const Model *m, const Batch *b) {
    return (int64_t)b->samples * m->cp.L.nlocal * block_chunks_per_frag(m);
}
static Chunk block_chunk(const Model *m, int64_t k) {
    const int64_t per = block_chunks_per_frag(m), R = m->acts.chunk_rows, n = m->cp.L.frag_len;
    Chunk c;
    c.frag = k / per;
    c.off = (k % per) * R;
    c.n = n - c.off < R ? n - c.off : R;
    c.row = cp_frag_row(&m->cp, (int)(c.frag / m->cp.L.nlocal), (int)(c.frag % m->cp.L.nlocal)) + c.off;
    return c;
}

/* Points layer l's token buffers (model.h) at the rows from `row` on, and says whether the forward of the
 * buffers the caller asks for (`input`: the input side, ln1 and the in_proj outputs; else h and the MLP's) must
 * run there now: always outside the layer's backward; in it only where those buffers hold one chunk. A kept
 * layer (none, or checkpoint.keep_layers) holds every row of both; under checkpoint.input_rows whole the
 * input side has every row from the recompute (model_acts_layer_inputs_whole). Where a buffer has every row
 * its pointer is a cursor into it, which holds the forward's rows in the backward; elsewhere it stays on the
 * chunk buffer. */
static int block_rows_at(Model *m, int l, int64_t row, int input, const Dims *dd) {
    const Dims d = *dd;
    LayerActs *a = &m->la[l];
    const int kept = model_acts_layer_keeps(&m->acts, l);
    const int whole = model_acts_layer_inputs_whole(&m->acts, l);
    if (whole && row != a->at) {
        const int64_t r = row - a->at;
        a->ln1 = AT(a->ln1, r * d.H);
        a->rstd1 += r;
        if (m->lp[l].kind == LAYER_KIND_LINEAR) {
            a->gdn_proj = AT(a->gdn_proj, r * d.Pg);
            if (d.kda) a->kda_f = AT(a->kda_f, r * d.Gw);
        } else
            a->attn_proj = AT(a->attn_proj, r * d.Pa);
        if (kept) {
            a->h = AT(a->h, r * d.H);
            a->ln2 = AT(a->ln2, r * d.H);
            a->rstd2 += r;
            a->gate_up = AT(a->gate_up, r * 2 * d.I);
            if (model_acts_layer_keeps_act(&m->acts, l)) a->act = AT(a->act, r * d.I);
            if (m->lp[l].kind == LAYER_KIND_LINEAR) {
                a->gdn_normed = AT(a->gdn_normed, r * d.Vd);
                a->gdn_norm_rstd += r * d.nv;
                if (d.kda) a->kda_unit = AT(a->kda_unit, r * d.Vd);
            } else
                a->attn_gated = AT(a->attn_gated, r * d.qd);
        }
        a->at = row;
    }
    return !a->backward || !(input ? whole : kept);
}

/* Each per-token forward (ln1 with the in_proj after it, h, the MLP) counts here when it runs inside
 * its layer's backward: a recompute, whatever made it run (none: never). */
static void block_rows_count(Model *m, int l) {
    if (m->la[l].backward) m->count.chunk_recomputes++;
}

static void block_ln1_compute(Model *m, int l, int64_t row, int64_t n, const Dims *dd) {
    const Dims d = *dd;
    LayerActs *a = &m->la[l];
    block_rows_count(m, l);
    m->be->rmsnorm_forward(a->ln1, a->rstd1, AT(a->x, row * d.H), W(m->lp[l].in_ln), n, 1, d.H, d.H, d.H, d.eps, 1);
}

/* ln1 (token) = input RMSNorm of x's rows [row, row + n) (block_rows_at: not again where they have every row) */
static void block_ln1(Model *m, int l, int64_t row, int64_t n, const Dims *dd) {
    if (block_rows_at(m, l, row, 1, dd)) block_ln1_compute(m, l, row, n, dd);
}

/* backward of ln1 -> in_proj for one chunk's rows: dW_in += dproj^T ln1, and dx (the residual
 * stream's gradient, d_resid) += the norm's backward of dproj W_in. OC = the rows of W_in that dproj
 * holds (the GDN conv halo's gradient has only the first Cc); ln1 and rstd1 hold the rows' norm. */
static void block_in_proj_backward(Model *m, int l, int64_t row, int64_t n, const void *dproj, int OC, int ldp,
                                   const Dims *dd) {
    const Dims d = *dd;
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    RS_CHECK(!model_acts_layer_inputs_whole(&m->acts, l) || a->at == row, "layer %d: ln1 at row %lld, not %lld",
             l, (long long)a->at, (long long)row);
    be->matmul_backward(m->d_ln, G(p->in_proj), dproj, a->ln1, W(p->in_proj), n, d.H, OC, d.H, ldp, 0);
    be->rmsnorm_backward(AT(m->d_resid, row * d.H), G(p->in_ln), m->d_ln, AT(a->x, row * d.H), W(p->in_ln), a->rstd1,
                         n, 1, d.H, d.H, d.H, 1);
}

/* ---- the MLP, one chunk: its input h (R,H) is in the token buffer --------- */

static void block_mlp_forward(Model *m, int l, const Chunk *c, void *out, const Dims *dd) {
    const Dims d = *dd;
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    block_rows_count(m, l);
    be->rmsnorm_forward(a->ln2, a->rstd2, a->h, W(p->post_ln), c->n, 1, d.H, d.H, d.H, d.eps, 1);
    be->matmul_forward(a->gate_up, a->ln2, W(p->gate_up), c->n, d.H, 2 * d.I, d.H, 2 * d.I, 0);
    if (!out) return; /* a recompute: its backward writes act again (swiglu_backward) */
    be->swiglu_forward(a->act, a->gate_up, c->n, d.I);
    be->matmul_forward_residual(AT(out, c->row * d.H), a->act, W(p->down), a->h, c->n, d.I, d.H, d.I, d.H, d.H);
}

/* d_resid's rows: dL/d(block output) in, dL/dh out (the MLP's forward of the chunk in the token buffers) */
static void block_mlp_backward(Model *m, int l, const Chunk *c, const Dims *dd) {
    const Dims d = *dd;
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    void *dres = AT(m->d_resid, c->row * d.H);
    if (model_acts_layer_keeps_act(&m->acts, l)) { /* act from the forward */
        be->matmul_backward(m->d_act, G(p->down), dres, a->act, W(p->down), c->n, d.I, d.H, d.I, d.H, 0);
        be->swiglu_backward(m->d_gate_up, NULL, m->d_act, a->gate_up, c->n, d.I);
    } else { /* d_act first, then act again beside the SwiGLU gradient, then the down projection's dW */
        be->matmul_backward(m->d_act, NULL, dres, NULL, W(p->down), c->n, d.I, d.H, d.I, d.H, 0);
        be->swiglu_backward(m->d_gate_up, a->act, m->d_act, a->gate_up, c->n, d.I);
        be->matmul_backward(NULL, G(p->down), dres, a->act, W(p->down), c->n, d.I, d.H, d.I, d.H, 0);
    }
    be->matmul_backward(m->d_ln, G(p->gate_up), m->d_gate_up, a->ln2, W(p->gate_up), c->n, d.H, 2 * d.I, d.H,
                        2 * d.I, 0);
    be->rmsnorm_backward(dres, G(p->post_ln), m->d_ln, a->h, W(p->post_ln), a->rstd2, c->n, 1, d.H, d.H, d.H, 1);
}

/* ---- Gated DeltaNet mixer ---------------------------------------------- */

/* Each sample's rows are its local fragments (cp.h): one chunked-delta-rule call per fragment,
 * fragment i = s x nlocal + f, and the conv over the fragment's row chunks, each chunk's halo the
 * previous chunk's last Kc-1 pre-conv rows. With cp > 1 a fragment's first halo and entry state
 * come from the CP group (cp_gdn.c); with cp = 1 the one fragment is the whole sample, which
 * starts from nothing. */

static CpGdnDims block_gdn_cp_dims(const Dims *d) {
    return (CpGdnDims){.nk = d->nk, .nv = d->nv, .dk = d->dk, .dv = d->dv, .Cc = d->Cc, .Kc = d->Kc};
}

/* The layer's delta-rule core as cp_gdn.c runs it (cp.h CpGdnCore): the whole-rows buffers, the CP
 * entry states and transitions (cp > 1), and what each fragment's forward keeps for the backward
 * (checkpoint.gdn_keep; backend.h gdn_kept_bytes, model_acts.c "gdn_kept"): written by the forward
 * that the layer's backward follows (BLOCK_FORWARD under the none policy; the recompute under remat /
 * full, into the shared scratch), read by the backward, which then skips that work; keep 0, or
 * gdn_keep none (no buffer: both recompute), keeps nothing. */
static CpGdnCore block_gdn_core(const Model *m, int l, const LayerActs *a, int keep, const Dims *dd) {
    const Dims d = *dd;
    const int multi = m->cp.L.P > 1;
    CpGdnCore c = {.q = a->gdn_qk_norm, .k = AT(a->gdn_qk_norm, d.Kd), .v = a->gdn_v, .g = a->gdn_g,
                   .beta = a->gdn_beta, .ldq = 2 * d.Kd, .ldv = d.Vd, .ldo = d.Vd,
                   .states = multi ? a->gdn_cp_states : NULL, .M = multi ? a->gdn_cp_M : NULL,
                   .kept_kind = model_acts_gdn_kept_kind(&m->acts, m->cfg, l), .kda = d.kda};
    if (keep && m->cfg->checkpoint.gdn_keep != GDN_KEEP_NONE) {
        c.kept = a->gdn_kept;
        c.kept_bytes = (d.kda ? m->be->kda_kept_bytes : m->be->gdn_kept_bytes)(m->cp.L.frag_len, d.nv, d.dk, d.dv,
                                                                               c.kept_kind);
    }
    return c;
}

/* ln1 and proj (token buffers) of a chunk's rows, and of a KDA layer the decay gate's input f = f_a f_b^T
 * (block_rows_at: not again where they have every row) */
static void block_gdn_proj(Model *m, int l, int64_t row, int64_t n, const Dims *dd) {
    const Dims d = *dd;
    if (!block_rows_at(m, l, row, 1, dd)) return;
    block_ln1_compute(m, l, row, n, dd);
    m->be->matmul_forward(m->la[l].gdn_proj, m->la[l].ln1, W(m->lp[l].in_proj), n, d.H, d.Pg, d.H, d.Pg, 0);
    if (d.kda)
        m->be->matmul_forward(m->la[l].kda_f, AT(m->la[l].gdn_proj, d.fa), W(m->lp[l].f_b), n, d.dv, d.Gw, d.Pg, d.Gw, 0);
}

/* The conv halo a chunk reads: the fragment's (from the CP group; none when cp = 1) or the previous
 * chunk's last rows (gdn_halo, saved by block_gdn_save_halo). */
static const void *block_gdn_halo_in(const Model *m, const LayerActs *a, const Chunk *c, const Dims *d) {
    if (c->off > 0) return a->gdn_halo;
    return m->cp.L.P > 1 ? (const char *)a->gdn_conv_halo + c->frag * (int64_t)(d->Kc - 1) * d->Cc * d->es : NULL;
}
/* After a chunk's conv: its last Kc-1 pre-conv rows are the next chunk's halo (none after the fragment's end). */
static void block_gdn_save_halo(Model *m, LayerActs *a, const Chunk *c, const Dims *dd) {
    const Dims d = *dd;
    if (c->off + c->n < m->cp.L.frag_len)
        m->be->copy_2d(a->gdn_halo, AT(a->gdn_proj, (c->n - (d.Kc - 1)) * d.Pg), d.Kc - 1, d.Cc, d.Cc, d.Pg);
}

/* The pre-conv [q|k|v] of each local fragment's last Kc-1 rows into cp->halo_send (the tails the CP
 * halo exchange sends), computed from x on their own: the fragment's chunks come later. */
static void block_gdn_tails(Model *m, int l, const Batch *b, const Dims *dd) {
    const Dims d = *dd;
    const CpLayout *L = &m->cp.L;
    const int w = d.Kc - 1;
    for (int s = 0; s < b->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t i = (int64_t)s * L->nlocal + f, row = cp_frag_row(&m->cp, s, f) + L->frag_len - w;
            block_ln1(m, l, row, w, dd);
            m->be->matmul_forward(AT(m->cp.halo_send, i * w * d.Cc), m->la[l].ln1, W(m->lp[l].in_proj), w, d.H, d.Cc,
                                  d.H, d.Cc, 0);
        }
}

/* The mixer up to its whole-rows buffers: per chunk ln1, proj, conv + SiLU, L2 norm, gates (into
 * qk_norm, v, z, beta, g); then the delta rule per fragment (core), with cp > 1 from the entry
 * states the CP group passes (cp_gdn_forward: the chain at cp = 2, the hybrid or the scan above). */
static void block_gdn_forward(Model *m, int l, const Batch *b, int mode) {
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    Dims d = block_dims(m, b->T);
    Cp *cp = &m->cp;
    const CpLayout *L = &cp->L;
    const int multi = L->P > 1;
    const CpGdnDims cd = block_gdn_cp_dims(&d);
    /* the remat recompute keeps what came from the CP group: no halo exchange, no entry states */
    const int communicate = multi && mode != BLOCK_REMAT;
    /* under remat / full the first forward's kept buffer would be overwritten before any backward reads it; the
     * hybrid's state passes run alone into it all the same (cp_gdn_forward_needs_kept: scratch there) */
    const int keep = mode != BLOCK_FORWARD || model_acts_layer_keeps(&m->acts, l) ||
                     (communicate && cp_gdn_forward_needs_kept(cp));
    if (communicate) {
        block_gdn_tails(m, l, b, &d);
        cp_gdn_halo_forward(cp, l, a->gdn_conv_halo, NULL, d.Cc, &cd);
    }
    for (int64_t k = 0, K = block_chunks(m, b); k < K; k++) {
        const Chunk c = block_chunk(m, k);
        block_gdn_proj(m, l, c.row, c.n, &d);
        if (d.kda) { /* conv + SiLU; the L2 norm of q, k, the v copy; the output gate's input g_a g_b^T; the gates */
            be->conv1d_silu_forward(a->gdn_conv, a->gdn_proj, block_gdn_halo_in(m, a, &c, &d), W(p->conv),
                                    b->doc_pos + c.row, c.n, d.Cc, d.Kc, d.Pg, d.Cc);
            block_gdn_save_halo(m, a, &c, &d);
            be->l2norm_forward(AT(a->gdn_qk_norm, c.row * 2 * d.Kd), a->gdn_qk_rstd + c.row * 2 * d.nk, a->gdn_conv,
                               c.n, 2 * d.nk, d.dk, d.Cc, 2 * d.Kd);
            be->copy_2d(AT(a->gdn_v, c.row * d.Vd), AT(a->gdn_conv, 2 * d.Kd), c.n, d.Vd, d.Vd, d.Cc);
            be->matmul_forward(AT(a->gdn_z, c.row * d.Vd), AT(a->gdn_proj, d.ga), W(p->g_b), c.n, d.dv, d.Vd, d.Pg,
                               d.Vd, 0);
            be->kda_gates_forward(a->gdn_beta + c.row * d.nv, a->gdn_g + c.row * d.Gw, AT(a->gdn_proj, d.bc), a->kda_f,
                                  P32(p->A_log32), P32(p->dt_bias32), c.n, d.nv, d.dk, d.Pg, d.Gw);
            continue;
        }
        /* conv + SiLU, the L2 norm of q, k and the v, z copies into the whole-rows buffers, one pass */
        be->gdn_conv_split_forward(AT(a->gdn_qk_norm, c.row * 2 * d.Kd), a->gdn_qk_rstd + c.row * 2 * d.nk,
                                   AT(a->gdn_v, c.row * d.Vd), AT(a->gdn_z, c.row * d.Vd), a->gdn_proj,
                                   block_gdn_halo_in(m, a, &c, &d), W(p->conv), b->doc_pos + c.row, c.n, d.nk, d.dk,
                                   d.Vd, d.Kc, d.Pg);
        block_gdn_save_halo(m, a, &c, &d);
        be->gdn_gates_forward(a->gdn_beta + c.row * d.nv, a->gdn_g + c.row * d.nv, AT(a->gdn_proj, d.Cc + d.Vd),
                              AT(a->gdn_proj, d.Cc + d.Vd + d.nv), P32(p->A_log32), P32(p->dt_bias32), c.n, d.nv, d.Pg);
    }
    const CpGdnCore core = block_gdn_core(m, l, a, keep, &d);
    cp_gdn_forward(cp, l, a->gdn_core, &core, communicate, &cd);
}

/* h (chunk) = x + out_proj(gated RMSNorm(core, z)) of a chunk's rows; KDA: the RMSNorm (o_norm, plain scale)
 * into kda_unit, then its sigmoid gate (kimi_linear's o_norm: FusedRMSNormGated, activation sigmoid) */
static void block_gdn_out_forward(Model *m, int l, const Chunk *c, const Dims *dd) {
    const Dims d = *dd;
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    block_rows_count(m, l);
    if (d.kda) {
        be->rmsnorm_forward(a->kda_unit, a->gdn_norm_rstd, AT(a->gdn_core, c->row * d.Vd), W(p->gdn_norm), c->n, d.nv,
                            d.dv, d.Vd, d.Vd, d.eps, 0);
        be->sigmoid_gate_forward(a->gdn_normed, a->kda_unit, AT(a->gdn_z, c->row * d.Vd), c->n, d.Vd, d.Vd);
    } else
        be->gated_rmsnorm_forward(a->gdn_normed, a->gdn_norm_rstd, AT(a->gdn_core, c->row * d.Vd),
                                  AT(a->gdn_z, c->row * d.Vd), W(p->gdn_norm), c->n, d.nv, d.dv, d.Vd, d.eps);
    be->matmul_forward_residual(a->h, a->gdn_normed, W(p->out_proj), AT(a->x, c->row * d.H), c->n, d.Vd, d.H, d.Vd,
                                d.H, d.H);
}

/* d_resid's rows hold dL/dh: out_proj and the gated norm's backward into d_core, d_z (whole rows) */
static void block_gdn_out_backward(Model *m, int l, const Chunk *c, const Dims *dd) {
    const Dims d = *dd;
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    be->matmul_backward(m->d_mix, G(p->out_proj), AT(m->d_resid, c->row * d.H), a->gdn_normed, W(p->out_proj), c->n,
                        d.Vd, d.H, d.Vd, d.H, 0);
    if (d.kda) { /* the sigmoid gate, then the norm (its dinp accumulates: d_core's rows cleared first) */
        be->sigmoid_gate_backward(m->d_kda_unit, AT(m->d_z, c->row * d.Vd), m->d_mix, a->kda_unit,
                                  AT(a->gdn_z, c->row * d.Vd), c->n, d.Vd, d.Vd);
        be->memset_zero(AT(m->d_core, c->row * d.Vd), (size_t)(c->n * d.Vd * d.es));
        be->rmsnorm_backward(AT(m->d_core, c->row * d.Vd), G(p->gdn_norm), m->d_kda_unit,
                             AT(a->gdn_core, c->row * d.Vd), W(p->gdn_norm), a->gdn_norm_rstd, c->n, d.nv, d.dv, d.Vd,
                             d.Vd, 0);
        return;
    }
    be->gated_rmsnorm_backward(AT(m->d_core, c->row * d.Vd), AT(m->d_z, c->row * d.Vd), G(p->gdn_norm), m->d_mix,
                               AT(a->gdn_core, c->row * d.Vd), AT(a->gdn_z, c->row * d.Vd), W(p->gdn_norm),
                               a->gdn_norm_rstd, c->n, d.nv, d.dv, d.Vd);
}

/* After the chunks' out_proj backward (d_core, d_z hold every row): the delta rule's backward with
 * the CP group's state gradients (cp_gdn_backward; whole rows), then per chunk the gates', L2
 * norm's, conv's and in_proj's backward. A chunk's conv also gives the gradient of the halo it
 * read: the previous chunk's rows (their in_proj backward is then run again for those Kc-1 rows
 * alone: the backward is linear in dproj) or, for a fragment's first chunk, the CP predecessor's,
 * which the halo exchange returns to it. */
static void block_gdn_backward(Model *m, int l, const Batch *b) {
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    Dims d = block_dims(m, b->T);
    Cp *cp = &m->cp;
    const CpLayout *L = &cp->L;
    const int multi = L->P > 1;
    const CpGdnDims cd = block_gdn_cp_dims(&d);
    const int64_t tail = (int64_t)(d.Kc - 1) * d.Cc, n = L->frag_len;
    const CpGdnCore core = block_gdn_core(m, l, a, 1, &d);
    const CpGdnGrads grads = {.dq = m->d_qk, .dk = AT(m->d_qk, d.Kd), .dv = m->d_v, .dg = m->d_g,
                              .dbeta = m->d_beta, .dout = m->d_core};
    cp_gdn_backward(cp, l, &grads, &core, &cd); /* with cp > 1 the state gradients pass through the CP group */
    for (int64_t k = 0, K = block_chunks(m, b); k < K; k++) {
        const Chunk c = block_chunk(m, k);
        block_gdn_proj(m, l, c.row, c.n, &d);
        void *dhalo = c.off > 0 ? m->d_halo : multi ? AT(cp->halo_send, c.frag * tail) : NULL;
        if (d.kda) { /* the gates into b's columns and df; the low-rank up projections into f_a's and g_a's */
            be->kda_gates_backward(AT(m->d_proj, d.bc), m->d_kda_f, G(p->A_log), G(p->dt_bias),
                                   m->d_beta + c.row * d.nv, m->d_g + c.row * d.Gw, AT(a->gdn_proj, d.bc), a->kda_f,
                                   P32(p->A_log32), P32(p->dt_bias32), c.n, d.nv, d.dk, d.Pg, d.Gw);
            be->matmul_backward(AT(m->d_proj, d.fa), G(p->f_b), m->d_kda_f, AT(a->gdn_proj, d.fa), W(p->f_b), c.n, d.dv,
                                d.Gw, d.Pg, d.Gw, 0);
            be->matmul_backward(AT(m->d_proj, d.ga), G(p->g_b), AT(m->d_z, c.row * d.Vd), AT(a->gdn_proj, d.ga),
                                W(p->g_b), c.n, d.dv, d.Vd, d.Pg, d.Vd, 0);
            be->l2norm_backward(m->d_conv, AT(m->d_qk, c.row * 2 * d.Kd), AT(a->gdn_qk_norm, c.row * 2 * d.Kd),
                                a->gdn_qk_rstd + c.row * 2 * d.nk, c.n, 2 * d.nk, d.dk, d.Cc, 2 * d.Kd);
            be->copy_2d(AT(m->d_conv, 2 * d.Kd), AT(m->d_v, c.row * d.Vd), c.n, d.Vd, d.Cc, d.Vd);
            be->conv1d_silu_backward(m->d_proj, dhalo, G(p->conv), m->d_conv, a->gdn_proj,
                                     block_gdn_halo_in(m, a, &c, &d), W(p->conv), b->doc_pos + c.row, c.n, d.Cc, d.Kc,
                                     d.Pg, d.Cc);
        } else {
            be->gdn_gates_backward(AT(m->d_proj, d.Cc + d.Vd), AT(m->d_proj, d.Cc + d.Vd + d.nv), G(p->A_log),
                                   G(p->dt_bias), m->d_beta + c.row * d.nv, m->d_g + c.row * d.nv,
                                   AT(a->gdn_proj, d.Cc + d.Vd), AT(a->gdn_proj, d.Cc + d.Vd + d.nv), P32(p->A_log32),
                                   P32(p->dt_bias32), c.n, d.nv, d.Pg);
            /* the L2 norm's backward and dv through the conv's backward into d_proj's q|k|v columns (and the
             * halo's gradient, dw), dz into its z columns: one pass */
            be->gdn_conv_split_backward(m->d_proj, dhalo, G(p->conv), AT(m->d_qk, c.row * 2 * d.Kd),
                                        AT(a->gdn_qk_norm, c.row * 2 * d.Kd), a->gdn_qk_rstd + c.row * 2 * d.nk,
                                        AT(m->d_v, c.row * d.Vd), AT(m->d_z, c.row * d.Vd), a->gdn_proj,
                                        block_gdn_halo_in(m, a, &c, &d), W(p->conv), b->doc_pos + c.row, c.n, d.nk,
                                        d.dk, d.Vd, d.Kc, d.Pg);
        }
        block_gdn_save_halo(m, a, &c, &d);
        block_in_proj_backward(m, l, c.row, c.n, m->d_proj, d.Pg, d.Pg, &d);
        if (c.off > 0) { /* the halo's gradient: the previous chunk's last Kc-1 rows */
            block_ln1(m, l, c.row - (d.Kc - 1), d.Kc - 1, &d);
            block_in_proj_backward(m, l, c.row - (d.Kc - 1), d.Kc - 1, m->d_halo, d.Cc, d.Cc, &d);
        }
    }
    if (multi) { /* each fragment's first halo gradient goes back to the fragment before it */
        cp_gdn_halo_backward(cp, l, NULL, d.Cc, cp->halo_send, &cd);
        for (int s = 0; s < b->samples; s++)
            for (int f = 0; f < L->nlocal; f++) {
                const void *dtail = cp_gdn_halo_grad(cp, s, f, &cd);
                if (!dtail) continue;
                const int64_t row = cp_frag_row(cp, s, f) + n - (d.Kc - 1);
                block_ln1(m, l, row, d.Kc - 1, &d);
                block_in_proj_backward(m, l, row, d.Kc - 1, dtail, d.Cc, d.Cc, &d);
            }
    }
}

/* ---- softmax attention mixer ------------------------------------------- */

/* ln1 and proj [q|gate|k|v] (token buffers) of a chunk's rows (block_rows_at: not again where they have every
 * row) */
static void block_attention_proj(Model *m, int l, int64_t row, int64_t n, const Dims *dd) {
    const Dims d = *dd;
    if (!block_rows_at(m, l, row, 1, dd)) return;
    block_ln1_compute(m, l, row, n, dd);
    m->be->matmul_forward(m->la[l].attn_proj, m->la[l].ln1, W(m->lp[l].in_proj), n, d.H, d.Pa, d.H, d.Pa, 0);
}

/* Per chunk ln1, proj, q_norm, k_norm, v beside k, RoPE (into attn_q, attn_kv, attn_gate: whole rows);
 * then the ring (cp_ring.c; with cp = 1 one step, no communication). */
static void block_attention_forward(Model *m, int l, const Batch *b, int mode) {
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    Dims d = block_dims(m, b->T);
    for (int64_t k = 0, K = block_chunks(m, b); k < K; k++) {
        const Chunk c = block_chunk(m, k);
        void *q = AT(a->attn_q, c.row * d.qd), *kv = AT(a->attn_kv, c.row * 2 * d.kvd);
        block_attention_proj(m, l, c.row, c.n, &d);
        be->rmsnorm_forward(q, a->attn_qk_rstd + c.row * d.nh, a->attn_proj, W(p->q_norm), c.n, d.nh, d.hd, d.Pa,
                            d.qd, d.eps, 1);
        be->rmsnorm_forward(kv, a->attn_qk_rstd + d.T * d.nh + c.row * d.nkv, AT(a->attn_proj, 2 * d.qd),
                            W(p->k_norm), c.n, d.nkv, d.hd, d.Pa, 2 * d.kvd, d.eps, 1);
        be->copy_2d(AT(kv, d.kvd), AT(a->attn_proj, 2 * d.qd + d.kvd), c.n, d.kvd, 2 * d.kvd, d.Pa);
        be->rope_forward(q, b->pos + c.row, c.n, d.nh, d.hd, d.rd, d.qd, d.theta);
        be->rope_forward(kv, b->pos + c.row, c.n, d.nkv, d.hd, d.rd, 2 * d.kvd, d.theta);
        be->copy_2d(AT(a->attn_gate, c.row * d.qd), AT(a->attn_proj, d.qd), c.n, d.qd, d.qd, d.Pa);
    }
    /* the remat recompute keeps attention's output and LSE: no attention, no ring */
    if (mode != BLOCK_REMAT) {
        CpAttnDims ad = {.nh = d.nh, .nkv = d.nkv, .hd = d.hd};
        cp_ring_forward(&m->cp, l, a->attn_out, a->attn_lse, a->attn_q, a->attn_kv, &ad);
    }
}

/* h (chunk) = x + o_proj(out * sigmoid(gate)) of a chunk's rows */
static void block_attention_out_forward(Model *m, int l, const Chunk *c, const Dims *dd) {
    const Dims d = *dd;
    const Backend *be = m->be;
    LayerActs *a = &m->la[l];
    block_rows_count(m, l);
    be->sigmoid_gate_forward(a->attn_gated, AT(a->attn_out, c->row * d.qd), AT(a->attn_gate, c->row * d.qd), c->n,
                             d.qd, d.qd);
    be->matmul_forward_residual(a->h, a->attn_gated, W(m->lp[l].out_proj), AT(a->x, c->row * d.H), c->n, d.qd, d.H,
                                d.qd, d.H, d.H);
}

/* d_resid's rows hold dL/dh: o_proj and the gate's backward into d_attn_out, d_gate (whole rows) */
static void block_attention_out_backward(Model *m, int l, const Chunk *c, const Dims *dd) {
    const Dims d = *dd;
    const Backend *be = m->be;
    LayerActs *a = &m->la[l];
    be->matmul_backward(m->d_mix, G(m->lp[l].out_proj), AT(m->d_resid, c->row * d.H), a->attn_gated,
                        W(m->lp[l].out_proj), c->n, d.qd, d.H, d.qd, d.H, 0);
    be->sigmoid_gate_backward(AT(m->d_attn_out, c->row * d.qd), AT(m->d_gate, c->row * d.qd), m->d_mix,
                              AT(a->attn_out, c->row * d.qd), AT(a->attn_gate, c->row * d.qd), c->n, d.qd, d.qd);
}

/* The ring's backward (whole rows), RoPE's, then per chunk the norms' and in_proj's. */
static void block_attention_backward(Model *m, int l, const Batch *b) {
    const Backend *be = m->be;
    const LayerParams *p = &m->lp[l];
    LayerActs *a = &m->la[l];
    Dims d = block_dims(m, b->T);
    CpAttnDims ad = {.nh = d.nh, .nkv = d.nkv, .hd = d.hd};
    cp_ring_backward(&m->cp, l, m->d_q, m->d_kv, m->d_attn_out, a->attn_out, a->attn_lse, a->attn_q, a->attn_kv, &ad);
    be->rope_backward(m->d_q, b->pos, d.T, d.nh, d.hd, d.rd, d.qd, d.theta);
    be->rope_backward(m->d_kv, b->pos, d.T, d.nkv, d.hd, d.rd, 2 * d.kvd, d.theta);
    for (int64_t k = 0, K = block_chunks(m, b); k < K; k++) {
        const Chunk c = block_chunk(m, k);
        const void *dkv = AT(m->d_kv, c.row * 2 * d.kvd);
        block_attention_proj(m, l, c.row, c.n, &d);
        be->memset_zero(m->d_proj, (size_t)(c.n * d.Pa * d.es));
        be->rmsnorm_backward(m->d_proj, G(p->q_norm), AT(m->d_q, c.row * d.qd), a->attn_proj, W(p->q_norm),
                             a->attn_qk_rstd + c.row * d.nh, c.n, d.nh, d.hd, d.Pa, d.qd, 1);
        be->rmsnorm_backward(AT(m->d_proj, 2 * d.qd), G(p->k_norm), dkv, AT(a->attn_proj, 2 * d.qd), W(p->k_norm),
                             a->attn_qk_rstd + d.T * d.nh + c.row * d.nkv, c.n, d.nkv, d.hd, d.Pa, 2 * d.kvd, 1);
        be->copy_2d(AT(m->d_proj, 2 * d.qd + d.kvd), (const char *)dkv + (int64_t)d.kvd * d.es, c.n, d.kvd, d.Pa,
                    2 * d.kvd);
        be->copy_2d(AT(m->d_proj, d.qd), AT(m->d_gate, c.row * d.qd), c.n, d.qd, d.Pa, d.qd);
        block_in_proj_backward(m, l, c.row, c.n, m->d_proj, d.Pa, d.Pa, &d);
    }
}

/* ---- the block ----------------------------------------------------------- */

/* A chunk's h and MLP (token buffers): in the forward with `out`, the block output's rows too; in the
 * backward (out NULL) the recompute, which under none finds them kept and does nothing. */
static void block_chunk_forward(Model *m, int l, const Chunk *c, void *out, const Dims *d) {
    if (!block_rows_at(m, l, c->row, 0, d)) return;
    if (m->lp[l].kind == LAYER_KIND_LINEAR) block_gdn_out_forward(m, l, c, d);
    else block_attention_out_forward(m, l, c, d);
    block_mlp_forward(m, l, c, out, d);
}

void model_block_forward(Model *m, int l, const Batch *b, void *out, int mode) {
    const LayerParams *p = &m->lp[l];
    Dims d = block_dims(m, b->T);
    RS_CHECK(!m->la[l].backward, "layer %d: a forward inside its backward", l);
    if (mode != BLOCK_FORWARD) m->count.block_recomputes++;
    if (p->kind == LAYER_KIND_LINEAR) block_gdn_forward(m, l, b, mode);
    else block_attention_forward(m, l, b, mode);
    if (mode != BLOCK_FORWARD) return; /* the backward recomputes the rest chunk by chunk */
    RS_CHECK(out, "the forward writes the block output");
    if (l + 1 < (int)m->cfg->model.num_hidden_layers) model_offload_claim(m, l + 1); /* out is layer l+1's x */
    for (int64_t k = 0, K = block_chunks(m, b); k < K; k++) {
        const Chunk c = block_chunk(m, k);
        block_chunk_forward(m, l, &c, out, &d);
    }
}

void model_block_backward(Model *m, int l, const Batch *b) {
    const LayerParams *p = &m->lp[l];
    Dims d = block_dims(m, b->T);
    m->la[l].backward = 1;
    /* per chunk: h and the MLP's forward (again, but under none), then the MLP's backward (d_resid:
     * dL/d(out) -> dL/dh) and the mixer output's */
    for (int64_t k = 0, K = block_chunks(m, b); k < K; k++) {
        const Chunk c = block_chunk(m, k);
        block_chunk_forward(m, l, &c, NULL, &d);
        block_mlp_backward(m, l, &c, &d);
        if (p->kind == LAYER_KIND_LINEAR) block_gdn_out_backward(m, l, &c, &d);
        else block_attention_out_backward(m, l, &c, &d);
    }
    /* the mixer's core and input side: d_resid += the input norm's backward (dL/dh -> dL/dx) */
    if (p->kind == LAYER_KIND_LINEAR) block_gdn_backward(m, l, b);
    else block_attention_backward(m, l, b);
    m->la[l].backward = 0;
}
