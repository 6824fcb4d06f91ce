/*
 * ckpt_shard.c — the tensor slices of a sharded checkpoint (parallel.shard; docs/design/sharding.md).
 *
 * Each rank writes one file, shard-RRRRR.safetensors, holding its piece of every parameter tensor it
 * owns part of, as 1-D F32 slices named "<prefix><tensor>@<first element>" (prefix "" for the master
 * weights, "m." and "v." for the AdamW moments). The names carry the tensor and the element range, not the
 * ranks or the bucket padding, so a reader at any other world size or shard setting takes from every file
 * what it needs of each tensor: resharding. The manifest lists every file with its crc32 (ckpt.h), so a
 * missing or corrupt shard makes ckpt_load name it and fall back to the previous checkpoint.
 *
 * Callers: lib/run/train_ckpt.c (save and resume), lib/io/hf_import.c (export, eval, init_from of a
 * sharded checkpoint).
 */
#include "ckpt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "fsio.h"

int ckpt_is_sharded(const Ckpt *ck) {
    for (int64_t i = 0; i < ck->n_files; i++)
        if (!strncmp(ck->file_names[i], "shard-", 6)) return 1;
    return 0;
}

void ckpt_shard_slice_name(char *buf, size_t n, const char *prefix, const char *tensor, int64_t first) {
    snprintf(buf, n, "%s%s@%lld", prefix, tensor, (long long)first);
}

int ckpt_shard_read(const Ckpt *ck, const char *prefix, const ParamTable *ptab, float *dst, const int64_t *lo,
                    const int64_t *hi, char *err, size_t err_len) {
    int64_t *got = RS_CALLOC((size_t)ptab->n, sizeof *got);
    const size_t np = strlen(prefix);
    int rc = 0;
    for (int64_t f = 0; f < ck->n_files && rc == 0; f++) {
        if (strncmp(ck->file_names[f], "shard-", 6) != 0) continue;
        const SafetensorsFile *sf = &ck->files[f];
        for (int64_t j = 0; j < sf->n && rc == 0; j++) {
            const StTensor *t = &sf->tensors[j];
            if (strncmp(t->name, prefix, np) != 0) continue;
            const char *at = strrchr(t->name, '@');
            if (!at) continue;
            char name[PARAM_NAME_MAX];
            size_t len = (size_t)(at - t->name) - np;
            if (len >= sizeof name) continue;
            memcpy(name, t->name + np, len);
            name[len] = 0;
            if (np == 0 && (!strncmp(name, "m.", 2) || !strncmp(name, "v.", 2))) continue; /* a moment's slice */
            int i = model_params_find(ptab, name);
            char *end = NULL;
            long long first = strtoll(at + 1, &end, 10);
            const int64_t count = t->ndim == 1 ? t->shape[0] : -1;
            if (i < 0 || !end || *end || first < 0 || t->dtype != ST_DTYPE_F32 || count < 0 ||
                first + count > ptab->t[i].numel) {
                fsio_errf(err, err_len, "%s: slice '%s' names no element range of this model's tensors (expected "
                          "1-D F32 '<tensor>@<first>' within the tensor)", sf->path, t->name);
                rc = RS_EXIT_USAGE;
                break;
            }
            const int64_t a = first > (lo ? lo[i] : 0) ? first : (lo ? lo[i] : 0);
            const int64_t e = first + count < (hi ? hi[i] : ptab->t[i].numel) ? first + count
                                                                               : (hi ? hi[i] : ptab->t[i].numel);
            if (e <= a) continue;
            char *p = (char *)(dst + ptab->t[i].offset + a);
            size_t want = (size_t)(e - a) * sizeof(float);
            off_t off = (off_t)(t->offset + (a - first) * (int64_t)sizeof(float));
            while (want > 0) {
                ssize_t r = pread(sf->fd, p, want, off);
                if (r <= 0) {
                    fsio_errf(err, err_len, "%s: reading slice '%s': %s", sf->path, t->name,
                              r < 0 ? strerror(errno) : "unexpected end of file");
                    rc = r < 0 ? RS_EXIT_FAIL : RS_EXIT_USAGE;
                    break;
                }
                p += r;
                want -= (size_t)r;
                off += r;
            }
            got[i] += e - a;
        }
    }
    for (int i = 0; i < ptab->n && rc == 0; i++) {
        const int64_t need = (hi ? hi[i] : ptab->t[i].numel) - (lo ? lo[i] : 0);
        if (need > 0 && got[i] != need) {
            fsio_errf(err, err_len, "checkpoint %s: the shard files hold %lld of the %lld elements of %s%s needed "
                      "here: not a complete sharded checkpoint of this model", ck->dir, (long long)got[i],
                      (long long)need, prefix, ptab->t[i].name);
            rc = RS_EXIT_USAGE;
        }
    }
    free(got);
    return rc;
}
