/*
 * test_ckpt.c — cases of build/test_ops for the tensor files
 * (lib/io/safetensors.c) and checkpoints (lib/io/ckpt.c), on real files in a
 * fresh directory under /tmp per case:
 *   st_*    round trip of every dtype (scalar and empty shapes included),
 *           dtype/shape checks on read, writer argument checks, every
 *           truncation and every single-byte corruption of a file (must be
 *           rejected or read cleanly, never crash), hand-made bad headers;
 *   ckpt_*  save/load round trip, retention, crc fallback, manifest
 *           tampering, missing manifest, LATEST missing/garbage/naming a
 *           missing directory, re-saving a step, stale temporaries, the
 *           save lock, bad arguments.
 * The Python side (tests/test_ckpt.py) adds the cross-language checks and
 * the kill -9 test.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/ckpt.h"
#include "core/error.h"
#include "io/fsio.h"
#include "test_util.h"

/* ---- helpers -------------------------------------------------------------- */

static char ck_root[256];

static const char *ck_tmpdir(void) {
    snprintf(ck_root, sizeof ck_root, "/tmp/rs_test_ckpt_XXXXXX");
    if (!mkdtemp(ck_root)) {
        fprintf(stderr, "mkdtemp failed\n");
        exit(2);
    }
    return ck_root;
}

static void ck_cleanup(void) {
    char err[1024];
    if (fsio_remove_tree(ck_root, err, sizeof err) != 0) printf("cleanup: %s\n", err);
}

static const char *ck_path(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/%s", ck_root, rel);
    return buf;
}

static int ck_exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

static void ck_write_bytes(const char *path, const void *buf, int64_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n > 0 && fwrite(buf, 1, (size_t)n, f) != (size_t)n)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(f);
}

/* not inlined: inlined, gcc 12 takes the returned buffer for the local `buf` whose address fsio_read_file
 * got, and warns of a dangling pointer where the caller writes into it */
__attribute__((noinline)) static char *ck_read_bytes(const char *path, int64_t *n) {
    char *buf = NULL, err[1024];
    if (fsio_read_file(path, (int64_t)1 << 30, &buf, n, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        exit(2);
    }
    return buf;
}

/* Flips the lowest bit of byte `offset` (negative: from the end). */
static void ck_flip_byte(const char *path, int64_t offset) {
    int64_t n;
    char *b = ck_read_bytes(path, &n);
    if (offset < 0) offset += n;
    if (offset < 0 || offset >= n) {
        fprintf(stderr, "%s: byte %lld is outside the %lld-byte file\n", path, (long long)offset, (long long)n);
        exit(2);
    }
    b[offset] ^= 0x01;
    ck_write_bytes(path, b, n);
    free(b);
}

static void ck_fill_bytes(uint8_t *p, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(seed >> 56);
    }
}

/* A raw safetensors file: 8-byte length + header text + data. */
static void ck_write_raw(const char *path, const char *header, const void *data, int64_t data_len) {
    int64_t hl = (int64_t)strlen(header);
    uint8_t *buf = malloc((size_t)(8 + hl + data_len + 1));
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, (size_t)hl);
    if (data_len) memcpy(buf + 8 + hl, data, (size_t)data_len);
    ck_write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

/* Opening `path` must fail with RS_EXIT_USAGE, a message naming the file and containing `want`. */
static void ck_expect_reject(const char *what, const char *path, const char *want) {
    SafetensorsFile f;
    char err[2048] = "";
    int rc = safetensors_open(&f, path, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE, "%s: open returned %d, expected %d (err: %s)", what, rc, RS_EXIT_USAGE, err);
    EXPECT(strstr(err, path) != NULL, "%s: message does not name the file: %s", what, err);
    EXPECT(!want || strstr(err, want) != NULL, "%s: message lacks '%s': %s", what, want, err);
    if (rc == 0) safetensors_close(&f);
    else printf("%s: rejected: %s\n", what, err);
}

/* ---- safetensors ---------------------------------------------------------- */

