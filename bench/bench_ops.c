/*
 * bench_ops.c — our attention, Gated DeltaNet and Kimi Delta Attention kernels
 * timed on the GPU for `ringscan bench attn|gdn|kda` (bench.h). One case of the
 * request at a time:
 * allocate through the Backend table, fill with random values on the device
 * (never zeros), then warm-up runs and timed runs, each timed with CUDA events
 * on the compute stream: mark 0, forward, mark 1, backward, mark 2, so one
 * run gives the forward time and the forward+backward time. The median of the
 * timed runs is reported; repeating stops early once the timed runs of the
 * case took max_s seconds and at least 3 were done.
 *
 * Inputs (the peers draw theirs from the same distributions, bench/peer/README.md):
 *   attention  q, k, v, dO uniform in [-1, 1); one document, causal; k and v interleaved in rows of 2 nkv hd (and
 *              dk, dv likewise), as the model lays them (lib/model/model_block.c).
 *   GDN        q, k uniform in [-1, 1) then L2-normalised per head; v, dO uniform in
 *              [-1, 1); g (log decay per token) uniform in [-0.1, -0.001); beta uniform
 *              in [0.05, 0.95); documents from the case's cu_seqlens.
 *   KDA        as GDN, but g (T, H, K) the log decay of every key channel, kimi_linear's gate
 *              (kda_gates_forward) of f uniform in [-1, 1): g = -exp(A_log[h]) softplus(f +
 *              dt_bias[h, c]), A_log and dt_bias drawn as FLA's KDA layer initialises them
 *              (bench_kda_gate_params), so g lies in about [-4, -0.0004]; beta as GDN's. The chunk
 *              alone is timed (the gates are per token, outside, as FLA's chunk_kda without
 *              use_gate_in_kernel).
 * GDN's (and KDA's) forward keeps what the Backend keeps for the backward by --gdn-keep, as the model does by
 * checkpoint.gdn_keep in a recomputed layer (gdn_kept_bytes, model_acts_gdn_kept_kind; default states: W, U,
 * the gate cumsum, GDN's Tinv and the chunk states, where FLA keeps A from its forward and recomputes the states;
 * wy as FLA), so the forward+backward time is the training step's.
 * Gradients: our attention backward accumulates (+=) into fp32 dq, dk, dv (its contract),
 * so repeated runs add up; the values are not used.
 *
 * Callers: bench/bench.c.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model_acts.h" /* model_gdn_kept_kind */
#include "bench_common.h"
#include "core/error.h"
#ifdef RS_WITH_CUDA
#include "cuda_attention_cudnn.h"
#include "cuda_bench.h"
#endif

#ifdef RS_WITH_CUDA

static int64_t bench_int(const json_t *c, const char *key) {
    json_t *v = json_object_get(c, key);
    RS_CHECK(v && json_is_integer(v), "bench case lacks integer \"%s\"", key);
    return (int64_t)json_integer_value(v);
}

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef void (*BenchFn)(void *ctx);

/* Runs fwd then bwd warmup + reps times (see the header); fills the result row. */
static json_t *bench_time(const char *name, BenchFn fwd, BenchFn bwd, void *ctx, const BenchOptions *o) {
    CudaBenchTimer *tm = cuda_bench_timer_create();
    double *f = RS_MALLOC((size_t)o->reps * sizeof(double)), *fb = RS_MALLOC((size_t)o->reps * sizeof(double));
    int n = 0;
    double spent = 0;
    for (int i = 0; i < o->warmup + o->reps; i++) {
        cuda_bench_mark(tm, 0);
        fwd(ctx);
        cuda_bench_mark(tm, 1);
        bwd(ctx);
        cuda_bench_mark(tm, 2);
        double a = cuda_bench_elapsed_ms(tm, 0, 1), b = cuda_bench_elapsed_ms(tm, 0, 2);
        if (i < o->warmup) continue;
        f[n] = a;
        fb[n] = b;
        n++;
        spent += b / 1e3;
        if (n >= 3 && spent > o->max_s) break;
    }
    cuda_bench_timer_free(tm);
    json_t *r = json_pack("{ss ss sf sf si}", "case", name, "impl", "ringscan", "ms_fwd", bench_median(f, n),
                          "ms_fwdbwd", bench_median(fb, n), "reps", n);
    free(f);
    free(fb);
    return r;
}

/* ---- attention ---------------------------------------------------------------- */

