/*
 * bench_common.c — what `ringscan bench` (bench.c) and `ringscan bench cp`
 * (bench_cp.c) share (bench_common.h): the names of the tune switches, the
 * request and its cases (attention: T x shapes x document lengths; GDN and
 * KDA: T x heads x document lengths, cu_seqlens drawn from the seed), the FLOPs
 * and minimum bytes of a case, KDA's entries and gate parameters, and the
 * helpers of the result tables. Below both, so the dependencies point one way:
 * bench.c -> bench_cp.c -> bench_common.c.
 */
#include "bench_common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "plan/plan.h"
#ifdef RS_WITH_CUDA
#include "cuda_attention_tune.h"
#endif

const char *const bench_kind_names[BENCH_KIND_COUNT] = {"attn", "gdn", "step", "kda"};

/* the fields of CudaGdnTune (kernels/cuda/cuda_gdn_tune.h), in its order, with what each takes */
const char *const bench_gdn_tune_names[BENCH_GDN_TUNE_N] = {
    "split", "nst", "bv", "dseg", "dual", "state_fwd_wgmma", "state_bwd_wgmma", "dual_wgmma", "state_fwd_wgmma_cols",
    "piece", "state_bwd_wgmma_cols"};

/* the fields of CudaAttnTune (kernels/cuda/cuda_attention_tune.h), in its order; each 0 or 1 */
const char *const bench_attn_tune_names[BENCH_ATTN_TUNE_N] = {"dq_atomic", "throttle"};

json_t *bench_tune_json(const char *const *names, const int *vals, int n) {
    json_t *t = json_object();
    for (int f = 0; f < n; f++) json_object_set_new(t, names[f], json_integer(vals[f]));
    return t;
}

#ifdef RS_WITH_CUDA
void bench_attn_tune_apply(const BenchOptions *o) {
    const CudaAttnTune t = {o->attn_tune[0], o->attn_tune[1]}; /* bench_attn_tune_names' order */
    cuda_attention_tune_set(&t);
}
#endif

json_t *bench_request(const BenchOptions *o, const char *kind) {
    return json_pack("{ss ss si si sf sI s[]}", "schema", "ringscan-bench-request/1", "kind", kind,
                     "warmup", o->warmup, "reps", o->reps, "max_s", o->max_s, "seed", (json_int_t)o->seed, "cases");
}

/* with --doc-len (attn_docs), each case per mean document length, named _docsN and carrying cu_seqlens;
 * without, one document per case (no cu_seqlens) */
void bench_attn_cases(const BenchOptions *o, json_t *cases) {
    for (int t = 0; t < o->nT; t++)
        for (int s = 0; s < o->n_attn; s++)
            for (int d = 0; d < (o->attn_docs ? o->n_doc_len : 1); d++) {
                char name[96];
                int n = snprintf(name, sizeof name, "T%lld_nh%d_nkv%d_hd%d", (long long)o->T[t], o->attn[s][0],
                                 o->attn[s][1], o->attn[s][2]);
                json_t *c = json_pack("{ss sI si si si sb}", "name", name, "T", (json_int_t)o->T[t], "nh",
                                      o->attn[s][0], "nkv", o->attn[s][1], "hd", o->attn[s][2], "causal", 1);
                if (o->attn_docs) {
                    json_t *cu = bench_cu_seqlens(o->T[t], o->doc_len[d], o->seed);
                    snprintf(name + n, sizeof name - (size_t)n, "_docs%zu", json_array_size(cu) - 1);
                    json_object_set_new(c, "name", json_string(name));
                    json_object_set_new(c, "cu_seqlens", cu);
                }
                json_array_append_new(cases, c);
            }
}

/* Document boundaries of a sample of T tokens with mean length L (0: one document): lengths
 * drawn uniformly in [L/2, 3L/2), the last document takes what is left. */
json_t *bench_cu_seqlens(int64_t T, int64_t L, uint64_t seed) {
    json_t *cu = json_array();
    json_array_append_new(cu, json_integer(0));
    Rng r;
    rng_init(&r, seed, 0xd0c5);
    int64_t at = 0;
    while (L > 0 && T - at > L + L / 2) {
        at += L / 2 + (int64_t)rng_below(&r, (uint64_t)L);
        json_array_append_new(cu, json_integer(at));
    }
    json_array_append_new(cu, json_integer(T));
    return cu;
}

