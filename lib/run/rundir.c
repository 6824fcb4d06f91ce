/*
 * rundir.c — the run directory of `train` and `resume` (run.out_dir): which
 * directories a run may write into, the run lock, and opening the directory's
 * files for a run.
 *
 * A run directory holds .lock, config.resolved.yaml, log.txt, metrics.jsonl,
 * ckpt/ (ckpt.h) and what `submit`, `eval` and `plot` write beside them
 * (README, "Run directories"). Rank 0 claims it (run_dir_claim): it takes
 * RUN/.lock with flock for the life of the process, so a second `train` or
 * `resume` into a live run is refused naming the holder; the lock file stays
 * as the marker that a ringscan run wrote the directory. `train` writes only
 * into a new or empty directory, or one holding a ringscan attempt that
 * stopped before its first checkpoint (restarted: its metrics are dropped);
 * it refuses anything it did not write and any checkpoint (`resume` continues
 * those). The verdict is checked before the lock is created (a refusal writes
 * nothing) and again under it, and every rank learns it through one
 * all-reduce. run_dir_open then writes config.resolved.yaml (temporary file
 * and rename) and opens log.txt for train_say and error.h.
 *
 * Callers: train.c (run_dir_claim, run_dir_open, run_dir_trim_metrics on
 * resume), cmd/ringscan.c (run_dir_check_out_dir, rundir.h), scheduler/submit.c
 * (run_dir_check_contents: the same rule before submit writes).
 */
#include "rundir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "io/ckpt.h"
#include "io/fsio.h"
#include "train_state.h"

/* What a run directory may hold (README, "Run directories"): the names ringscan
 * writes there. `train` refuses a directory holding anything else, and a
 * ringscan name without the run's marker (RUN/.lock, written by the run that
 * created the directory), since then no ringscan run wrote it. */
/* what ringscan writes into a run directory: train, the watchdog's records of a hang (.watchdog/<attempt>/, kept
 * for a post-mortem; a restart writes its own attempt's), and `eval` / `plot` of the run (eval.json, plot.png) */
static const char *const run_dir_names[] = {".lock",     "config.resolved.yaml", "log.txt",  "metrics.jsonl", "ckpt",
                                            ".watchdog", "eval.json",            "plot.png", NULL};
static const char *const run_dir_submit_names[] = {"job.sbatch", "config.submitted.yaml", "logs", NULL};
static const char run_dir_lock_magic[] = "ringscan run lock";

static int run_dir_name_in(const char *name, const char *const *names) {
    for (int i = 0; names[i]; i++)
        if (!strcmp(name, names[i])) return 1;
    return 0;
}

/* A temporary file of run_dir_write_resolved / run_dir_trim_metrics, eval or plot ("<name>.tmp.<pid>"). */
static int run_dir_is_tmp_name(const char *name) {
    static const char *const bases[] = {"config.resolved.yaml.tmp.", "metrics.jsonl.tmp.", "eval.json.tmp.",
                                        "plot.png.tmp.", NULL};
    for (int i = 0; bases[i]; i++)
        if (!strncmp(name, bases[i], strlen(bases[i]))) return 1;
    return 0;
}

/* What RUN/.lock is: 1 a ringscan run lock (its first line), 0 missing or
 * empty (a ringscan that has just created it), -1 anything else. */
static int run_dir_marker(const char *dir) {
    char path[PATH_MAX + 16], head[sizeof run_dir_lock_magic] = "";
    snprintf(path, sizeof path, "%s/.lock", dir);
    char err[PATH_MAX + 128];
    int missing = 0;
    FILE *f = fsio_fopen_regular(path, &missing, NULL, err, sizeof err); /* a FIFO: not ringscan's lock */
    if (!f) return missing ? 0 : -1;
    size_t n = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    return n == 0 ? 0 : n == sizeof head - 1 && !memcmp(head, run_dir_lock_magic, n) ? 1 : -1;
}

/* Adds `name` to the list of foreign entries in `list` (the first few; all are counted). */
static void run_dir_note_foreign(char *list, size_t cap, int *n, const char *prefix, const char *name) {
    if ((*n)++ < 4) {
        size_t k = strlen(list);
        snprintf(list + k, cap - k, "%s%s%s", k ? ", " : "", prefix, name);
    }
}

/* Decides whether `train` or `submit` may write into `dir` (rank 0, before and
 * again after taking the run lock; submit before it writes): rundir.h. */
