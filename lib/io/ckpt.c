/*
 * ckpt.c — checkpoint save (temporary directory, fsync, rename, LATEST,
 * retention) and load (verify LATEST's directory, fall back to older ones).
 * The protocol and its guarantees are described in ckpt.h; durable file
 * steps are in fsio.c, tensor files in safetensors.c.
 */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "fsio.h"

#define CKPT_MANIFEST_MAX ((int64_t)64 << 20)
#define CKPT_MSG_MAX 2048

void (*ckpt_save_hook)(const char *stage, int64_t step) = NULL;

static void ckpt_stage(const char *stage, int64_t step) {
    if (ckpt_save_hook) ckpt_save_hook(stage, step);
}

/* ---- names ---------------------------------------------------------------- */

/* "step_NNNNNNNN" -> N; anything else -> -1. */
static int64_t ckpt_parse_step_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    int64_t s = 0;
    for (int i = 5; i < 13; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        s = s * 10 + (name[i] - '0');
    }
    return name[13] == 0 ? s : -1;
}

static int ckpt_file_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 200 || name[0] == '.' || !strcmp(name, CKPT_MANIFEST)) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                 c == '_' || c == '-';
        if (!ok) return 0;
    }
    return 1;
}

/* Left by a save that did not finish: removed by the next save. */
static int ckpt_is_stale_name(const char *name) {
    return (!strncmp(name, "step_", 5) && strstr(name, ".tmp.") != NULL) || !strncmp(name, "LATEST.tmp", 10);
}

static int ckpt_cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The steps of the step_NNNNNNNN directories in ckdir (those holding a
 * manifest when require_manifest), ascending. A missing ckdir gives none. */
static int ckpt_scan(const char *ckdir, int require_manifest, int64_t **steps, int64_t *n, char *err,
                     size_t err_len) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(ckdir);
    if (!d) {
        if (errno == ENOENT) return 0;
        fsio_errf(err, err_len, "%s: cannot list: %s", ckdir, strerror(errno));
        return RS_EXIT_FAIL;
    }
    int64_t cap = 0;
    struct dirent *de;
    while ((errno = 0, de = readdir(d)) != NULL) {
        int64_t s = ckpt_parse_step_name(de->d_name);
        if (s < 0) continue;
        char p[CKPT_PATH_MAX];
        struct stat st;
        if (fsio_path(p, sizeof p, NULL, 0, "%s/%s", ckdir, de->d_name) != 0) continue;
        if (lstat(p, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (require_manifest) {
            if (fsio_path(p, sizeof p, NULL, 0, "%s/%s/%s", ckdir, de->d_name, CKPT_MANIFEST) != 0) continue;
            if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            *steps = RS_REALLOC(*steps, sizeof(int64_t) * (size_t)cap);
        }
        (*steps)[(*n)++] = s;
    }
    int e = errno;
    closedir(d);
    if (e) {
        fsio_errf(err, err_len, "%s: readdir failed: %s", ckdir, strerror(e));
        free(*steps);
        *steps = NULL;
        *n = 0;
        return RS_EXIT_FAIL;
    }
    if (*n > 1) qsort(*steps, (size_t)*n, sizeof(int64_t), ckpt_cmp_i64);
    return 0;
}

int ckpt_list_steps(const char *run_dir, int64_t **steps, int64_t *n, char *err, size_t err_len) {
    char ckdir[CKPT_PATH_MAX];
    int rc = fsio_path(ckdir, sizeof ckdir, err, err_len, "%s/ckpt", run_dir);
    if (rc) {
        *steps = NULL;
        *n = 0;
        return rc;
    }
    return ckpt_scan(ckdir, 1, steps, n, err, err_len);
}

/* The step that ckdir/LATEST names; -1 when it is missing (*missing = 1),
 * unreadable or malformed (the reason in msg). */
static int64_t ckpt_read_latest(const char *ckdir, int *missing, char *msg, size_t msg_len) {
    char p[CKPT_PATH_MAX], *text = NULL;
    *missing = 0;
    if (fsio_path(p, sizeof p, msg, msg_len, "%s/LATEST", ckdir) != 0) return -1;
    if (fsio_read_file(p, 64, &text, NULL, missing, msg, msg_len) != 0) return -1;
    size_t len = strlen(text);
    if (len > 0 && text[len - 1] == '\n') text[--len] = 0;
    int64_t step = ckpt_parse_step_name(text);
    if (step < 0) {
        for (size_t i = 0; i < len; i++)
            if (text[i] < 0x20 || text[i] > 0x7e) text[i] = '?';
        fsio_errf(msg, msg_len, "%s: expected 'step_NNNNNNNN', found '%.40s'", p, text);
    }
    free(text);
    return step;
}

/* crc32 of the manifest's compact, key-sorted JSON without its "crc32" key. */
static int ckpt_manifest_crc(const json_t *manifest, uint32_t *crc) {
    json_t *copy = json_copy((json_t *)manifest);
    if (!copy) return -1;
    json_object_del(copy, "crc32");
    char *text = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(copy);
    if (!text) return -1;
    *crc = (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), (const Bytef *)text, strlen(text));
    free(text);
    return 0;
}

