/*
 * train.h — the training loop: `ringscan train` and `ringscan resume`.
 *
 * A run is a directory (run.out_dir): config.resolved.yaml, log.txt,
 * metrics.jsonl and ckpt/. `train` starts a new run (and refuses a directory
 * that already holds one); `resume` continues one from its newest valid
 * checkpoint with the same model and data (a changed model or data key is
 * refused with the diff), reproducing the uninterrupted run's losses exactly
 * on the cpu backend.
 *
 * Exit codes (error.h): 0 done (or stopped by run.stop_after_step), 1 runtime
 * failure, 2 bad config/data/checkpoint, 75 stopped by SIGUSR1/SIGTERM after
 * writing a checkpoint (the Slurm job script requeues on it).
 *
 * Callers: cmd/ringscan.c.
 */
#ifndef RS_TRAIN_H
#define RS_TRAIN_H

#include "comm.h"
#include "config.h"

/* `cfg` is loaded and validated; MPI is up (comm_init). For a resume,
 * `resume_dir` is the run directory and cfg came from its resolved config
 * plus the command line's overrides; with `dry_run` the checkpoint is loaded
 * and checked, what would happen is printed, and nothing is written or run.
 * Returns the exit code. */
int train_run(Config *cfg, Comm *comm, const char *resume_dir, int dry_run);

/* Starts catching SIGUSR1/SIGTERM (a stop request the loop answers with a
 * checkpoint and exit 75). Called before MPI starts, so a warning signal
 * that a Slurm job forwards while the ranks are still starting is kept, not
 * fatal; train_run calls it too. */
void train_catch_stop_signals(void);

#endif
