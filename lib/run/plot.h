/*
 * plot.h — `ringscan plot RUN_DIR [--out FILE]`: a PNG of a run's loss,
 * learning rate, gradient norm and tokens/s against step, and of its
 * held-out loss by context length when `ringscan eval` wrote RUN_DIR/eval.json
 * (drawn by gnuplot; lib/run/plot.c says how). Callers: cmd/plot.c.
 */
#ifndef RS_PLOT_H
#define RS_PLOT_H

/* Draws RUN_DIR's PNG into out (NULL: RUN_DIR/plot.png); returns the exit code
 * (fatal errors exit through error.h). */
int plot_run(const char *run_dir, const char *out);

#endif