/* ---- save ----------------------------------------------------------------- */

static int ckpt_check_save_args(const char *run_dir, int64_t step, const CkptFile *files, int64_t n_files,
                                const json_t *state, int64_t keep, char *err, size_t err_len) {
    if (step < 0 || step > CKPT_MAX_STEP) {
        fsio_errf(err, err_len, "%s: checkpoint step %lld out of range 0..%d", run_dir, (long long)step,
                  CKPT_MAX_STEP);
        return RS_EXIT_USAGE;
    }
    if (keep < 1) {
        fsio_errf(err, err_len, "%s: keep = %lld, expected at least 1 checkpoint to keep", run_dir, (long long)keep);
        return RS_EXIT_USAGE;
    }
    if (state && !json_is_object(state)) {
        fsio_errf(err, err_len, "%s: checkpoint state must be a JSON object", run_dir);
        return RS_EXIT_USAGE;
    }
    if (n_files < 0 || (n_files > 0 && !files)) {
        fsio_errf(err, err_len, "%s: bad checkpoint file list (n = %lld)", run_dir, (long long)n_files);
        return RS_EXIT_USAGE;
    }
    for (int64_t i = 0; i < n_files; i++) {
        if (!files[i].name || !ckpt_file_name_ok(files[i].name)) {
            fsio_errf(err, err_len, "%s: checkpoint file name '%s' must be made of [A-Za-z0-9._-], not start with "
                      "'.', and not be %s", run_dir, files[i].name ? files[i].name : "(null)", CKPT_MANIFEST);
            return RS_EXIT_USAGE;
        }
        for (int64_t j = 0; j < i; j++)
            if (!strcmp(files[i].name, files[j].name)) {
                fsio_errf(err, err_len, "%s: checkpoint file name '%s' given twice", run_dir, files[i].name);
                return RS_EXIT_USAGE;
            }
    }
    return 0;
}

/* Removes what a crashed (or killed) save left in ckdir; their names, space-separated, into
 * `names` when not NULL. */
static int ckpt_remove_stale(const char *ckdir, char *names, size_t names_len, char *err, size_t err_len) {
    if (names && names_len) names[0] = 0;
    DIR *d = opendir(ckdir);
    if (!d) {
        if (errno == ENOENT) return 0;
        fsio_errf(err, err_len, "%s: cannot list: %s", ckdir, strerror(errno));
        return RS_EXIT_FAIL;
    }
    int rc = 0;
    size_t k = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (!ckpt_is_stale_name(de->d_name)) continue;
        char p[CKPT_PATH_MAX];
        rc = fsio_path(p, sizeof p, err, err_len, "%s/%s", ckdir, de->d_name);
        if (rc == 0) rc = fsio_remove_tree(p, err, err_len);
        if (rc == 0 && names && k < names_len)
            k += (size_t)snprintf(names + k, names_len - k, "%s%s", k ? " " : "", de->d_name);
    }
    closedir(d);
    return rc;
}

/* *fd = ckpt/.lock (LOCK_PATH) opened and held exclusively: one process saves or clears a run's checkpoints at a
 * time. Another holder: RS_EXIT_USAGE naming CKDIR. */
static int ckpt_lock_take(int *fd, const char *lock_path, const char *ckdir, char *err, size_t err_len) {
    *fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) {
        fsio_errf(err, err_len, "%s: cannot open: %s", lock_path, strerror(errno));
        return RS_EXIT_FAIL;
    }
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(*fd);
        *fd = -1;
        if (e == EWOULDBLOCK) {
            fsio_errf(err, err_len, "%s: another process is saving checkpoints into this run directory", ckdir);
            return RS_EXIT_USAGE;
        }
        fsio_errf(err, err_len, "%s: flock failed: %s", lock_path, strerror(e));
        return RS_EXIT_FAIL;
    }
    return 0;
}

