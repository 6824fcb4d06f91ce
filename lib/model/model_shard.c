/*
 * model_shard.c — the optimizer step and parallel.shard: which rank holds which piece of the fp32 master
 * weights and AdamW moments, the gradient norm over the pieces, and the all-gather that gives every rank
 * the updated compute copy again (docs/design/sharding.md).
 *
 * Layout: the flat buffer is cut into buckets (model_params.h: embed_tokens, each layer, the head), each
 * padded to a multiple of P x PARAM_ALIGN (P = world = dp x cp); rank r owns the r-th of the P equal
 * pieces of every bucket, [s_b + r n_b, s_b + (r+1) n_b) with n_b = len_b / P, and keeps them concatenated
 * in bucket order: shard element s_b / P + k is flat element s_b + r n_b + k. The buckets are the units the
 * backward reduces (model_step.c), so the step's communication stays per layer.
 *
 * The gradients (parallel.shard: gradients): embed_tokens' and the head's buckets keep whole buffers (the
 * head's gradient is made during the forward, embed_tokens' last), reduce-scattered at the step's last
 * micro-batch; the layers share two buffers, layer l in slot l % 2: after its backward (every micro-batch)
 * the slot is reduce-scattered in place, and before layer l - 2 takes the slot its summed piece is added
 * into grad_shard (the rank's pieces) and the slot zeroed, so the reduce-scatter overlaps the next layer.
 *
 * The step: AdamW is elementwise, so each rank runs it over (tensor ∩ its piece) with the tensor's weight
 * decay, reading the summed gradient of its piece (optimizer: the all-reduced whole gradient; gradients:
 * grad_shard) and writing the compute copy of its piece (bf16 on
 * cuda; the full fp32 copy on cpu, where `weights` is then a buffer of its own); then every bucket's compute
 * copy is all-gathered in place over the world. The GDN gates (A_log, dt_bias), which the kernels read in
 * fp32, are gathered apart on cuda: each rank writes its owned values into a zeroed compact buffer and one
 * all-reduce sums it (exact: one term per element is not zero).
 *
 * The weights (parallel.shard: weights): embed_tokens' and the head's compute copy stay whole (all-gathered
 * after the step as above); a layer's compute copy is only the rank's pieces (w_shard), and the forward and
 * the backward all-gather layer l into slot l % 2 one layer ahead (model_weights_fetch / ready, called by
 * model_step.c), so two layers' weights are whole at once; the step writes the pieces and nothing more.
 *
 * Without sharding everything here is the plain per-tensor step over full buffers.
 *
 * Callers: lib/run/train.c (the step, the norm, init_from, resume), lib/run/train_ckpt.c (get_full),
 * lib/run/eval.c, lib/model/model.c (initial weights), lib/model/model_step.c (the gradient and weight slots).
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model.h"

int model_param_bucket(const Model *m, int i) {
    const ParamTensor *p = &m->ptab.t[i];
    if (p->layer >= 0) return p->layer + 1;
    return p->offset < m->ptab.bucket_start[1] ? 0 : m->ptab.n_buckets - 1;
}

void model_shard_piece(const Model *m, int b, int64_t *a, int64_t *n, int64_t *sh) {
    const int64_t s = m->ptab.bucket_start[b], len = m->ptab.bucket_start[b + 1] - s, P = m->ptab.pieces;
    *n = len / P;
    *a = s + m->shard_rank * *n;
    *sh = s / P;
}

/* Bucket b's whole-gradient storage (the current slot for a layer under shard gradients). */
static float *model_grad_bucket(Model *m, int b) {
    const int nb = m->ptab.n_buckets;
    if (m->shard < SHARD_GRADIENTS) return m->grads + m->ptab.bucket_start[b];
    return b == 0 ? m->grad_head[0] : b == nb - 1 ? m->grad_head[1] : m->grad_slot[(b - 1) % 2];
}

void model_zero_grads(Model *m) {
    const Backend *be = m->be;
    const int64_t *bs = m->ptab.bucket_start;
    const int nb = m->ptab.n_buckets;
    if (m->shard < SHARD_GRADIENTS) {
        be->memset_zero(m->grads, (size_t)m->ptab.buffer_numel * sizeof(float));
        return;
    }
    be->memset_zero(m->grad_head[0], (size_t)(bs[1] - bs[0]) * sizeof(float));
    be->memset_zero(m->grad_head[1], (size_t)(bs[nb] - bs[nb - 1]) * sizeof(float));
    be->memset_zero(m->grad_shard, (size_t)m->shard_numel * sizeof(float));
}

