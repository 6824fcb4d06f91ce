/*
 * submit.c — `ringscan submit`: check, render, write, sbatch (see submit.h).
 *
 * Order matters: everything that can be wrong is found before the first
 * byte is written, so a refused submission leaves no trace; and sbatch is
 * started directly (posix_spawnp, argument vector), never through a shell.
 */
#include "submit.h"

#include <errno.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "io/fsio.h"
#include "plan/plan.h"
#include "run/rundir.h"
#include "sbatch.h"

extern char **environ;

#define SUBMIT_PATH_MAX 4096

static void submit_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void submit_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fputs("ringscan submit: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* `path` made absolute against `base`, without a trailing '/'. */
static int submit_absolute(char *dst, size_t cap, const char *base, const char *path) {
    int n = path[0] == '/' ? snprintf(dst, cap, "%s", path) : snprintf(dst, cap, "%s/%s", base, path);
    if (n < 0 || (size_t)n >= cap) return -1;
    for (size_t len = strlen(dst); len > 1 && dst[len - 1] == '/'; len--) dst[len - 1] = 0;
    return 0;
}

static bool submit_exists(const char *dir, const char *name) {
    char p[SUBMIT_PATH_MAX + 64];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

/* The config as the job will load it: YAML text, malloc'd. */
static char *submit_config_text(const Config *cfg, const char *config_path, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    RS_CHECK(f != NULL, "open_memstream: %s", strerror(errno));
    char q[4 * SUBMIT_PATH_MAX + 8]; /* the path quoted: a newline in it cannot end the comment */
    if (config_yaml_quote(q, sizeof q, config_path) != 0) snprintf(q, sizeof q, "(a path that is not UTF-8)");
    fprintf(f, "# ringscan config of run %s, submitted as a Slurm job by `ringscan submit %s`;\n"
               "# the job's first run trains from it (later runs resume from ckpt/LATEST)\n",
            cfg->run.name, q);
    config_write_yaml(cfg, f, false);
    RS_CHECK(fclose(f) == 0, "writing the submitted config: %s", strerror(errno));
    return buf;
}

/* Runs `sbatch --parsable SCRIPT`; its stdout (the job id) goes to `out`.
 * Returns sbatch's exit status, or -1 when it could not be started (errno). */
static int submit_sbatch(const char *script, char *out, size_t cap) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    char *argv[] = {"sbatch", "--parsable", (char *)script, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "sbatch", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        errno = rc;
        return -1;
    }
    size_t n = 0;
    ssize_t got;
    while ((got = read(fds[0], out + n, cap - 1 - n)) != 0) {
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) break;
        n += (size_t)got;
        if (n == cap - 1) break;
    }
    out[n] = 0;
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The data the job will read: data.path must be given, and on a real submit its file(s) must exist
 * (from the working directory, where the job runs), or the job would fail only once it starts. A
 * dry run only needs the value: it may render a job for data made later. */
static int submit_check_data(const Config *cfg, int dry_run) {
    const char *p = cfg->data.path;
    if (!p[0]) {
        submit_error("data.path is empty: the job would have no data; nothing was written or submitted\n"
                     "  hint: set data.path to a flat token file or a Megatron prefix (`ringscan data` makes one)");
        return RS_EXIT_USAGE;
    }
    if (dry_run) return 0;
    int meg = cfg->data.format == DATA_FORMAT_MEGATRON;
    const char *const want[3] = {meg ? ".bin" : "", meg ? ".idx" : NULL, NULL};
    for (int k = 0; want[k]; k++) {
        char f[SUBMIT_PATH_MAX + 8];
        struct stat st;
        snprintf(f, sizeof f, "%s%s", p, want[k]);
        int e = stat(f, &st) != 0 ? errno : 0;
        if (e || !S_ISREG(st.st_mode)) {
            submit_error("data.path = \"%s\": %s is not a file here (%s); nothing was written or submitted\n"
                         "  hint: the job reads it from the directory you submit from; give a path that exists "
                         "(the nodes must see it too)",
                         p, f, e ? strerror(e) : "not a regular file");
            return RS_EXIT_USAGE;
        }
    }
    return 0;
}

int submit_run(const Config *cfg_in, const char *config_path, int dry_run) {
    int drc = submit_check_data(cfg_in, dry_run);
    if (drc) return drc;
    /* 1. does it fit? (the same verdict as `ringscan plan`) */
    Plan plan;
    plan_build(&plan, cfg_in);
    ActPolicy policy = (ActPolicy)cfg_in->checkpoint.activations;
    if (!plan_fits(&plan, policy)) {
        submit_error("the run does not fit: %.2f GiB per %s with checkpoint.activations = %s, but device.memory_gib = "
                     "%g; nothing was written or submitted\n"
                     "  hint: `ringscan plan %s` shows the memory by category, and which policy (and ring "
                     "settings) fit",
                     (double)plan.total[policy] / (1 << 30), cfg_in->device.kind == DEVICE_KIND_CUDA ? "GPU" : "rank",
                     act_policy_names[policy], cfg_in->device.memory_gib, config_path);
        plan_free(&plan);
        return RS_EXIT_FAIL;
    }
    plan_free(&plan);

    /* 2. absolute paths */
    char workdir[SUBMIT_PATH_MAX], run_dir[SUBMIT_PATH_MAX], exe[PATH_MAX], conf[SUBMIT_PATH_MAX + 64],
        site_env[SUBMIT_PATH_MAX] = "";
    if (!getcwd(workdir, sizeof workdir)) {
        submit_error("cannot read the working directory: %s", strerror(errno));
        return RS_EXIT_FAIL;
    }
    if (!realpath("/proc/self/exe", exe)) {
        submit_error("cannot find this binary through /proc/self/exe: %s", strerror(errno));
        return RS_EXIT_FAIL;
    }
    if (submit_absolute(run_dir, sizeof run_dir, workdir, cfg_in->run.out_dir) != 0) {
        submit_error("run.out_dir = \"%s\": the absolute path is longer than %d bytes", cfg_in->run.out_dir,
                     SUBMIT_PATH_MAX - 1);
        return RS_EXIT_USAGE;
    }
    snprintf(conf, sizeof conf, "%s/config.submitted.yaml", run_dir);
    if (cfg_in->slurm.site_env[0]) {
        struct stat st;
        if (submit_absolute(site_env, sizeof site_env, workdir, cfg_in->slurm.site_env) != 0 ||
            stat(site_env, &st) != 0 || !S_ISREG(st.st_mode) || access(site_env, R_OK) != 0) {
            submit_error("slurm.site_env = \"%s\": %s is not a readable file\n"
                         "  hint: slurm/site.env is the template; copy it, set your cluster's NCCL/UCX variables, "
                         "and point slurm.site_env at the copy (or set it to \"\")",
                         cfg_in->slurm.site_env, site_env[0] ? site_env : "the path");
            return RS_EXIT_USAGE;
        }
    }

    /* the run directory must not hold a run or a job already; a dry run only warns (it writes nothing) */
    static const char *const taken[] = {"job.sbatch", "ckpt", "metrics.jsonl", NULL};
    bool warned = false; /* a dry run warns once */
    for (int i = 0; taken[i]; i++)
        if (submit_exists(run_dir, taken[i])) {
            char hint[SUBMIT_PATH_MAX + 128];
            if (i == 0) snprintf(hint, sizeof hint, "`sbatch %s/job.sbatch` runs its job again (it resumes from "
                                                    "ckpt/LATEST)", run_dir);
            else snprintf(hint, sizeof hint, "`ringscan resume %s` continues it", run_dir);
            char used[2 * SUBMIT_PATH_MAX + 128];
            snprintf(used, sizeof used, "run.out_dir = \"%s\": %s already holds a %s (%s exists)", cfg_in->run.out_dir,
                     run_dir, i == 0 ? "submitted job" : "run", taken[i]);
            if (dry_run) {
                fflush(stdout);
                fprintf(stderr, "ringscan submit: warning: %s; the script is printed anyway, but a submit without "
                                "--dry-run refuses this directory\n  hint: %s, or set run.out_dir to a new directory\n",
                        used, hint);
                warned = true;
                break;
            }
            submit_error("%s; nothing was written or submitted\n  hint: %s, or set run.out_dir to a new directory", used,
                         hint);
            return RS_EXIT_USAGE;
        }
    /* what it holds besides: the rule of `train` (rundir.h), so the job's train never refuses it */
    char why[16384];
    int restart = 0;
    if (!warned && run_dir_check_contents(run_dir, &restart, why, sizeof why) != 0) {
        char *hint = strstr(why, "\n  hint: ");
        if (hint) *hint = 0;
        if (dry_run) {
            fflush(stdout);
            fprintf(stderr, "ringscan submit: warning: %s; the script is printed anyway, but a submit without "
                            "--dry-run refuses this directory%s%s\n", why, hint ? "\n" : "", hint ? hint + 1 : "");
        } else {
            submit_error("%s; nothing was written or submitted%s%s", why, hint ? "\n" : "", hint ? hint + 1 : "");
            return RS_EXIT_USAGE;
        }
    }
    struct stat st_run;
    bool run_dir_is_new = stat(run_dir, &st_run) != 0;

    /* 3. the config as the job loads it, and the script */
    Config cfg;
    config_copy(&cfg, cfg_in);
    free(cfg.run.out_dir);
    cfg.run.out_dir = RS_STRDUP(run_dir);
    free(cfg.slurm.site_env);
    cfg.slurm.site_env = RS_STRDUP(site_env);
    SbatchPaths paths = {.run_dir = run_dir, .workdir = workdir, .ringscan = exe, .config = conf,
                         .site_env = site_env};
    ConfigErrors err = {0};
    char *script = sbatch_render(&cfg, &paths, &err);
    if (!script) {
        for (char *line = err.text; line && *line;) {
            char *nl = strchr(line, '\n');
            fprintf(stderr, "ringscan submit: error: %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
            line = nl ? nl + 1 : NULL;
        }
        fprintf(stderr, "ringscan submit: %d value%s cannot go into a job script; nothing was written or submitted\n",
                err.count, err.count == 1 ? "" : "s");
        config_errors_free(&err);
        config_free(&cfg);
        return RS_EXIT_USAGE;
    }
    if (dry_run) {
        fputs(script, stdout);
        free(script);
        config_free(&cfg);
        return RS_EXIT_OK;
    }

    /* 4. write, then sbatch */
    char logs[SUBMIT_PATH_MAX + 16], job[SUBMIT_PATH_MAX + 16], msg[8192];
    snprintf(logs, sizeof logs, "%s/logs", run_dir);
    snprintf(job, sizeof job, "%s/job.sbatch", run_dir);
    size_t conf_len = 0;
    char *conf_text = submit_config_text(&cfg, config_path, &conf_len);
    config_free(&cfg);
    if (fsio_mkdirs(logs) != 0) {
        submit_error("cannot create %s: %s", logs, strerror(errno));
        return RS_EXIT_FAIL;
    }
    if (fsio_write_file_durable(conf, conf_text, (int64_t)conf_len, msg, sizeof msg) != 0 ||
        fsio_write_file_durable(job, script, (int64_t)strlen(script), msg, sizeof msg) != 0) {
        submit_error("%s", msg);
        return RS_EXIT_FAIL;
    }
    free(conf_text);
    free(script);

    char out[256];
    int rc = submit_sbatch(job, out, sizeof out);
    char *id_end = out;
    while (*id_end >= '0' && *id_end <= '9') id_end++;
    if (rc != 0 || id_end == out) {
        if (rc < 0 && errno == ENOENT)
            submit_error("sbatch is not on PATH: submit from a Slurm login node (or use --dry-run to see the script)");
        else if (rc < 0) submit_error("cannot start sbatch: %s", strerror(errno));
        else if (rc != 0) submit_error("sbatch %s failed with exit %d (its message is above)", job, rc);
        else submit_error("sbatch printed no job id: \"%s\"", out);
        /* leave the run directory as it was, so the same command can be retried */
        unlink(job);
        unlink(conf);
        rmdir(logs);
        if (run_dir_is_new) rmdir(run_dir);
        return RS_EXIT_FAIL;
    }
    *id_end = 0;
    printf("%s\n", out);
    fflush(stdout);
    fprintf(stderr, "ringscan submit: job %s: run %s in %s (script job.sbatch, output logs/job-%s.RESTART.log)\n", out,
            cfg_in->run.name, run_dir, out);
    return RS_EXIT_OK;
}
