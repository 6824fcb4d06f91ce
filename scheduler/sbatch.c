/*
 * sbatch.c — renders slurm/job.sbatch.in for one run (see sbatch.h).
 *
 * One table (sbatch_values) lists every placeholder: its name in the
 * template, where its value comes from (a config key, or a path submit
 * resolved) and whether it may be empty. Rendering walks the template line
 * by line; a placeholder missing from the table is a bug in this file or
 * the template and stops with an internal error, never with a half-filled
 * script.
 *
 * Callers: scheduler/submit.c.
 */
#include "sbatch.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct {
    const char *name;  /* placeholder in the template */
    const char *what;  /* for messages: the config key, or what the path is */
    char        value[CONFIG_STR_MAX];
    bool        may_be_empty;
} SbatchValue;

#define SBATCH_MAX_VALUES 32

typedef struct {
    SbatchValue v[SBATCH_MAX_VALUES];
    int         n;
} SbatchValues;

static void sbatch_set(SbatchValues *vs, const char *name, const char *what, bool may_be_empty, const char *fmt,
                       ...) __attribute__((format(printf, 5, 6)));
static void sbatch_set(SbatchValues *vs, const char *name, const char *what, bool may_be_empty, const char *fmt,
                       ...) {
    RS_CHECK(vs->n < SBATCH_MAX_VALUES, "raise SBATCH_MAX_VALUES");
    SbatchValue *v = &vs->v[vs->n++];
    v->name = name;
    v->what = what;
    v->may_be_empty = may_be_empty;
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(v->value, sizeof v->value, fmt, ap);
    va_end(ap);
    RS_CHECK(len >= 0 && len < (int)sizeof v->value, "%s: value longer than %d bytes", what, CONFIG_STR_MAX - 1);
}

/* The one character set of the script: letters, digits and _ . , / + = @ : - */
static bool sbatch_char_ok(unsigned char c) { return isalnum(c) || strchr("_.,/+=@:-", c) != NULL; }

/* Every value, checked; returns the number of errors added. */
static int sbatch_check(const SbatchValues *vs, ConfigErrors *err) {
    int before = err->count;
    for (int i = 0; i < vs->n; i++) {
        const SbatchValue *v = &vs->v[i];
        if (!v->value[0] && !v->may_be_empty) {
            config_errors_add(err, "%s is empty: the job script needs a value", v->what);
            continue;
        }
        for (const unsigned char *p = (const unsigned char *)v->value; *p; p++) {
            if (sbatch_char_ok(*p)) continue;
            char shown[64];
            if (*p >= 0x20 && *p < 0x7f) snprintf(shown, sizeof shown, "'%c'", *p);
            else snprintf(shown, sizeof shown, "byte 0x%02x", *p);
            config_errors_add(err, "%s = \"%.200s\": %s may not reach a job script: only letters, digits and "
                                   "_ . , / + = @ : - (no spaces, quotes or shell characters)",
                              v->what, v->value, shown);
            break;
        }
    }
    return err->count - before;
}

static const SbatchValue *sbatch_find(const SbatchValues *vs, const char *name, size_t len) {
    for (int i = 0; i < vs->n; i++)
        if (strlen(vs->v[i].name) == len && !strncmp(vs->v[i].name, name, len)) return &vs->v[i];
    return NULL;
}

typedef struct {
    char  *s;
    size_t len, cap;
} SbatchText;

static void sbatch_append(SbatchText *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->s = RS_REALLOC(t->s, t->cap);
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = 0;
}

/* Renders one template line (without its '\n') into t, or leaves it out when
 * an optional placeholder on it is empty. */