int ckpt_remove_leftovers(const char *run_dir, char *names, size_t names_len, char *err, size_t err_len) {
    char ckdir[CKPT_PATH_MAX], lock[CKPT_PATH_MAX];
    if (names && names_len) names[0] = 0;
    int rc = fsio_path(ckdir, sizeof ckdir, err, err_len, "%s/ckpt", run_dir);
    if (rc == 0) rc = fsio_path(lock, sizeof lock, err, err_len, "%s/.lock", ckdir);
    if (rc) return rc;
    struct stat st;
    if (stat(ckdir, &st) != 0 && errno == ENOENT) return 0; /* nothing saved yet */
    int fd;
    rc = ckpt_lock_take(&fd, lock, ckdir, err, err_len); /* as ckpt_save: never beside a running save */
    if (rc == RS_EXIT_USAGE) { /* another process is saving: the temporaries may be its own; a save of this run
                                  meets the lock and says so */
        err[0] = 0;
        return 0;
    }
    if (rc) return rc;
    rc = ckpt_remove_stale(ckdir, names, names_len, err, err_len);
    close(fd);
    return rc;
}

/* Moves tmp to final; when final exists it is swapped out atomically and its
 * old contents are left at *old (to be removed once the swap is durable). */
static int ckpt_install_dir(const char *tmp, const char *final, char *old, size_t old_cap, char *err,
                            size_t err_len) {
    old[0] = 0;
    struct stat st;
    if (lstat(final, &st) != 0) {
        if (errno != ENOENT) {
            fsio_errf(err, err_len, "%s: stat failed: %s", final, strerror(errno));
            return RS_EXIT_FAIL;
        }
        if (rename(tmp, final) != 0) {
            fsio_errf(err, err_len, "rename %s -> %s failed: %s", tmp, final, strerror(errno));
            return RS_EXIT_FAIL;
        }
        return 0;
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        return fsio_path(old, old_cap, err, err_len, "%s", tmp);
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
        fsio_errf(err, err_len, "renameat2(RENAME_EXCHANGE) %s <-> %s failed: %s", tmp, final, strerror(errno));
        return RS_EXIT_FAIL;
    }
    /* No atomic exchange on this file system: two renames (see ckpt.h, Limits). */
    int rc = fsio_path(old, old_cap, err, err_len, "%s.old", tmp);
    if (rc) return rc;
    if (rename(final, old) != 0) {
        fsio_errf(err, err_len, "rename %s -> %s failed: %s", final, old, strerror(errno));
        old[0] = 0;
        return RS_EXIT_FAIL;
    }
    if (rename(tmp, final) != 0) {
        fsio_errf(err, err_len, "rename %s -> %s failed: %s", tmp, final, strerror(errno));
        return RS_EXIT_FAIL;
    }
    return 0;
}

/* Deletes the complete checkpoints older than `step` beyond the newest keep-1.
 * Only after `step` is complete and named by LATEST: never before a save,
 * because an older checkpoint may be the only one that verifies. Failures
 * are warnings: the new checkpoint is already complete. */
static void ckpt_retain(const char *ckdir, int64_t step, int64_t keep) {
    char err[CKPT_MSG_MAX];
    int64_t *steps = NULL, n = 0;
    if (ckpt_scan(ckdir, 1, &steps, &n, err, sizeof err) != 0) {
        RS_WARN("checkpoint retention skipped: %s", err);
        return;
    }
    int64_t n_older = 0;
    while (n_older < n && steps[n_older] < step) n_older++;
    for (int64_t i = 0; i + (keep - 1) < n_older; i++) { /* oldest first */
        char src[CKPT_PATH_MAX], dst[CKPT_PATH_MAX];
        if (fsio_path(src, sizeof src, err, sizeof err, "%s/step_%08lld", ckdir, (long long)steps[i]) ||
            fsio_path(dst, sizeof dst, err, sizeof err, "%s/step_%08lld.tmp.%ld.del", ckdir, (long long)steps[i],
                      (long)getpid())) {
            RS_WARN("checkpoint retention: %s", err);
            break;
        }
        if (rename(src, dst) != 0) {
            RS_WARN("checkpoint retention: rename %s -> %s failed: %s", src, dst, strerror(errno));
            break;
        }
        if (fsio_fsync_dir(ckdir, err, sizeof err) != 0) {
            RS_WARN("checkpoint retention: %s", err);
            break;
        }
        ckpt_stage("retention_renamed", steps[i]);
        if (fsio_remove_tree(dst, err, sizeof err) != 0) {
            RS_WARN("checkpoint retention: %s (removed on the next save)", err);
            break;
        }
    }
    free(steps);
}