int run_dir_check_contents(const char *dir, int *restart, char *msg, size_t cap) {
    *restart = 0;
    DIR *d = opendir(dir);
    if (!d) return 0; /* missing, or not a directory: fsio_mkdirs says which */
    char foreign[1024] = "", path[PATH_MAX + 64];
    int n_foreign = 0, run_files = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        if (!strcmp(name, ".") || !strcmp(name, "..")) continue;
        if (run_dir_name_in(name, run_dir_names) || run_dir_is_tmp_name(name)) run_files += strcmp(name, ".lock") != 0;
        else if (!run_dir_name_in(name, run_dir_submit_names)) run_dir_note_foreign(foreign, sizeof foreign, &n_foreign, "", name);
    }
    closedir(d);
    int marker = run_dir_marker(dir);
    if (marker < 0) run_dir_note_foreign(foreign, sizeof foreign, &n_foreign, "", ".lock (not a ringscan run lock)");
    /* ckpt/: the lock and LATEST of ckpt.h, complete and partial step_* directories */
    snprintf(path, sizeof path, "%s/ckpt", dir);
    if ((d = opendir(path)) != NULL) {
        while ((de = readdir(d)) != NULL) {
            const char *name = de->d_name;
            if (!strcmp(name, ".") || !strcmp(name, "..") || !strcmp(name, ".lock") || !strncmp(name, "LATEST", 6) ||
                !strncmp(name, "step_", 5))
                continue;
            run_dir_note_foreign(foreign, sizeof foreign, &n_foreign, "ckpt/", name);
        }
        closedir(d);
    }
    if (n_foreign) {
        snprintf(msg, cap,
                 "run.out_dir %s holds %d entr%s that ringscan did not write (%s%s); `train` and `submit` write only "
                 "into a new or empty directory, or one holding a ringscan attempt that stopped before its first "
                 "checkpoint\n"
                 "  hint: set run.out_dir to a new directory",
                 dir, n_foreign, n_foreign == 1 ? "y" : "ies", foreign, n_foreign > 4 ? ", ..." : "");
        return RS_EXIT_USAGE;
    }
    int64_t *steps = NULL, n_steps = 0;
    char err[1024];
    snprintf(path, sizeof path, "%s/ckpt/LATEST", dir);
    struct stat st;
    int has_latest = stat(path, &st) == 0;
    if (ckpt_list_steps(dir, &steps, &n_steps, err, sizeof err) != 0) {
        snprintf(msg, cap, "cannot check run.out_dir %s for checkpoints: %s", dir, err);
        return RS_EXIT_USAGE;
    }
    free(steps);
    if (has_latest || n_steps > 0) {
        snprintf(msg, cap,
                 "run directory %s already holds a run with a checkpoint (%s)\n"
                 "  hint: continue it with `ringscan resume %s`, or set run.out_dir to a new directory",
                 dir, has_latest ? "ckpt/LATEST" : "ckpt/step_*", dir);
        return RS_EXIT_USAGE;
    }
    if (run_files && marker != 1) {
        snprintf(msg, cap,
                 "run.out_dir %s holds ringscan's file names (metrics.jsonl, config.resolved.yaml, log.txt or ckpt/) "
                 "but not the marker of a ringscan run (.lock): they were not written by a run of this ringscan, so "
                 "`train` does not replace them\n"
                 "  hint: set run.out_dir to a new directory, or move those files away",
                 dir);
        return RS_EXIT_USAGE;
    }
    *restart = run_files != 0;
    return 0;
}

int run_dir_check_out_dir(const char *dir, char *msg, size_t cap) {
    if (!dir[0]) {
        snprintf(msg, cap, "run.out_dir is empty: it must name the run directory (e.g. runs/my-run)");
        return RS_EXIT_USAGE;
    }
    /* "/", "//", "/./..": an absolute path made only of empty, "." and ".." components */
    int root = dir[0] == '/';
    for (const char *p = dir; root && *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n && strncmp(p, ".", n) && strncmp(p, "..", n < 2 ? 2 : n)) root = 0;
        p += n + (e != NULL);
    }
    char real[PATH_MAX];
    if (root || (realpath(dir, real) && !strcmp(real, "/"))) {
        snprintf(msg, cap, "run.out_dir = \"%s\" is the file system root: a run directory must be a directory of "
                           "its own (e.g. runs/my-run)", dir);
        return RS_EXIT_USAGE;
    }
    /* an existing file, a dangling symlink, a place inside a run's ckpt/: refused before anything starts */
    return ckpt_check_output(dir, FSIO_OUT_DIR, "run.out_dir", msg, cap);
}