static void sbatch_render_line(SbatchText *t, const SbatchValues *vs, const char *line, size_t n) {
    size_t start = t->len;
    const char *p = line, *end = line + n;
    while (p < end) {
        const char *open = memmem(p, (size_t)(end - p), "{{", 2);
        if (!open) {
            sbatch_append(t, p, (size_t)(end - p));
            break;
        }
        sbatch_append(t, p, (size_t)(open - p));
        const char *close = memmem(open + 2, (size_t)(end - open - 2), "}}", 2);
        RS_CHECK(close != NULL, "slurm/job.sbatch.in: unclosed {{ in line: %.*s", (int)n, line);
        const char *name = open + 2;
        size_t name_len = (size_t)(close - name);
        bool optional = name_len > 0 && name[name_len - 1] == '?';
        if (optional) name_len--;
        const SbatchValue *v = sbatch_find(vs, name, name_len);
        RS_CHECK(v != NULL, "slurm/job.sbatch.in: unknown placeholder {{%.*s}}", (int)name_len, name);
        if (optional && !v->value[0]) { /* drop the whole line */
            t->len = start;
            if (t->s) t->s[t->len] = 0;
            return;
        }
        sbatch_append(t, v->value, strlen(v->value));
        p = close + 2;
    }
    sbatch_append(t, "\n", 1);
}

char *sbatch_render(const Config *cfg, const SbatchPaths *paths, ConfigErrors *err) {
    const SlurmConfig *s = &cfg->slurm;
    bool cuda = cfg->device.kind == DEVICE_KIND_CUDA;
    int64_t tasks = config_tasks_per_node(cfg);
    SbatchValues *vs = RS_CALLOC(1, sizeof *vs);
    sbatch_set(vs, "job_name", "run.name", false, "%s", cfg->run.name);
    sbatch_set(vs, "nodes", "slurm.nodes", false, "%lld", (long long)s->nodes);
    sbatch_set(vs, "tasks_per_node", "slurm.gpus_per_node", false, "%lld", (long long)tasks);
    /* one GPU per task on cuda; on cpu each rank gets its BLAS threads */
    char gpus[32] = "", cpus[32] = "", warn[32] = "";
    if (cuda) snprintf(gpus, sizeof gpus, "%lld", (long long)tasks);
    else snprintf(cpus, sizeof cpus, "%lld", (long long)cfg->device.threads);
    if (s->signal_s > 0) snprintf(warn, sizeof warn, "%lld", (long long)s->signal_s);
    sbatch_set(vs, "gpus_per_node", "slurm.gpus_per_node", true, "%s", gpus);
    sbatch_set(vs, "cpus_per_task", "device.threads", true, "%s", cpus);
    sbatch_set(vs, "partition", "slurm.partition", true, "%s", s->partition);
    sbatch_set(vs, "account", "slurm.account", true, "%s", s->account);
    sbatch_set(vs, "qos", "slurm.qos", true, "%s", s->qos);
    sbatch_set(vs, "time", "slurm.time", false, "%s", s->time);
    sbatch_set(vs, "signal_s", "slurm.signal_s", true, "%s", warn);
    sbatch_set(vs, "max_restarts", "slurm.max_restarts", false, "%lld", (long long)s->max_restarts);
    sbatch_set(vs, "launcher", "slurm.launcher", false, "%s", slurm_launcher_names[s->launcher]);
    sbatch_set(vs, "srun_mpi", "slurm.srun_mpi", false, "%s", s->srun_mpi);
    sbatch_set(vs, "site_env", "slurm.site_env (made absolute)", true, "%s", paths->site_env);
    sbatch_set(vs, "run_dir", "run.out_dir (made absolute)", false, "%s", paths->run_dir);
    sbatch_set(vs, "workdir", "the working directory of `ringscan submit` (the job's too)", false, "%s",
               paths->workdir);
    sbatch_set(vs, "ringscan", "the path of the ringscan binary", false, "%s", paths->ringscan);
    sbatch_set(vs, "config", "the submitted config (in run.out_dir)", false, "%s", paths->config);

    if (sbatch_check(vs, err)) {
        free(vs);
        return NULL;
    }
    SbatchText t = {0};
    for (const char *p = sbatch_template; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        sbatch_render_line(&t, vs, p, n);
        p += n + (nl ? 1 : 0);
    }
    free(vs);
    return t.s;
}
