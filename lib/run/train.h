/*
 * train.h — the training loop: `ringscan train` and `ringscan resume`.
 *
 * A run is a directory (run.out_dir): .lock, config.resolved.yaml, log.txt,
 * metrics.jsonl and ckpt/ (README, "Run directories"). One process at a time
 * trains in it: rank 0 holds RUN/.lock (flock) from start to exit, and a
 * second `train` or `resume` is refused naming the holder. `train` starts a
 * new run (and refuses a directory holding a checkpoint or files it did not
 * write); `resume` continues one from its newest valid checkpoint with the
 * same model and data (a changed model or data key is refused with the diff)
 * and the same global batch (dp x micro_batch x grad_accum; dp x cp may
 * change), reproducing the uninterrupted run's losses exactly on the cpu
 * backend when the layout is the same.
 *
 * Exit codes (error.h): 0 done (or stopped by run.stop_after_step), 1 runtime
 * failure, 2 bad config/data/checkpoint, 75 stopped by SIGUSR1/SIGTERM after
 * writing a checkpoint (the Slurm job script requeues on it), 130 and 129
 * stopped by SIGINT/SIGHUP after writing a checkpoint (not requeued).
 *
 * Callers: cmd/ringscan.c.
 */
#ifndef RS_TRAIN_H
#define RS_TRAIN_H

#include <stddef.h>

#include "comm/comm.h"
#include "config/config.h"

enum {
    TRAIN_DRY_RUN            = 1, /* resume: load and check, say what would happen, write nothing */
    TRAIN_ALLOW_BATCH_CHANGE = 2, /* resume: accept a changed dp x micro_batch x grad_accum */
};

/* `cfg` is loaded and validated; MPI is up (comm_init). For a resume,
 * `resume_dir` is the run directory and cfg came from its resolved config
 * plus the command line's overrides. `flags`: TRAIN_* above. Returns the exit
 * code. */
int train_run(Config *cfg, Comm *comm, const char *resume_dir, unsigned flags);

/* Starts catching the stop signals: SIGUSR1 and SIGTERM (preemption: the
 * loop finishes its step, checkpoints and exits 75) and SIGINT and SIGHUP
 * (the same, exit 128 + signal: 130 and 129, which the job script does not
 * requeue); a second SIGINT exits 130 at once, without a checkpoint. main()
 * calls it first thing for `train` and `resume`, before the config is read
 * and MPI starts, so a signal that arrives while the ranks start is kept,
 * not fatal (a signal before the first step ends the run before it
 * trains); train_run calls it again. Under mpirun the first call also forks
 * the rank's relay into mpirun's process group, so that the terminal's
 * Ctrl-C reaches the rank as SIGINT (train.c says why). */
void train_catch_stop_signals(void);
/* The exit code of a run stopped by `sig`. */
int train_stop_exit_code(int sig);

#endif