TEST(st_roundtrip_all_dtypes) {
    ck_tmpdir();
    char path[512];
    ck_path(path, sizeof path, "all.safetensors");
    StTensor t[ST_DTYPE_COUNT + 3];
    uint8_t *bufs[ST_DTYPE_COUNT + 3];
    char names[ST_DTYPE_COUNT + 3][32];
    int64_t n = 0;
    for (int d = 0; d < ST_DTYPE_COUNT; d++, n++) { /* shape [3, d+1] of every dtype */
        memset(&t[n], 0, sizeof t[n]);
        snprintf(names[n], sizeof names[n], "t.%s", st_dtype_names[d]);
        t[n].name = names[n];
        t[n].dtype = (StDtype)d;
        t[n].ndim = 2;
        t[n].shape[0] = 3;
        t[n].shape[1] = d + 1;
    }
    StTensor extra[3] = {
        {.name = "scalar", .dtype = ST_DTYPE_F32, .ndim = 0},
        {.name = "empty", .dtype = ST_DTYPE_BF16, .ndim = 1, .shape = {0}},
        {.name = "empty3", .dtype = ST_DTYPE_I64, .ndim = 3, .shape = {3, 0, 2}},
    };
    for (int i = 0; i < 3; i++) t[n++] = extra[i];
    for (int64_t i = 0; i < n; i++) {
        int64_t nb = st_numel(t[i].ndim, t[i].shape) * st_dtype_size(t[i].dtype);
        bufs[i] = malloc((size_t)nb + 1);
        ck_fill_bytes(bufs[i], nb, (uint64_t)i + 1);
        t[i].data = nb ? bufs[i] : NULL;
    }
    json_t *meta = json_pack("{s:s, s:s}", "format", "pt", "note", "héllo");
    char err[2048];
    StWriteInfo info;
    int rc = safetensors_write_file(path, t, n, meta, &info, err, sizeof err);
    EXPECT(rc == 0, "write: %s", err);
    int64_t sz = 0;
    uint32_t crc = 0;
    EXPECT(fsio_crc32_file(path, &sz, &crc, err, sizeof err) == 0 && sz == info.size && crc == info.crc32,
           "writer's size/crc %lld/%08x differ from the file's %lld/%08x", (long long)info.size, info.crc32,
           (long long)sz, crc);
    SafetensorsFile f;
    rc = safetensors_open(&f, path, err, sizeof err);
    EXPECT(rc == 0, "open: %s", err);
    if (rc == 0) {
        EXPECT(f.n == n, "%lld tensors, expected %lld", (long long)f.n, (long long)n);
        EXPECT(f.data_start % 8 == 0, "data starts at %lld, not 8-aligned", (long long)f.data_start);
        EXPECT(f.metadata && json_equal(f.metadata, meta), "metadata differs");
        for (int64_t i = 0; i < n; i++) {
            const StTensor *e = safetensors_find(&f, t[i].name);
            EXPECT(e != NULL, "tensor %s missing", t[i].name);
            if (!e) continue;
            EXPECT(e->offset % st_dtype_size(e->dtype) == 0, "%s at offset %lld is not aligned to its element size",
                   e->name, (long long)e->offset);
            int64_t nb = st_numel(t[i].ndim, t[i].shape) * st_dtype_size(t[i].dtype);
            uint8_t *got = malloc((size_t)nb + 1);
            rc = safetensors_read(&f, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, got, err, sizeof err);
            EXPECT(rc == 0, "read %s: %s", t[i].name, err);
            EXPECT(rc != 0 || memcmp(got, bufs[i], (size_t)nb) == 0, "%s: data differs", t[i].name);
            free(got);
        }
        safetensors_close(&f);
    }
    printf("st_roundtrip_all_dtypes: %lld tensors, %lld bytes ok\n", (long long)n, (long long)info.size);
    json_decref(meta);
    for (int64_t i = 0; i < n; i++) free(bufs[i]);
    ck_cleanup();
}

