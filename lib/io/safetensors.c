/*
 * safetensors.c — the safetensors writer and validating reader (format and
 * rules in safetensors.h). The JSON header is built and parsed by jansson;
 * this file only checks what the JSON says against the file.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "fsio.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so is this host");

const char *const st_dtype_names[ST_DTYPE_COUNT + 1] = {
    "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
    "I32", "U32", "F32", "F64", "I64", "U64", NULL,
};

static const int64_t st_dtype_sizes[ST_DTYPE_COUNT] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};

int64_t st_dtype_size(StDtype dtype) {
    return (int)dtype >= 0 && dtype < ST_DTYPE_COUNT ? st_dtype_sizes[dtype] : 0;
}

int st_dtype_parse(const char *name, StDtype *out) {
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (!strcmp(name, st_dtype_names[i])) {
            *out = (StDtype)i;
            return 0;
        }
    return -1;
}

int64_t st_numel(int32_t ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

void st_format_shape(char *buf, size_t cap, int32_t ndim, const int64_t *shape) {
    size_t k = 0;
    int m = snprintf(buf, cap, "[");
    if (m > 0) k = (size_t)m;
    for (int32_t i = 0; i < ndim && k < cap; i++) {
        m = snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (m > 0) k += (size_t)m;
    }
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* numel x size, or -1 on a bad shape / overflow. */
static int64_t st_nbytes(StDtype dtype, int32_t ndim, const int64_t *shape) {
    int64_t n = st_numel(ndim, shape), sz = st_dtype_size(dtype);
    if (n < 0 || sz == 0) return -1;
    if (n > INT64_MAX / sz) return -1;
    return n * sz;
}

/* ---- writer --------------------------------------------------------------- */

typedef struct {
    const StTensor *t;
    int64_t index;
} StOrder;

static int st_cmp_name(const void *a, const void *b) {
    return strcmp((*(const StOrder *)a).t->name, (*(const StOrder *)b).t->name);
}

/* Largest element first, then the caller's order. */
static int st_cmp_layout(const void *a, const void *b) {
    const StOrder *x = a, *y = b;
    int64_t sx = st_dtype_size(x->t->dtype), sy = st_dtype_size(y->t->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static int st_check_write_args(const char *path, const StTensor *tensors, int64_t n, const json_t *metadata,
                               StOrder *order, char *err, size_t err_len) {
    if (n < 0 || (n > 0 && !tensors)) {
        fsio_errf(err, err_len, "%s: bad tensor list (n = %lld)", path, (long long)n);
        return RS_EXIT_USAGE;
    }
    if (metadata) {
        if (!json_is_object(metadata)) {
            fsio_errf(err, err_len, "%s: __metadata__ must be a JSON object of strings", path);
            return RS_EXIT_USAGE;
        }
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)metadata, k, v) {
            if (!json_is_string(v)) {
                fsio_errf(err, err_len, "%s: __metadata__ value of key '%s' must be a string", path, k);
                return RS_EXIT_USAGE;
            }
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const StTensor *t = &tensors[i];
        if (!t->name || !*t->name || !strcmp(t->name, ST_METADATA_KEY)) {
            fsio_errf(err, err_len, "%s: tensor %lld has an empty or reserved name", path, (long long)i);
            return RS_EXIT_USAGE;
        }
        if ((int)t->dtype < 0 || t->dtype >= ST_DTYPE_COUNT) {
            fsio_errf(err, err_len, "%s: tensor '%s' has an unknown dtype %d", path, t->name, (int)t->dtype);
            return RS_EXIT_USAGE;
        }
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) {
            fsio_errf(err, err_len, "%s: tensor '%s' has %d dimensions, expected 0..%d", path, t->name, t->ndim,
                      ST_MAX_DIMS);
            return RS_EXIT_USAGE;
        }
        int64_t nb = st_nbytes(t->dtype, t->ndim, t->shape);
        if (nb < 0) {
            char s[256];
            st_format_shape(s, sizeof s, t->ndim, t->shape);
            fsio_errf(err, err_len, "%s: tensor '%s' has a negative or overflowing shape %s", path, t->name, s);
            return RS_EXIT_USAGE;
        }
        if (nb > 0 && !t->data) {
            fsio_errf(err, err_len, "%s: tensor '%s' has %lld bytes but no data pointer", path, t->name,
                      (long long)nb);
            return RS_EXIT_USAGE;
        }
        order[i].t = t;
        order[i].index = i;
    }
    if (n > 1) {
        qsort(order, (size_t)n, sizeof *order, st_cmp_name);
        for (int64_t i = 1; i < n; i++)
            if (!strcmp(order[i - 1].t->name, order[i].t->name)) {
                fsio_errf(err, err_len, "%s: tensor name '%s' appears twice", path, order[i].t->name);
                return RS_EXIT_USAGE;
            }
        qsort(order, (size_t)n, sizeof *order, st_cmp_layout);
    }
    return 0;
}

