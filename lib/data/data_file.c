/*
 * data_file.c — what every file of the data module and its readers share, below all of them (data.h
 * declares it): the error messages (data_error fills a caller's buffer with a message and a hint and
 * returns an exit code; data_fail exits with it) and opening a file safely (data_open_file: a regular
 * file, never a FIFO or a device, opened without blocking; data_map_file: the same, mapped read-only,
 * for the Megatron index and the inputs of `ringscan data bytes`).
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
