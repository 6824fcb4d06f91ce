/*
 * ckpt_stress.c — drives the checkpoint code from outside, for
 * tests/test_ckpt.py (the kill -9 and crash-point tests, and the
 * safetensors cross-checks against a Python reader and writer).
 *
 *   ckpt_stress write RUN_DIR [--steps N] [--keep K] [--start S] [--crash-at STAGE[:K]]
 *       Saves checkpoints step S, S+1, ... (forever unless --steps) of about
 *       4 MiB whose every byte is derived from the step number, keep K
 *       (default 2). S defaults to one past the checkpoint that loads (1 when
 *       none). --crash-at kills the process with SIGKILL at the K-th time
 *       (default 1st) a save reaches STAGE (see ckpt_save_hook in ckpt.h).
 *   ckpt_stress verify RUN_DIR [--strict] [--expect-step N] [--max-complete M]
 *       Loads the latest checkpoint through ckpt_load and checks every tensor
 *       byte and the state against what that step must contain. --strict:
 *       fail if a newer checkpoint had to be skipped. --max-complete: fail if
 *       more than M complete checkpoints are on disk. Exit 0 ok, 1 mismatch,
 *       2 no loadable checkpoint.
 *   ckpt_stress st-dump FILE      one JSON line per tensor (name, dtype,
 *       shape, hex of its bytes) after a "__metadata__" line; exit 2 with a
 *       message when the file is rejected.
 *   ckpt_stress st-sample FILE    writes a fixed file holding every dtype,
 *       a scalar and empty tensors (values listed in tests/test_ckpt.py).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/ckpt.h"
#include "core/error.h"

/* ---- the data a step must contain ----------------------------------------- */

typedef struct {
    const char *file;
    const char *name;
    StDtype dtype;
    int32_t ndim;
    int64_t shape[2];
} StressTensor;

static const StressTensor stress_tensors[] = {
    {"model.safetensors", "w", ST_DTYPE_F32, 2, {256, 1024}},
    {"model.safetensors", "emb", ST_DTYPE_F32, 2, {512, 512}},
    {"model.safetensors", "norm", ST_DTYPE_BF16, 1, {4096, 0}},
    {"optim.safetensors", "m", ST_DTYPE_F32, 2, {256, 1024}},
    {"optim.safetensors", "v", ST_DTYPE_F32, 2, {256, 1024}},
    {"optim.safetensors", "count", ST_DTYPE_I64, 0, {0, 0}},
};
#define STRESS_N ((int64_t)(sizeof stress_tensors / sizeof stress_tensors[0]))
static const char *const stress_files[] = {"model.safetensors", "optim.safetensors"};

