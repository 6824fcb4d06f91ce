/*
 * train_ckpt.h — what a ringscan checkpoint holds, and saving, checking and
 * restoring it for the trainer (over ckpt.h's atomic, verified checkpoints).
 *
 * Files of a checkpoint:
 *   model.safetensors   fp32 master weights, internal names (model_params.h)
 *   optim.safetensors   AdamW moments: "m.<name>" and "v.<name>", fp32
 *   manifest.json       ckpt.h's manifest; its state object holds
 *     step, samples_consumed, tokens_consumed (the data position: global,
 *     independent of dp/cp), seed, world {dp, cp}, identity_hash,
 *     config_yaml (the resolved config of the run when it was saved) and
 *     data {path, bytes, mtime_ns, n_tokens, n_docs, fingerprint, idx}: the
 *     data file's fingerprint when the run opened it (data.h,
 *     DataFingerprint).
 * The AdamW step counter is `step`; the weights' RNG is not needed after
 * initialisation, so no RNG state is stored beyond the seed.
 *
 * A resume refuses (exit 2, nothing written) a checkpoint whose model or data
 * differ from the config it runs with (identity keys: model.*, data.format,
 * data.path, data.seq_len, data.shuffle, run.seed), printing the differing
 * keys; and options it cannot honour: run.out_dir set to another directory
 * than the run's (the run directory is the command's argument), a
 * run.stop_after_step at or before the checkpoint's step, and a global batch
 * (parallel.dp x data.micro_batch x train.grad_accum samples per step) other
 * than the checkpoint's unless --allow-batch-change. dp x cp may change when
 * the global batch stays (resume on another number of ranks); and
 * one whose data file has another fingerprint (a replaced or regenerated
 * file at the same path), unless `--set data.accept_changed=true` is given
 * on the resume's command line. Only an mtime that changed is a note.
 */
#ifndef RS_TRAIN_CKPT_H
#define RS_TRAIN_CKPT_H

#include "io/ckpt.h"
#include "train_state.h"

typedef struct {
    Ckpt    ck;
    char    dir[PATH_MAX];
    int64_t step, samples;
    int64_t batch_before; /* the checkpoint's samples per step (dp x micro_batch x grad_accum) */
} TrainResume;

/* Loads the newest valid checkpoint of t->run_dir and checks it against
 * t->cfg; exits 2 with a message when there is none or it does not match.
 * Sets t->cfg->run.out_dir to t->run_dir (what config.resolved.yaml records). */
void train_ckpt_load(Trainer *t, TrainResume *r);
/* Copies weights and AdamW state into t->model, sets t->step and
 * t->samples, and closes the checkpoint. */
void train_ckpt_restore(Trainer *t, TrainResume *r);
/* Saves step t->step (rank 0 writes; every rank waits for it). A failed save
 * stops the run: an error naming the cause, exit 1 (or 2 when another process
 * holds ckpt/.lock). */
void train_ckpt_save(Trainer *t);

#endif