float *model_grad_at(Model *m, int64_t off) {
    const int64_t *bs = m->ptab.bucket_start;
    const int nb = m->ptab.n_buckets;
    const int b = off < bs[1] ? 0 : nb - 1;
    RS_CHECK(off < bs[1] || off >= bs[nb - 1], "model_grad_at(%lld): a layer's element; its layer's backward "
             "reaches it through grad_cur", (long long)off);
    return model_grad_bucket(m, b) + (off - bs[b]);
}

/* Shard gradients: waits for slot k's reduce-scatter (its layer's), adds its summed piece into grad_shard
 * and zeroes the slot for the next layer. */
static void model_grad_drain(Model *m, int k) {
    const int l = m->slot_layer[k];
    if (l < 0) return;
    int64_t a, n, sh;
    model_shard_piece(m, l + 1, &a, &n, &sh);
    comm_wait(m->comm, &m->slot_h[k]);
    m->be->add_f32(m->grad_shard + sh, m->grad_slot[k] + (a - m->ptab.bucket_start[l + 1]), n);
    m->be->memset_zero(m->grad_slot[k], (size_t)m->grad_slot_numel * sizeof(float));
    m->slot_layer[k] = -1;
}

void model_grad_layer_begin(Model *m, int l) {
    if (m->shard >= SHARD_GRADIENTS) model_grad_drain(m, l % 2);
    m->grad_cur = model_grad_bucket(m, l + 1);
    m->grad_cur_start = m->ptab.bucket_start[l + 1];
}

void model_grad_layer_end(Model *m, int l) {
    if (m->shard < SHARD_GRADIENTS) return;
    const int k = l % 2;
    const int64_t len = m->ptab.bucket_start[l + 2] - m->ptab.bucket_start[l + 1];
    comm_ireduce_scatter_sum_f32(m->comm, COMM_WORLD, m->grad_slot[k], len / m->ptab.pieces, &m->slot_h[k]);
    comm_progress(m->comm, &m->slot_h[k]);
    m->slot_layer[k] = l;
}

void model_grad_finish(Model *m, int reduce) {
    if (m->shard < SHARD_GRADIENTS) return;
    model_grad_drain(m, 0);
    model_grad_drain(m, 1);
    if (!reduce) return; /* the head's buckets add up over the step's micro-batches */
    CommHandle h = {0};
    const int nb = m->ptab.n_buckets;
    const int bk[2] = {0, nb - 1};
    for (int k = 0; k < 2; k++) {
        const int64_t len = m->ptab.bucket_start[bk[k] + 1] - m->ptab.bucket_start[bk[k]];
        comm_ireduce_scatter_sum_f32(m->comm, COMM_WORLD, m->grad_head[k], len / m->ptab.pieces, &h);
    }
    comm_wait(m->comm, &h);
    for (int k = 0; k < 2; k++) {
        int64_t a, n, sh;
        model_shard_piece(m, bk[k], &a, &n, &sh);
        m->be->add_f32(m->grad_shard + sh, m->grad_head[k] + (a - m->ptab.bucket_start[bk[k]]), n);
    }
}

float *model_grad_piece(Model *m, int b) {
    int64_t a, n, sh;
    model_shard_piece(m, b, &a, &n, &sh);
    return m->shard >= SHARD_GRADIENTS ? m->grad_shard + sh : m->grads + a;
}

/* Shard weights: the gathered layers are stale (the compute copy changed); any gather in flight is waited. */
static void model_weights_forget(Model *m) {
    for (int k = 0; k < 2 && m->shard == SHARD_WEIGHTS; k++) {
        if (m->w_slot_layer[k] >= 0) comm_wait(m->comm, &m->w_slot_h[k]);
        m->w_slot_layer[k] = -1;
    }
}

void model_weights_fetch(Model *m, int l) {
    if (m->shard != SHARD_WEIGHTS || l < 0 || l >= m->cfg->model.num_hidden_layers) return;
    const int k = l % 2;
    if (m->w_slot_layer[k] == l) return;
    comm_wait(m->comm, &m->w_slot_h[k]); /* (an earlier gather into the slot, if any, is complete) */
    const int es = m->be->act_size;
    int64_t a, n, sh;
    model_shard_piece(m, l + 1, &a, &n, &sh);
    /* the rank's piece at its place in the slot, then the in-place all-gather over the world */
    m->be->copy((char *)m->w_slot[k] + (a - m->ptab.bucket_start[l + 1]) * es, (char *)m->w_shard + sh * es,
                (size_t)(n * es));
    comm_set_context(m->comm, l, "weight all-gather");
    comm_iallgather_inplace(m->comm, COMM_WORLD, m->w_slot[k], n * es, &m->w_slot_h[k]);
    comm_progress(m->comm, &m->w_slot_h[k]);
    m->w_slot_layer[k] = l;
}

