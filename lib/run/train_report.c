/*
 * train_report.c — how the trainer speaks (train_state.h): train_say (rank 0 prints to stdout and appends to
 * log.txt), train_append / train_check_writes (every write to log.txt and metrics.jsonl whole or cut off, and
 * a failed one stopping the run on every rank) and train_fail (every rank at the same point: rank 0 reports
 * the error, every rank leaves MPI and exits). Below the loop (train.c) and the checkpoint glue
 * (train_ckpt.c), which both call it.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsio.h"
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
    train_append(t, t->log, "log.txt", line);
}

void train_append(Trainer *t, FILE *f, const char *name, const char *text) {
    if (t->comm->rank != 0 || !f || (f == t->log && t->write_failed)) return;
    char path[PATH_MAX + 32], err[sizeof t->write_err];
    snprintf(path, sizeof path, "%s/%s", t->run_dir, name);
    if (fsio_append_record(fileno(f), path, text, (int64_t)strlen(text), err, sizeof err) == 0 || t->write_failed)
        return;
    snprintf(t->write_err, sizeof t->write_err, "%s", err);
    t->write_failed = 1;
}

void train_check_writes(Trainer *t, int code) {
    comm_set_context(t->comm, -1, "write-check all-reduce");
    if (!comm_allreduce_max_int(t->comm, t->comm->world, t->write_failed)) return;
    char kept[128], next[PATH_MAX + 160];
    if (t->last_ckpt >= 0) {
        snprintf(kept, sizeof kept, "the newest checkpoint, step %lld, is intact", (long long)t->last_ckpt);
        snprintf(next, sizeof next, "`ringscan resume %s` continues from it (and keeps the metrics up to it)",
                 t->run_dir);
    } else {
        snprintf(kept, sizeof kept, "no checkpoint was written yet");
        snprintf(next, sizeof next, "the same `ringscan train` starts the attempt over");
    }
    train_fail(t, code, "the run directory cannot be written: %s; the run stops after step %lld (%s)\n"
                        "  hint: free space in (or repair) %s, then %s",
               t->comm->rank == 0 ? t->write_err : "", (long long)t->step, kept, t->run_dir, next);
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