/* The header text (JSON, space padded) with its 8-byte length in front. */
static int st_build_header(const char *path, const StOrder *order, int64_t n, const json_t *metadata, char **out,
                           int64_t *out_len, char *err, size_t err_len) {
    json_t *root = json_object();
    int bad = root == NULL;
    if (!bad && metadata) bad = json_object_set_new(root, ST_METADATA_KEY, json_deep_copy(metadata)) != 0;
    int64_t off = 0;
    for (int64_t i = 0; i < n && !bad; i++) {
        const StTensor *t = order[i].t;
        int64_t nb = st_nbytes(t->dtype, t->ndim, t->shape);
        json_t *shape = json_array();
        for (int32_t d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_names[t->dtype], "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + nb));
        if (!e || json_object_set_new(root, t->name, e) != 0) {
            json_decref(root);
            fsio_errf(err, err_len, "%s: cannot put tensor name '%s' in the JSON header (not valid UTF-8?)", path,
                      t->name);
            return RS_EXIT_USAGE;
        }
        off += nb;
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) {
        fsio_errf(err, err_len, "%s: building the JSON header failed", path);
        return RS_EXIT_USAGE;
    }
    int64_t len = (int64_t)strlen(text);
    int64_t padded = (8 + len + 7) / 8 * 8 - 8;
    if (padded > ST_MAX_HEADER) {
        free(text);
        fsio_errf(err, err_len, "%s: header of %lld bytes exceeds the format's %lld-byte limit", path,
                  (long long)padded, (long long)ST_MAX_HEADER);
        return RS_EXIT_USAGE;
    }
    char *buf = RS_MALLOC((size_t)(8 + padded));
    for (int i = 0; i < 8; i++) buf[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
    memcpy(buf + 8, text, (size_t)len);
    memset(buf + 8 + len, ' ', (size_t)(padded - len));
    free(text);
    *out = buf;
    *out_len = 8 + padded;
    return 0;
}

int safetensors_write_file(const char *path, const StTensor *tensors, int64_t n, const json_t *metadata,
                           StWriteInfo *info, char *err, size_t err_len) {
    StOrder *order = RS_MALLOC(sizeof(StOrder) * (size_t)(n > 0 ? n : 1));
    char *hdr = NULL;
    int64_t hdr_len = 0;
    int rc = st_check_write_args(path, tensors, n, metadata, order, err, err_len);
    if (rc == 0) rc = st_build_header(path, order, n, metadata, &hdr, &hdr_len, err, err_len);
    char tmp[4096], dir[4096];
    if (rc == 0) rc = fsio_path(tmp, sizeof tmp, err, err_len, "%s.tmp.%ld", path, (long)getpid());
    if (rc == 0) rc = fsio_dirname(dir, sizeof dir, path, err, err_len);
    if (rc) {
        free(order);
        free(hdr);
        return rc;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fsio_errf(err, err_len, "%s: cannot create: %s", tmp, strerror(errno));
        free(order);
        free(hdr);
        return RS_EXIT_FAIL;
    }
    uLong crc = crc32_z(0L, Z_NULL, 0);
    int64_t size = hdr_len;
    int e = fsio_write_all(fd, hdr, hdr_len);
    crc = crc32_z(crc, (const Bytef *)hdr, (z_size_t)hdr_len);
    for (int64_t i = 0; i < n && !e; i++) {
        const StTensor *t = order[i].t;
        int64_t nb = st_nbytes(t->dtype, t->ndim, t->shape);
        if (nb == 0) continue;
        e = fsio_write_all(fd, t->data, nb);
        crc = crc32_z(crc, (const Bytef *)t->data, (z_size_t)nb);
        size += nb;
    }
    if (e) fsio_errf(err, err_len, "%s: write failed: %s", tmp, strerror(e));
    if (!e && fsync(fd) != 0) {
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
    free(order);
    free(hdr);
    if (e) {
        unlink(tmp);
        return RS_EXIT_FAIL;
    }
    rc = fsio_fsync_dir(dir, err, err_len);
    if (rc == 0 && info) {
        info->size = size;
        info->crc32 = (uint32_t)crc;
    }
    return rc;
}

/* ---- reader --------------------------------------------------------------- */

static int st_cmp_offset(const void *a, const void *b) {
    const StTensor *x = *(StTensor *const *)a, *y = *(StTensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* A JSON value that must be a non-negative integer. */
static int st_get_count(const json_t *v, int64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -1;
    *out = (int64_t)x;
    return 0;
}

/* Validates one tensor entry of the header; fills t (name not set). */
static int st_parse_entry(const char *path, const char *name, json_t *v, int64_t data_size, StTensor *t, char *err,
                          size_t err_len) {
    if (!json_is_object(v)) {
        fsio_errf(err, err_len, "%s: header entry '%s' must be an object with dtype, shape and data_offsets", path,
                  name);
        return RS_EXIT_USAGE;
    }
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!jd || !js || !jo) {
        fsio_errf(err, err_len, "%s: tensor '%s' lacks '%s'", path, name,
                  !jd ? "dtype" : !js ? "shape" : "data_offsets");
        return RS_EXIT_USAGE;
    }
    if (json_object_size(v) != 3) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets")) break;
        }
        fsio_errf(err, err_len, "%s: tensor '%s' has an unknown key '%s' (expected dtype, shape, data_offsets)",
                  path, name, k ? k : "?");
        return RS_EXIT_USAGE;
    }
    if (!json_is_string(jd) || st_dtype_parse(json_string_value(jd), &t->dtype) != 0) {
        fsio_errf(err, err_len, "%s: tensor '%s' has dtype %s%s%s, expected one of BOOL U8 I8 F8_E5M2 F8_E4M3 "
                  "I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64", path, name,
                  json_is_string(jd) ? "'" : "", json_is_string(jd) ? json_string_value(jd) : "(not a string)",
                  json_is_string(jd) ? "'" : "");
        return RS_EXIT_USAGE;
    }
    if (!json_is_array(js)) {
        fsio_errf(err, err_len, "%s: tensor '%s': shape must be a list of integers", path, name);
        return RS_EXIT_USAGE;
    }
    if (json_array_size(js) > ST_MAX_DIMS) {
        fsio_errf(err, err_len, "%s: tensor '%s' has %zu dimensions; ringscan reads at most %d", path, name,
                  json_array_size(js), ST_MAX_DIMS);
        return RS_EXIT_USAGE;
    }
    t->ndim = (int32_t)json_array_size(js);
    for (int32_t d = 0; d < t->ndim; d++)
        if (st_get_count(json_array_get(js, (size_t)d), &t->shape[d]) != 0) {
            fsio_errf(err, err_len, "%s: tensor '%s': shape[%d] must be a non-negative integer", path, name, d);
            return RS_EXIT_USAGE;
        }
    int64_t b = 0, e = 0;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || st_get_count(json_array_get(jo, 0), &b) != 0 ||
        st_get_count(json_array_get(jo, 1), &e) != 0 || e < b) {
        fsio_errf(err, err_len, "%s: tensor '%s': data_offsets must be [begin, end] with 0 <= begin <= end", path,
                  name);
        return RS_EXIT_USAGE;
    }
    int64_t nb = st_nbytes(t->dtype, t->ndim, t->shape);
    char s[256];
    st_format_shape(s, sizeof s, t->ndim, t->shape);
    if (nb < 0) {
        fsio_errf(err, err_len, "%s: tensor '%s': shape %s overflows", path, name, s);
        return RS_EXIT_USAGE;
    }
    if (e - b != nb) {
        fsio_errf(err, err_len, "%s: tensor '%s' is %s %s = %lld bytes but data_offsets [%lld, %lld] span %lld",
                  path, name, st_dtype_names[t->dtype], s, (long long)nb, (long long)b, (long long)e,
                  (long long)(e - b));
        return RS_EXIT_USAGE;
    }
    if (e > data_size) {
        fsio_errf(err, err_len, "%s: tensor '%s' ends at data byte %lld but the file holds only %lld data bytes "
                  "(truncated?)", path, name, (long long)e, (long long)data_size);
        return RS_EXIT_USAGE;
    }
    t->nbytes = nb;
    t->offset = b; /* relative for now; made absolute once the layout is checked */
    return 0;
}

/* Parses and checks the header text; fills f->tensors / f->metadata. */
static int st_parse_header(SafetensorsFile *f, const char *hdr, int64_t hdr_len, char *err, size_t err_len) {
    const char *path = f->path;
    if (hdr[0] != '{') {
        fsio_errf(err, err_len, "%s: header must start with '{', found byte 0x%02x", path, (unsigned char)hdr[0]);
        return RS_EXIT_USAGE;
    }
    json_error_t je;
    json_t *root = json_loadb(hdr, (size_t)hdr_len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        fsio_errf(err, err_len, "%s: header is not valid JSON: %s (at header byte %d)", path, je.text, je.position);
        return RS_EXIT_USAGE;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        fsio_errf(err, err_len, "%s: header must be a JSON object", path);
        return RS_EXIT_USAGE;
    }
    int64_t data_size = f->file_size - f->data_start;
    f->tensors = RS_CALLOC(json_object_size(root) + 1, sizeof(StTensor));
    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, ST_METADATA_KEY)) {
            if (!json_is_object(v)) {
                fsio_errf(err, err_len, "%s: __metadata__ must be an object of strings", path);
                rc = RS_EXIT_USAGE;
                break;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    fsio_errf(err, err_len, "%s: __metadata__ value of key '%s' must be a string", path, mk);
                    rc = RS_EXIT_USAGE;
                    break;
                }
            }
            if (rc) break;
            f->metadata = json_incref(v);
            continue;
        }
        StTensor *t = &f->tensors[f->n];
        rc = st_parse_entry(path, key, v, data_size, t, err, err_len);
        if (rc) break;
        t->name = RS_STRDUP(key);
        f->n++;
    }
    json_decref(root);
    if (rc) return rc;

    /* The tensors must tile the data buffer: sorted by offset, each begins
     * where the previous ended, and the last ends at the end of the file. */
    StTensor **by_off = RS_MALLOC(sizeof(StTensor *) * (size_t)(f->n + 1));
    for (int64_t i = 0; i < f->n; i++) by_off[i] = &f->tensors[i];
    qsort(by_off, (size_t)f->n, sizeof *by_off, st_cmp_offset);
    int64_t cursor = 0;
    const StTensor *prev = NULL;
    for (int64_t i = 0; i < f->n && !rc; i++) {
        const StTensor *t = by_off[i];
        if (t->offset < cursor) {
            fsio_errf(err, err_len, "%s: tensor '%s' [%lld, %lld) overlaps tensor '%s' [%lld, %lld)", path, t->name,
                      (long long)t->offset, (long long)(t->offset + t->nbytes), prev->name, (long long)prev->offset,
                      (long long)(prev->offset + prev->nbytes));
            rc = RS_EXIT_USAGE;
        } else if (t->offset > cursor) {
            fsio_errf(err, err_len, "%s: data bytes [%lld, %lld) belong to no tensor (a gap before '%s')", path,
                      (long long)cursor, (long long)t->offset, t->name);
            rc = RS_EXIT_USAGE;
        }
        if (t->offset + t->nbytes > cursor) { /* prev: the tensor that ends at the cursor */
            cursor = t->offset + t->nbytes;
            prev = t;
        }
    }
    free(by_off);
    if (!rc && cursor != data_size) {
        fsio_errf(err, err_len, "%s: tensors cover %lld data bytes but the file holds %lld after the header "
                  "(trailing bytes)", path, (long long)cursor, (long long)data_size);
        rc = RS_EXIT_USAGE;
    }
    for (int64_t i = 0; i < f->n; i++) f->tensors[i].offset += f->data_start;
    return rc;
}

