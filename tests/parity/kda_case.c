/*
 * kda_case.c — one Kimi Delta Attention chunk call on a case's inputs, on the cpu oracle or the cuda kernels
 * (build/kda_case): the C side of tests/parity/kda_fla_check.py, which compares its outputs and FLA's chunk_kda's
 * with a float64 reference on the same inputs.
 *
 *   build/kda_case CASE_DIR [--device cpu|cuda] [--keep none|wy|states] [--out FILE]
 *
 * Reads CASE_DIR/inputs.safetensors (F32 unless said; T tokens, H heads (key heads = value heads), K = V on
 * cuda; FLA's (B=1, T, H, D) layout with B dropped):
 *   q, k        (T, H, K)  already L2-normalised; on cuda rounded to bf16 on the way in (the writer stores
 *                          bf16-exact values, so nothing is rounded)
 *   v, dout     (T, H, V)  the same
 *   g           (T, H, K)  the natural-log decay of every key channel (the gate already applied)
 *   beta        (T, H)     after its sigmoid
 *   cu_seqlens  (N+1) I32  document boundaries [0, ..., T], increasing (one document: [0, T])
 * and runs kda_chunk_forward then kda_chunk_backward (backend.h; no initial state, no final state, scale
 * K^-1/2 inside, the state reset at every document start), with the forward's kept buffer as the model keeps
 * it (--keep, checkpoint.gdn_keep; default the config's). Writes FILE (default CASE_DIR/outputs.safetensors),
 * all F32: o (T, H, V), dq, dk (T, H, K), dv (T, H, V), dg (T, H, K), dbeta (T, H); on cuda o, dq, dk, dv are
 * the kernels' bf16 values widened exactly.
 *
 * Bad input (a missing tensor, a shape or dtype other than the above, cu_seqlens not [0, ..., T] increasing,
 * dims the cuda kernels do not take) exits 2 naming the file and tensor; nothing is written then.
 * One process, no MPI; on cuda GPU 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/runtime.h"
#include "config/config.h"
#include "core/error.h"
#include "io/safetensors.h"

#define KDA_CASE_HINT "kda_case CASE_DIR [--device cpu|cuda] [--keep none|wy|states] [--out FILE]"

/* the case's sizes, from q and v */
typedef struct {
    int64_t T;
    int H, K, V, ndocs;
} KdaCaseDims;

/* tensor `name` of f: exactly F32 (or I32 for cu_seqlens) of ndim dims, else exit 2 naming file and tensor */
static const StTensor *kda_case_tensor(const SafetensorsFile *f, const char *name, StDtype dtype, int ndim) {
    const StTensor *t = safetensors_find(f, name);
    if (!t) RS_USAGE(KDA_CASE_HINT, "%s: no tensor '%s'", f->path, name);
    if (t->dtype != dtype || t->ndim != ndim)
        RS_USAGE(KDA_CASE_HINT, "%s: tensor '%s' is %s with %d dims, expected %s with %d", f->path, name,
                 st_dtype_names[t->dtype], t->ndim, st_dtype_names[dtype], ndim);
    return t;
}

