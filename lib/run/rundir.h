/*
 * rundir.h — the run directory's checks that need no run: whether run.out_dir
 * can name a run directory at all. The claiming, locking and opening of the
 * directory by a run (rundir.c) work on the trainer's state and are declared
 * in train_state.h.
 *
 * Callers: cmd/ringscan.c (config validation of `train` and `resume`),
 * scheduler/submit.c (the directory's contents before submit writes there).
 */
#ifndef RS_RUNDIR_H
#define RS_RUNDIR_H

#include <stddef.h>

/* Whether run.out_dir can name a run directory: not empty, not the file
 * system root, not an existing file or a dangling symlink, not inside a run's
 * ckpt/ (ckpt_check_output). 0, or an exit code with the reason in msg. The
 * command line adds it to the config's validation. */
int run_dir_check_out_dir(const char *dir, char *msg, size_t cap);

/* Whether `train` or `submit` may write into the run directory `dir`: 0 when it
 * is missing, empty, holds only what `submit` wrote, or holds a ringscan
 * attempt that stopped before its first checkpoint (*restart = 1: train starts
 * it over); RS_EXIT_USAGE with the reason and a hint in msg when it holds
 * anything ringscan did not write, a checkpoint (`resume` continues those), or
 * ringscan's file names without the run's marker (.lock). Reads only. */
int run_dir_check_contents(const char *dir, int *restart, char *msg, size_t cap);

#endif
