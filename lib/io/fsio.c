/*
 * fsio.c — durable file-system steps (see fsio.h): full writes and reads,
 * fsync of files and directories, write-to-temporary-then-rename, file crc32
 * (zlib), and removal of a directory tree through directory descriptors (so a
 * symlink inside a checkpoint directory is removed, never followed).
 */
#include "fsio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"

#define FSIO_CHUNK ((int64_t)1 << 22) /* 4 MiB per read/write call */

void fsio_errf(char *err, size_t err_len, const char *fmt, ...) {
    if (!err || err_len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

int fsio_path(char *dst, size_t cap, char *err, size_t err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) {
        fsio_errf(err, err_len, "path too long (more than %zu bytes): %.200s...", cap - 1, dst);
        return RS_EXIT_USAGE;
    }
    return 0;
}

int fsio_write_all(int fd, const void *buf, int64_t n) {
    const char *p = buf;
    while (n > 0) {
        size_t want = (size_t)(n < FSIO_CHUNK ? n : FSIO_CHUNK);
        ssize_t w = write(fd, p, want);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        p += w;
        n -= w;
    }
    return 0;
}

int fsio_append_record(int fd, const char *path, const void *buf, int64_t n, char *err, size_t err_len) {
    off_t start = lseek(fd, 0, SEEK_END);
    if (start < 0) {
        fsio_errf(err, err_len, "%s: cannot find its end: %s", path, strerror(errno));
        return RS_EXIT_FAIL;
    }
    int e = fsio_write_all(fd, buf, n);
    if (!e) return 0;
    if (ftruncate(fd, start) == 0)
        fsio_errf(err, err_len, "%s: write of %lld bytes failed: %s (the partial record was cut off: the file ends "
                                "with its last whole record)", path, (long long)n, strerror(e));
    else
        fsio_errf(err, err_len, "%s: write of %lld bytes failed: %s; cutting the partial record off failed too (%s): "
                                "the bytes from offset %lld on are a partial record", path, (long long)n, strerror(e),
                  strerror(errno), (long long)start);
    return RS_EXIT_FAIL;
}

int fsio_pread_all(int fd, void *buf, int64_t n, int64_t offset, int64_t *got) {
    char *p = buf;
    int64_t done = 0;
    while (done < n) {
        int64_t left = n - done;
        size_t want = (size_t)(left < FSIO_CHUNK ? left : FSIO_CHUNK);
        ssize_t r = pread(fd, p + done, want, (off_t)(offset + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            if (got) *got = done;
            return errno;
        }
        if (r == 0) {
            if (got) *got = done;
            return -1;
        }
        done += r;
    }
    if (got) *got = done;
    return 0;
}

int fsio_fsync_dir(const char *dir, char *err, size_t err_len) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        fsio_errf(err, err_len, "%s: open of the directory for fsync failed: %s", dir, strerror(errno));
        return RS_EXIT_FAIL;
    }
    int rc = 0;
    if (fsync(fd) != 0 && errno != EINVAL) {
        fsio_errf(err, err_len, "%s: fsync of the directory failed: %s", dir, strerror(errno));
        rc = RS_EXIT_FAIL;
    }
    close(fd);
    return rc;
}

int fsio_dirname(char *dst, size_t cap, const char *path, char *err, size_t err_len) {
    const char *slash = strrchr(path, '/');
    if (!slash) return fsio_path(dst, cap, err, err_len, ".");
    if (slash == path) return fsio_path(dst, cap, err, err_len, "/");
    return fsio_path(dst, cap, err, err_len, "%.*s", (int)(slash - path), path);
}

int fsio_write_file_durable(const char *path, const void *buf, int64_t n, char *err, size_t err_len) {
    char tmp[4096];
    int rc = fsio_path(tmp, sizeof tmp, err, err_len, "%s.tmp.%ld", path, (long)getpid());
    if (rc) return rc;
    return fsio_write_file_via(tmp, path, buf, n, err, err_len);
}