/* reads tensor name (F32, shape {a, b[, c]}) into a new host buffer; exit 2 on another shape */
static float *kda_case_read(const SafetensorsFile *f, const char *name, int ndim, int64_t a, int64_t b, int64_t c) {
    char err[4096];
    const int64_t shape[3] = {a, b, c};
    kda_case_tensor(f, name, ST_DTYPE_F32, ndim);
    const int64_t n = st_numel(ndim, shape);
    float *h = RS_MALLOC((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (safetensors_read(f, name, ST_DTYPE_F32, ndim, shape, h, err, sizeof err)) RS_USAGE(KDA_CASE_HINT, "%s", err);
    return h;
}

/* doc_pos (T) from cu_seqlens, which must be [0, ..., T] increasing; returns the number of documents */
static int kda_case_doc_pos(int32_t *doc_pos, const SafetensorsFile *f, int64_t T) {
    char err[4096];
    const StTensor *t = kda_case_tensor(f, "cu_seqlens", ST_DTYPE_I32, 1);
    const int64_t n = t->shape[0];
    if (n < 2) RS_USAGE(KDA_CASE_HINT, "%s: cu_seqlens has %lld entries, expected [0, ..., T] (at least 2)", f->path,
                        (long long)n);
    int32_t *cu = RS_MALLOC((size_t)n * sizeof(int32_t));
    if (safetensors_read(f, "cu_seqlens", ST_DTYPE_I32, 1, &n, cu, err, sizeof err)) RS_USAGE(KDA_CASE_HINT, "%s", err);
    if (cu[0] != 0 || cu[n - 1] != T) RS_USAGE(KDA_CASE_HINT, "%s: cu_seqlens runs from %d to %d, expected 0 to T = %lld",
                                               f->path, cu[0], cu[n - 1], (long long)T);
    for (int64_t i = 1; i < n; i++) {
        if (cu[i] <= cu[i - 1])
            RS_USAGE(KDA_CASE_HINT, "%s: cu_seqlens[%lld] = %d after %d: expected increasing boundaries", f->path,
                     (long long)i, cu[i], cu[i - 1]);
        for (int32_t t0 = cu[i - 1]; t0 < cu[i]; t0++) doc_pos[t0] = t0 - cu[i - 1];
    }
    free(cu);
    return (int)(n - 1);
}

/* host fp32 (n) -> a new device buffer of the activation type */
static void *kda_case_act_up(const Backend *be, const float *h, int64_t n) {
    float *f = be->alloc((size_t)n * sizeof(float));
    be->to_device(f, h, (size_t)n * sizeof(float));
    void *a = be->alloc((size_t)n * (size_t)be->act_size);
    be->act_from_f32(a, f, n);
    be->free(f);
    return a;
}

static float *kda_case_f32_up(const Backend *be, const float *h, int64_t n) {
    float *d = be->alloc((size_t)n * sizeof(float));
    be->to_device(d, h, (size_t)n * sizeof(float));
    return d;
}

/* device activation (n) -> a new host fp32 buffer */
static float *kda_case_act_down(const Backend *be, const void *a, int64_t n) {
    float *f = be->alloc((size_t)n * sizeof(float)), *h = RS_MALLOC((size_t)n * sizeof(float));
    be->act_to_f32(f, a, n);
    be->to_host(h, f, (size_t)n * sizeof(float));
    be->free(f);
    return h;
}

static float *kda_case_f32_down(const Backend *be, const float *d, int64_t n) {
    float *h = RS_MALLOC((size_t)n * sizeof(float));
    be->to_host(h, d, (size_t)n * sizeof(float));
    return h;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') RS_USAGE(KDA_CASE_HINT, "missing CASE_DIR");
    const char *dir = argv[1], *device = "cpu", *keep = NULL, *out_arg = NULL;
    for (int i = 2; i < argc; i += 2) {
        if (i + 1 >= argc) RS_USAGE(KDA_CASE_HINT, "%s needs a value", argv[i]);
        if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--keep")) keep = argv[i + 1];
        else if (!strcmp(argv[i], "--out")) out_arg = argv[i + 1];
        else RS_USAGE(KDA_CASE_HINT, "unknown argument %s", argv[i]);
    }
    Config cfg;
    ConfigErrors ce = {0};
    char set[256], why[4096], path[4096], err[4096];
    config_init_defaults(&cfg);
    snprintf(set, sizeof set, "device.kind=%s", device);
    config_apply_set(&cfg, set, 0, &ce);
    config_apply_set(&cfg, "device.attention_kernel=ringscan", 1, &ce); /* no attention here: nothing to load */
    if (keep) {
        snprintf(set, sizeof set, "checkpoint.gdn_keep=%s", keep);
        config_apply_set(&cfg, set, 2, &ce);
    }
    if (ce.count) RS_USAGE(KDA_CASE_HINT, "%s", ce.text);
    const int cuda = cfg.device.kind == DEVICE_KIND_CUDA;

    /* the inputs, checked before any device is touched */
    SafetensorsFile f;
    snprintf(path, sizeof path, "%s/inputs.safetensors", dir);
    if (safetensors_open(&f, path, err, sizeof err)) RS_USAGE(KDA_CASE_HINT, "%s", err);
    const StTensor *tq = kda_case_tensor(&f, "q", ST_DTYPE_F32, 3), *tv = kda_case_tensor(&f, "v", ST_DTYPE_F32, 3);
    KdaCaseDims d = {.T = tq->shape[0], .H = (int)tq->shape[1], .K = (int)tq->shape[2], .V = (int)tv->shape[2]};
    if (d.T < 1 || d.H < 1 || d.K < 1 || d.V < 1 || tv->shape[0] != d.T || tv->shape[1] != d.H)
        RS_USAGE(KDA_CASE_HINT, "%s: q is (%lld, %lld, %lld) and v (%lld, %lld, %lld): expected (T, H, K) and (T, H, V)",
                 path, (long long)tq->shape[0], (long long)tq->shape[1], (long long)tq->shape[2],
                 (long long)tv->shape[0], (long long)tv->shape[1], (long long)tv->shape[2]);
    if (cuda && ((d.K != 64 && d.K != 128) || d.V != d.K))
        RS_USAGE(KDA_CASE_HINT, "%s: K = %d, V = %d: the cuda KDA kernels take K = V = 64 or 128", path, d.K, d.V);
    const int64_t qn = d.T * d.H * d.K, vn = d.T * d.H * d.V, bn = d.T * d.H;
    float *q = kda_case_read(&f, "q", 3, d.T, d.H, d.K), *k = kda_case_read(&f, "k", 3, d.T, d.H, d.K);
    float *v = kda_case_read(&f, "v", 3, d.T, d.H, d.V), *dout = kda_case_read(&f, "dout", 3, d.T, d.H, d.V);
    float *g = kda_case_read(&f, "g", 3, d.T, d.H, d.K), *beta = kda_case_read(&f, "beta", 2, d.T, d.H, 0);
    int32_t *doc_pos = RS_MALLOC((size_t)d.T * sizeof(int32_t));
    d.ndocs = kda_case_doc_pos(doc_pos, &f, d.T);
    safetensors_close(&f);

    const Backend *be = runtime_open(&cfg, NULL, why, sizeof why); /* cuda: GPU 0 */
    if (!be) RS_USAGE(KDA_CASE_HINT, "%s", why);
    if (!be->kda_chunk_forward || !be->kda_chunk_backward || !be->kda_kept_bytes)
        RS_USAGE(KDA_CASE_HINT, "the %s backend has no Kimi Delta Attention kernels", be->name);
    void *q_d = kda_case_act_up(be, q, qn), *k_d = kda_case_act_up(be, k, qn), *v_d = kda_case_act_up(be, v, vn);
    void *dout_d = kda_case_act_up(be, dout, vn);
    float *g_d = kda_case_f32_up(be, g, qn), *beta_d = kda_case_f32_up(be, beta, bn);
    int32_t *doc_d = be->alloc((size_t)d.T * sizeof(int32_t));
    be->to_device(doc_d, doc_pos, (size_t)d.T * sizeof(int32_t));
    void *o_d = be->alloc((size_t)vn * (size_t)be->act_size), *dq_d = be->alloc((size_t)qn * (size_t)be->act_size);
    void *dk_d = be->alloc((size_t)qn * (size_t)be->act_size), *dv_d = be->alloc((size_t)vn * (size_t)be->act_size);
    float *dg_d = be->alloc((size_t)qn * sizeof(float)), *dbeta_d = be->alloc((size_t)bn * sizeof(float));
    const int gk = cfg.checkpoint.gdn_keep, states = gk == GDN_KEEP_STATES;
    void *kept = gk == GDN_KEEP_NONE ? NULL : be->alloc(be->kda_kept_bytes(d.T, d.H, d.K, d.V, states));

    be->kda_chunk_forward(o_d, NULL, q_d, k_d, v_d, g_d, beta_d, NULL, doc_d, d.T, d.H, d.H, d.K, d.V, d.H * d.K,
                          d.H * d.V, d.H * d.V, kept, states ? GDN_KEPT_STATES : 0);
    be->kda_chunk_backward(dq_d, dk_d, dv_d, dg_d, dbeta_d, NULL, dout_d, NULL, q_d, k_d, v_d, g_d, beta_d, NULL, doc_d,
                           d.T, d.H, d.H, d.K, d.V, d.H * d.K, d.H * d.V, d.H * d.V, kept, states);

    float *o = kda_case_act_down(be, o_d, vn), *dq = kda_case_act_down(be, dq_d, qn);
    float *dk = kda_case_act_down(be, dk_d, qn), *dv = kda_case_act_down(be, dv_d, vn);
    float *dg = kda_case_f32_down(be, dg_d, qn), *dbeta = kda_case_f32_down(be, dbeta_d, bn);
    StTensor out[] = {
        {.name = "o", .dtype = ST_DTYPE_F32, .ndim = 3, .shape = {d.T, d.H, d.V}, .data = o},
        {.name = "dq", .dtype = ST_DTYPE_F32, .ndim = 3, .shape = {d.T, d.H, d.K}, .data = dq},
        {.name = "dk", .dtype = ST_DTYPE_F32, .ndim = 3, .shape = {d.T, d.H, d.K}, .data = dk},
        {.name = "dv", .dtype = ST_DTYPE_F32, .ndim = 3, .shape = {d.T, d.H, d.V}, .data = dv},
        {.name = "dg", .dtype = ST_DTYPE_F32, .ndim = 3, .shape = {d.T, d.H, d.K}, .data = dg},
        {.name = "dbeta", .dtype = ST_DTYPE_F32, .ndim = 2, .shape = {d.T, d.H}, .data = dbeta},
    };
    if (out_arg) snprintf(path, sizeof path, "%s", out_arg);
    else snprintf(path, sizeof path, "%s/outputs.safetensors", dir);
    if (safetensors_write_file(path, out, (int64_t)(sizeof out / sizeof out[0]), NULL, NULL, err, sizeof err))
        RS_FATAL("%s", err);
    printf("kda_case %s: %s, T %lld, H %d, K %d, V %d, %d document%s, gdn_keep %s: wrote %s\n", dir, be->name,
           (long long)d.T, d.H, d.K, d.V, d.ndocs, d.ndocs == 1 ? "" : "s", gdn_keep_names[gk], path);

    void *dev[] = {q_d, k_d, v_d, dout_d, g_d, beta_d, doc_d, o_d, dq_d, dk_d, dv_d, dg_d, dbeta_d, kept};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) be->free(dev[i]);
    float *host[] = {q, k, v, dout, g, beta, o, dq, dk, dv, dg, dbeta};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    free(doc_pos);
    config_free(&cfg);
    return 0;
}
