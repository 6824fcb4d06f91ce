/*
 * error.c — fatal errors, warnings and checked allocation (see error.h).
 *
 * The rank is a process-wide value set by comm once MPI is up; the host name
 * is read lazily on the first message. Messages go to stderr in one write so
 * that lines from several ranks do not interleave mid-line.
 */
#include "error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int error_rank_value = -1;
static void (*error_abort_fn)(int code);
static int error_log_fd = -1;
static char error_backlog[16384]; /* messages for the log, printed before it opened */
static size_t error_backlog_len;

void error_set_rank(int rank) { error_rank_value = rank; }
int  error_rank(void) { return error_rank_value; }
void error_set_abort(void (*abort_fn)(int code)) { error_abort_fn = abort_fn; }

static void error_format_origin(char *buf, size_t n) {
    char host[64] = "?";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    if (error_rank_value >= 0)
        snprintf(buf, n, "rank %d@%s", error_rank_value, host);
    else
        snprintf(buf, n, "rank ?@%s", host);
}

static void error_write_log(const char *msg, size_t len) {
    off_t start = lseek(error_log_fd, 0, SEEK_END);
    while (len > 0) {
        ssize_t w = write(error_log_fd, msg, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { /* the log is lost (disk full): stderr has the message; no partial one is left */
            int cut = start >= 0 ? ftruncate(error_log_fd, start) : -1;
            (void)cut;
            return;
        }
        msg += w;
        len -= (size_t)w;
    }
}

int error_open_log(const char *path) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    if (error_log_fd >= 0) close(error_log_fd);
    error_log_fd = fd;
    error_write_log(error_backlog, error_backlog_len);
    error_backlog_len = 0;
    return 0;
}

void error_vreport(const char *kind, const char *file, int line, const char *hint, const char *fmt, va_list ap) {
    char origin[96], msg[4096];
    error_format_origin(origin, sizeof origin);
    int k = snprintf(msg, sizeof msg, "ringscan: %s [%s] %s:%d: ", kind, origin, file, line);
    if (k < 0) k = 0;
    if ((size_t)k < sizeof msg) {
        int m = vsnprintf(msg + k, sizeof msg - (size_t)k, fmt, ap);
        if (m > 0) k += m;
    }
    if ((size_t)k >= sizeof msg - 2) k = (int)sizeof msg - 2;
    msg[k++] = '\n';
    msg[k] = 0;
    /* hint lines: each prefixed with "  hint: " */
    if (hint && *hint) {
        const char *p = hint;
        while (*p && (size_t)k < sizeof msg - 16) {
            const char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            int m = snprintf(msg + k, sizeof msg - (size_t)k, "  hint: %.*s\n", (int)len, p);
            if (m < 0) break;
            k += m;
            if ((size_t)k >= sizeof msg) { k = (int)sizeof msg - 1; break; }
            p = e ? e + 1 : p + len;
        }
    }
    fflush(stdout);
    fputs(msg, stderr);
    fflush(stderr);
    if (error_rank_value > 0 && strcmp(kind, "error") != 0) return;
    size_t len = strlen(msg);
    if (error_log_fd >= 0) {
        error_write_log(msg, len);
    } else if (error_backlog_len + len <= sizeof error_backlog) {
        memcpy(error_backlog + error_backlog_len, msg, len);
        error_backlog_len += len;
    }
}

void error_exit(int code, const char *file, int line, const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vreport("error", file, line, hint, fmt, ap);
    va_end(ap);
    if (error_abort_fn) error_abort_fn(code);
    exit(code);
}

void error_warn(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vreport("warning", file, line, NULL, fmt, ap);
    va_end(ap);
}

void *error_check_malloc(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) error_exit(RS_EXIT_FAIL, file, line, NULL, "malloc(%zu) failed: out of host memory", n);
    return p;
}

void *error_check_calloc(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) error_exit(RS_EXIT_FAIL, file, line, NULL, "calloc(%zu, %zu) failed: out of host memory", n, size);
    return p;
}

void *error_check_realloc(void *p, size_t n, const char *file, int line) {
    void *q = realloc(p, n ? n : 1);
    if (!q) error_exit(RS_EXIT_FAIL, file, line, NULL, "realloc(%zu) failed: out of host memory", n);
    return q;
}

char *error_check_strdup(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *p = error_check_malloc(n, file, line);
    memcpy(p, s, n);
    return p;
}
