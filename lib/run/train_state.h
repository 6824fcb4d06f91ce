/*
 * train_state.h — the state of a training run, shared by the loop (train.c),
 * the checkpoint glue (train_ckpt.c) and the run directory (rundir.c). Not for
 * other callers: they use train.h.
 */
#ifndef RS_TRAIN_STATE_H
#define RS_TRAIN_STATE_H

#include <limits.h>
#include <stdio.h>
#include <stdnoreturn.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "config/config.h"
#include "data/data.h"
#include "model/model.h"
#include "plan/plan.h"

typedef struct {
    Config        *cfg;
    Comm          *comm;
    const Backend *be;
    Model          model;
    DataSet       *data;
    Plan           plan;
    char           run_dir[PATH_MAX];
    int            lock_fd;              /* rank 0: RUN/.lock, flock'd for the process's life; else -1 */
    int            restart;              /* train: the directory holds an attempt with no checkpoint */
    int            allow_batch_change;   /* resume: --allow-batch-change */
    FILE          *log, *metrics;        /* rank 0 only; appended through fsio_append_record (whole records) */
    int            write_failed;         /* rank 0: a write to log.txt or metrics.jsonl failed (train_check_writes) */
    char           write_err[2048];      /* rank 0: what failed, for the message */
    int64_t        step;                 /* completed optimizer steps */
    int64_t        start_step;           /* step at start (0, or the resumed checkpoint's) */
    int64_t        last_ckpt;            /* step of the newest checkpoint written or resumed; -1: none */
    int64_t        samples;              /* global samples consumed: the data position */
    int64_t        samples_per_step;     /* dp x micro_batch x grad_accum */
    int64_t        tokens_per_step;
    int64_t        T_local;              /* tokens of one sample on this rank: seq_len / cp */
    int            step_width;           /* digits of train.steps, for the log */
    int32_t       *tokens, *targets, *pos, *doc_pos; /* (grad_accum x micro_batch x T_local) this step: host_alloc */
    int32_t       *batch_dev; /* cuda: (grad_accum, 4, micro_batch x T_local) the step's rows on the device; else NULL */
} Trainer;

double train_lr(const Config *cfg, int64_t step);
/* Rank 0 prints to stdout and appends to log.txt. */
void train_say(Trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Rank 0 appends `text` to the run directory's file `f` (log.txt, metrics.jsonl) as one whole record; a failed
 * write (disk full, I/O error) is cut off and noted for train_check_writes, and later log lines are not tried. */
void train_append(Trainer *t, FILE *f, const char *name, const char *text);
/* Every rank at the same point: when rank 0 noted a failed write, the run stops with exit `code` (1, or the
 * signal's code when a stop signal's checkpoint is already written) and the error on stderr and in log.txt
 * (when log.txt itself failed, on stderr only). */
void train_check_writes(Trainer *t, int code);
/* Every rank calls it at the same point (a deterministic failure, such as a
 * bad checkpoint): rank 0 prints the message as an error (error.h: stderr and,
 * once open, log.txt), every rank leaves MPI and exits with `code`. */
#define train_fail(t, code, ...) train_fail_at((t), (code), __FILE__, __LINE__, __VA_ARGS__)
noreturn void train_fail_at(Trainer *t, int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* rundir.c: the run directory. run_dir_claim takes RUN/.lock (rank 0; every
 * rank learns the verdict and fails together on a refusal), checking on
 * `train` that the directory may be written; with dry_run it only tests.
 * run_dir_open writes config.resolved.yaml and opens log.txt.
 * run_dir_trim_metrics keeps the metrics.jsonl lines of steps <= `step`. */
void run_dir_claim(Trainer *t, int resuming, int dry_run);
void run_dir_open(Trainer *t);
void run_dir_trim_metrics(Trainer *t, int64_t step);

#endif
