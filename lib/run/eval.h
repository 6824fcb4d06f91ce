/*
 * eval.h — `ringscan eval`: the held-out loss of a checkpoint, and its loss by
 * the context a token has (does the model use its long context?).
 *
 *   [mpirun -np DPxCP] ringscan eval RUN_DIR|CKPT_DIR --data PATH [--out FILE] [--tokens N]
 *                                   [--set key=value]...
 *
 * The model and its weights are the checkpoint's (a run directory's newest
 * verified one, or RUN/ckpt/step_N); the config is the one saved with it,
 * then data.path = PATH, data.shuffle = false, then the --set overrides
 * (parallel.cp / parallel.dp for the layout, device.kind, data.seq_len to
 * evaluate at another context length, data.micro_batch, data.format, ...).
 * It reads the first N tokens' samples of PATH in file order (default: one
 * epoch; rounded down to whole steps of dp x micro_batch samples), runs the
 * training forward on them (cpu or cuda, any dp x cp, the same CP algorithms)
 * and sums the per-token losses in double over the world.
 *
 * A token's context is the number of tokens of its document the model sees
 * before it: min(pos, doc_pos) (backend.h). Buckets are log-spaced: [0, 1),
 * [1, 2), [2, 4), ..., [2^k, 2^(k+1)).
 *
 * Output (rank 0): a table on stdout, and FILE (default RUN_DIR/eval.json),
 * written durably:
 *   {"format": "ringscan-eval", "version": 1, "checkpoint": DIR, "step": N,
 *    "data": PATH, "seq_len": T, "samples": S, "tokens": S*T, "predicted_tokens": n,
 *    "loss": mean, "perplexity": exp(mean), "backend": "cpu", "world": {"dp", "cp"},
 *    "buckets": [{"from": lo, "to": hi (exclusive), "tokens": n, "loss": mean}, ...]}
 * (buckets with no token are left out). `ringscan plot` draws the buckets.
 *
 * The backward runs too (the model has one training step, lib/model/model.h) with
 * a gradient scale of 0; eval costs a training step per micro-batch.
 *
 * Exit codes: 0, 2 (bad arguments, checkpoint or data), 1 (I/O failure).
 * Callers: cmd/eval.c (which parses the command line into EvalOptions).
 */
#ifndef RS_EVAL_H
#define RS_EVAL_H

#include <stdint.h>

#define EVAL_TOKENS_MAX (INT64_C(1) << 60) /* --tokens at most: far above any file, far below overflow */

typedef struct {
    const char *src;      /* RUN_DIR or RUN_DIR/ckpt/step_N */
    const char *data;     /* --data PATH */
    const char *out;      /* --out FILE; NULL: RUN_DIR/eval.json */
    int64_t     tokens;   /* --tokens N (1..EVAL_TOKENS_MAX); 0: one epoch */
    const char *sets[64]; /* --set key=value, in order */
    int         n_sets;
} EvalOptions;

/* Starts MPI (comm_init), evaluates and writes the JSON; returns the exit code. */
int eval_run(const EvalOptions *o);

#endif