TEST(st_read_checks_dtype_and_shape) {
    ck_tmpdir();
    char path[512], err[2048];
    ck_path(path, sizeof path, "x.safetensors");
    float w[6] = {1, 2, 3, 4, 5, 6};
    StTensor t = {.name = "layer.w", .dtype = ST_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = w};
    EXPECT(safetensors_write_file(path, &t, 1, NULL, NULL, err, sizeof err) == 0, "write: %s", err);
    SafetensorsFile f;
    EXPECT(safetensors_open(&f, path, err, sizeof err) == 0, "open: %s", err);
    float dst[8];
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s6[1] = {6};
    struct { const char *name; StDtype dt; int32_t nd; const int64_t *sh; const char *want; } cases[] = {
        {"layer.w", ST_DTYPE_BF16, 2, s23, "but BF16 [2, 3] was expected"},
        {"layer.w", ST_DTYPE_F32, 2, s32, "is F32 [2, 3] but F32 [3, 2] was expected"},
        {"layer.w", ST_DTYPE_F32, 1, s6, "but F32 [6] was expected"},
        {"layer.b", ST_DTYPE_F32, 2, s23, "no tensor named 'layer.b'"},
    };
    for (int i = 0; i < 4; i++) {
        int rc = safetensors_read(&f, cases[i].name, cases[i].dt, cases[i].nd, cases[i].sh, dst, err, sizeof err);
        EXPECT(rc == RS_EXIT_USAGE && strstr(err, cases[i].want) && strstr(err, path) && strstr(err, cases[i].name),
               "case %d: rc %d, message: %s", i, rc, err);
        printf("read mismatch %d: %s\n", i, err);
    }
    EXPECT(safetensors_read(&f, "layer.w", ST_DTYPE_F32, 2, s23, dst, err, sizeof err) == 0, "%s", err);
    EXPECT(memcmp(dst, w, sizeof w) == 0, "data differs");
    safetensors_close(&f);
    ck_cleanup();
}

TEST(st_writer_rejects_bad_arguments) {
    ck_tmpdir();
    char path[512], err[2048];
    ck_path(path, sizeof path, "bad.safetensors");
    float x[4] = {0};
    StTensor two[2] = {{.name = "a", .dtype = ST_DTYPE_F32, .ndim = 1, .shape = {4}, .data = x},
                       {.name = "a", .dtype = ST_DTYPE_F32, .ndim = 1, .shape = {4}, .data = x}};
    StTensor bad[] = {
        {.name = "", .dtype = ST_DTYPE_F32, .ndim = 1, .shape = {4}, .data = x},
        {.name = "__metadata__", .dtype = ST_DTYPE_F32, .ndim = 1, .shape = {4}, .data = x},
        {.name = "nodata", .dtype = ST_DTYPE_F32, .ndim = 1, .shape = {4}, .data = NULL},
        {.name = "negdim", .dtype = ST_DTYPE_F32, .ndim = 1, .shape = {-1}, .data = x},
        {.name = "rank9", .dtype = ST_DTYPE_F32, .ndim = 9, .data = x},
        {.name = "dtype", .dtype = ST_DTYPE_COUNT, .ndim = 1, .shape = {1}, .data = x},
        {.name = "overflow", .dtype = ST_DTYPE_F64, .ndim = 2, .shape = {INT64_MAX / 4, 4}, .data = x},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = safetensors_write_file(path, &bad[i], 1, NULL, NULL, err, sizeof err);
        EXPECT(rc == RS_EXIT_USAGE, "bad tensor %zu (%s) accepted (rc %d)", i, bad[i].name, rc);
        printf("rejected: %s\n", err);
    }
    int rc = safetensors_write_file(path, two, 2, NULL, NULL, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "appears twice"), "duplicate names: rc %d %s", rc, err);
    json_t *meta = json_pack("{s:i}", "n", 3);
    rc = safetensors_write_file(path, two, 1, meta, NULL, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "__metadata__"), "non-string metadata: rc %d %s", rc, err);
    json_decref(meta);
    EXPECT(!ck_exists(path), "a rejected write left %s behind", path);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    EXPECT(!ck_exists(tmp), "a rejected write left %s behind", tmp);
    /* A file that is already there survives a failed write. */
    EXPECT(safetensors_write_file(path, two, 1, NULL, NULL, err, sizeof err) == 0, "%s", err);
    int64_t n0, n1;
    char *before = ck_read_bytes(path, &n0);
    EXPECT(safetensors_write_file(path, two, 2, NULL, NULL, err, sizeof err) == RS_EXIT_USAGE, "dup accepted");
    char *after = ck_read_bytes(path, &n1);
    EXPECT(n0 == n1 && memcmp(before, after, (size_t)n0) == 0, "a failed write damaged the existing file");
    free(before);
    free(after);
    ck_cleanup();
}

/* Every prefix of a valid file is rejected; every single-byte change is
 * either rejected with a message or reads back without error; never a crash
 * or an over-read (run this binary under ASan to see the latter). */