/* Opens RUN/.lock (creating it when `create`) and takes its flock without
 * waiting: 0 with *fd (-1 when it does not exist and !create), or an exit
 * code with the reason in msg (RS_EXIT_USAGE naming the holder when another
 * process holds it). */
static int run_dir_lock_take(const char *run_dir, int create, int *fd, char *msg, size_t cap) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/.lock", run_dir);
    /* never through a symlink, never blocking on a FIFO: the lock is written in place, and what .lock names
     * instead of ringscan's own file (a user's file, a pipe) is refused, not truncated or waited on */
    *fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (create ? O_CREAT : 0), 0644);
    if (*fd < 0 && (errno == ENOENT || errno == ENOTDIR) && !create) return 0; /* fsio_mkdirs says why */
    if (*fd < 0) {
        int e = errno;
        if (e == ELOOP || e == EISDIR || e == ENXIO) {
            snprintf(msg, cap, "the run lock %s is %s, not the file ringscan writes; nothing was run or written\n"
                     "  hint: remove it if no ringscan process uses %s", path,
                     e == ELOOP ? "a symlink" : e == EISDIR ? "a directory" : "a socket or device", run_dir);
            return RS_EXIT_USAGE;
        }
        snprintf(msg, cap, "cannot open the run lock %s: %s", path, strerror(e));
        return RS_EXIT_FAIL;
    }
    struct stat st;
    if (fstat(*fd, &st) != 0) {
        snprintf(msg, cap, "cannot stat the run lock %s: %s", path, strerror(errno));
        close(*fd);
        *fd = -1;
        return RS_EXIT_FAIL;
    }
    if (!S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        snprintf(msg, cap, "the run lock %s is %s, not the file ringscan writes; nothing was run or written\n"
                 "  hint: remove it if no ringscan process uses %s", path,
                 S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)" : "not a regular file", run_dir);
        return RS_EXIT_USAGE;
    }
    int flags = fcntl(*fd, F_GETFL);
    if (flags < 0 || fcntl(*fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        snprintf(msg, cap, "cannot open the run lock %s: fcntl: %s", path, strerror(errno));
        close(*fd);
        *fd = -1;
        return RS_EXIT_FAIL;
    }
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0) return 0;
    int e = errno;
    char holder[512] = "";
    ssize_t n = pread(*fd, holder, sizeof holder - 1, 0);
    holder[n > 0 ? n : 0] = 0;
    close(*fd);
    *fd = -1;
    char *line = strstr(holder, "holder: ");
    if (line) line[strcspn(line, "\n")] = 0;
    if (e != EWOULDBLOCK) {
        snprintf(msg, cap, "cannot lock %s: flock failed: %s (ringscan needs flock on the run directory's file system "
                           "to keep one trainer per run)", path, strerror(e));
        return RS_EXIT_FAIL;
    }
    snprintf(msg, cap,
             "run directory %s is in use: %s holds %s; a second `train` or `resume` would mix two runs in one "
             "directory, so nothing was run or written\n"
             "  hint: wait for it to end, or stop it (SIGTERM: it checkpoints and exits 75) and then `ringscan resume "
             "%s`; to train separately, set run.out_dir to a new directory",
             run_dir, line ? line + 8 : "a ringscan process (starting; it has not written its name yet)", path, run_dir);
    return RS_EXIT_USAGE;
}

/* Takes RUN/.lock for the whole life of this process (rank 0; every rank
 * learns the verdict): a second `train` or `resume` into a directory whose run
 * is alive is refused naming the holder. The lock file stays as the run's
 * marker, naming its last holder. With dry_run the lock is only tested, and
 * nothing is created. On `train` the directory is checked under the lock; when
 * it has no lock file yet, it is checked first (nothing is written on a
 * refusal) and again once the new lock is held. */
