/*
 * error.c — fatal errors, warnings and checked allocation (see error.h).
 *
 * The rank is a process-wide value set by comm once MPI is up; the host name
 * is read lazily on the first message. Messages go to stderr in one write so
 * that lines from several ranks do not interleave mid-line.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int error_rank_value = -1;
static void (*error_abort_fn)(int code);

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

static void error_vprint(const char *kind, const char *file, int line, const char *hint,
                         const char *fmt, va_list ap) {
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
}

void error_exit(int code, const char *file, int line, const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vprint("error", file, line, hint, fmt, ap);
    va_end(ap);
    if (error_abort_fn) error_abort_fn(code);
    exit(code);
}

void error_warn(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vprint("warning", file, line, NULL, fmt, ap);
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