TEST(st_truncations_and_byte_flips) {
    ck_tmpdir();
    char path[512], bad[512], err[2048];
    ck_path(path, sizeof path, "ok.safetensors");
    ck_path(bad, sizeof bad, "bad.safetensors");
    int32_t a[3] = {1, 2, 3};
    uint16_t b[2] = {0x3f80, 0x4000};
    int64_t c = 42;
    StTensor t[3] = {{.name = "a", .dtype = ST_DTYPE_I32, .ndim = 1, .shape = {3}, .data = a},
                     {.name = "b", .dtype = ST_DTYPE_BF16, .ndim = 2, .shape = {1, 2}, .data = b},
                     {.name = "c", .dtype = ST_DTYPE_I64, .ndim = 0, .data = &c}};
    json_t *meta = json_pack("{s:s}", "k", "v");
    EXPECT(safetensors_write_file(path, t, 3, meta, NULL, err, sizeof err) == 0, "%s", err);
    json_decref(meta);
    int64_t n;
    char *good = ck_read_bytes(path, &n);
    int64_t rejected = 0, accepted = 0;
    for (int64_t len = 0; len < n; len++) {
        ck_write_bytes(bad, good, len);
        SafetensorsFile f;
        int rc = safetensors_open(&f, bad, err, sizeof err);
        EXPECT(rc == RS_EXIT_USAGE && strstr(err, bad), "prefix of %lld/%lld bytes: rc %d (%s)", (long long)len,
               (long long)n, rc, err);
        if (rc == 0) safetensors_close(&f);
        rejected++;
    }
    char *mut = malloc((size_t)n + 1);
    const uint8_t subst[] = {0x00, 0xff, '{', '}', '"', ',', '9', '-', ' '};
    for (int64_t i = 0; i < n; i++) {
        for (size_t s = 0; s < sizeof subst; s++) {
            memcpy(mut, good, (size_t)n);
            if ((uint8_t)mut[i] == subst[s]) continue;
            mut[i] = (char)subst[s];
            ck_write_bytes(bad, mut, n);
            SafetensorsFile f;
            err[0] = 0;
            int rc = safetensors_open(&f, bad, err, sizeof err);
            if (rc == 0) {
                accepted++;
                for (int64_t k = 0; k < f.n; k++) {
                    const StTensor *e = &f.tensors[k];
                    EXPECT(e->offset >= f.data_start && e->offset + e->nbytes <= f.file_size,
                           "byte %lld: accepted tensor outside the file", (long long)i);
                    uint8_t *dst = malloc((size_t)e->nbytes + 1);
                    EXPECT(safetensors_read(&f, e->name, e->dtype, e->ndim, e->shape, dst, err, sizeof err) == 0,
                           "byte %lld: %s", (long long)i, err);
                    free(dst);
                }
                safetensors_close(&f);
            } else {
                rejected++;
                EXPECT(rc == RS_EXIT_USAGE && strstr(err, bad), "byte %lld: rc %d, message %s", (long long)i, rc,
                       err);
            }
        }
    }
    printf("st_truncations_and_byte_flips: %lld-byte file, %lld variants rejected, %lld read cleanly\n",
           (long long)n, (long long)rejected, (long long)accepted);
    free(mut);
    free(good);
    ck_cleanup();
}

TEST(st_rejects_handmade_headers) {
    ck_tmpdir();
    char p[512];
    ck_path(p, sizeof p, "h.safetensors");
    uint8_t data[64] = {0};
    struct { const char *header; int64_t data_len; const char *want; } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, NULL}, /* valid control */
        {"[1,2]", 0, "must start with '{'"},
        {"{\"a\":", 0, "not valid JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
         "\"data_offsets\":[0,8]}}", 8, "duplicate"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "truncated"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "trailing bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 12, "span 12"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
         "\"data_offsets\":[4,12]}}", 12, "overlaps"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
         "\"data_offsets\":[12,20]}}", 20, "belong to no tensor"},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype 'F33'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, "unknown key 'x'"},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "lacks 'shape'"},
        {"{\"__metadata__\":{\"k\":1},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         "__metadata__"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", 8, "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "at most 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,99999999999999999999]}}", 8, "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_write_raw(p, cases[i].header, data, cases[i].data_len);
        char what[64];
        snprintf(what, sizeof what, "header case %zu", i);
        if (!cases[i].want) {
            SafetensorsFile f;
            char err[2048];
            EXPECT(safetensors_open(&f, p, err, sizeof err) == 0, "valid control rejected: %s", err);
            safetensors_close(&f);
        } else {
            ck_expect_reject(what, p, cases[i].want);
        }
    }
    /* Header length field itself. */
    uint8_t raw[16] = {0};
    ck_write_bytes(p, raw, 5);
    ck_expect_reject("5-byte file", p, "too short");
    memset(raw, 0xff, 8);
    ck_write_bytes(p, raw, 16);
    ck_expect_reject("length 2^64-1", p, "exceeds");
    raw[0] = 100;
    memset(raw + 1, 0, 7);
    ck_write_bytes(p, raw, 16);
    ck_expect_reject("length past the end", p, "runs past the end");
    char missing[512];
    ck_path(missing, sizeof missing, "nope.safetensors");
    ck_expect_reject("missing file", missing, "cannot open");
    ck_cleanup();
}

