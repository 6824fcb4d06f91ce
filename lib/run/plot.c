/*
 * plot.c — `ringscan plot RUN_DIR [--out FILE]`: one PNG of a run.
 *
 * Panels: loss, learning rate, gradient norm and tokens/s against step (from
 * RUN_DIR/metrics.jsonl), and, when RUN_DIR/eval.json exists (`ringscan
 * eval`), the held-out loss by context length (log2 axis). Drawn by gnuplot
 * (Debian's gnuplot-nox, installed by `make deps`; pngcairo terminal): the
 * columns and a script go to a temporary directory, gnuplot writes
 * FILE.tmp.<pid>, which is renamed to FILE (default RUN_DIR/plot.png).
 *
 * Exit codes: 0; 2 (not a run directory, no step in metrics.jsonl, a bad
 * line, gnuplot missing); 1 (gnuplot failed, I/O).
 * Callers: cmd/plot.c (the command line).
 */
#include "plot.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "io/fsio.h"

extern char **environ;

/* metrics.jsonl -> columns "step loss lr grad_norm tokens_per_s"; returns the number of steps. */
static int64_t plot_metrics(const char *run_dir, FILE *dat, char *title, size_t title_len) {
    char path[PATH_MAX + 32], line[1 << 16];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    char err[PATH_MAX + 128];
    FILE *f = fsio_fopen_regular(path, NULL, NULL, err, sizeof err);
    if (!f)
        RS_USAGE("ringscan plot reads RUN_DIR/metrics.jsonl, which `ringscan train` writes",
                 "%s is not a run directory: %s", run_dir, err);
    int64_t n = 0, first = -1, last = -1;
    for (int ln = 1; fgets(line, sizeof line, f); ln++) {
        if (line[strspn(line, " \t\r\n")] == 0) continue;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *s = json_object_get(o, "step"), *l = json_object_get(o, "loss");
        if (!json_is_integer(s) || !json_is_number(l))
            RS_USAGE(NULL, "%s:%d: expected a JSON object with \"step\" and \"loss\" (a line of ringscan's metrics)",
                     path, ln);
        double v[4];
        static const char *const keys[4] = {"loss", "lr", "grad_norm", "tokens_per_s"};
        for (int k = 0; k < 4; k++) {
            json_t *x = json_object_get(o, keys[k]);
            v[k] = json_is_number(x) ? json_number_value(x) : 0.0 / 0.0;
        }
        last = json_integer_value(s);
        if (first < 0) first = last;
        fprintf(dat, "%lld %.9g %.9g %.9g %.9g\n", (long long)last, v[0], v[1], v[2], v[3]);
        json_decref(o);
        n++;
    }
    fclose(f);
    if (n == 0) RS_USAGE("plot a run after its first step", "%s has no step yet", path);
    const char *base = strrchr(run_dir, '/');
    snprintf(title, title_len, "%s: steps %lld-%lld", base && base[1] ? base + 1 : run_dir, (long long)first,
             (long long)last);
    return n;
}

/* eval.json's buckets -> "mid loss tokens"; 0 when there is no eval.json. */
static int plot_eval(const char *run_dir, FILE *dat, char *label, size_t label_len) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/eval.json", run_dir);
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    json_t *b = json_object_get(o, "buckets");
    if (!json_is_array(b) || json_array_size(b) == 0)
        RS_USAGE(NULL, "%s:%d: expected the JSON of `ringscan eval` with a \"buckets\" array", path, je.line);
    size_t i;
    json_t *x;
    json_array_foreach(b, i, x) {
        double lo = (double)json_integer_value(json_object_get(x, "from"));
        double hi = (double)json_integer_value(json_object_get(x, "to"));
        fprintf(dat, "%.9g %.9g %lld\n", lo > 0 ? lo * 1.41421356 : 0.5 * hi,
                json_number_value(json_object_get(x, "loss")),
                (long long)json_integer_value(json_object_get(x, "tokens")));
    }
    snprintf(label, label_len, "eval loss by context (step %lld, loss %.4f)",
             (long long)json_integer_value(json_object_get(o, "step")), json_number_value(json_object_get(o, "loss")));
    json_decref(o);
    return 1;
}

/* `s` as a gnuplot single-quoted string: '' for a quote, control characters as '?' (a title only: no path
 * ringscan does not choose goes into the script; the PNG is drawn in the temporary directory). */