int safetensors_open(SafetensorsFile *f, const char *path, char *err, size_t err_len) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = RS_STRDUP(path);
    int rc = fsio_open_regular(path, &f->fd, NULL, err, err_len); /* a FIFO never waits for a writer */
    if (rc) {
        safetensors_close(f);
        return rc;
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        fsio_errf(err, err_len, "%s: fstat failed: %s", path, strerror(errno));
        safetensors_close(f);
        return RS_EXIT_FAIL;
    }
    f->file_size = (int64_t)st.st_size;
    if (f->file_size < 8) {
        fsio_errf(err, err_len, "%s: %lld bytes, too short for the 8-byte header length (not a safetensors file)",
                  path, (long long)f->file_size);
        safetensors_close(f);
        return RS_EXIT_USAGE;
    }
    unsigned char lenb[8];
    int e = fsio_pread_all(f->fd, lenb, 8, 0, NULL);
    if (e) {
        fsio_errf(err, err_len, "%s: reading the header length failed: %s", path, e < 0 ? "file shrank" : strerror(e));
        safetensors_close(f);
        return RS_EXIT_FAIL;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | lenb[i];
    if (n > (uint64_t)ST_MAX_HEADER) {
        fsio_errf(err, err_len, "%s: header length %llu exceeds the format's %lld-byte limit (not a safetensors "
                  "file?)", path, (unsigned long long)n, (long long)ST_MAX_HEADER);
        rc = RS_EXIT_USAGE;
    } else if ((int64_t)n > f->file_size - 8) {
        fsio_errf(err, err_len, "%s: header length %llu runs past the end of the file (%lld bytes; truncated?)", path,
                  (unsigned long long)n, (long long)f->file_size);
        rc = RS_EXIT_USAGE;
    } else if (n < 2) {
        fsio_errf(err, err_len, "%s: header length %llu is too small for a JSON object", path, (unsigned long long)n);
        rc = RS_EXIT_USAGE;
    }
    if (rc) {
        safetensors_close(f);
        return rc;
    }
    f->data_start = 8 + (int64_t)n;
    char *hdr = RS_MALLOC((size_t)n);
    e = fsio_pread_all(f->fd, hdr, (int64_t)n, 8, NULL);
    if (e) {
        fsio_errf(err, err_len, "%s: reading the %llu-byte header failed: %s", path, (unsigned long long)n,
                  e < 0 ? "file shrank" : strerror(e));
        rc = RS_EXIT_FAIL;
    } else {
        rc = st_parse_header(f, hdr, (int64_t)n, err, err_len);
    }
    free(hdr);
    if (rc) safetensors_close(f);
    return rc;
}