/* ---- checkpoints ---------------------------------------------------------- */

/* Two files of a small checkpoint whose bytes depend on `seed`. */
typedef struct {
    float w[64];
    uint16_t h[16];
    int64_t count;
    StTensor model[2], optim[1];
    CkptFile files[2];
} CkSet;

static void ck_set_init(CkSet *s, uint64_t seed) {
    memset(s, 0, sizeof *s);
    ck_fill_bytes((uint8_t *)s->w, sizeof s->w, seed);
    ck_fill_bytes((uint8_t *)s->h, sizeof s->h, seed + 1);
    s->count = (int64_t)seed;
    s->model[0] = (StTensor){.name = "w", .dtype = ST_DTYPE_F32, .ndim = 2, .shape = {8, 8}, .data = s->w};
    s->model[1] = (StTensor){.name = "h", .dtype = ST_DTYPE_BF16, .ndim = 1, .shape = {16}, .data = s->h};
    s->optim[0] = (StTensor){.name = "count", .dtype = ST_DTYPE_I64, .ndim = 0, .data = &s->count};
    s->files[0] = (CkptFile){"model.safetensors", s->model, 2, NULL};
    s->files[1] = (CkptFile){"optim.safetensors", s->optim, 1, NULL};
}

static int ck_save(const char *run, int64_t step, int64_t keep, uint64_t seed) {
    CkSet s;
    ck_set_init(&s, seed);
    json_t *state = json_pack("{s:I, s:s}", "tokens", (json_int_t)(step * 100), "seed", "x");
    char err[2048];
    int rc = ckpt_save(run, step, s.files, 2, state, keep, err, sizeof err);
    json_decref(state);
    if (rc) printf("ckpt_save(step %lld): %s\n", (long long)step, err);
    return rc;
}

/* Loads and checks the contents against `seed`; returns the step (-1 on failure). */
static int64_t ck_load_check(const char *run, uint64_t seed, int64_t *rejected) {
    Ckpt ck;
    char err[2048];
    if (ckpt_load(&ck, run, err, sizeof err) != 0) {
        printf("ckpt_load: %s\n", err);
        return -1;
    }
    CkSet want, got;
    ck_set_init(&want, seed);
    memset(&got, 0, sizeof got);
    int64_t s88[2] = {8, 8}, s16[1] = {16};
    int rc = ckpt_read(&ck, "model.safetensors", "w", ST_DTYPE_F32, 2, s88, got.w, err, sizeof err);
    if (rc == 0) rc = ckpt_read(&ck, "model.safetensors", "h", ST_DTYPE_BF16, 1, s16, got.h, err, sizeof err);
    if (rc == 0) rc = ckpt_read(&ck, "optim.safetensors", "count", ST_DTYPE_I64, 0, NULL, &got.count, err, sizeof err);
    EXPECT(rc == 0, "ckpt_read: %s", err);
    EXPECT(memcmp(got.w, want.w, sizeof got.w) == 0 && memcmp(got.h, want.h, sizeof got.h) == 0 &&
           got.count == want.count, "step %lld: tensor data differs from seed %llu", (long long)ck.step,
           (unsigned long long)seed);
    json_int_t tokens = json_integer_value(json_object_get(ck.state, "tokens"));
    EXPECT(tokens == ck.step * 100, "state tokens %lld at step %lld", (long long)tokens, (long long)ck.step);
    if (rejected) *rejected = ck.n_rejected;
    int64_t step = ck.step;
    ckpt_close(&ck);
    return step;
}

