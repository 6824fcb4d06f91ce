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
 * The step: AdamW is elementwise, so each rank runs it over (tensor ∩ its piece) with the tensor's weight
 * decay, reading the summed gradient at the same flat place (optimizer: the all-reduced full gradient;
 * gradients: the piece the reduce-scatter left there) and writing the compute copy of its piece (bf16 on
 * cuda; the full fp32 copy on cpu, where `weights` is then a buffer of its own); then every bucket's compute
 * copy is all-gathered in place over the world. The GDN gates (A_log, dt_bias), which the kernels read in
 * fp32, are gathered apart on cuda: each rank writes its owned values into a zeroed compact buffer and one
 * all-reduce sums it (exact: one term per element is not zero).
 *
 * Without sharding everything here is the plain per-tensor step over full buffers.
 *
 * Callers: lib/run/train.c (the step, the norm, init_from, resume), lib/run/train_ckpt.c (get_full),
 * lib/run/eval.c, lib/model/model.c (initial weights).
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
    /* the compute copy through the full fp32 gradient buffer (zeroed at every step's start) */
    be->to_device(m->grads, host, (size_t)N * sizeof(float));
    be->act_from_f32(m->weights, m->grads, N);
    if (m->gates) {
        for (int l = 0; l < m->cfg->model.num_hidden_layers; l++) {
            const LayerParams *p = &m->lp[l];
            if (p->kind != LAYER_KIND_LINEAR) continue;
            const size_t nv = (size_t)m->cfg->model.linear_num_value_heads * sizeof(float);
            be->copy(m->gates + p->A_log32, m->grads + p->A_log, nv);
            be->copy(m->gates + p->dt_bias32, m->grads + p->dt_bias, nv);
        }
    }
    be->memset_zero(m->grads, (size_t)N * sizeof(float));
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
        s += be->sum_squares(m->grads + a, n);
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
        int64_t x0 = p->offset, x1 = p->offset + p->numel, sh = x0; /* flat range; its master element */
        if (m->shard != SHARD_NONE) { /* the tensor's part in this rank's piece */
            int64_t a, n;
            model_shard_piece(m, model_param_bucket(m, i), &a, &n, &sh);
            x0 = x0 > a ? x0 : a;
            x1 = x1 < a + n ? x1 : a + n;
            if (x1 <= x0) continue;
            sh += x0 - a;
        }
        void *compute = m->weights == (void *)m->params ? NULL : (char *)m->weights + x0 * es;
        be->adamw_update(m->params + sh, m->adam_m + sh, m->adam_v + sh, compute, m->grads + x0, x1 - x0, (float)lr,
                         b1, b2, eps, wd, clip_scale, step);
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
            const int64_t nv = cfg->model.linear_num_value_heads;
            const int64_t at[2] = {p->A_log, p->dt_bias}, to[2] = {p->A_log32, p->dt_bias32};
            for (int k = 0; k < 2; k++) {
                int64_t x0 = at[k] > a ? at[k] : a, x1 = at[k] + nv < a + n ? at[k] + nv : a + n;
                if (x1 > x0)
                    be->copy(m->gates + to[k] + (x0 - at[k]), m->params + sh + (x0 - a),
                             (size_t)(x1 - x0) * sizeof(float));
            }
        }
        comm_iallreduce_sum_f32(c, COMM_WORLD, m->gates, m->gates_numel, &h);
    }
    for (int b = 0; b < m->ptab.n_buckets; b++) {
        const int64_t s = m->ptab.bucket_start[b], n = (m->ptab.bucket_start[b + 1] - s) / m->ptab.pieces;
        comm_iallgather_inplace(c, COMM_WORLD, (char *)m->weights + s * es, n * es, &h);
        comm_progress(c, &h);
    }
    comm_wait(c, &h);
}