static void plot_gp_quote(char *out, size_t cap, const char *s) {
    size_t j = 0;
    out[j++] = '\'';
    for (; *s && j + 4 < cap; s++) {
        if (*s == '\'') out[j++] = '\'';
        out[j++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    }
    out[j++] = '\'';
    out[j] = 0;
}

static int plot_run_gnuplot(const char *script) {
    pid_t pid;
    char *argv[] = {"gnuplot", (char *)script, NULL};
    int e = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
    if (e == ENOENT)
        RS_USAGE("install it: `make deps` (Debian package gnuplot-nox)", "gnuplot is not installed; ringscan plot draws "
                 "with it");
    if (e) RS_FATAL("cannot start gnuplot: %s", strerror(e));
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) RS_FATAL("waitpid(gnuplot): %s", strerror(errno));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int plot_run(const char *run_dir, const char *out_arg) {
    char tmpdir[] = "/tmp/ringscan-plot.XXXXXX";
    if (!mkdtemp(tmpdir)) RS_FATAL("mkdtemp %s: %s", tmpdir, strerror(errno));
    char steps[64], evalp[64], script[64], png[64], title[PATH_MAX + 64], qtitle[2 * PATH_MAX + 160], label[256] = "";
    snprintf(steps, sizeof steps, "%s/steps.dat", tmpdir);
    snprintf(evalp, sizeof evalp, "%s/eval.dat", tmpdir);
    snprintf(script, sizeof script, "%s/plot.gp", tmpdir);
    snprintf(png, sizeof png, "%s/plot.png", tmpdir);
    FILE *fs = fopen(steps, "w"), *fe = fopen(evalp, "w"), *gp = fopen(script, "w");
    RS_CHECK(fs && fe && gp, "cannot write in %s", tmpdir);
    plot_metrics(run_dir, fs, title, sizeof title);
    int has_eval = plot_eval(run_dir, fe, label, sizeof label);
    fclose(fs);
    fclose(fe);

    char out[PATH_MAX + 32], tmp_out[PATH_MAX + 64];
    snprintf(out, sizeof out, "%s", out_arg ? out_arg : run_dir);
    if (!out_arg) snprintf(out, sizeof out, "%s/plot.png", run_dir);
    snprintf(tmp_out, sizeof tmp_out, "%s.tmp.%ld", out, (long)getpid());
    fprintf(gp, "set terminal pngcairo size 1200,%d font 'sans,10'\n", has_eval ? 1150 : 800);
    plot_gp_quote(qtitle, sizeof qtitle, title);
    fprintf(gp, "set output '%s'\n", png);
    fprintf(gp, "set multiplot layout %d,2 title %s font 'sans,12'\n", has_eval ? 3 : 2, qtitle);
    fprintf(gp, "set grid\nset key off\nset xlabel 'step'\nset style data lines\n");
    static const char *const panels[4][2] = {
        {"loss (nats)", "2"}, {"learning rate", "3"}, {"gradient norm (before clipping)", "4"}, {"tokens/s", "5"}};
    for (int k = 0; k < 4; k++)
        fprintf(gp, "set title '%s'\nplot '%s' using 1:%s lw 2 lc rgb '#%s'\n", panels[k][0], steps, panels[k][1],
                k == 0 ? "1f5fa8" : k == 1 ? "8a3ab9" : k == 2 ? "c0392b" : "218c4f");
    if (has_eval)
        fprintf(gp, "set title '%s'\nset logscale x 2\nset xlabel 'context: tokens of the document before the token'\n"
                    "set format x '2^{%%L}'\nplot '%s' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f5fa8'\n",
                label, evalp);
    fprintf(gp, "unset multiplot\n");
    fclose(gp);
    int st = plot_run_gnuplot(script);
    char err[PATH_MAX * 2 + 256], *bytes = NULL;
    int64_t n = 0;
    int rc = st != 0 ? 0 : fsio_read_file(png, (int64_t)1 << 30, &bytes, &n, NULL, err, sizeof err);
    char ignored[512];
    fsio_remove_tree(tmpdir, ignored, sizeof ignored);
    if (st != 0) RS_FATAL("gnuplot failed (exit %d) drawing %s", st, out);
    if (rc) RS_FATAL("%s", err);
    char made[PATH_MAX] = ""; /* --out's missing directories, made as export and data synth make theirs */
    rc = fsio_mkdirs_parent(out, made, sizeof made, err, sizeof err);
    if (!rc) rc = fsio_write_file_via(tmp_out, out, bytes, n, err, sizeof err); /* durable; a failure leaves no partial file */
    if (rc) fsio_rmdirs_made(out, made);
    free(bytes);
    if (rc) RS_FATAL("%s", err);
    printf("wrote %s\n", out);
    return RS_EXIT_OK;
}