static void ck_expect_steps(const char *run, const int64_t *want, int64_t n_want) {
    int64_t *steps = NULL, n = 0;
    char err[2048];
    EXPECT(ckpt_list_steps(run, &steps, &n, err, sizeof err) == 0, "%s", err);
    int same = n == n_want;
    for (int64_t i = 0; same && i < n; i++) same = steps[i] == want[i];
    char got[256] = "", exp[256] = "";
    for (int64_t i = 0; i < n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), " %lld", (long long)steps[i]);
    for (int64_t i = 0; i < n_want; i++) snprintf(exp + strlen(exp), sizeof exp - strlen(exp), " %lld", (long long)want[i]);
    EXPECT(same, "checkpoints on disk:%s, expected:%s", got, exp);
    printf("checkpoints on disk:%s\n", got);
    free(steps);
}

static void ck_write_latest(const char *text) {
    char p[512];
    ck_path(p, sizeof p, "ckpt/LATEST");
    ck_write_bytes(p, text, (int64_t)strlen(text));
}

TEST(ckpt_roundtrip) {
    const char *run = ck_tmpdir();
    EXPECT(ck_save(run, 7, 2, 77) == 0, "save");
    int64_t rej = -1;
    EXPECT(ck_load_check(run, 77, &rej) == 7 && rej == 0, "load step 7 (rejected %lld)", (long long)rej);
    char p[512];
    int64_t n;
    char *latest = ck_read_bytes(ck_path(p, sizeof p, "ckpt/LATEST"), &n);
    EXPECT(!strcmp(latest, "step_00000007\n"), "LATEST holds '%s'", latest);
    free(latest);
    Ckpt ck;
    char err[2048];
    EXPECT(ckpt_load(&ck, run, err, sizeof err) == 0, "%s", err);
    float w[64];
    int64_t s = 64;
    int rc = ckpt_read(&ck, "model.safetensors", "w", ST_DTYPE_F32, 1, &s, w, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "'w'") && strstr(err, "model.safetensors") && strstr(err, "[8, 8]"),
           "shape mismatch: rc %d %s", rc, err);
    rc = ckpt_read(&ck, "opt.safetensors", "w", ST_DTYPE_F32, 1, &s, w, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "opt.safetensors"), "missing file: rc %d %s", rc, err);
    EXPECT(ckpt_file(&ck, "optim.safetensors") && ckpt_file(&ck, "optim.safetensors")->n == 1, "optim file");
    ckpt_close(&ck);
    ck_cleanup();
}

TEST(ckpt_retention) {
    const char *run = ck_tmpdir();
    for (int64_t s = 1; s <= 6; s++) EXPECT(ck_save(run, s, 3, (uint64_t)s) == 0, "save %lld", (long long)s);
    ck_expect_steps(run, (int64_t[]){4, 5, 6}, 3);
    EXPECT(ck_load_check(run, 6, NULL) == 6, "load 6");
    /* A run resumed from an earlier step: newer checkpoints are left alone, LATEST moves back. */
    EXPECT(ck_save(run, 3, 2, 33) == 0, "save 3");
    ck_expect_steps(run, (int64_t[]){3, 4, 5, 6}, 4);
    EXPECT(ck_load_check(run, 33, NULL) == 3, "LATEST names step 3");
    EXPECT(ck_save(run, 4, 2, 44) == 0, "save 4 again");
    ck_expect_steps(run, (int64_t[]){3, 4, 5, 6}, 4);
    EXPECT(ck_load_check(run, 44, NULL) == 4, "re-saved step 4 loads with its new data");
    EXPECT(ck_save(run, 7, 1, 7) == 0, "save 7 keep 1");
    ck_expect_steps(run, (int64_t[]){7}, 1);
    char p[512];
    DIR *d = opendir(ck_path(p, sizeof p, "ckpt"));
    struct dirent *de;
    int extra = 0;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strcmp(de->d_name, ".lock") &&
            strcmp(de->d_name, "LATEST") && strcmp(de->d_name, "step_00000007")) {
            printf("left over in ckpt/: %s\n", de->d_name);
            extra++;
        }
    closedir(d);
    EXPECT(extra == 0, "%d entries left over in ckpt/", extra);
    ck_cleanup();
}

