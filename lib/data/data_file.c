/*
 * data_file.c — what every file of the data module and its readers share, below all of them (data.h
 * declares it): the error messages (data_error fills a caller's buffer with a message and a hint and
 * returns an exit code; data_fail exits with it) and opening a file safely (data_open_file: a regular
 * file, never a FIFO or a device, opened without blocking; data_map_file: the same, mapped read-only,
 * for the Megatron index and the inputs of `ringscan data bytes`), and reading an opened token file
 * (data_source_read: pread, the file's change noticed by data_source_check; data_dtype_bytes).
 *
 * Callers: data_source.c, data_flat.c, data_megatron.c, data_pack.c, data_bytes.c, data_synth.c.
 */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

/* ---- messages ------------------------------------------------------------ */

int data_error(char *err, size_t n, int code, const char *hint, const char *fmt, ...) {
    if (!err || n == 0) return code;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(err, n, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k < n && hint && *hint) snprintf(err + k, n - (size_t)k, "\n%s", hint);
    return code;
}

noreturn void data_fail(const char *err) {
    const char *nl = strchr(err, '\n');
    char msg[2048];
    snprintf(msg, sizeof msg, "%.*s", nl ? (int)(nl - err) : (int)strlen(err), err);
    error_exit(RS_EXIT_USAGE, __FILE__, __LINE__, nl ? nl + 1 : NULL, "%s", msg);
}

/* ---- files ---------------------------------------------------------------- */

int data_open_file(const char *path, const char *what, int *fd, struct stat *st, char *err, size_t n) {
    *fd = -1;
    if (stat(path, st) != 0) {
        int e = errno;
        if (e == ENOENT)
            return data_error(err, n, RS_EXIT_USAGE, "check the path (data.path in the config, or the argument)",
                              "%s %s does not exist", what, path);
        return data_error(err, n, RS_EXIT_USAGE, NULL, "%s %s cannot be opened: %s", what, path, strerror(e));
    }
    const char *kind = S_ISFIFO(st->st_mode) ? "a FIFO (named pipe)" : S_ISDIR(st->st_mode) ? "a directory"
                       : S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) ? "a device" : S_ISSOCK(st->st_mode) ? "a socket"
                                                                                                       : NULL;
    if (kind)
        return data_error(err, n, RS_EXIT_USAGE, "token files are read at random places: give a regular file",
                          "%s %s is not a regular file: it is %s", what, path, kind);
    /* O_NONBLOCK: if the path became a FIFO since stat, open returns instead of waiting for a writer */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0) {
        int e = errno;
        return data_error(err, n, RS_EXIT_USAGE, NULL, "%s %s cannot be opened: %s", what, path, strerror(e));
    }
    if (fstat(f, st) != 0 || !S_ISREG(st->st_mode)) {
        int e = errno;
        close(f);
        return data_error(err, n, RS_EXIT_USAGE, NULL, "%s %s is not a regular file (%s)", what, path,
                          e ? strerror(e) : "it changed while being opened");
    }
    *fd = f;
    return 0;
}

int data_map_file(const char *path, const char *what, void **ptr, size_t *len, char *err, size_t n) {
    *ptr = NULL;
    *len = 0;
    int fd;
    struct stat st;
    int rc = data_open_file(path, what, &fd, &st, err, n);
    if (rc) return rc;
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return data_error(err, n, RS_EXIT_FAIL, NULL, "%s %s: mmap of %lld bytes failed: %s", what, path,
                              (long long)st.st_size, strerror(e));
        }
        *ptr = p;
        *len = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

/* ---- reading a token file ---------------------------------------------------- */

const char *const data_dtype_names[DATA_DTYPE_COUNT + 1] = {"uint8", "int8",   "int16", "uint16",
                                                            "int32", "uint32", "int64", NULL};

int data_dtype_bytes(DataDtype dt) {
    switch (dt) {
    case DATA_DTYPE_U8:
    case DATA_DTYPE_I8: return 1;
    case DATA_DTYPE_I16:
    case DATA_DTYPE_U16: return 2;
    case DATA_DTYPE_I32:
    case DATA_DTYPE_U32: return 4;
    case DATA_DTYPE_I64: return 8;
    default: RS_FATAL("data_dtype_bytes: dtype %d out of range", (int)dt);
    }
}

int64_t data_mtime_ns(const struct stat *st) {
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* "2026-03-01 12:00:00.123456789" (local time) */
static void data_fmt_mtime(int64_t ns, char *buf, size_t n) {
    time_t s = (time_t)(ns / 1000000000);
    struct tm tm;
    char day[32] = "?";
    if (localtime_r(&s, &tm)) strftime(day, sizeof day, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(buf, n, "%s.%09lld", day, (long long)(ns % 1000000000));
}

static const char *const data_changed_hint =
    "the data of a run must not change while it runs: nothing was trained on what was read, and the\n"
    "last checkpoint is intact; put the original file back and `ringscan resume` the run";

int data_source_check(const DataSource *src, char *err, size_t n) {
    struct stat st;
    if (fstat(src->fd, &st) != 0)
        return data_error(err, n, RS_EXIT_FAIL, NULL, "data file %s: fstat failed: %s", src->path, strerror(errno));
    int64_t mt = data_mtime_ns(&st), ct = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
    int same = (int64_t)st.st_size == src->fp.bytes && mt == src->fp.mtime_ns;
    if (same && (ct == src->fp.ctime_ns || src->fp.ctime_ns == 0)) return 0;
    char was[64], now[64];
    if (same) { /* size and mtime kept: only the status change time says it was touched */
        data_fmt_mtime(src->fp.ctime_ns, was, sizeof was);
        data_fmt_mtime(ct, now, sizeof now);
        return data_error(err, n, RS_EXIT_USAGE, data_changed_hint,
                          "data file %s changed while the run was reading it: same size (%lld bytes) and mtime, but "
                          "its status change time moved from %s to %s: written in place with the old mtime "
                          "restored (or its owner or permissions changed)",
                          src->path, (long long)src->fp.bytes, was, now);
    }
    data_fmt_mtime(src->fp.mtime_ns, was, sizeof was);
    data_fmt_mtime(mt, now, sizeof now);
    return data_error(err, n, RS_EXIT_USAGE, data_changed_hint,
                      "data file %s changed while the run was reading it: %s (%lld bytes, modified %s when opened; "
                      "now %lld bytes, modified %s)",
                      src->path, (int64_t)st.st_size < src->fp.bytes ? "truncated" : "overwritten",
                      (long long)src->fp.bytes, was, (long long)st.st_size, now);
}

int data_source_read(const DataSource *src, void *buf, size_t len, int64_t off, char *err, size_t n) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(src->fd, (char *)buf + got, len - got, (off_t)(off + (int64_t)got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return data_error(err, n, RS_EXIT_FAIL, NULL, "data file %s: read of %zu bytes at offset %lld failed: %s",
                              src->path, len, (long long)off, strerror(errno));
        if (r == 0) { /* the file is shorter than when it was opened */
            int rc = data_source_check(src, err, n);
            if (rc) return rc;
            return data_error(err, n, RS_EXIT_USAGE, data_changed_hint,
                              "data file %s: end of file at byte %lld, expected %lld bytes", src->path,
                              (long long)(off + (int64_t)got), (long long)src->fp.bytes);
        }
        got += (size_t)r;
    }
    return 0;
}
