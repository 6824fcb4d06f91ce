/*
 * fsio.h — durable file-system steps shared by the tensor-file writer
 * (safetensors.c) and the checkpoint protocol (ckpt.c).
 *
 * "Durable" means: the bytes are written in full (short writes and EINTR
 * retried), the file is fsynced before it is renamed into place, and the
 * directory that holds the new name is fsynced after the rename. A crash at
 * any moment leaves either the old file or the complete new one under the
 * final name, never a partial file.
 *
 * Every function returns 0 on success or RS_EXIT_FAIL (an I/O failure) /
 * RS_EXIT_USAGE (bad input, e.g. a path too long) and writes one line into
 * `err` that names the path and the failing call with strerror(errno).
 * Nothing here exits or prints.
 *
 * Callers: lib/io/safetensors.c, lib/io/ckpt.c, tests/tools/ckpt_stress.c; the
 * directory steps also lib/data/data_flat.c, lib/run/train.c, bench/bench.c and
 * scheduler/submit.c.
 */
#ifndef RS_FSIO_H
#define RS_FSIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

/* snprintf into err (no-op when err is NULL or err_len is 0). */
void fsio_errf(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* snprintf into dst; RS_EXIT_USAGE with a message when the result does not fit. */
int fsio_path(char *dst, size_t cap, char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Writes all n bytes to fd (retrying short writes and EINTR). Returns 0 or errno. */
int fsio_write_all(int fd, const void *buf, int64_t n);

/* Appends one record (a metrics line, a log line) to the end of the file open as fd: all n bytes, or, when
 * a write fails (ENOSPC, EIO, EFBIG), the file truncated back to its size before, so no partial record is
 * left. 0, or RS_EXIT_FAIL with err naming `path`, the error and what was left (the trim failing too is said
 * with the byte offset where the partial record starts). */
int fsio_append_record(int fd, const char *path, const void *buf, int64_t n, char *err, size_t err_len);

/* Reads exactly n bytes at `offset` (pread, retrying). Returns 0, errno, or -1
 * when the file ends first (*got then says how many bytes were there). */
int fsio_pread_all(int fd, void *buf, int64_t n, int64_t offset, int64_t *got);

/* fsync of a directory, so that names created or renamed in it are durable.
 * EINVAL (a file system that cannot sync directories) counts as success. */
int fsio_fsync_dir(const char *dir, char *err, size_t err_len);

/* The directory part of `path` ("." when it has none) into dst. */
int fsio_dirname(char *dst, size_t cap, const char *path, char *err, size_t err_len);

/* Writes buf to `path` durably: `path.tmp.<pid>`, fsync, rename, fsync the
 * directory. An existing `path` is replaced atomically. */
int fsio_write_file_durable(const char *path, const void *buf, int64_t n, char *err, size_t err_len);
/* The same through a temporary name the caller chooses (same directory). */
int fsio_write_file_via(const char *tmp, const char *path, const void *buf, int64_t n, char *err, size_t err_len);

/* Reads a whole small file (at most max_bytes) into a malloc'd, NUL-terminated
 * buffer. ENOENT gives RS_EXIT_USAGE; *missing is set to 1 in that case when
 * missing is not NULL. */
/* Opens `path` for reading only if it is a regular file: O_NONBLOCK so that a FIFO returns at once instead of
 * waiting for a writer, then fstat; a FIFO, directory, device or socket is refused (RS_EXIT_USAGE, err naming
 * what it is), a missing file too (RS_EXIT_USAGE, *missing = 1 when missing is not NULL). 0 with *fd open
 * (blocking again) otherwise. Every file ringscan reads goes through it. */
int fsio_open_regular(const char *path, int *fd, int *missing, char *err, size_t err_len);
/* The same as a stdio stream ("r"): NULL with err set on a refusal (the code in *rc when rc is not NULL). */
FILE *fsio_fopen_regular(const char *path, int *missing, int *rc, char *err, size_t err_len);
int fsio_read_file(const char *path, int64_t max_bytes, char **out, int64_t *out_len, int *missing, char *err,
                   size_t err_len);

/* Size and zlib crc32 of a whole file, read in chunks. */
int fsio_crc32_file(const char *path, int64_t *size, uint32_t *crc, char *err, size_t err_len);

/* Removes a file or a directory tree (no symlinks followed). A path that is
 * already gone is success. */
int fsio_remove_tree(const char *path, char *err, size_t err_len);

/* mkdir -p: creates `path` and its missing parents (mode 0755); an existing
 * directory is success, an existing non-directory ENOTDIR. Returns -1 with
 * errno set on failure. */
int fsio_mkdirs(const char *path);

/* mkdir -p of the directory that holds the file `path` (the writers of output
 * files call it, so `OUT` may name a directory that does not exist yet). The
 * parent of each new directory is fsynced. `made` (made_cap bytes) receives
 * the outermost directory this call created, "" when none, for
 * fsio_rmdirs_made after a later failure. A component that is not a directory
 * or cannot be created: RS_EXIT_USAGE (RS_EXIT_FAIL for an I/O failure), err
 * naming that component and `path`. */
int fsio_mkdirs_parent(const char *path, char *made, size_t made_cap, char *err, size_t err_len);

/* A path as a JSON string (the one way ringscan puts a path into JSON: jansson escapes it when dumped).
 * JSON holds only UTF-8, so each byte of a path that is not valid UTF-8 becomes U+FFFD instead of the
 * key silently missing (json_string returns NULL there). Never NULL. */
json_t *fsio_json_path(const char *path);

/* What an output path names: a file (written by rename over it) or a directory. */
enum { FSIO_OUT_FILE, FSIO_OUT_DIR };

/* Checks an output path before any work is done, and resolves it: `resolved` (cap bytes) gets the realpath of
 * its nearest existing ancestor (symlinks followed) with the missing components after it ("." dropped, ".."
 * taken lexically: the directories will be created as plain ones). Refused, with err naming `what` and the
 * path: a dangling symlink on the way, an ancestor that is not a directory, an existing path of the other kind
 * (a directory where a file is written, anything but a directory where a directory is; FSIO_OUT_FILE also
 * refuses a FIFO or device, which a rename would replace). RS_EXIT_USAGE for those, RS_EXIT_FAIL when the
 * file system does not answer. Writes nothing. */
int fsio_resolve_output(const char *path, int kind, const char *what, char *resolved, size_t cap, char *err,
                        size_t err_len);

/* Takes back what fsio_mkdirs_parent(path) created: removes the directory of
 * `path` and its parents up to and including `made`, stopping at the first
 * one that is not empty. A no-op when made is "". */
void fsio_rmdirs_made(const char *path, const char *made);

#endif