void run_dir_claim(Trainer *t, int resuming, int dry_run) {
    char msg[16384] = "";
    int code = 0, fd = -1;
    t->lock_fd = -1;
    t->restart = 0;
    if (t->comm->rank == 0) {
        int restart = 0;
        code = run_dir_lock_take(t->run_dir, 0, &fd, msg, sizeof msg);
        if (!code && !resuming) code = run_dir_check_contents(t->run_dir, &restart, msg, sizeof msg);
        if (!code && fd < 0 && !dry_run) {
            if (!resuming && fsio_mkdirs(t->run_dir) != 0) {
                snprintf(msg, sizeof msg, "cannot create run directory %s: %s", t->run_dir, strerror(errno));
                code = RS_EXIT_FAIL;
            }
            if (!code) code = run_dir_lock_take(t->run_dir, 1, &fd, msg, sizeof msg);
            if (!code && !resuming) code = run_dir_check_contents(t->run_dir, &restart, msg, sizeof msg);
        }
        if (fd >= 0 && (code || dry_run)) close(fd); /* refused, or only tested */
        else if (fd >= 0) {
            t->lock_fd = fd; /* held until the process exits */
            t->restart = restart;
            char text[1024], when[64];
            time_t now = time(NULL);
            strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
            int len = snprintf(text, sizeof text, "%s of %s\nholder: `ringscan %s` (pid %ld on host %s, since %s)\n",
                               run_dir_lock_magic, t->run_dir, resuming ? "resume" : "train", (long)getpid(),
                               t->comm->host, when);
            /* the magic first line is rewritten in place, never absent: a reader always sees the marker */
            if (pwrite(fd, text, (size_t)len, 0) != len || ftruncate(fd, len) != 0 || fsync(fd) != 0) {
                snprintf(msg, sizeof msg, "cannot write the run lock %s/.lock: %s", t->run_dir, strerror(errno));
                code = RS_EXIT_FAIL;
            }
        }
    }
    code = comm_allreduce_max_int(t->comm, t->comm->world, code);
    if (code) train_fail(t, code, "%s", msg);
}

/* Writes config.resolved.yaml through a temporary file and rename. */
static void run_dir_write_resolved(Trainer *t) {
    char path[PATH_MAX + 64], tmp[PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/config.resolved.yaml", t->run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    RS_CHECK(f != NULL, "open_memstream: %s", strerror(errno));
    fprintf(f, "# ringscan resolved config of run %s (written by `ringscan train`/`resume`; read by `resume`)\n",
            t->cfg->run.name);
    config_write_yaml(t->cfg, f, 0);
    fclose(f);
    char err[2 * PATH_MAX + 256];
    /* whole or not at all: a failed write removes the temporary file, the old config stays */
    if (fsio_write_file_via(tmp, path, text, (int64_t)len, err, sizeof err) != 0) RS_FATAL("%s", err);
    free(text);
}

/* Keeps the metrics of steps <= `step` (a resume replays the steps after it). */
void run_dir_trim_metrics(Trainer *t, int64_t step) {
    char path[PATH_MAX + 64], tmp[PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->run_dir);
    char err[PATH_MAX + 128];
    int missing = 0, rc = 0;
    FILE *in = fsio_fopen_regular(path, &missing, &rc, err, sizeof err);
    if (!in && missing) return;
    if (!in) train_fail(t, rc, "%s\n  hint: metrics.jsonl of a run directory is a file ringscan writes", err);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *out = fopen(tmp, "w");
    if (!out) RS_FATAL("cannot write %s: %s", tmp, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    /* whole lines of steps <= step; a line a failed write left partial (no newline, no JSON) is dropped */
    while ((len = getline(&line, &cap, in)) > 0) {
        json_error_t je;
        json_t *o = line[len - 1] == '\n' ? json_loads(line, 0, &je) : NULL;
        json_t *s = o ? json_object_get(o, "step") : NULL;
        if (s && json_is_integer(s) && json_integer_value(s) <= step) fputs(line, out);
        json_decref(o);
    }
    free(line);
    fclose(in);
    /* whole or not at all: on a failed write the temporary file goes, metrics.jsonl stays as it was */
    int bad = ferror(out) || fflush(out) != 0 || fsync(fileno(out)) != 0;
    int e = errno;
    if (fclose(out) != 0 && !bad) bad = 1, e = errno;
    if (!bad && rename(tmp, path) != 0) bad = 1, e = errno;
    if (bad) {
        unlink(tmp);
        RS_FATAL("cannot write %s (metrics.jsonl kept as it was): %s", tmp, strerror(e));
    }
}

/* Writes config.resolved.yaml, drops the lines of a failed attempt, and opens
 * log.txt: for train_say (rank 0) and for error.h's messages (every rank). */
void run_dir_open(Trainer *t) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/log.txt", t->run_dir);
    if (t->comm->rank == 0) {
        if (t->restart) run_dir_trim_metrics(t, 0);
        run_dir_write_resolved(t);
        t->log = fopen(path, "a");
        if (!t->log) RS_FATAL("cannot open %s: %s", path, strerror(errno));
    }
    if (error_open_log(path) != 0) RS_FATAL("cannot open %s: %s", path, strerror(errno));
    if (t->restart)
        train_say(t, "run directory %s holds an attempt that stopped before its first checkpoint; starting the "
                     "run over (its metrics.jsonl lines are dropped)\n",
                  t->run_dir);
}
