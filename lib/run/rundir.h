/*
 * rundir.h — the run directory's checks that need no run: whether run.out_dir
 * can name a run directory at all. The claiming, locking and opening of the
 * directory by a run (rundir.c) work on the trainer's state and are declared
 * in train_state.h.
 *
 * Callers: cmd/ringscan.c (config validation of `train` and `resume`).
 */
#ifndef RS_RUNDIR_H
#define RS_RUNDIR_H

#include <stddef.h>

/* Whether run.out_dir can name a run directory: not empty, not the file
 * system root. 0, or RS_EXIT_USAGE with one line in msg. The command line
 * adds it to the config's validation. */
int run_dir_check_out_dir(const char *dir, char *msg, size_t cap);

#endif
