/*
 * model_step.c — one micro-batch through the model: embedding, the blocks,
 * the final norm and the fused lm_head + cross-entropy, then the backward in
 * reverse with the checkpoint policy's recompute before each block.
 *
 * The fused loss produces dL/d(final norm output) during the forward (the
 * logits of a row chunk are used for the loss and their gradient at once), so
 * the backward starts from d_final.
 *
 * Callers: lib/train.c, tests/parity/parity_step.c.
 */
#include <math.h>
#include <stdlib.h>

#include "error.h"
#include "model.h"
#include "model_block.h"

double model_forward_backward(Model *m, const Batch *b, float grad_scale) {
    const Backend *be = m->be;
    const Config *cfg = m->cfg;
    int L = (int)cfg->model.num_hidden_layers;
    int64_t T = b->T;
    int H = (int)cfg->model.hidden_size, V = (int)cfg->model.vocab_size;
    int es = be->act_size;
    int pol = cfg->checkpoint.activations;
    float eps = (float)cfg->model.rms_norm_eps;
    const char *w = m->weights;
    RS_CHECK(T == m->T, "micro-batch of %lld rows, model built for %lld", (long long)T, (long long)m->T);

    /* forward */
    be->embedding_forward(m->la[0].x, b->tokens, w + m->embed * es, T, H);
    for (int l = 0; l < L; l++)
        model_block_forward(m, l, b, l + 1 < L ? m->la[l + 1].x : m->final_in, BLOCK_FORWARD);
    be->rmsnorm_forward(m->final_norm, m->final_rstd, m->final_in, w + m->final_norm_w * es, T, 1, H, H, H, eps, 1);
    be->lm_head_loss(m->losses, m->d_final, m->grads + m->lm_head, m->final_norm, w + m->lm_head * es, b->targets,
                     grad_scale, m->loss_workspace, m->acts.loss_chunk_rows, T, H, V);

    float *losses = RS_MALLOC((size_t)T * sizeof(float));
    be->to_host(losses, m->losses, (size_t)T * sizeof(float));
    double loss_sum = 0;
    for (int64_t t = 0; t < T; t++) loss_sum += losses[t];
    free(losses);

    /* backward */
    be->memset_zero(m->d_resid, (size_t)(T * H * es));
    be->rmsnorm_backward(m->d_resid, m->grads + m->final_norm_w, m->d_final, m->final_in, w + m->final_norm_w * es,
                         m->final_rstd, T, 1, H, H, H, 1);
    for (int l = L - 1; l >= 0; l--) {
        if (pol == ACT_POLICY_FULL) model_block_forward(m, l, b, NULL, BLOCK_RECOMPUTE);
        else if (pol == ACT_POLICY_REMAT) model_block_forward(m, l, b, NULL, BLOCK_REMAT);
        model_block_backward(m, l, b);
    }
    be->embedding_backward(m->grads + m->embed, m->d_resid, b->tokens, T, H);
    return loss_sum;
}
