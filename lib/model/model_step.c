/*
 * model_step.c — one micro-batch through the model: embedding, the blocks,
 * the final norm and the fused lm_head + cross-entropy, then the backward in
 * reverse with the checkpoint policy's recompute before each block (none before the layers of
 * checkpoint.keep_layers, which keep what none keeps).
 *
 * The head runs in loss row chunks during the forward: the final norm, the
 * fused lm_head + loss (the logits of a row chunk are used for the loss and
 * their gradient at once) and the final norm's backward, so the backward
 * starts from d_resid and the head's buffers hold one row chunk.
 *
 * With checkpoint.offload: host each layer's kept buffers go to host memory
 * after its forward and come back one layer ahead in the backward
 * (model_offload.c: stash, fetch, ready; model_block.c claims a slot before
 * writing into it).
 *
 * Before anything, the CP group's token metadata of the micro-batch is
 * gathered (cp_batch_begin), so every rank plans the same ring and scan.
 *
 * Gradient all-reduce (the step's last micro-batch, world > 1; with
 * parallel.shard: gradients a reduce-scatter of each layer after its backward in
 * every micro-batch, into two rotating layer buffers, model_shard.c): the
 * parameters of layer l are one contiguous range of the flat buffer
 * (model_params.c adds them layer by layer), so each layer is a bucket,
 * posted non-blocking over the world as soon as its backward is done; the
 * embedding, final norm and lm_head (before and after the layers) go last.
 * All are waited before returning (on cuda the compute stream waits; the
 * buckets run on the world group's NCCL stream beside the backward). The
 * lm_head's gradient is complete after the forward, but it shares the last
 * bucket so buckets stay in one order.
 *
 * parallel.shard: weights: each layer's weights are all-gathered into one of two slots, layer l + 1's
 * posted before layer l's forward and layer l - 1's before layer l's backward (model_weights_fetch, _ready
 * in model_shard.c); the head's and embed_tokens' are whole.
 *
 * Nothing here reads the backend back: the per-token losses stay in the
 * micro-batch's slot until model_loss_sum, the step's one read.
 *
 * model_forward is the forward alone (the losses, no gradient, nothing sent to
 * the host): `ringscan eval`.
 *
 * Callers: lib/run/train.c, bench/bench_step.c, tests/parity/parity_step.c, lib/run/eval.c.
 */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "model.h"
#include "model_block.h"

/* Posts bucket b's gradient all-reduce over the world (parallel.shard: gradients reduce-scatters instead,
 * model_shard.c's model_grad_layer_end / model_grad_finish). */
static void model_reduce_bucket(Model *m, int b, CommHandle *h) {
    const int64_t s = m->ptab.bucket_start[b], len = m->ptab.bucket_start[b + 1] - s;
    comm_iallreduce_sum_f32(m->comm, COMM_WORLD, m->grads + s, len, h);
}

/* The forward of one micro-batch: the CP metadata, the embedding, the blocks, and the head in loss row
 * chunks. With `backward` the lm_head's gradient (scaled by grad_scale) and the final norm's backward into
 * d_resid are made as the loss is, ready for the layers' backward; without, only the losses (the
 * lm_head's outputs with grad_scale 0). */