/* Under the lock: clears a crashed save's leftovers and creates the step's temporary directory. */
static int ckpt_begin_locked(CkptSave *sv, char *err, size_t err_len) {
    int rc = ckpt_remove_stale(sv->ckdir, NULL, 0, err, err_len);
    if (rc == 0)
        rc = fsio_path(sv->tmp, sizeof sv->tmp, err, err_len, "%s/step_%08lld.tmp.%ld", sv->ckdir,
                       (long long)sv->step, (long)getpid());
    if (rc) return rc;
    if (mkdir(sv->tmp, 0755) != 0) {
        fsio_errf(err, err_len, "%s: mkdir failed: %s", sv->tmp, strerror(errno));
        return RS_EXIT_FAIL;
    }
    ckpt_stage("tmp_created", sv->step);
    return 0;
}

/* Under the lock, the temporary directory made: the caller's files, the manifest (those and the files
 * others wrote), the rename into place, LATEST, retention. */
static int ckpt_finish_locked(CkptSave *sv, const CkptFile *files, int64_t n_files, const CkptWritten *written,
                              int64_t n_written, const json_t *state, int64_t keep, char *err, size_t err_len) {
    const char *ckdir = sv->ckdir, *tmp = sv->tmp;
    const int64_t step = sv->step;
    char final[CKPT_PATH_MAX], p[CKPT_PATH_MAX], old[CKPT_PATH_MAX];
    int rc = fsio_path(final, sizeof final, err, err_len, "%s/step_%08lld", ckdir, (long long)step);

    json_t *list = json_array();
    for (int64_t i = 0; i < n_files && rc == 0; i++) {
        StWriteInfo info;
        rc = fsio_path(p, sizeof p, err, err_len, "%s/%s", tmp, files[i].name);
        if (rc == 0)
            rc = safetensors_write_file(p, files[i].tensors, files[i].n_tensors, files[i].metadata, &info, err,
                                        err_len);
        if (rc == 0) {
            json_array_append_new(list, json_pack("{s:s, s:I, s:I}", "name", files[i].name, "size",
                                                  (json_int_t)info.size, "crc32", (json_int_t)info.crc32));
            ckpt_stage("file_written", step);
        }
    }
    for (int64_t i = 0; i < n_written && rc == 0; i++) {
        if (!ckpt_file_name_ok(written[i].name)) {
            fsio_errf(err, err_len, "%s: checkpoint file name '%s' must be made of [A-Za-z0-9._-]", tmp,
                      written[i].name);
            rc = RS_EXIT_USAGE;
            break;
        }
        json_array_append_new(list, json_pack("{s:s, s:I, s:I}", "name", written[i].name, "size",
                                              (json_int_t)written[i].size, "crc32", (json_int_t)written[i].crc32));
    }
    json_t *manifest = json_pack("{s:s, s:i, s:I, s:o, s:o}", "format", CKPT_FORMAT, "version", CKPT_VERSION,
                                 "step", (json_int_t)step, "state",
                                 state ? json_deep_copy(state) : json_object(), "files", list);
    uint32_t crc = 0;
    if (rc == 0 && (!manifest || ckpt_manifest_crc(manifest, &crc) != 0)) {
        fsio_errf(err, err_len, "%s: building the manifest failed (state not serialisable?)", tmp);
        rc = RS_EXIT_USAGE;
    }
    if (rc == 0) {
        json_object_set_new(manifest, "crc32", json_integer((json_int_t)crc));
        char *text = json_dumps(manifest, JSON_INDENT(2));
        rc = fsio_path(p, sizeof p, err, err_len, "%s/%s", tmp, CKPT_MANIFEST);
        if (rc == 0 && !text) {
            fsio_errf(err, err_len, "%s: serialising the manifest failed", p);
            rc = RS_EXIT_USAGE;
        }
        if (rc == 0) {
            size_t len = strlen(text);
            text = RS_REALLOC(text, len + 2);
            text[len] = '\n';
            text[len + 1] = 0;
            rc = fsio_write_file_durable(p, text, (int64_t)len + 1, err, err_len); /* fsyncs tmp/ too */
        }
        free(text);
    }
    json_decref(manifest);
    if (rc == 0) ckpt_stage("manifest_written", step);

    if (rc == 0) rc = ckpt_install_dir(tmp, final, old, sizeof old, err, err_len);
    if (rc) {
        char e2[CKPT_MSG_MAX];
        if (fsio_remove_tree(tmp, e2, sizeof e2) != 0) RS_WARN("cleaning up a failed save: %s", e2);
        return rc;
    }
    rc = fsio_fsync_dir(ckdir, err, err_len);
    if (rc) return rc;
    ckpt_stage("renamed", step);
    if (old[0] && fsio_remove_tree(old, p, sizeof p) != 0)
        RS_WARN("removing the replaced checkpoint: %s (removed on the next save)", p);

    char latest[32], latest_tmp[CKPT_PATH_MAX];
    int len = snprintf(latest, sizeof latest, "step_%08lld\n", (long long)step);
    rc = fsio_path(p, sizeof p, err, err_len, "%s/LATEST", ckdir);
    if (rc == 0) rc = fsio_path(latest_tmp, sizeof latest_tmp, err, err_len, "%s/LATEST.tmp", ckdir);
    if (rc == 0) rc = fsio_write_file_via(latest_tmp, p, latest, len, err, err_len);
    if (rc) return rc;
    ckpt_stage("latest_written", step);

    ckpt_retain(ckdir, step, keep);
    ckpt_stage("retention_done", step);
    return 0;
}

