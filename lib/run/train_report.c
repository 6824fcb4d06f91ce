/*
 * train_report.c — how the trainer speaks (train_state.h): train_say (rank 0 prints to stdout and appends to
 * log.txt) and train_fail (every rank at the same point: rank 0 reports the error, every rank leaves MPI
 * and exits). Below the loop (train.c) and the checkpoint glue (train_ckpt.c), which both call it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "train_state.h"

void train_say(Trainer *t, const char *fmt, ...) {
    if (t->comm->rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    char line[4096];
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fputs(line, stdout);
    fflush(stdout);
    if (t->log) {
        fputs(line, t->log);
        fflush(t->log);
    }
}

noreturn void train_fail_at(Trainer *t, int code, const char *file, int line, const char *fmt, ...) {
    if (t->comm->rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        error_vreport("error", file, line, NULL, fmt, ap);
        va_end(ap);
    }
    comm_finalize(t->comm);
    exit(code);
}
