/*
 * model_block.h — forward and backward of one decoder block (model_block.c).
 * Used by model_step.c, which runs the layers and the checkpoint policy.
 */
#ifndef RS_MODEL_BLOCK_H
#define RS_MODEL_BLOCK_H

#include "model.h"

enum {
    BLOCK_FORWARD,   /* the forward pass: writes every buffer and the output */
    BLOCK_RECOMPUTE, /* checkpoint.activations=full: the whole-rows buffers again, no output */
    BLOCK_REMAT,     /* checkpoint.activations=remat: attention core (and CP communication) not rerun */
};

/* Reads m->la[l].x; writes the layer's whole-rows buffers and, in BLOCK_FORWARD,
 * the block output (T,H) into `out`. */
void model_block_forward(Model *m, int l, const Batch *b, void *out, int mode);
/* On entry m->d_resid holds dL/d(block output); on return dL/d(block input).
 * Parameter gradients are added into m->grads. */
void model_block_backward(Model *m, int l, const Batch *b);

#endif