int ckpt_save_begin(CkptSave *sv, const char *run_dir, int64_t step, char *err, size_t err_len) {
    memset(sv, 0, sizeof *sv);
    sv->fd = -1;
    sv->step = step;
    int rc = ckpt_check_save_args(run_dir, step, NULL, 0, NULL, 1, err, err_len);
    if (rc) return rc;
    struct stat st;
    if (stat(run_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fsio_errf(err, err_len, "%s: the run directory does not exist (or is not a directory)", run_dir);
        return RS_EXIT_USAGE;
    }
    char lock[CKPT_PATH_MAX];
    rc = fsio_path(sv->ckdir, sizeof sv->ckdir, err, err_len, "%s/ckpt", run_dir);
    if (rc == 0) rc = fsio_path(lock, sizeof lock, err, err_len, "%s/.lock", sv->ckdir);
    if (rc) return rc;
    if (mkdir(sv->ckdir, 0755) == 0) {
        rc = fsio_fsync_dir(run_dir, err, err_len);
        if (rc) return rc;
    } else if (errno != EEXIST) {
        fsio_errf(err, err_len, "%s: mkdir failed: %s", sv->ckdir, strerror(errno));
        return RS_EXIT_FAIL;
    } else if (stat(sv->ckdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fsio_errf(err, err_len, "%s: expected a directory", sv->ckdir);
        return RS_EXIT_USAGE;
    }
    int fd;
    rc = ckpt_lock_take(&fd, lock, sv->ckdir, err, err_len);
    if (rc) return rc;
    sv->fd = fd;
    rc = ckpt_begin_locked(sv, err, err_len);
    if (rc) {
        close(fd); /* releases the lock */
        sv->fd = -1;
    }
    return rc;
}

int ckpt_save_finish(CkptSave *sv, const CkptFile *files, int64_t n_files, const CkptWritten *written,
                     int64_t n_written, const json_t *state, int64_t keep, char *err, size_t err_len) {
    int rc = ckpt_check_save_args(sv->ckdir, sv->step, files, n_files, state, keep, err, err_len);
    if (rc) ckpt_save_abort(sv);
    else {
        rc = ckpt_finish_locked(sv, files, n_files, written, n_written, state, keep, err, err_len);
        close(sv->fd); /* releases the lock */
        sv->fd = -1;
    }
    return rc;
}

void ckpt_save_abort(CkptSave *sv) {
    if (sv->fd < 0) return;
    char e2[CKPT_MSG_MAX];
    if (sv->tmp[0] && fsio_remove_tree(sv->tmp, e2, sizeof e2) != 0) RS_WARN("cleaning up a failed save: %s", e2);
    close(sv->fd);
    sv->fd = -1;
}

int ckpt_save(const char *run_dir, int64_t step, const CkptFile *files, int64_t n_files, const json_t *state,
              int64_t keep, char *err, size_t err_len) {
    int rc = ckpt_check_save_args(run_dir, step, files, n_files, state, keep, err, err_len);
    if (rc) return rc;
    CkptSave sv;
    rc = ckpt_save_begin(&sv, run_dir, step, err, err_len);
    if (rc == 0) rc = ckpt_save_finish(&sv, files, n_files, NULL, 0, state, keep, err, err_len);
    return rc;
}

void ckpt_close(Ckpt *ck) {
    for (int64_t i = 0; i < ck->n_files; i++) {
        if (ck->files) safetensors_close(&ck->files[i]);
        if (ck->file_names) free(ck->file_names[i]);
    }
    free(ck->files);
    free(ck->file_names);
    free(ck->dir);
    if (ck->manifest) json_decref(ck->manifest);
    memset(ck, 0, sizeof *ck);
}

/* A JSON integer in [lo, hi], or -1 (lo >= 0 everywhere here). */
static int64_t ckpt_json_int(const json_t *v, int64_t lo, int64_t hi) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    return x >= lo && x <= hi ? (int64_t)x : -1;
}

/* Verifies the step directory `dir` and opens its files into ck. */
static int ckpt_open_dir(Ckpt *ck, const char *dir, int64_t step, char *err, size_t err_len) {
    memset(ck, 0, sizeof *ck);
    char p[CKPT_PATH_MAX];
    int rc = fsio_path(p, sizeof p, err, err_len, "%s/%s", dir, CKPT_MANIFEST);
    if (rc) return rc;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fsio_errf(err, err_len, "%s: the directory does not exist", dir);
        return RS_EXIT_USAGE;
    }
    char *text = NULL;
    int64_t len = 0;
    int missing = 0;
    rc = fsio_read_file(p, CKPT_MANIFEST_MAX, &text, &len, &missing, err, err_len);
    if (rc) {
        if (missing) fsio_errf(err, err_len, "%s: no %s (the save did not finish)", dir, CKPT_MANIFEST);
        return RS_EXIT_USAGE;
    }
    json_error_t je;
    json_t *m = json_loadb(text, (size_t)len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!m) {
        fsio_errf(err, err_len, "%s: not valid JSON: %s (line %d, column %d)", p, je.text, je.line, je.column);
        return RS_EXIT_USAGE;
    }
    ck->manifest = m;
    rc = RS_EXIT_USAGE;
    const json_t *fmt = json_object_get(m, "format");
    int64_t version = ckpt_json_int(json_object_get(m, "version"), 0, INT32_MAX);
    int64_t mstep = ckpt_json_int(json_object_get(m, "step"), 0, CKPT_MAX_STEP);
    int64_t mcrc = ckpt_json_int(json_object_get(m, "crc32"), 0, 0xffffffffLL);
    json_t *state = json_object_get(m, "state"), *files = json_object_get(m, "files");
    uint32_t crc = 0;
    if (!json_is_object(m) || !json_is_string(fmt) || strcmp(json_string_value(fmt), CKPT_FORMAT) != 0) {
        fsio_errf(err, err_len, "%s: expected an object with \"format\": \"%s\"", p, CKPT_FORMAT);
    } else if (version != CKPT_VERSION) {
        fsio_errf(err, err_len, "%s: manifest version %lld, this ringscan reads version %d", p, (long long)version,
                  CKPT_VERSION);
    } else if (mcrc < 0 || ckpt_manifest_crc(m, &crc) != 0 || (uint32_t)mcrc != crc) {
        fsio_errf(err, err_len, "%s: manifest checksum mismatch (crc32 stored %s0x%08llx, computed 0x%08x): the "
                  "manifest was modified or corrupted", p, mcrc < 0 ? "(missing) " : "",
                  (unsigned long long)(mcrc < 0 ? 0 : mcrc), crc);
    } else if (mstep < 0) {
        fsio_errf(err, err_len, "%s: \"step\" is missing or outside 0..%d (the directory name says %lld)", p,
                  CKPT_MAX_STEP, (long long)step);
    } else if (mstep != step) {
        fsio_errf(err, err_len, "%s: manifest says step %lld, the directory name says %lld", p, (long long)mstep,
                  (long long)step);
    } else if (!json_is_object(state)) {
        fsio_errf(err, err_len, "%s: \"state\" must be an object", p);
    } else if (!json_is_array(files)) {
        fsio_errf(err, err_len, "%s: \"files\" must be a list", p);
    } else {
        rc = 0;
    }
    if (rc) {
        ckpt_close(ck);
        return rc;
    }
    ck->state = state;
    ck->step = step;
    ck->dir = RS_STRDUP(dir);
    int64_t n = (int64_t)json_array_size(files);
    ck->file_names = RS_CALLOC((size_t)n + 1, sizeof(char *));
    ck->files = RS_CALLOC((size_t)n + 1, sizeof(SafetensorsFile));
    for (int64_t i = 0; i < n && rc == 0; i++) {
        json_t *f = json_array_get(files, (size_t)i);
        const char *name = json_string_value(json_object_get(f, "name"));
        int64_t size = ckpt_json_int(json_object_get(f, "size"), 0, INT64_MAX);
        int64_t fcrc = ckpt_json_int(json_object_get(f, "crc32"), 0, 0xffffffffLL);
        rc = RS_EXIT_USAGE;
        if (!json_is_object(f) || !name || !ckpt_file_name_ok(name) || size < 0 || fcrc < 0) {
            fsio_errf(err, err_len, "%s: files[%lld] must be {\"name\": plain file name, \"size\": bytes, "
                      "\"crc32\": integer}", p, (long long)i);
            break;
        }
        int dup = 0;
        for (int64_t j = 0; j < ck->n_files; j++) dup |= !strcmp(ck->file_names[j], name);
        if (dup) {
            fsio_errf(err, err_len, "%s: file '%s' listed twice", p, name);
            break;
        }
        char fp[CKPT_PATH_MAX];
        rc = fsio_path(fp, sizeof fp, err, err_len, "%s/%s", dir, name);
        if (rc) break;
        rc = RS_EXIT_USAGE;
        if (lstat(fp, &st) != 0) {
            fsio_errf(err, err_len, "%s: listed in the manifest but missing (%s)", fp, strerror(errno));
            break;
        }
        if (!S_ISREG(st.st_mode)) {
            fsio_errf(err, err_len, "%s: expected a regular file", fp);
            break;
        }
        if ((int64_t)st.st_size != size) {
            fsio_errf(err, err_len, "%s: %lld bytes, the manifest says %lld", fp, (long long)st.st_size,
                      (long long)size);
            break;
        }
        int64_t got_size = 0;
        uint32_t got_crc = 0;
        if (fsio_crc32_file(fp, &got_size, &got_crc, err, err_len) != 0) break;
        if (got_size != size || got_crc != (uint32_t)fcrc) {
            fsio_errf(err, err_len, "%s: crc32 0x%08x over %lld bytes, the manifest says 0x%08x over %lld (the file "
                      "is corrupted)", fp, got_crc, (long long)got_size, (uint32_t)fcrc, (long long)size);
            break;
        }
        rc = safetensors_open(&ck->files[i], fp, err, err_len);
        if (rc) {
            rc = RS_EXIT_USAGE;
            break;
        }
        ck->file_names[i] = RS_STRDUP(name);
        ck->n_files++;
    }
    if (rc) ckpt_close(ck);
    return rc;
}

