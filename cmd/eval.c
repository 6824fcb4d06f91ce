/*
 * eval.c — the command line of `ringscan eval` (lib/run/eval.h says what it
 * computes): RUN_DIR|CKPT_DIR, --data PATH, --out FILE, --tokens N and --set
 * key=value parsed into EvalOptions, then eval_run. A bad argument prints the
 * usage and exits 2 before MPI starts.
 *
 * Callers: cmd/ringscan.c (the `eval` entry of its command table).
 */
#include "cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "run/eval.h"

#define EVAL_USAGE "ringscan eval RUN_DIR|CKPT_DIR --data PATH [--out FILE] [--tokens N] [--set key=value]..."

static void eval_parse(EvalOptions *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            printf("usage: %s\n\n"
                   "The checkpoint's loss on held-out data (PATH, in data.format; read in file order), and its loss by\n"
                   "the context each token has (min(pos, doc_pos): tokens of its document before it), in log-spaced\n"
                   "buckets. The config is the checkpoint's, with data.path = PATH, data.shuffle = false and the\n"
                   "--set overrides (parallel.cp, parallel.dp, device.kind, data.seq_len, data.micro_batch, ...);\n"
                   "launch dp x cp ranks with mpirun as for train. --tokens N: the first N tokens (default one epoch,\n"
                   "rounded down to whole steps of dp x micro_batch samples). --out FILE: the JSON (default\n"
                   "RUN_DIR/eval.json); `ringscan plot` draws it.\n", EVAL_USAGE);
            exit(RS_EXIT_OK);
        } else if (!strcmp(s, "--data") || !strcmp(s, "--out") || !strcmp(s, "--tokens") || !strcmp(s, "--set")) {
            if (!v) RS_USAGE(EVAL_USAGE, "%s needs a value", s);
            i++;
            if (!strcmp(s, "--data")) a->data = v;
            else if (!strcmp(s, "--out")) a->out = v;
            else if (!strcmp(s, "--set")) {
                if (a->n_sets == 64) RS_USAGE(EVAL_USAGE, "more than 64 --set options");
                a->sets[a->n_sets++] = v;
            } else {
                char *end;
                errno = 0;
                a->tokens = strtoll(v, &end, 10);
                if (!*v || *end || errno == ERANGE || a->tokens < 1 || a->tokens > EVAL_TOKENS_MAX)
                    RS_USAGE(EVAL_USAGE, "--tokens %s: expected a whole count from 1 to 2^60 (%lld)", v,
                             (long long)EVAL_TOKENS_MAX);
            }
        } else if (s[0] == '-' && s[1]) RS_USAGE(EVAL_USAGE, "unknown option %s", s);
        else if (!a->src) a->src = s;
        else RS_USAGE(EVAL_USAGE, "unexpected argument %s", s);
    }
    if (!a->src || !a->data) RS_USAGE(EVAL_USAGE, "needs the checkpoint (RUN_DIR or RUN_DIR/ckpt/step_N) and --data PATH");
}

int cmd_eval(int argc, char **argv) {
    EvalOptions a;
    eval_parse(&a, argc, argv);
    return eval_run(&a);
}