static void model_forward_part(Model *m, const Batch *b, float grad_scale, int backward) {
    const Backend *be = m->be;
    const Config *cfg = m->cfg;
    int L = (int)cfg->model.num_hidden_layers;
    int64_t T = b->T;
    int H = (int)cfg->model.hidden_size, V = (int)cfg->model.vocab_size;
    int es = be->act_size;
    float eps = (float)cfg->model.rms_norm_eps;
    RS_CHECK(T == m->T, "micro-batch of %lld rows, model built for %lld", (long long)T, (long long)m->T);
    RS_CHECK(b->pos_host && b->doc_pos_host, "the batch's host metadata is not set");
    comm_set_context(m->comm, -1, "batch metadata all-gather");
    cp_batch_begin(&m->cp, b->micro, b->pos_host, b->doc_pos_host);

    model_offload_claim(m, 0);
    model_weights_fetch(m, 0); /* shard weights: layer l + 1's gather is posted before layer l's forward */
    be->embedding_forward(m->la[0].x, b->tokens, model_weight_at(m, m->embed), T, H);
    for (int l = 0; l < L; l++) {
        model_weights_fetch(m, l + 1);
        model_weights_ready(m, l);
        model_block_forward(m, l, b, l + 1 < L ? m->la[l + 1].x : m->final_in, BLOCK_FORWARD);
        if (backward) model_offload_stash(m, l); /* (the forward alone: nothing will read it back) */
    }
    /* the head, row chunk by row chunk: final norm, lm_head + CE (its gradient at once), and the final
     * norm's backward into d_resid, which the layers' backward then starts from */
    if (backward) be->memset_zero(m->d_resid, (size_t)(T * H * es));
    for (int64_t r0 = 0, R = m->acts.loss_chunk_rows; r0 < T; r0 += R) {
        const int64_t n = T - r0 < R ? T - r0 : R;
        const void *x = (const char *)m->final_in + r0 * H * es;
        be->rmsnorm_forward(m->final_norm, m->final_rstd, x, model_weight_at(m, m->final_norm_w), n, 1, H, H, H,
                            eps, 1);
        be->lm_head_loss(m->losses + b->micro * T + r0, m->d_final, model_grad_at(m, m->lm_head), m->final_norm,
                         model_weight_at(m, m->lm_head), b->targets + r0, backward ? grad_scale : 0.0f,
                         m->loss_workspace, R, n, H, V);
        if (backward)
            be->rmsnorm_backward((char *)m->d_resid + r0 * H * es, model_grad_at(m, m->final_norm_w), m->d_final, x,
                                 model_weight_at(m, m->final_norm_w), m->final_rstd, n, 1, H, H, H, 1);
    }
}

void model_forward(Model *m, const Batch *b) { model_forward_part(m, b, 0.0f, 0); }

void model_forward_backward(Model *m, const Batch *b, float grad_scale, int sync_grads) {
    const Backend *be = m->be;
    const Config *cfg = m->cfg;
    int L = (int)cfg->model.num_hidden_layers;
    int64_t T = b->T;
    int H = (int)cfg->model.hidden_size;
    int pol = cfg->checkpoint.activations;
    Comm *comm = m->comm;
    const int reduce = sync_grads && comm && comm->world_size > 1;
    CommHandle buckets = {0};
    model_forward_part(m, b, grad_scale, 1);

    /* backward */
    for (int l = L - 1; l >= 0; l--) {
        model_weights_fetch(m, l - 1); /* shard weights: gathered once for the recompute and the backward */
        model_weights_ready(m, l);
        model_offload_ready(m, l);
        const int kept = model_acts_layer_keeps(&m->acts, l); /* none, or one of checkpoint.keep_layers */
        if (pol == ACT_POLICY_FULL && !kept) model_block_forward(m, l, b, NULL, BLOCK_RECOMPUTE);
        else if (pol == ACT_POLICY_REMAT && !kept) model_block_forward(m, l, b, NULL, BLOCK_REMAT);
        model_grad_layer_begin(m, l);
        model_block_backward(m, l, b);
        model_offload_fetch(m, l - 2);
        if (m->shard >= SHARD_GRADIENTS) {
            comm_set_context(comm, l, "gradient reduce-scatter");
            model_grad_layer_end(m, l);
        } else if (reduce) {
            comm_set_context(comm, l, "gradient all-reduce");
            model_reduce_bucket(m, l + 1, &buckets);
            comm_progress(comm, &buckets);
        }
    }
    be->embedding_backward(model_grad_at(m, m->embed), m->d_resid, b->tokens, T, H);
    if (m->shard >= SHARD_GRADIENTS) {
        comm_set_context(comm, -1, "gradient reduce-scatter");
        model_grad_finish(m, reduce);
    } else if (reduce) { /* the head: embed_tokens before the layers, model.norm and lm_head after them */
        comm_set_context(comm, -1, "gradient all-reduce");
        model_reduce_bucket(m, 0, &buckets);
        model_reduce_bucket(m, L + 1, &buckets);
        comm_wait(comm, &buckets);
    }
}

double model_loss_sum(Model *m, int micro_batches) {
    RS_CHECK(micro_batches >= 1 && micro_batches <= m->cfg->train.grad_accum, "%d micro-batches of a step of %lld",
             micro_batches, (long long)m->cfg->train.grad_accum);
    int64_t n = micro_batches * m->T;
    float *losses = RS_MALLOC((size_t)n * sizeof(float));
    m->be->to_host(losses, m->losses, (size_t)n * sizeof(float));
    double sum = 0;
    for (int64_t t = 0; t < n; t++) sum += losses[t];
    free(losses);
    return sum;
}