void safetensors_close(SafetensorsFile *f) {
    if (f->fd >= 0) close(f->fd);
    for (int64_t i = 0; i < f->n; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    if (f->metadata) json_decref(f->metadata);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const StTensor *safetensors_find(const SafetensorsFile *f, const char *name) {
    for (int64_t i = 0; i < f->n; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

int safetensors_read(const SafetensorsFile *f, const char *name, StDtype dtype, int32_t ndim, const int64_t *shape,
                     void *dst, char *err, size_t err_len) {
    const StTensor *t = safetensors_find(f, name);
    if (!t) {
        fsio_errf(err, err_len, "%s: no tensor named '%s' (the file has %lld tensors)", f->path, name,
                  (long long)f->n);
        return RS_EXIT_USAGE;
    }
    int same = t->dtype == dtype && t->ndim == ndim;
    for (int32_t d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char want[256], got[256];
        st_format_shape(want, sizeof want, ndim, shape);
        st_format_shape(got, sizeof got, t->ndim, t->shape);
        fsio_errf(err, err_len, "%s: tensor '%s' is %s %s but %s %s was expected", f->path, name,
                  st_dtype_names[t->dtype], got, (int)dtype >= 0 && dtype < ST_DTYPE_COUNT ? st_dtype_names[dtype] : "?",
                  want);
        return RS_EXIT_USAGE;
    }
    int64_t got_bytes = 0;
    int e = fsio_pread_all(f->fd, dst, t->nbytes, t->offset, &got_bytes);
    if (e) {
        if (e < 0)
            fsio_errf(err, err_len, "%s: tensor '%s': file ended after %lld of %lld bytes (changed while open?)",
                      f->path, name, (long long)got_bytes, (long long)t->nbytes);
        else
            fsio_errf(err, err_len, "%s: tensor '%s': read failed: %s", f->path, name, strerror(e));
        return RS_EXIT_FAIL;
    }
    return 0;
}