int fsio_write_file_via(const char *tmp, const char *path, const void *buf, int64_t n, char *err, size_t err_len) {
    char dir[4096];
    int rc = fsio_dirname(dir, sizeof dir, path, err, err_len);
    if (rc) return rc;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fsio_errf(err, err_len, "%s: cannot create: %s", tmp, strerror(errno));
        return RS_EXIT_FAIL;
    }
    int e = fsio_write_all(fd, buf, n);
    if (e) {
        fsio_errf(err, err_len, "%s: write of %lld bytes failed: %s", tmp, (long long)n, strerror(e));
    } else if (fsync(fd) != 0) {
        e = errno;
        fsio_errf(err, err_len, "%s: fsync failed: %s", tmp, strerror(e));
    }
    if (close(fd) != 0 && !e) {
        e = errno;
        fsio_errf(err, err_len, "%s: close failed: %s", tmp, strerror(e));
    }
    if (!e && rename(tmp, path) != 0) {
        e = errno;
        fsio_errf(err, err_len, "rename %s -> %s failed: %s", tmp, path, strerror(e));
    }
    if (e) {
        unlink(tmp);
        return RS_EXIT_FAIL;
    }
    return fsio_fsync_dir(dir, err, err_len);
}

int fsio_open_regular(const char *path, int *fd, int *missing, char *err, size_t err_len) {
    *fd = -1;
    if (missing) *missing = 0;
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0) {
        int e = errno;
        if (missing && e == ENOENT) *missing = 1;
        fsio_errf(err, err_len, "%s: cannot open: %s", path, strerror(e));
        return e == ENOENT || e == ENOTDIR || e == EISDIR ? RS_EXIT_USAGE : RS_EXIT_FAIL;
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        fsio_errf(err, err_len, "%s: fstat failed: %s", path, strerror(errno));
        close(f);
        return RS_EXIT_FAIL;
    }
    if (!S_ISREG(st.st_mode)) {
        const char *kind = S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)" : S_ISDIR(st.st_mode) ? "a directory"
                           : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : S_ISSOCK(st.st_mode) ? "a socket"
                                                                                                         : "not a file";
        fsio_errf(err, err_len, "%s: expected a regular file, found %s", path, kind);
        close(f);
        return RS_EXIT_USAGE;
    }
    int flags = fcntl(f, F_GETFL);
    if (flags < 0 || fcntl(f, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        fsio_errf(err, err_len, "%s: fcntl failed: %s", path, strerror(errno));
        close(f);
        return RS_EXIT_FAIL;
    }
    *fd = f;
    return 0;
}

FILE *fsio_fopen_regular(const char *path, int *missing, int *rc, char *err, size_t err_len) {
    int fd, r = fsio_open_regular(path, &fd, missing, err, err_len);
    FILE *f = r ? NULL : fdopen(fd, "r");
    if (!r && !f) {
        fsio_errf(err, err_len, "%s: fdopen failed: %s", path, strerror(errno));
        close(fd);
        r = RS_EXIT_FAIL;
    }
    if (rc) *rc = r;
    return f;
}

int fsio_read_file(const char *path, int64_t max_bytes, char **out, int64_t *out_len, int *missing, char *err,
                   size_t err_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    int fd, rc = fsio_open_regular(path, &fd, missing, err, err_len);
    if (rc) return rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fsio_errf(err, err_len, "%s: fstat failed: %s", path, strerror(errno));
        close(fd);
        return RS_EXIT_FAIL;
    }
    if ((int64_t)st.st_size > max_bytes) {
        fsio_errf(err, err_len, "%s: %lld bytes, expected at most %lld", path, (long long)st.st_size,
                  (long long)max_bytes);
        close(fd);
        return RS_EXIT_USAGE;
    }
    int64_t n = (int64_t)st.st_size, got = 0;
    char *buf = RS_MALLOC((size_t)n + 1);
    int e = fsio_pread_all(fd, buf, n, 0, &got);
    close(fd);
    if (e) {
        if (e == -1)
            fsio_errf(err, err_len, "%s: file shrank while reading (%lld of %lld bytes)", path, (long long)got,
                      (long long)n);
        else
            fsio_errf(err, err_len, "%s: read failed: %s", path, strerror(e));
        free(buf);
        return RS_EXIT_FAIL;
    }
    buf[n] = 0;
    *out = buf;
    if (out_len) *out_len = n;
    return 0;
}