TEST(ckpt_crc_mismatch_falls_back) {
    const char *run = ck_tmpdir();
    EXPECT(ck_save(run, 1, 3, 1) == 0 && ck_save(run, 2, 3, 2) == 0 && ck_save(run, 3, 3, 3) == 0, "saves");
    char p[512];
    ck_flip_byte(ck_path(p, sizeof p, "ckpt/step_00000003/optim.safetensors"), -3); /* a data byte */
    int64_t rej = 0;
    EXPECT(ck_load_check(run, 2, &rej) == 2 && rej == 1, "flipped data byte: expected step 2 with 1 rejected, got "
           "%lld rejected", (long long)rej);
    char err[2048];
    int rc = ckpt_verify_dir(ck_path(p, sizeof p, "ckpt/step_00000003"), 3, NULL, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "crc32") && strstr(err, "optim.safetensors"), "verify: %s", err);
    printf("verify step 3: %s\n", err);
    /* A changed digit in the manifest's state is caught by the manifest's own crc. */
    int64_t n;
    char *m = ck_read_bytes(ck_path(p, sizeof p, "ckpt/step_00000002/manifest.json"), &n);
    char *digit = strstr(m, "\"tokens\": 200");
    EXPECT(digit != NULL, "manifest layout: %s", m);
    if (digit) digit[10] = '3';
    ck_write_bytes(p, m, n);
    free(m);
    EXPECT(ck_load_check(run, 1, &rej) == 1 && rej == 2, "tampered manifest: expected step 1, 2 rejected (%lld)",
           (long long)rej);
    rc = ckpt_verify_dir(ck_path(p, sizeof p, "ckpt/step_00000002"), 2, NULL, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "manifest checksum mismatch"), "verify: %s", err);
    /* Truncated tensor file: size mismatch. */
    ck_write_bytes(ck_path(p, sizeof p, "ckpt/step_00000001/model.safetensors"), "x", 1);
    Ckpt ck;
    rc = ckpt_load(&ck, run, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "no checkpoint verifies"), "all corrupt: rc %d %s", rc, err);
    printf("all corrupt: %s\n", err);
    ck_cleanup();
}

TEST(ckpt_missing_manifest_is_ignored) {
    const char *run = ck_tmpdir();
    EXPECT(ck_save(run, 1, 3, 1) == 0 && ck_save(run, 2, 3, 2) == 0, "saves");
    char p[512];
    unlink(ck_path(p, sizeof p, "ckpt/step_00000002/manifest.json"));
    int64_t rej = 0;
    EXPECT(ck_load_check(run, 1, &rej) == 1 && rej == 1, "LATEST's manifest missing: step 1 expected");
    ck_expect_steps(run, (int64_t[]){1}, 1);
    /* A step directory without a manifest that LATEST does not name is skipped too. */
    mkdir(ck_path(p, sizeof p, "ckpt/step_00000009"), 0755);
    unlink(ck_path(p, sizeof p, "ckpt/LATEST"));
    EXPECT(ck_load_check(run, 1, &rej) == 1 && rej == 2, "scan: step 1 expected, 2 rejected (%lld)", (long long)rej);
    ck_cleanup();
}

TEST(ckpt_latest_missing_or_bad) {
    const char *run = ck_tmpdir();
    EXPECT(ck_save(run, 1, 3, 1) == 0 && ck_save(run, 2, 3, 2) == 0, "saves");
    int64_t rej = 0;
    ck_write_latest("step_00000009\n");
    EXPECT(ck_load_check(run, 2, &rej) == 2 && rej == 1, "LATEST naming a missing dir: step 2 expected");
    ck_write_latest("step_00000001\n");
    EXPECT(ck_load_check(run, 1, &rej) == 1 && rej == 0, "LATEST naming step 1 is honoured");
    ck_write_latest("garbage");
    EXPECT(ck_load_check(run, 2, &rej) == 2 && rej == 0, "garbage LATEST: scan finds step 2");
    char p[512];
    unlink(ck_path(p, sizeof p, "ckpt/LATEST"));
    EXPECT(ck_load_check(run, 2, &rej) == 2 && rej == 0, "no LATEST: scan finds step 2");
    ck_cleanup();
}

TEST(ckpt_no_checkpoints) {
    const char *run = ck_tmpdir();
    Ckpt ck;
    char err[2048];
    int rc = ckpt_load(&ck, run, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "no checkpoints") && strstr(err, run), "empty run: rc %d %s", rc, err);
    char p[512];
    mkdir(ck_path(p, sizeof p, "ckpt"), 0755);
    rc = ckpt_load(&ck, run, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "no checkpoints"), "empty ckpt/: rc %d %s", rc, err);
    printf("empty: %s\n", err);
    ck_cleanup();
}