int ckpt_load_dir(Ckpt *ck, const char *dir, int64_t step, char *err, size_t err_len) {
    return ckpt_open_dir(ck, dir, step, err, err_len);
}

int ckpt_verify_dir(const char *dir, int64_t step, json_t **manifest, char *err, size_t err_len) {
    Ckpt ck;
    int rc = ckpt_open_dir(&ck, dir, step, err, err_len);
    if (rc) return rc;
    if (manifest) *manifest = json_incref(ck.manifest);
    ckpt_close(&ck);
    return 0;
}

int ckpt_load(Ckpt *ck, const char *run_dir, char *err, size_t err_len) {
    memset(ck, 0, sizeof *ck);
    char ckdir[CKPT_PATH_MAX], msg[CKPT_MSG_MAX];
    int rc = fsio_path(ckdir, sizeof ckdir, err, err_len, "%s/ckpt", run_dir);
    if (rc) return rc;
    struct stat st;
    if (stat(ckdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fsio_errf(err, err_len, "%s: no checkpoints (%s is not a directory)", run_dir, ckdir);
        return RS_EXIT_USAGE;
    }
    int64_t *steps = NULL, n_steps = 0;
    rc = ckpt_scan(ckdir, 0, &steps, &n_steps, err, err_len);
    if (rc) return rc;

    /* LATEST first. */
    int64_t rejected = 0;
    int missing = 0;
    int64_t latest = ckpt_read_latest(ckdir, &missing, msg, sizeof msg);
    if (latest < 0 && (!missing || n_steps > 0))
        RS_WARN("%s; scanning %s for checkpoints", missing ? "ckpt/LATEST is missing" : msg, ckdir);
    if (latest >= 0) {
        char dir[CKPT_PATH_MAX];
        rc = fsio_path(dir, sizeof dir, err, err_len, "%s/step_%08lld", ckdir, (long long)latest);
        if (rc == 0 && ckpt_open_dir(ck, dir, latest, msg, sizeof msg) == 0) {
            free(steps);
            return 0;
        }
        if (rc) {
            free(steps);
            return rc;
        }
        RS_WARN("checkpoint %s (named by LATEST) failed verification: %s; trying older checkpoints", dir, msg);
        rejected++;
    }
    /* Then the others, newest first: older than LATEST's step when LATEST named one. */
    for (int64_t i = n_steps - 1; i >= 0; i--) {
        if (latest >= 0 && steps[i] >= latest) continue;
        char dir[CKPT_PATH_MAX];
        rc = fsio_path(dir, sizeof dir, err, err_len, "%s/step_%08lld", ckdir, (long long)steps[i]);
        if (rc) break;
        if (ckpt_open_dir(ck, dir, steps[i], msg, sizeof msg) == 0) {
            ck->n_rejected = rejected;
            free(steps);
            return 0;
        }
        RS_WARN("checkpoint %s failed verification: %s; trying an older one", dir, msg);
        rejected++;
    }
    free(steps);
    if (rc) return rc;
    if (rejected == 0)
        fsio_errf(err, err_len, "%s: no checkpoints (no LATEST and no step_NNNNNNNN directories)", ckdir);
    else
        fsio_errf(err, err_len, "%s: no checkpoint verifies (%lld tried; the warnings above say why)", ckdir,
                  (long long)rejected);
    return RS_EXIT_USAGE;
}

const SafetensorsFile *ckpt_file(const Ckpt *ck, const char *file) {
    for (int64_t i = 0; i < ck->n_files; i++)
        if (!strcmp(ck->file_names[i], file)) return &ck->files[i];
    return NULL;
}

int ckpt_read(const Ckpt *ck, const char *file, const char *tensor, StDtype dtype, int32_t ndim,
              const int64_t *shape, void *dst, char *err, size_t err_len) {
    const SafetensorsFile *f = ckpt_file(ck, file);
    if (!f) {
        fsio_errf(err, err_len, "%s: checkpoint has no file '%s' (its manifest lists %lld files)", ck->dir, file,
                  (long long)ck->n_files);
        return RS_EXIT_USAGE;
    }
    return safetensors_read(f, tensor, dtype, ndim, shape, dst, err, err_len);
}

/* Whether `dir` (resolved) is a run's checkpoint tree or a checkpoint directory: see ckpt_check_output. */
static int ckpt_is_ckpt_dir(const char *dir) {
    const char *slash = strrchr(dir, '/'), *base = slash ? slash + 1 : dir;
    char p[PATH_MAX + 32];
    struct stat st;
    if (!strcmp(base, "ckpt")) {
        static const char *const marks[] = {"LATEST", ".lock", "../.lock", NULL};
        for (int i = 0; marks[i]; i++) {
            snprintf(p, sizeof p, "%s/%s", dir, marks[i]);
            if (lstat(p, &st) == 0) return 1;
        }
    }
    if (!strncmp(base, "step_", 5)) {
        snprintf(p, sizeof p, "%s/%s", dir, CKPT_MANIFEST);
        if (lstat(p, &st) == 0) return 1;
    }
    return 0;
}

int ckpt_check_output(const char *path, int kind, const char *what, char *err, size_t err_len) {
    char real[PATH_MAX];
    int rc = fsio_resolve_output(path, kind, what, real, sizeof real, err, err_len);
    if (rc) return rc;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", real);
    for (;;) { /* the path itself, then each ancestor up to the root */
        if (ckpt_is_ckpt_dir(dir)) {
            char via[PATH_MAX + 32] = "";
            if (strcmp(real, path)) snprintf(via, sizeof via, " (it resolves to %s)", real);
            fsio_errf(err, err_len, "%s %s%s lies inside the checkpoint directory %s: checkpoint rotation deletes "
                                    "what is there, and a resume refuses files it did not write; nothing was written\n"
                                    "  hint: write it outside the run's ckpt/ (e.g. beside the run directory)",
                      what, path, via, dir);
            return RS_EXIT_USAGE;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir) break;
        *slash = 0;
    }
    return 0;
}