typedef struct {
    const Backend *be;
    int64_t T;
    int nh, nkv, hd;
    void *q, *k, *v, *o, *dout; /* bf16 (T, nh hd); k, v: halves of (T, 2 nkv hd) rows */
    float *lse, *dq, *dk, *dv;  /* lse (T, nh); dq (T, nh hd); dk, dv: halves of (T, 2 nkv hd) rows */
    int32_t *pos, *doc_pos; /* the case's documents (cu_seqlens; one when absent) */
    AttnHint hint;          /* the rows' summary (lib/backend/attn_hint.h), from the host copies */
} AttnCase;

static void bench_attn_fwd(void *p) {
    AttnCase *a = p;
    a->be->attention_forward(a->o, a->lse, a->q, a->k, a->v, a->pos, a->doc_pos, a->pos, a->doc_pos, &a->hint, a->T,
                             a->T, a->nh, a->nkv, a->hd, a->nh * a->hd, 2 * a->nkv * a->hd, a->nh * a->hd, 1);
}

static void bench_attn_bwd(void *p) {
    AttnCase *a = p;
    a->be->attention_backward(a->dq, a->dk, a->dv, a->dout, a->o, a->lse, a->q, a->k, a->v, a->pos, a->doc_pos,
                              a->pos, a->doc_pos, &a->hint, a->T, a->T, a->nh, a->nkv, a->hd, a->nh * a->hd,
                              2 * a->nkv * a->hd, a->nh * a->hd, 1);
}

static int32_t *bench_upload_i32(const Backend *be, const int32_t *h, int64_t n) {
    int32_t *d = be->alloc((size_t)n * sizeof(int32_t));
    be->to_device(d, h, (size_t)n * sizeof(int32_t));
    return d;
}

const Backend *bench_attn_backend(const Backend *base, int impl, const char *lib) {
    if (impl == ATTN_KERNEL_RINGSCAN) return base;
    char err[4096];
    if (cuda_attention_cudnn_load(lib, err, sizeof err))
        RS_USAGE(NULL, "bench: attention kernel %s (--attn-impl, device.attention_kernel): %s", attn_kernel_names[impl],
                 err);
    cuda_attention_cudnn_set_deterministic(impl == ATTN_KERNEL_CUDNN_DET);
    static int told;
    if (!told++) printf("\nattention kernel: %s (%s)\n", cuda_attention_cudnn_describe(), attn_kernel_names[impl]);
    return cuda_backend_with_cudnn_attention(base);
}

json_t *bench_attn_case(const json_t *c, const BenchOptions *o) {
    int64_t before[4] = {0}, after[4] = {0}, vl0[2] = {0}, vl1[2] = {0};
    if (o->attn_impl != ATTN_KERNEL_RINGSCAN) cuda_attention_cudnn_counts(before), cuda_attention_cudnn_varlen_counts(vl0);
    AttnCase a = {.be = bench_attn_backend(&backend_cuda, o->attn_impl, o->cudnn_lib), .T = bench_int(c, "T"),
                  .nh = (int)bench_int(c, "nh"), .nkv = (int)bench_int(c, "nkv"), .hd = (int)bench_int(c, "hd")};
    const Backend *be = a.be;
    int64_t qn = a.T * a.nh * a.hd, kn = a.T * a.nkv * a.hd;
    a.q = be->alloc((size_t)qn * 2);
    a.o = be->alloc((size_t)qn * 2);
    a.dout = be->alloc((size_t)qn * 2);
    a.k = be->alloc((size_t)kn * 4); /* k and v interleaved: (T, 2 nkv hd) */
    a.v = (char *)a.k + (size_t)a.nkv * a.hd * 2;
    a.lse = be->alloc((size_t)(a.T * a.nh) * 4);
    a.dq = be->alloc((size_t)qn * 4);
    a.dk = be->alloc((size_t)kn * 8); /* dk and dv likewise */
    a.dv = a.dk + (size_t)a.nkv * a.hd;
    int32_t *pos = RS_MALLOC((size_t)a.T * sizeof(int32_t)), *doc_pos = RS_MALLOC((size_t)a.T * sizeof(int32_t));
    for (int64_t t = 0; t < a.T; t++) pos[t] = (int32_t)t;
    bench_case_doc_pos(doc_pos, c, a.T);
    a.pos = bench_upload_i32(be, pos, a.T);
    a.doc_pos = bench_upload_i32(be, doc_pos, a.T);
    a.hint = attn_hint_rows(pos, doc_pos, a.T, pos, doc_pos, a.T);
    free(pos);
    free(doc_pos);
    uint64_t s = o->seed * 1000003u;
    cuda_bench_fill_bf16(a.q, qn, s + 1, -1, 1);
    cuda_bench_fill_bf16(a.k, 2 * kn, s + 2, -1, 1);
    cuda_bench_fill_bf16(a.dout, qn, s + 4, -1, 1);
    json_t *r = bench_time(json_string_value(json_object_get(c, "name")), bench_attn_fwd, bench_attn_bwd, &a, o);
    json_object_set_new(r, "attn_impl", json_string(attn_kernel_names[o->attn_impl]));
    if (o->attn_impl != ATTN_KERNEL_RINGSCAN) {
        cuda_attention_cudnn_counts(after);
        cuda_attention_cudnn_varlen_counts(vl1);
        json_object_set_new(r, "routed", json_pack("{sI sI sI sI sI sI}", "fwd_cudnn", (json_int_t)(after[0] - before[0]),
                                                   "fwd_ours", (json_int_t)(after[1] - before[1]), "bwd_cudnn",
                                                   (json_int_t)(after[2] - before[2]), "bwd_ours",
                                                   (json_int_t)(after[3] - before[3]), "fwd_varlen",
                                                   (json_int_t)(vl1[0] - vl0[0]), "bwd_varlen",
                                                   (json_int_t)(vl1[1] - vl0[1])));
        printf(" [routed fwd cudnn %lld (variable length %lld) ours %lld, bwd cudnn %lld (variable length %lld) ours "
               "%lld]",
               (long long)(after[0] - before[0]), (long long)(vl1[0] - vl0[0]), (long long)(after[1] - before[1]),
               (long long)(after[2] - before[2]), (long long)(vl1[1] - vl0[1]), (long long)(after[3] - before[3]));
    }
    void *bufs[] = {a.q, a.o, a.dout, a.k, a.lse, a.dq, a.dk, a.pos, a.doc_pos}; /* v, dv: inside k, dk */
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(bufs[i]);
    return r;
}