int fsio_crc32_file(const char *path, int64_t *size, uint32_t *crc, char *err, size_t err_len) {
    int fd, rc = fsio_open_regular(path, &fd, NULL, err, err_len);
    if (rc) return rc;
    char *buf = RS_MALLOC((size_t)FSIO_CHUNK);
    uLong c = crc32_z(0L, Z_NULL, 0);
    int64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, (size_t)FSIO_CHUNK);
        if (r < 0) {
            if (errno == EINTR) continue;
            fsio_errf(err, err_len, "%s: read failed at byte %lld: %s", path, (long long)total, strerror(errno));
            rc = RS_EXIT_FAIL;
            break;
        }
        if (r == 0) break;
        c = crc32_z(c, (const Bytef *)buf, (z_size_t)r);
        total += r;
    }
    free(buf);
    close(fd);
    if (rc) return rc;
    *size = total;
    *crc = (uint32_t)c;
    return 0;
}

/* Empties the directory open as `fd` (closed here), then the caller removes it. */
static int fsio_empty_dir(int fd, const char *path, char *err, size_t err_len) {
    DIR *d = fdopendir(fd);
    if (!d) {
        fsio_errf(err, err_len, "%s: fdopendir failed: %s", path, strerror(errno));
        close(fd);
        return RS_EXIT_FAIL;
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (errno = 0, de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        struct stat st;
        if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) continue;
            fsio_errf(err, err_len, "%s/%s: stat failed: %s", path, de->d_name, strerror(errno));
            rc = RS_EXIT_FAIL;
            break;
        }
        if (S_ISDIR(st.st_mode)) {
            char sub[4096];
            rc = fsio_path(sub, sizeof sub, err, err_len, "%s/%s", path, de->d_name);
            if (rc) break;
            int cfd = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (cfd < 0) {
                fsio_errf(err, err_len, "%s: open failed: %s", sub, strerror(errno));
                rc = RS_EXIT_FAIL;
                break;
            }
            rc = fsio_empty_dir(cfd, sub, err, err_len);
            if (rc == 0 && unlinkat(fd, de->d_name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
                fsio_errf(err, err_len, "%s: rmdir failed: %s", sub, strerror(errno));
                rc = RS_EXIT_FAIL;
            }
        } else if (unlinkat(fd, de->d_name, 0) != 0 && errno != ENOENT) {
            fsio_errf(err, err_len, "%s/%s: unlink failed: %s", path, de->d_name, strerror(errno));
            rc = RS_EXIT_FAIL;
        }
    }
    if (rc == 0 && errno != 0) {
        fsio_errf(err, err_len, "%s: readdir failed: %s", path, strerror(errno));
        rc = RS_EXIT_FAIL;
    }
    closedir(d);
    return rc;
}

int fsio_remove_tree(const char *path, char *err, size_t err_len) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        fsio_errf(err, err_len, "%s: stat failed: %s", path, strerror(errno));
        return RS_EXIT_FAIL;
    }
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT) {
            fsio_errf(err, err_len, "%s: unlink failed: %s", path, strerror(errno));
            return RS_EXIT_FAIL;
        }
        return 0;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        fsio_errf(err, err_len, "%s: open failed: %s", path, strerror(errno));
        return RS_EXIT_FAIL;
    }
    int rc = fsio_empty_dir(fd, path, err, err_len);
    if (rc) return rc;
    if (rmdir(path) != 0 && errno != ENOENT) {
        fsio_errf(err, err_len, "%s: rmdir failed: %s", path, strerror(errno));
        return RS_EXIT_FAIL;
    }
    return 0;
}

/* Creates `dir` and its missing parents, one component at a time; `for_path`
 * (the file or directory they are made for) only goes into messages. The
 * parent of each new directory is fsynced. `made` as in fsio_mkdirs_parent.
 * On failure errno says why (ENOTDIR: a component is not a directory). */