void model_weights_ready(Model *m, int l) {
    if (m->shard != SHARD_WEIGHTS) return;
    const int k = l % 2;
    model_weights_fetch(m, l);
    comm_set_context(m->comm, l, "weight all-gather");
    comm_wait(m->comm, &m->w_slot_h[k]);
    m->w_cur = m->w_slot[k];
    m->w_cur_start = m->ptab.bucket_start[l + 1];
}

const void *model_weight_at(const Model *m, int64_t off) {
    const int es = m->be->act_size;
    if (m->shard != SHARD_WEIGHTS) return (const char *)m->weights + off * es;
    const int64_t *bs = m->ptab.bucket_start;
    const int nb = m->ptab.n_buckets;
    RS_CHECK(off < bs[1] || off >= bs[nb - 1], "model_weight_at(%lld): a layer's element; its layer reads it "
             "through w_cur", (long long)off);
    return off < bs[1] ? (const char *)m->w_head[0] + (off - bs[0]) * es
                       : (const char *)m->w_head[1] + (off - bs[nb - 1]) * es;
}

/* Where the optimizer writes the compute copy of flat element x of bucket b (this rank's piece [a, a + n)
 * at shard element sh); NULL on cpu without sharding (the kernels read the master weights). */
static void *model_compute_at(Model *m, int b, int64_t x, int64_t a, int64_t sh) {
    const int es = m->be->act_size, nb = m->ptab.n_buckets;
    if (m->shard != SHARD_WEIGHTS) return m->weights == (void *)m->params ? NULL : (char *)m->weights + x * es;
    if (b > 0 && b < nb - 1) return (char *)m->w_shard + (sh + (x - a)) * es;
    return (char *)m->w_head[b == 0 ? 0 : 1] + (x - m->ptab.bucket_start[b]) * es;
}

void model_set_full(Model *m, int which, const float *host) {
    const Backend *be = m->be;
    const int64_t N = m->ptab.buffer_numel;
    if (which != 0) { /* an AdamW moment: this rank's pieces, or all of it */
        float *dst = which == 1 ? m->adam_m : m->adam_v;
        if (m->shard == SHARD_NONE) be->to_device(dst, host, (size_t)N * sizeof(float));
        for (int b = 0; m->shard != SHARD_NONE && b < m->ptab.n_buckets; b++) {
            int64_t a, n, sh;
            model_shard_piece(m, b, &a, &n, &sh);
            be->to_device(dst + sh, host + a, (size_t)n * sizeof(float));
        }
        return;
    }
    if (m->shard == SHARD_NONE) {
        be->to_device(m->params, host, (size_t)N * sizeof(float));
        if (m->weights != (void *)m->params) be->act_from_f32(m->weights, m->params, N);
        return;
    }
    for (int b = 0; b < m->ptab.n_buckets; b++) {
        int64_t a, n, sh;
        model_shard_piece(m, b, &a, &n, &sh);
        be->to_device(m->params + sh, host + a, (size_t)n * sizeof(float));
    }
    /* the compute copy and the fp32 gates, bucket by bucket through its gradient storage (zeroed after) */
    for (int b = 0; b < m->ptab.n_buckets; b++) {
        const int64_t s = m->ptab.bucket_start[b], len = m->ptab.bucket_start[b + 1] - s;
        float *buf = m->shard >= SHARD_GRADIENTS && b > 0 && b < m->ptab.n_buckets - 1 ? m->grad_slot[0]
                                                                                        : model_grad_bucket(m, b);
        const LayerParams *p = b > 0 && b < m->ptab.n_buckets - 1 ? &m->lp[b - 1] : NULL;
        be->to_device(buf, host + s, (size_t)len * sizeof(float));
        if (m->shard != SHARD_WEIGHTS) be->act_from_f32((char *)m->weights + s * be->act_size, buf, len);
        else if (!p) be->act_from_f32(m->w_head[b == 0 ? 0 : 1], buf, len);
        else { /* shard weights: a layer's compute copy is the rank's piece */
            int64_t a, n, sh;
            model_shard_piece(m, b, &a, &n, &sh);
            be->act_from_f32((char *)m->w_shard + sh * be->act_size, buf + (a - s), n);
        }
        if (m->gates && p && p->kind == LAYER_KIND_LINEAR) {
            const size_t nv = (size_t)m->cfg->model.linear_num_value_heads * sizeof(float);
            be->copy(m->gates + p->A_log32, buf + (p->A_log - s), nv);
            be->copy(m->gates + p->dt_bias32, buf + (p->dt_bias - s), (size_t)p->dt_bias_n * sizeof(float));
        }
        be->memset_zero(buf, (size_t)len * sizeof(float));
    }
    model_weights_forget(m);
}