/* ---- Gated DeltaNet ------------------------------------------------------------- */

typedef struct {
    const Backend *be;
    int64_t T;
    int H, K, V;
    int kda;    /* the kda_chunk_* entries, g and dg (T, H, K) */
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *g, *beta, *dg, *dbeta;
    int32_t *doc_pos;
    void *kept; /* gdn_kept_bytes (kda_kept_bytes): what the forward keeps for the backward, as FLA keeps A (the
                 * kernels' states) */
    int kind;   /* the kept buffer's kind (backend.h GDN_KEPT_*): --gdn-keep states the chunk states too; GDN (not
                 * KDA) under wy or states Tinv too, as in a recomputed layer */
} GdnCase;

static void bench_gdn_fwd(void *p) {
    GdnCase *a = p;
    (a->kda ? a->be->kda_chunk_forward : a->be->gdn_chunk_forward)(
        a->o, NULL, a->q, a->k, a->v, a->g, a->beta, NULL, a->doc_pos, a->T, a->H, a->H, a->K, a->V, a->H * a->K,
        a->H * a->V, a->H * a->V, a->kept, a->kind);
}

static void bench_gdn_bwd(void *p) {
    GdnCase *a = p;
    (a->kda ? a->be->kda_chunk_backward : a->be->gdn_chunk_backward)(
        a->dq, a->dk, a->dv, a->dg, a->dbeta, NULL, a->dout, NULL, a->q, a->k, a->v, a->g, a->beta, NULL, a->doc_pos,
        a->T, a->H, a->H, a->K, a->V, a->H * a->K, a->H * a->V, a->H * a->V, a->kept, a->kind);
}