static int fsio_mkdirs_walk(char *dir, const char *for_path, char *made, size_t made_cap, char *err,
                            size_t err_len) {
    if (made && made_cap) made[0] = 0;
    int recorded = 0; /* the outermost new directory is in `made` ("" if it did not fit: nothing taken back) */
    size_t n = strlen(dir);
    for (size_t i = 1; i <= n; i++) {
        if ((dir[i] != '/' && dir[i] != 0) || dir[i - 1] == '/') continue;
        char c = dir[i];
        dir[i] = 0; /* dir is now the prefix up to this component */
        struct stat st;
        int rc = 0;
        if (stat(dir, &st) == 0) {
            if (!S_ISDIR(st.st_mode)) {
                fsio_errf(err, err_len, "%s is not a directory, so %s cannot be created under it", dir, for_path);
                errno = ENOTDIR;
                rc = RS_EXIT_USAGE;
            }
        } else {
            int made_here = errno == ENOENT && mkdir(dir, 0755) == 0; /* EEXIST: made by someone else */
            if (!made_here && errno != EEXIST) {
                int e = errno;
                fsio_errf(err, err_len, "cannot create the directory %s (for %s): %s", dir, for_path, strerror(e));
                rc = e == ENOSPC || e == EDQUOT || e == EIO ? RS_EXIT_FAIL : RS_EXIT_USAGE;
                errno = e;
            } else if (made_here) {
                if (made && made_cap && !recorded++ && (size_t)snprintf(made, made_cap, "%s", dir) >= made_cap)
                    made[0] = 0;
                char parent[PATH_MAX];
                if (fsio_dirname(parent, sizeof parent, dir, err, err_len) != 0 ||
                    fsio_fsync_dir(parent, err, err_len) != 0)
                    rc = RS_EXIT_FAIL;
            }
        }
        dir[i] = c;
        if (rc) return rc;
    }
    return 0;
}

int fsio_mkdirs_parent(const char *path, char *made, size_t made_cap, char *err, size_t err_len) {
    char dir[PATH_MAX];
    if (made && made_cap) made[0] = 0;
    int rc = fsio_dirname(dir, sizeof dir, path, err, err_len);
    return rc ? rc : fsio_mkdirs_walk(dir, path, made, made_cap, err, err_len);
}

void fsio_rmdirs_made(const char *path, const char *made) {
    if (!made || !made[0]) return;
    char dir[PATH_MAX];
    if (fsio_dirname(dir, sizeof dir, path, NULL, 0) != 0) return;
    size_t keep = strlen(made);
    /* dir runs from the innermost directory out to `made`; rmdir fails on the first one not empty */
    while (strlen(dir) >= keep && rmdir(dir) == 0 && strlen(dir) > keep) {
        char *slash = strrchr(dir, '/');
        if (!slash) break;
        *slash = 0;
    }
}

int fsio_mkdirs(const char *path) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return fsio_mkdirs_walk(tmp, path, NULL, 0, NULL, 0) ? -1 : 0;
}

/* Appends the missing components of `tail` to the resolved prefix in dst: "." dropped, ".." pops a component. */
static int fsio_append_tail(char *dst, size_t cap, const char *tail) {
    for (const char *p = tail; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        size_t len = strlen(dst);
        if (n == 2 && !strncmp(p, "..", 2)) {
            char *slash = strrchr(dst, '/');
            if (slash && slash != dst) *slash = 0;
            else snprintf(dst, cap, "/");
        } else if (n && !(n == 1 && *p == '.')) {
            if (len + n + 2 > cap) return -1;
            snprintf(dst + len, cap - len, "%s%.*s", len && dst[len - 1] == '/' ? "" : "/", (int)n, p);
        }
        p += n + (e != NULL);
    }
    return 0;
}

