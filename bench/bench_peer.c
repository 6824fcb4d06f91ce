/*
 * bench_peer.c — running one peer script of bench/peer for `ringscan bench
 * --peer` (bench.h; the contract is bench/peer/README.md).
 *
 * The request (the cases, the repetition rule, the seed) goes to
 * OUT/request_NAME.json (NAME: attn, gdn, kda, step, cp_attn, cp_gdn, cp_kda); the script
 * runs as
 *   PYTHON PEER_DIR/SCRIPT --request OUT/request_NAME.json --out OUT/peer_NAME.json
 * or, for the CP peers (one process per GPU),
 *   PYTHON -m torch.distributed.run --standalone --nproc_per_node P PEER_DIR/SCRIPT ...
 * with its stdout and stderr in OUT/peer_NAME.log, in its own process group,
 * killed (SIGTERM, then SIGKILL after 10 s) when it outlives --peer-timeout.
 * It is started by fork + execvp with an argument vector (no shell), so paths
 * with spaces or shell characters are passed as they are. Under mpirun (bench
 * cp) the child drops the launcher's OMPI_* / PMIX_* variables first, so
 * nothing in the peer mistakes itself for an MPI rank.
 *
 * A peer that fails, times out or writes no valid result is not fatal: the
 * returned object carries "error" with what happened and the log's path, and
 * the table says so in place of the numbers.
 *
 * Callers: bench/bench.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "core/error.h"

extern char **environ;

void bench_write_json(const json_t *j, const char *path) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(j, tmp, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8)) != 0 ||
        rename(tmp, path) != 0)
        error_exit(RS_EXIT_FAIL, __FILE__, __LINE__, "hint: --out DIR must be a writable directory",
                   "cannot write %s: %s", path, strerror(errno));
}

static json_t *bench_peer_error(const char *fmt, const char *a, const char *b) {
    char msg[10240];
    snprintf(msg, sizeof msg, fmt, a, b);
    return json_pack("{ss s[]}", "error", msg, "results");
}

static double bench_peer_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Drops the MPI launcher's variables from this (child) process's environment. */
static void bench_peer_drop_mpi_env(void) {
    for (int i = 0; environ[i];) {
        if (strncmp(environ[i], "OMPI_", 5) && strncmp(environ[i], "PMIX_", 5)) {
            i++;
            continue;
        }
        char name[256];
        size_t n = strcspn(environ[i], "=");
        snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), environ[i]);
        if (unsetenv(name) != 0) i++; /* environ shifts down when it worked */
    }
}

json_t *bench_peer_run(const BenchOptions *o, const char *kn, const char *script_name, int nproc,
                       const json_t *request) {
    char req[4096], out[4096], log[4096], script[4096], np[32];
    snprintf(req, sizeof req, "%s/request_%s.json", o->out_dir, kn);
    snprintf(out, sizeof out, "%s/peer_%s.json", o->out_dir, kn);
    snprintf(log, sizeof log, "%s/peer_%s.log", o->out_dir, kn);
    snprintf(script, sizeof script, "%s/%s", o->peer_dir, script_name);
    snprintf(np, sizeof np, "%d", nproc);
    struct stat st;
    if (stat(script, &st) != 0)
        return bench_peer_error("peer script %s not found (--peer-dir %s)", script, o->peer_dir);
    bench_write_json(request, req);
    unlink(out);

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return bench_peer_error("cannot start %s: %s", script, strerror(errno));
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        bench_peer_drop_mpi_env();
        char *one[] = {(char *)o->python, script, "--request", req, "--out", out, NULL};
        char *dist[] = {(char *)o->python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", np,
                        script, "--request", req, "--out", out, NULL};
        execvp(o->python, nproc > 0 ? dist : one);
        fprintf(stderr, "cannot run %s: %s\n", o->python, strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    double t0 = bench_peer_now(), killed_at = 0;
    int status = 0, timed_out = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) break;
        double el = bench_peer_now() - t0;
        if (!timed_out && el > o->peer_timeout) {
            timed_out = 1;
            killed_at = el;
            kill(-pid, SIGTERM);
        } else if (timed_out && el > killed_at + 10) {
            kill(-pid, SIGKILL);
        }
        usleep(100 * 1000);
    }
    char why[256];
    if (timed_out) {
        snprintf(why, sizeof why, "timed out after %.0f s (--peer-timeout)", o->peer_timeout);
        return bench_peer_error("%s; log: %s", why, log);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (WIFEXITED(status)) snprintf(why, sizeof why, "exited with status %d", WEXITSTATUS(status));
        else snprintf(why, sizeof why, "ended by signal %d", WTERMSIG(status));
        return bench_peer_error("%s; log: %s", why, log);
    }
    json_error_t je;
    json_t *r = json_load_file(out, 0, &je);
    if (!r) return bench_peer_error("no valid result file %s; log: %s", out, log);
    if (!json_is_array(json_object_get(r, "results"))) {
        json_decref(r);
        return bench_peer_error("%s has no \"results\" array; log: %s", out, log);
    }
    return r;
}