/* GDN's case, or with kda KDA's (bench.c refused a backend whose kda entries are NULL) */
static json_t *bench_delta_case(const json_t *c, const BenchOptions *o, int kda) {
    GdnCase a = {.be = &backend_cuda, .T = bench_int(c, "T"), .H = (int)bench_int(c, "H"),
                 .K = (int)bench_int(c, "K"), .V = (int)bench_int(c, "V"), .kda = kda,
                 .kind = model_gdn_kept_kind(o->gdn_keep, kda, 0)}; /* as in a recomputed layer */
    const Backend *be = a.be;
    int64_t qn = a.T * a.H * a.K, vn = a.T * a.H * a.V, gn = a.T * a.H, gw = kda ? qn : gn; /* g's elements */
    void **act[] = {&a.q, &a.k, &a.dq, &a.dk};
    for (int i = 0; i < 4; i++) *act[i] = be->alloc((size_t)qn * 2);
    void **vact[] = {&a.v, &a.o, &a.dout, &a.dv};
    for (int i = 0; i < 4; i++) *vact[i] = be->alloc((size_t)vn * 2);
    a.g = be->alloc((size_t)gw * 4);
    a.dg = be->alloc((size_t)gw * 4);
    a.beta = be->alloc((size_t)gn * 4);
    a.dbeta = be->alloc((size_t)gn * 4);

    /* doc_pos from the case's document boundaries */
    RS_CHECK(json_is_array(json_object_get(c, "cu_seqlens")), "bench gdn case lacks cu_seqlens");
    int32_t *doc_pos = RS_MALLOC((size_t)a.T * sizeof(int32_t));
    bench_case_doc_pos(doc_pos, c, a.T);
    a.doc_pos = bench_upload_i32(be, doc_pos, a.T);
    free(doc_pos);
    a.kept = o->gdn_keep == GDN_KEEP_NONE
                 ? NULL
                 : be->alloc((kda ? be->kda_kept_bytes : be->gdn_kept_bytes)(a.T, a.H, a.K, a.V, a.kind));

    uint64_t s = o->seed * 1000003u + 77;
    void *raw = be->alloc((size_t)qn * 2);
    float *rstd = be->alloc((size_t)gn * 4);
    cuda_bench_fill_bf16(raw, qn, s + 1, -1, 1);
    be->l2norm_forward(a.q, rstd, raw, a.T, a.H, a.K, a.H * a.K, a.H * a.K);
    cuda_bench_fill_bf16(raw, qn, s + 2, -1, 1);
    be->l2norm_forward(a.k, rstd, raw, a.T, a.H, a.K, a.H * a.K, a.H * a.K);
    be->free(raw);
    be->free(rstd);
    cuda_bench_fill_bf16(a.v, vn, s + 3, -1, 1);
    cuda_bench_fill_bf16(a.dout, vn, s + 4, -1, 1);
    if (kda) { /* g = kimi_linear's gate of f (T, H*K) uniform in [-1, 1); f in dq, the gate's b in dbeta (scratch) */
        float *A_log = RS_MALLOC((size_t)a.H * sizeof(float)), *dt_bias = RS_MALLOC((size_t)(a.H * a.K) * sizeof(float));
        bench_kda_gate_params(A_log, dt_bias, a.H, a.K, o->seed);
        float *A_log_d = be->alloc((size_t)a.H * 4), *dt_bias_d = be->alloc((size_t)(a.H * a.K) * 4);
        be->to_device(A_log_d, A_log, (size_t)a.H * 4);
        be->to_device(dt_bias_d, dt_bias, (size_t)(a.H * a.K) * 4);
        free(A_log);
        free(dt_bias);
        cuda_bench_fill_bf16(a.dq, qn, s + 5, -1, 1);
        cuda_bench_fill_bf16(a.dbeta, gn, s + 7, -1, 1);
        be->kda_gates_forward(a.beta, a.g, a.dbeta, a.dq, A_log_d, dt_bias_d, a.T, a.H, a.K, a.H, a.H * a.K);
        be->free(A_log_d);
        be->free(dt_bias_d);
    } else
        cuda_bench_fill_f32(a.g, gn, s + 5, -0.1f, -0.001f);
    cuda_bench_fill_f32(a.beta, gn, s + 6, 0.05f, 0.95f); /* KDA: in place of the gate's sigmoid(b), as GDN's */

    json_t *r = bench_time(json_string_value(json_object_get(c, "name")), bench_gdn_fwd, bench_gdn_bwd, &a, o);
    be->free(a.kept);
    void *bufs[] = {a.q, a.k, a.dq, a.dk, a.v, a.o, a.dout, a.dv, a.g, a.beta, a.dg, a.dbeta, a.doc_pos};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(bufs[i]);
    return r;
}

json_t *bench_gdn_case(const json_t *c, const BenchOptions *o) { return bench_delta_case(c, o, 0); }
json_t *bench_kda_case(const json_t *c, const BenchOptions *o) { return bench_delta_case(c, o, 1); }

#else /* built without the cuda backend: bench.c stops before any case (exit 2 naming the device) */

json_t *bench_attn_case(const json_t *c, const BenchOptions *o) {
    (void)c, (void)o;
    RS_FATAL("bench_attn_case: this ringscan was built without the cuda backend");
}
json_t *bench_gdn_case(const json_t *c, const BenchOptions *o) {
    (void)c, (void)o;
    RS_FATAL("bench_gdn_case: this ringscan was built without the cuda backend");
}
json_t *bench_kda_case(const json_t *c, const BenchOptions *o) {
    (void)c, (void)o;
    RS_FATAL("bench_kda_case: this ringscan was built without the cuda backend");
}

#endif
