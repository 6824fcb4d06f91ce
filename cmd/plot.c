/*
 * plot.c — the command line of `ringscan plot RUN_DIR [--out FILE]`
 * (lib/run/plot.h draws): the arguments checked (a bad one prints the usage,
 * exit 2), then plot_run.
 *
 * Callers: cmd/ringscan.c (the `plot` entry of its command table).
 */
#include "cmd.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "io/ckpt.h"
#include "io/fsio.h"
#include "run/plot.h"

#define PLOT_USAGE "ringscan plot RUN_DIR [--out FILE]"

int cmd_plot(int argc, char **argv) {
    const char *run_dir = NULL, *out_arg = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s\n\nA PNG of loss, learning rate, gradient norm and tokens/s against step (metrics.jsonl),\n"
                   "and of the held-out loss by context length when RUN_DIR/eval.json exists (`ringscan eval`).\n"
                   "Drawn with gnuplot; default FILE: RUN_DIR/plot.png.\n", PLOT_USAGE);
            return RS_EXIT_OK;
        } else if (!strcmp(argv[i], "--out")) {
            if (i + 1 >= argc) RS_USAGE(PLOT_USAGE, "--out needs a file name");
            out_arg = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) RS_USAGE(PLOT_USAGE, "unknown option %s", argv[i]);
        else if (!run_dir) run_dir = argv[i];
        else RS_USAGE(PLOT_USAGE, "unexpected argument %s", argv[i]);
    }
    if (!run_dir) RS_USAGE(PLOT_USAGE, "needs the run directory");
    char err[PATH_MAX * 3 + 512], out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/plot.png", run_dir);
    int rc = ckpt_check_output(out_arg ? out_arg : out, FSIO_OUT_FILE, "plot --out", err, sizeof err);
    if (rc) {
        fprintf(stderr, "ringscan plot: error: %s\n", err);
        return rc;
    }
    return plot_run(run_dir, out_arg);
}