/* doc_pos (T) of a case's document boundaries (its cu_seqlens; absent: one document) */
void bench_case_doc_pos(int32_t *doc_pos, const json_t *c, int64_t T) {
    json_t *cu = json_object_get(c, "cu_seqlens");
    if (!cu) {
        for (int64_t t = 0; t < T; t++) doc_pos[t] = (int32_t)t;
        return;
    }
    RS_CHECK(json_is_array(cu) && json_array_size(cu) >= 2, "bench case: cu_seqlens is not a list of boundaries");
    for (size_t d = 0; d + 1 < json_array_size(cu); d++) {
        int64_t b = json_integer_value(json_array_get(cu, d)), e = json_integer_value(json_array_get(cu, d + 1));
        RS_CHECK(0 <= b && b < e && e <= T, "cu_seqlens[%zu..%zu] = %lld..%lld", d, d + 1, (long long)b,
                 (long long)e);
        for (int64_t t = b; t < e; t++) doc_pos[t] = (int32_t)(t - b);
    }
}

double bench_doc_attn_fraction(const json_t *cu, int64_t T) {
    if (!cu) return 1.0;
    double s = 0;
    for (size_t d = 0; d + 1 < json_array_size(cu); d++) {
        double L = (double)(json_integer_value(json_array_get(cu, d + 1)) - json_integer_value(json_array_get(cu, d)));
        s += L * L;
    }
    return s / ((double)T * (double)T);
}

void bench_gdn_cases(const BenchOptions *o, json_t *cases) {
    for (int t = 0; t < o->nT; t++)
        for (int h = 0; h < o->n_heads; h++)
            for (int d = 0; d < o->n_doc_len; d++) {
                json_t *cu = bench_cu_seqlens(o->T[t], o->doc_len[d], o->seed);
                char name[96];
                snprintf(name, sizeof name, "T%lld_H%d_K%d_docs%zu", (long long)o->T[t], o->heads[h], o->dim,
                         json_array_size(cu) - 1);
                json_array_append_new(cases, json_pack("{ss sI si si si so}", "name", name, "T", (json_int_t)o->T[t],
                                                       "H", o->heads[h], "K", o->dim, "V", o->dim, "cu_seqlens", cu));
            }
}

BenchWork bench_work(BenchKind kind, const json_t *c) {
    BenchWork w = {0};
    double T = (double)json_integer_value(json_object_get(c, "T"));
    if (kind == BENCH_ATTN) {
        double nh = (double)json_integer_value(json_object_get(c, "nh"));
        double nkv = (double)json_integer_value(json_object_get(c, "nkv"));
        double hd = (double)json_integer_value(json_object_get(c, "hd"));
        /* causal within each document (cu_seqlens; absent: one) */
        json_t *cu = json_object_get(c, "cu_seqlens");
        double pairs = cu ? 0 : T * T / 2;
        for (size_t d = 0; cu && d + 1 < json_array_size(cu); d++) {
            double len = (double)(json_integer_value(json_array_get(cu, d + 1)) -
                                  json_integer_value(json_array_get(cu, d)));
            pairs += len * len / 2;
        }
        w.flops_fwd = 4.0 * pairs * hd * nh;
        w.flops_fb = 3.5 * w.flops_fwd;
        w.bytes_fwd = 2 * (2 * T * nh * hd + 2 * T * nkv * hd) + 4 * T * nh;          /* q,o; k,v; lse */
        w.bytes_fb = w.bytes_fwd + 2 * (4 * T * nh * hd + 4 * T * nkv * hd) + 4 * T * nh; /* + q,o,dO,dq; k,v,dk,dv; lse */
    } else if (kind == BENCH_GDN || kind == BENCH_KDA) {
        /* KDA: plan counts its chunk as GDN's (plan.c; the per-channel decays are elementwise work); its g and dg
         * are K wide per head */
        double H = (double)json_integer_value(json_object_get(c, "H"));
        double K = (double)json_integer_value(json_object_get(c, "K"));
        double V = (double)json_integer_value(json_object_get(c, "V"));
        json_t *cu = json_object_get(c, "cu_seqlens");
        double chunks = 0;
        for (size_t d = 0; d + 1 < json_array_size(cu); d++) {
            int64_t len = json_integer_value(json_array_get(cu, d + 1)) - json_integer_value(json_array_get(cu, d));
            chunks += (double)((len + GDN_CHUNK - 1) / GDN_CHUNK);
        }
        double f, b;
        plan_gdn_chunk_flops(GDN_CHUNK, K, V, &f, &b);
        w.flops_fwd = H * chunks * f;
        w.flops_fb = H * chunks * (f + b);
        const double gb = 4 * T * H * (kind == BENCH_KDA ? K : 1) + 4 * T * H; /* g, beta fp32 */
        w.bytes_fwd = 2 * T * H * (2 * K + 2 * V) + gb;                 /* q,k,v,o bf16; g,beta */
        w.bytes_fb = w.bytes_fwd + 2 * T * H * (2 * K + V) + 2 * T * H * V + gb /* q,k,v; dO; g,beta */
                     + 2 * T * H * (2 * K + V) + gb;                           /* dq,dk,dv; dg,dbeta */
    }
    return w;
}