void model_get_full(Model *m, int which, float *host) {
    const Backend *be = m->be;
    float *src = which == 0 ? m->params : which == 1 ? m->adam_m : m->adam_v;
    if (m->shard == SHARD_NONE) {
        be->to_host(host, src, (size_t)m->ptab.buffer_numel * sizeof(float));
        return;
    }
    float *mine = RS_MALLOC((size_t)m->shard_numel * sizeof(float));
    be->to_host(mine, src, (size_t)m->shard_numel * sizeof(float));
    for (int b = 0; b < m->ptab.n_buckets; b++) {
        int64_t a, n, sh;
        model_shard_piece(m, b, &a, &n, &sh);
        comm_allgather(m->comm, m->comm->world, mine + sh, host + m->ptab.bucket_start[b],
                       n * (int64_t)sizeof(float));
    }
    free(mine);
}

double model_grad_sum_squares(Model *m) {
    const Backend *be = m->be;
    if (m->shard == SHARD_NONE) return be->sum_squares(m->grads, m->ptab.buffer_numel);
    double s = 0;
    for (int b = 0; b < m->ptab.n_buckets; b++) {
        int64_t a, n, sh;
        model_shard_piece(m, b, &a, &n, &sh);
        s += be->sum_squares(model_grad_piece(m, b), n);
    }
    comm_set_context(m->comm, -1, "gradient norm all-reduce");
    return comm_allreduce_sum_scalar(m->comm, m->comm->world, s);
}

void model_optimizer_step(Model *m, double lr, float clip_scale, int step) {
    const Config *cfg = m->cfg;
    const Backend *be = m->be;
    const int es = be->act_size;
    const float b1 = (float)cfg->train.beta1, b2 = (float)cfg->train.beta2, eps = (float)cfg->train.eps;
    for (int i = 0; i < m->ptab.n; i++) {
        const ParamTensor *p = &m->ptab.t[i];
        float wd = model_param_decays(cfg, (ParamGroup)p->group) ? (float)cfg->train.weight_decay : 0.0f;
        /* the tensor's part in this rank's piece of its bucket (the whole tensor without sharding) */
        const int b = model_param_bucket(m, i);
        int64_t a, n, sh;
        model_shard_piece(m, b, &a, &n, &sh);
        const int64_t x0 = p->offset > a ? p->offset : a;
        const int64_t x1 = p->offset + p->numel < a + n ? p->offset + p->numel : a + n;
        if (x1 <= x0) continue;
        void *compute = model_compute_at(m, b, x0, a, sh);
        be->adamw_update(m->params + sh + (x0 - a), m->adam_m + sh + (x0 - a), m->adam_v + sh + (x0 - a), compute,
                         model_grad_piece(m, b) + (x0 - a), x1 - x0, (float)lr, b1, b2, eps, wd, clip_scale, step);
    }
    if (m->shard == SHARD_NONE) return;

    /* every rank's updated pieces to every rank: the compute copy per bucket, and the fp32 gates */
    Comm *c = m->comm;
    CommHandle h = {0};
    comm_set_context(c, -1, "weight all-gather");
    if (m->gates) {
        be->memset_zero(m->gates, (size_t)m->gates_numel * sizeof(float));
        for (int l = 0; l < cfg->model.num_hidden_layers; l++) {
            const LayerParams *p = &m->lp[l];
            if (p->kind != LAYER_KIND_LINEAR) continue;
            int64_t a, n, sh;
            model_shard_piece(m, l + 1, &a, &n, &sh);
            const int64_t len[2] = {cfg->model.linear_num_value_heads, p->dt_bias_n};
            const int64_t at[2] = {p->A_log, p->dt_bias}, to[2] = {p->A_log32, p->dt_bias32};
            for (int k = 0; k < 2; k++) {
                int64_t x0 = at[k] > a ? at[k] : a, x1 = at[k] + len[k] < a + n ? at[k] + len[k] : a + n;
                if (x1 > x0)
                    be->copy(m->gates + to[k] + (x0 - at[k]), m->params + sh + (x0 - a),
                             (size_t)(x1 - x0) * sizeof(float));
            }
        }
        comm_iallreduce_sum_f32(c, COMM_WORLD, m->gates, m->gates_numel, &h);
    }
    for (int b = 0; b < m->ptab.n_buckets; b++) {
        const int64_t s = m->ptab.bucket_start[b], n = (m->ptab.bucket_start[b + 1] - s) / m->ptab.pieces;
        if (m->shard == SHARD_WEIGHTS) { /* the layers stay pieces: gathered before their next use */
            if (b > 0 && b < m->ptab.n_buckets - 1) continue;
            comm_iallgather_inplace(c, COMM_WORLD, m->w_head[b == 0 ? 0 : 1], n * es, &h);
        } else
            comm_iallgather_inplace(c, COMM_WORLD, (char *)m->weights + s * es, n * es, &h);
        comm_progress(c, &h);
    }
    comm_wait(c, &h);
    model_weights_forget(m);
}