TEST(ckpt_stale_temporaries_removed) {
    const char *run = ck_tmpdir();
    EXPECT(ck_save(run, 1, 2, 1) == 0, "save 1");
    char p[512];
    mkdir(ck_path(p, sizeof p, "ckpt/step_00000002.tmp.99999"), 0755);
    ck_write_bytes(ck_path(p, sizeof p, "ckpt/step_00000002.tmp.99999/model.safetensors"), "junk", 4);
    mkdir(ck_path(p, sizeof p, "ckpt/step_00000002.tmp.99999/sub"), 0755);
    ck_write_bytes(ck_path(p, sizeof p, "ckpt/LATEST.tmp"), "step_00000002\n", 14);
    EXPECT(ck_load_check(run, 1, NULL) == 1, "temporaries do not disturb a load");
    EXPECT(ck_save(run, 2, 2, 2) == 0, "save 2");
    EXPECT(!ck_exists(ck_path(p, sizeof p, "ckpt/step_00000002.tmp.99999")), "stale tmp dir not removed");
    EXPECT(!ck_exists(ck_path(p, sizeof p, "ckpt/LATEST.tmp")), "stale LATEST.tmp not removed");
    EXPECT(ck_load_check(run, 2, NULL) == 2, "load 2");
    ck_cleanup();
}

TEST(ckpt_save_rejects_bad_arguments) {
    const char *run = ck_tmpdir();
    CkSet s;
    ck_set_init(&s, 1);
    char err[2048];
    EXPECT(ckpt_save(run, 1, s.files, 2, NULL, 0, err, sizeof err) == RS_EXIT_USAGE, "keep 0 accepted");
    EXPECT(ckpt_save(run, -1, s.files, 2, NULL, 1, err, sizeof err) == RS_EXIT_USAGE, "step -1 accepted");
    EXPECT(ckpt_save(run, 100000000, s.files, 2, NULL, 1, err, sizeof err) == RS_EXIT_USAGE, "step 1e8 accepted");
    const char *names[] = {"../x", "manifest.json", ".hidden", "a/b", "", "sp ace"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        CkptFile f = {names[i], s.model, 2, NULL};
        int rc = ckpt_save(run, 1, &f, 1, NULL, 1, err, sizeof err);
        EXPECT(rc == RS_EXIT_USAGE, "file name '%s' accepted", names[i]);
    }
    CkptFile dup[2] = {s.files[0], s.files[0]};
    EXPECT(ckpt_save(run, 1, dup, 2, NULL, 1, err, sizeof err) == RS_EXIT_USAGE, "duplicate file accepted");
    json_t *arr = json_array();
    EXPECT(ckpt_save(run, 1, s.files, 2, arr, 1, err, sizeof err) == RS_EXIT_USAGE, "array state accepted");
    json_decref(arr);
    char p[512];
    int rc = ckpt_save(ck_path(p, sizeof p, "nope"), 1, s.files, 2, NULL, 1, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "does not exist"), "missing run dir: rc %d %s", rc, err);
    /* A bad tensor inside a file fails the save and leaves no step directory. */
    StTensor bad = {.name = "x", .dtype = ST_DTYPE_F32, .ndim = 1, .shape = {4}, .data = NULL};
    CkptFile bf = {"model.safetensors", &bad, 1, NULL};
    rc = ckpt_save(run, 1, &bf, 1, NULL, 1, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE, "tensor without data accepted (rc %d)", rc);
    int64_t *steps = NULL, n = -1;
    ckpt_list_steps(run, &steps, &n, err, sizeof err);
    EXPECT(n == 0, "%lld checkpoints after failed saves", (long long)n);
    free(steps);
    ck_cleanup();
}

TEST(ckpt_save_lock) {
    const char *run = ck_tmpdir();
    EXPECT(ck_save(run, 1, 2, 1) == 0, "save 1");
    char p[512], err[2048];
    int fd = open(ck_path(p, sizeof p, "ckpt/.lock"), O_RDWR);
    EXPECT(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0, "taking the lock");
    CkSet s;
    ck_set_init(&s, 2);
    int rc = ckpt_save(run, 2, s.files, 2, NULL, 2, err, sizeof err);
    EXPECT(rc == RS_EXIT_USAGE && strstr(err, "another process"), "save under a held lock: rc %d %s", rc, err);
    close(fd);
    EXPECT(ck_save(run, 2, 2, 2) == 0, "save after the lock is released");
    EXPECT(ck_load_check(run, 2, NULL) == 2, "load 2");
    ck_cleanup();
}