int bench_kda_missing(const Backend *be, const BackendSizes *sz, char *why, size_t n) {
    const struct {
        const char *name;
        int null;
    } e[] = {{"kda_gates_forward", !be->kda_gates_forward},
             {"kda_chunk_forward", !be->kda_chunk_forward},
             {"kda_chunk_backward", !be->kda_chunk_backward},
             {"kda_kept_bytes", !be->kda_kept_bytes},
             /* the CP schedules' (lib/cp/cp_gdn_fragment.c) and the CP buffers' sizes (model_acts.c) */
             {"kda_chunk_backward_stage", sz && !be->kda_chunk_backward_stage},
             {"kda_dkept_bytes", sz && !be->kda_dkept_bytes},
             {"kda_chunk_prep", sz && !be->kda_chunk_prep},
             {"kda_chunk_transition", sz && !be->kda_chunk_transition},
             {"kda_chunk_dstate", sz && !be->kda_chunk_dstate},
             {"BackendSizes.kda_kept_bytes", sz && !sz->kda_kept_bytes},
             {"BackendSizes.kda_dkept_bytes", sz && !sz->kda_dkept_bytes}};
    int missing = 0;
    size_t w = 0;
    if (n) why[0] = 0;
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
        if (!e[i].null) continue;
        if (w < n) w += (size_t)snprintf(why + w, n - w, "%s%s", missing ? ", " : "", e[i].name);
        missing++;
    }
    return missing;
}

void bench_kda_gate_params(float *A_log, float *dt_bias, int nv, int dk, uint64_t seed) {
    Rng r;
    rng_init(&r, seed, 0x6a7e);
    for (int h = 0; h < nv; h++) A_log[h] = (float)log(1.0 + 15.0 * rng_uniform(&r));
    for (int c = 0; c < nv * dk; c++) {
        const double dt = exp(log(0.001) + (log(0.1) - log(0.001)) * rng_uniform(&r));
        dt_bias[c] = (float)log(expm1(dt));
    }
}

double bench_num(const json_t *r, const char *key) {
    json_t *v = json_object_get(r, key);
    return v && json_is_number(v) ? json_number_value(v) : NAN;
}

const json_t *bench_find(const json_t *results, const char *cname, const char *impl) {
    size_t i;
    json_t *r;
    json_array_foreach(results, i, r) {
        const char *c = json_string_value(json_object_get(r, "case")), *m = json_string_value(json_object_get(r, "impl"));
        if (c && m && !strcmp(c, cname) && (!impl || !strcmp(m, impl))) return r;
    }
    return NULL;
}

void bench_fmt(char *buf, size_t n, const char *fmt, double v) {
    if (isfinite(v)) snprintf(buf, n, fmt, v);
    else snprintf(buf, n, "-");
}

/* A row that carries "error" (a case that failed, ours or a peer's): printed and recorded as such, in
 * columns of the table's widths; returns 1 when it was one. */
int bench_error_row(FILE *f, json_t *table, const char *cname, const char *impl, const json_t *r, int wcase,
                           int wimpl) {
    json_t *err = json_object_get(r, "error");
    if (!err || !json_is_string(err)) return 0;
    cname = cname ? cname : "?";
    impl = impl ? impl : "?";
    fprintf(f, "%-*s %-*s error: %s\n", wcase, cname, wimpl, impl, json_string_value(err));
    json_array_append_new(table, json_pack("{ss ss sO}", "case", cname, "impl", impl, "error", err));
    return 1;
}

void bench_print_notes(FILE *f, const json_t *peer) {
    if (!peer) return;
    json_t *err = json_object_get(peer, "error");
    if (err && json_is_string(err)) fprintf(f, "  peer failed: %s\n", json_string_value(err));
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(peer, "notes"), i, n)
        if (json_is_string(n)) fprintf(f, "  peer note: %s\n", json_string_value(n));
    json_t *r;
    json_array_foreach(json_object_get(peer, "results"), i, r) {
        json_t *note = json_object_get(r, "note");
        if (note && json_is_string(note))
            fprintf(f, "  note (%s, %s): %s\n", json_string_value(json_object_get(r, "case")),
                    json_string_value(json_object_get(r, "impl")), json_string_value(note));
    }
}

double bench_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