int fsio_resolve_output(const char *path, int kind, const char *what, char *resolved, size_t cap, char *err,
                        size_t err_len) {
    char cur[PATH_MAX], tail[PATH_MAX] = "", real[PATH_MAX];
    if (!path[0]) {
        fsio_errf(err, err_len, "%s is empty: it must name a %s", what, kind == FSIO_OUT_DIR ? "directory" : "file");
        return RS_EXIT_USAGE;
    }
    if (fsio_path(cur, sizeof cur, err, err_len, "%s", path)) return RS_EXIT_USAGE;
    for (size_t n = strlen(cur); n > 1 && cur[n - 1] == '/'; n--) cur[n - 1] = 0;
    int whole = 1; /* cur is the whole path (nothing peeled off yet) */
    while (!realpath(cur, real)) {
        int e = errno;
        struct stat lst;
        if (e == ENOENT && lstat(cur, &lst) == 0 && S_ISLNK(lst.st_mode)) {
            char to[PATH_MAX];
            ssize_t k = readlink(cur, to, sizeof to - 1);
            to[k > 0 ? k : 0] = 0;
            fsio_errf(err, err_len, "%s %s: %s is a symlink to %s, which does not exist (a dangling symlink); "
                                    "nothing was written", what, path, cur, to);
            return RS_EXIT_USAGE;
        }
        if (e != ENOENT && e != ENOTDIR) { /* ENOTDIR: peeled until the component that is not a directory */
            fsio_errf(err, err_len, "%s %s: cannot resolve %s: %s", what, path, cur, strerror(e));
            return e == ELOOP || e == EACCES || e == ENAMETOOLONG ? RS_EXIT_USAGE : RS_EXIT_FAIL;
        }
        /* peel the last component off into tail */
        char *slash = strrchr(cur, '/');
        const char *base = slash ? slash + 1 : cur;
        char t[PATH_MAX];
        snprintf(t, sizeof t, "%s%s%s", base, tail[0] ? "/" : "", tail);
        snprintf(tail, sizeof tail, "%s", t);
        if (!slash) snprintf(cur, sizeof cur, ".");
        else if (slash == cur) snprintf(cur, sizeof cur, "/");
        else *slash = 0;
        whole = 0;
    }
    if (whole) {
        struct stat st;
        if (stat(real, &st) != 0) {
            fsio_errf(err, err_len, "%s %s: stat failed: %s", what, path, strerror(errno));
            return RS_EXIT_FAIL;
        }
        if (kind == FSIO_OUT_DIR && !S_ISDIR(st.st_mode)) {
            fsio_errf(err, err_len, "%s %s exists and is not a directory; nothing was written", what, path);
            return RS_EXIT_USAGE;
        }
        if (kind == FSIO_OUT_FILE && !S_ISREG(st.st_mode)) {
            fsio_errf(err, err_len, "%s %s is %s, not a file it can replace; nothing was written", what, path,
                      S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                      : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "not a regular file");
            return RS_EXIT_USAGE;
        }
    } else {
        struct stat st; /* the nearest existing ancestor must be a directory (realpath of "file" succeeds) */
        if (stat(real, &st) == 0 && !S_ISDIR(st.st_mode)) {
            fsio_errf(err, err_len, "%s is not a directory, so %s cannot be created under it (%s); nothing was "
                                    "written\n  hint: each directory above the output must be a directory that "
                                    "exists or can be created", cur, path, what);
            return RS_EXIT_USAGE;
        }
    }
    if ((size_t)snprintf(resolved, cap, "%s", real) >= cap || fsio_append_tail(resolved, cap, tail) != 0) {
        fsio_errf(err, err_len, "%s %s: the resolved path is longer than %zu bytes", what, path, cap - 1);
        return RS_EXIT_USAGE;
    }
    return 0;
}

json_t *fsio_json_path(const char *path) {
    json_t *j = json_string(path);
    if (j) return j;
    size_t n = strlen(path), k = 0;
    char *buf = RS_MALLOC(3 * n + 1);
    for (size_t i = 0; i < n; i++) { /* jansson's check, byte by byte: a valid sequence is kept whole */
        size_t len = 1;
        unsigned char c = (unsigned char)path[i];
        if (c >= 0xc2 && c <= 0xf4) len = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
        json_t *seq = len > 1 && i + len <= n ? json_stringn(path + i, len) : NULL;
        if (seq) {
            json_decref(seq);
            memcpy(buf + k, path + i, len);
            k += len;
            i += len - 1;
        } else if (c < 0x80) buf[k++] = (char)c;
        else memcpy(buf + k, "\xef\xbf\xbd", 3), k += 3; /* U+FFFD */
    }
    j = json_stringn(buf, k);
    free(buf);
    return j ? j : json_string("?");
}