static uint64_t stress_mix(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static int64_t stress_nbytes(const StressTensor *t) {
    return st_numel(t->ndim, t->shape) * st_dtype_size(t->dtype);
}

/* Byte j of tensor k at step s. */
static void stress_fill(uint8_t *dst, int64_t nbytes, int64_t step, int64_t k) {
    uint64_t seed = stress_mix((uint64_t)step * 1000003ull + (uint64_t)k);
    for (int64_t j = 0; j < nbytes; j += 8) {
        uint64_t r = stress_mix(seed + (uint64_t)j);
        for (int64_t b = 0; b < 8 && j + b < nbytes; b++) dst[j + b] = (uint8_t)(r >> (8 * b));
    }
}

static json_t *stress_state(int64_t step) {
    char rng[32];
    snprintf(rng, sizeof rng, "%016llx", (unsigned long long)stress_mix((uint64_t)step));
    return json_pack("{s:I, s:I, s:s, s:s, s:f}", "step", (json_int_t)step, "tokens_consumed",
                     (json_int_t)(step * 4096), "rng", rng, "config_hash", "stress", "lr", 0.1 * (double)step);
}

/* ---- write ---------------------------------------------------------------- */

static const char *stress_crash_stage;
static int64_t stress_crash_count = 1;

static void stress_hook(const char *stage, int64_t step) {
    if (stress_crash_stage && !strcmp(stage, stress_crash_stage) && --stress_crash_count == 0) {
        fprintf(stderr, "ckpt_stress: SIGKILL at stage %s of step %lld\n", stage, (long long)step);
        kill(getpid(), SIGKILL);
    }
}

static int stress_write(const char *run_dir, int64_t steps, int64_t keep, int64_t start) {
    char err[4096];
    if (start < 0) {
        Ckpt ck;
        if (ckpt_load(&ck, run_dir, err, sizeof err) == 0) {
            start = ck.step + 1;
            ckpt_close(&ck);
        } else {
            start = 1;
        }
    }
    uint8_t *buf[STRESS_N];
    StTensor t[STRESS_N];
    for (int64_t k = 0; k < STRESS_N; k++) {
        buf[k] = RS_MALLOC((size_t)stress_nbytes(&stress_tensors[k]) + 1);
        memset(&t[k], 0, sizeof t[k]);
        t[k].name = stress_tensors[k].name;
        t[k].dtype = stress_tensors[k].dtype;
        t[k].ndim = stress_tensors[k].ndim;
        for (int d = 0; d < t[k].ndim; d++) t[k].shape[d] = stress_tensors[k].shape[d];
        t[k].data = buf[k];
    }
    /* Tensors are grouped by file in stress_tensors: model first, then optim. */
    CkptFile files[2] = {{stress_files[0], &t[0], 3, NULL}, {stress_files[1], &t[3], 3, NULL}};
    json_t *meta = json_pack("{s:s}", "producer", "ckpt_stress");
    files[0].metadata = meta;
    ckpt_save_hook = stress_hook;
    int rc = 0;
    for (int64_t s = start; steps == 0 || s < start + steps; s++) {
        for (int64_t k = 0; k < STRESS_N; k++) stress_fill(buf[k], stress_nbytes(&stress_tensors[k]), s, k);
        json_t *state = stress_state(s);
        rc = ckpt_save(run_dir, s, files, 2, state, keep, err, sizeof err);
        json_decref(state);
        if (rc) {
            fprintf(stderr, "ckpt_stress: error: %s\n", err);
            break;
        }
    }
    if (rc == 0) printf("write: saved steps %lld..%lld\n", (long long)start, (long long)(start + steps - 1));
    json_decref(meta);
    for (int64_t k = 0; k < STRESS_N; k++) free(buf[k]);
    return rc;
}

/* ---- verify --------------------------------------------------------------- */

static int stress_verify(const char *run_dir, int strict, int64_t expect_step, int64_t max_complete) {
    char err[4096];
    Ckpt ck;
    if (ckpt_load(&ck, run_dir, err, sizeof err) != 0) {
        fprintf(stderr, "ckpt_stress: error: %s\n", err);
        return 2;
    }
    int bad = 0;
    int64_t total = 0;
    for (int64_t k = 0; k < STRESS_N && !bad; k++) {
        const StressTensor *st = &stress_tensors[k];
        int64_t nb = stress_nbytes(st);
        uint8_t *got = RS_MALLOC((size_t)nb + 1), *want = RS_MALLOC((size_t)nb + 1);
        stress_fill(want, nb, ck.step, k);
        if (ckpt_read(&ck, st->file, st->name, st->dtype, st->ndim, st->shape, got, err, sizeof err) != 0) {
            fprintf(stderr, "verify: %s\n", err);
            bad = 1;
        } else if (memcmp(got, want, (size_t)nb) != 0) {
            int64_t j = 0;
            while (got[j] == want[j]) j++;
            fprintf(stderr, "verify: step %lld: %s/%s differs from the expected data at byte %lld\n",
                    (long long)ck.step, st->file, st->name, (long long)j);
            bad = 1;
        }
        total += nb;
        free(got);
        free(want);
    }
    for (int i = 0; i < 2 && !bad; i++) {
        const SafetensorsFile *f = ckpt_file(&ck, stress_files[i]);
        if (!f || f->n != 3) {
            fprintf(stderr, "verify: %s: expected 3 tensors\n", stress_files[i]);
            bad = 1;
        }
    }
    json_t *want_state = stress_state(ck.step);
    if (!bad && !json_equal(want_state, ck.state)) {
        char *g = json_dumps(ck.state, JSON_COMPACT | JSON_SORT_KEYS);
        fprintf(stderr, "verify: step %lld: state differs: %s\n", (long long)ck.step, g ? g : "?");
        free(g);
        bad = 1;
    }
    json_decref(want_state);
    if (!bad && strict && ck.n_rejected > 0) {
        fprintf(stderr, "verify: --strict: %lld newer checkpoint(s) failed verification\n", (long long)ck.n_rejected);
        bad = 1;
    }
    if (!bad && expect_step >= 0 && ck.step != expect_step) {
        fprintf(stderr, "verify: loaded step %lld, expected %lld\n", (long long)ck.step, (long long)expect_step);
        bad = 1;
    }
    int64_t *steps = NULL, n = 0;
    if (!bad && ckpt_list_steps(run_dir, &steps, &n, err, sizeof err) != 0) {
        fprintf(stderr, "verify: %s\n", err);
        bad = 1;
    }
    if (!bad && max_complete >= 0 && n > max_complete) {
        fprintf(stderr, "verify: %lld complete checkpoints on disk, expected at most %lld\n", (long long)n,
                (long long)max_complete);
        bad = 1;
    }
    free(steps);
    if (!bad)
        printf("verify: step %lld ok (%lld tensors, %lld bytes, %lld complete on disk, %lld rejected)\n",
               (long long)ck.step, (long long)STRESS_N, (long long)total, (long long)n, (long long)ck.n_rejected);
    ckpt_close(&ck);
    return bad;
}

/* ---- safetensors cross-checks --------------------------------------------- */

static int stress_st_dump(const char *path) {
    char err[4096];
    SafetensorsFile f;
    int rc = safetensors_open(&f, path, err, sizeof err);
    if (rc) {
        fprintf(stderr, "ckpt_stress: error: %s\n", err);
        return rc;
    }
    char *meta = f.metadata ? json_dumps(f.metadata, JSON_COMPACT) : NULL;
    printf("{\"__metadata__\": %s}\n", meta ? meta : "null");
    free(meta);
    for (int64_t i = 0; i < f.n && rc == 0; i++) {
        const StTensor *t = &f.tensors[i];
        uint8_t *data = RS_MALLOC((size_t)t->nbytes + 1);
        rc = safetensors_read(&f, t->name, t->dtype, t->ndim, t->shape, data, err, sizeof err);
        if (rc) {
            fprintf(stderr, "ckpt_stress: error: %s\n", err);
        } else {
            char *hex = RS_MALLOC((size_t)t->nbytes * 2 + 1);
            for (int64_t j = 0; j < t->nbytes; j++) snprintf(hex + 2 * j, 3, "%02x", data[j]);
            hex[2 * t->nbytes] = 0;
            json_t *shape = json_array();
            for (int32_t d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
            json_t *line = json_pack("{s:s, s:s, s:o, s:s}", "name", t->name, "dtype", st_dtype_names[t->dtype],
                                     "shape", shape, "hex", hex);
            char *text = json_dumps(line, JSON_COMPACT);
            printf("%s\n", text);
            free(text);
            json_decref(line);
            free(hex);
        }
        free(data);
    }
    safetensors_close(&f);
    return rc;
}

static int stress_st_sample(const char *path) {
    float f32[6], scalar = 3.25f;
    double f64[3];
    uint16_t bf16[4], f16[4] = {0x3C00, 0xC000, 0x3800, 0x7BFF}; /* 1, -2, 0.5, 65504 */
    int64_t i64[4];
    int32_t i32[5];
    int16_t i16[3];
    int8_t i8[4] = {-128, -1, 0, 127};
    uint8_t u8[3] = {0, 128, 255}, boolv[3] = {1, 0, 1}, f8[2] = {0x38, 0xB8};
    uint16_t u16[2] = {0, 65535};
    uint32_t u32[2] = {0, 4000000000u};
    uint64_t u64[2] = {0, UINT64_MAX};
    for (int i = 0; i < 6; i++) f32[i] = 0.5f * (float)i - 1.0f;
    for (int i = 0; i < 3; i++) f64[i] = (double)i / 3.0;
    for (int i = 0; i < 4; i++) {
        float x = (float)i - 1.5f;
        uint32_t bits;
        memcpy(&bits, &x, 4);
        bf16[i] = (uint16_t)(bits >> 16); /* exact: these values have 8-bit mantissas */
    }
    for (int i = 0; i < 4; i++) i64[i] = (int64_t)i * 1000000000007LL - 3;
    for (int i = 0; i < 5; i++) i32[i] = i * -100000 + 7;
    for (int i = 0; i < 3; i++) i16[i] = (int16_t)((i - 1) * 300);
    StTensor t[] = {
        {.name = "f32", .dtype = ST_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = f32},
        {.name = "f64", .dtype = ST_DTYPE_F64, .ndim = 1, .shape = {3}, .data = f64},
        {.name = "bf16", .dtype = ST_DTYPE_BF16, .ndim = 1, .shape = {4}, .data = bf16},
        {.name = "f16", .dtype = ST_DTYPE_F16, .ndim = 2, .shape = {2, 2}, .data = f16},
        {.name = "i64", .dtype = ST_DTYPE_I64, .ndim = 2, .shape = {2, 2}, .data = i64},
        {.name = "i32", .dtype = ST_DTYPE_I32, .ndim = 1, .shape = {5}, .data = i32},
        {.name = "i16", .dtype = ST_DTYPE_I16, .ndim = 1, .shape = {3}, .data = i16},
        {.name = "i8", .dtype = ST_DTYPE_I8, .ndim = 1, .shape = {4}, .data = i8},
        {.name = "u8", .dtype = ST_DTYPE_U8, .ndim = 1, .shape = {3}, .data = u8},
        {.name = "u16", .dtype = ST_DTYPE_U16, .ndim = 1, .shape = {2}, .data = u16},
        {.name = "u32", .dtype = ST_DTYPE_U32, .ndim = 1, .shape = {2}, .data = u32},
        {.name = "u64", .dtype = ST_DTYPE_U64, .ndim = 1, .shape = {2}, .data = u64},
        {.name = "bool", .dtype = ST_DTYPE_BOOL, .ndim = 1, .shape = {3}, .data = boolv},
        {.name = "f8", .dtype = ST_DTYPE_F8_E4M3, .ndim = 1, .shape = {2}, .data = f8},
        {.name = "scalar", .dtype = ST_DTYPE_F32, .ndim = 0, .data = &scalar},
        {.name = "empty", .dtype = ST_DTYPE_F32, .ndim = 2, .shape = {0, 4}, .data = NULL},
        {.name = "empty_i64", .dtype = ST_DTYPE_I64, .ndim = 1, .shape = {0}, .data = NULL},
    };
    json_t *meta = json_pack("{s:s, s:s}", "format", "pt", "producer", "ringscan");
    char err[4096];
    int rc = safetensors_write_file(path, t, (int64_t)(sizeof t / sizeof t[0]), meta, NULL, err, sizeof err);
    json_decref(meta);
    if (rc) fprintf(stderr, "ckpt_stress: error: %s\n", err);
    return rc;
}

/* ---- command line --------------------------------------------------------- */

static int stress_usage(void) {
    fprintf(stderr, "usage: ckpt_stress write RUN_DIR [--steps N] [--keep K] [--start S] [--crash-at STAGE[:K]]\n"
                    "       ckpt_stress verify RUN_DIR [--strict] [--expect-step N] [--max-complete M]\n"
                    "       ckpt_stress st-dump FILE | st-sample FILE\n");
    return 2;
}

static int stress_int(const char *s, int64_t *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end) return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return stress_usage();
    const char *mode = argv[1], *path = argv[2];
    int64_t steps = 0, keep = 2, start = -1, expect = -1, max_complete = -1;
    int strict = 0;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--strict")) {
            strict = 1;
            continue;
        }
        if (!v) return stress_usage();
        i++;
        int bad = 0;
        if (!strcmp(a, "--steps")) bad = stress_int(v, &steps);
        else if (!strcmp(a, "--keep")) bad = stress_int(v, &keep);
        else if (!strcmp(a, "--start")) bad = stress_int(v, &start);
        else if (!strcmp(a, "--expect-step")) bad = stress_int(v, &expect);
        else if (!strcmp(a, "--max-complete")) bad = stress_int(v, &max_complete);
        else if (!strcmp(a, "--crash-at")) {
            static char stage[64];
            snprintf(stage, sizeof stage, "%s", v);
            char *colon = strchr(stage, ':');
            if (colon) {
                *colon = 0;
                bad = stress_int(colon + 1, &stress_crash_count) || stress_crash_count < 1;
            }
            stress_crash_stage = stage;
        } else {
            return stress_usage();
        }
        if (bad) return stress_usage();
    }
    if (!strcmp(mode, "write")) return stress_write(path, steps, keep, start);
    if (!strcmp(mode, "verify")) return stress_verify(path, strict, expect, max_complete);
    if (!strcmp(mode, "st-dump")) return stress_st_dump(path);
    if (!strcmp(mode, "st-sample")) return stress_st_sample(path);
    return stress_usage();
}
