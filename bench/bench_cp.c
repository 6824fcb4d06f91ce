/*
 * bench_cp.c — `mpirun -np P ringscan bench cp [options]` (bench_cp.h): context
 * parallelism over P ranks (one per GPU) timed with the CP code the model
 * runs, beside the CP of torch and of flash-linear-attention (--peer: rank 0
 * alone runs bench/peer/cp_attn_torch.py, cp_gdn_fla.py and cp_kda_fla.py
 * under torchrun before any rank has a CUDA context; then runtime_open and
 * the cases).
 *
 * Ring attention per case (T, nh, nkv, hd), one causal document: rows
 * ringscan-cp (cp_ring_forward + cp_ring_backward, the production overlap),
 * ringscan-cp-serial (each exchange waited when posted), ringscan-1gpu (P = 1
 * at the full T, every rank at once, rank 0's time), per ring step compute and
 * communication (Cp.step_mark), and each exchange alone; --attn-impl,
 * --ring-calls and --ring-kv pick the route as training would. The GDN layer
 * per case (T, H, K = V, conv width 4), called as lib/model/model_block.c
 * calls it: halo, conv, L2 norm and cp_gdn_forward, then their backwards,
 * with the time of each phase (cp_gdn_steps' names) and the state exchange
 * and the halo alone; projections and gates are per token and left out, as in
 * FLA's peer. The KDA layer (--parts kda) is the same run with a KDA core
 * (CpGdnCore.kda: the kda_chunk_* entries, the per-channel transition through
 * the same schedules) and g (rows, H, K) drawn as `bench kda` draws it
 * (kda_gates_forward of random f, bench_ops.c); its conv is GDN's over
 * [q|k|v] (docs/design/kda.md, "Context parallelism").
 *
 * Inputs are random, never zeros, each rank its own seed. Timing: every rank
 * waits for its device and meets the others before each repetition (cuda:
 * events on the compute stream; cpu: the host clock); a CP repetition counts
 * as its slowest rank's, and the stop rule reads gathered numbers so every
 * rank stops together. Reported: medians. Output (rank 0): one table per part
 * (ms, TFLOP/s per GPU, CP efficiency = one-GPU ms / (P x CP ms), ratio = peer
 * ms / ringscan ms), the step and phase lines, and OUT/bench.json.
 *
 * Callers: bench/bench.c (bench_main for `bench cp`).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/runtime.h"
#include "model/model_acts.h" /* model_gdn_kept_kind */
#include "bench_common.h"
#include "bench_cp.h"
#include "core/build_info.h"
#include "comm/comm.h"
#include "cp/cp.h"
#include "core/error.h"
#include "io/fsio.h"
#include "core/rng.h"
#ifdef RS_WITH_CUDA
#include "cuda_attention_cudnn.h"
#include "cuda_setup.h"
#include "cuda_bench.h"
#define BC_MARKS CUDA_BENCH_MARKS
#else
#define BC_MARKS 80
#endif

#define BC_CONV_KERNEL 4                  /* the GDN layer's conv width (Qwen3-Next's) */
#define BC_STEP_MARK0 3                   /* ring: marks 0 start, 1 fwd done, 2 bwd done, then the steps' */
#define BC_GDN_STEPS 3                    /* the most steps of the GDN core (cp_gdn_steps) */
#define BC_GDN_PHASES (4 + 2 * BC_GDN_STEPS)

/* ---- the environment, marks, repetitions ----------------------------------------- */

typedef struct {
    Comm          *comm;
    const Backend *be;
    const BenchOptions *o;
    int            P, rank, cpu;
#ifdef RS_WITH_CUDA
    CudaBenchTimer *tm;
#endif
    double         host[BC_MARKS]; /* cpu: the host clock at each mark */
} BcEnv;

static void bc_mark(BcEnv *e, int i) {
    RS_CHECK(i >= 0 && i < BC_MARKS, "bench cp mark %d", i);
#ifdef RS_WITH_CUDA
    if (!e->cpu) {
        cuda_bench_mark(e->tm, i);
        return;
    }
#endif
    e->host[i] = bench_clock();
}

/* ms from mark i to mark j (cuda: waits for mark j) */
static double bc_ms(BcEnv *e, int i, int j) {
#ifdef RS_WITH_CUDA
    if (!e->cpu) return cuda_bench_elapsed_ms(e->tm, i, j);
#endif
    return 1e3 * (e->host[j] - e->host[i]);
}

static void bc_sync(BcEnv *e) {
#ifdef RS_WITH_CUDA
    if (!e->cpu) cuda_bench_sync();
#endif
    (void)e;
}

/* n repetitions of nv numbers from each of P ranks: all[(rep * P + rank) * nv + k] */
typedef struct {
    int     n, nv, P;
    double *all;
} BcTimes;

/* whose number a median is of: the slowest rank's, rank 0's, or (BC_RANK0 + p) rank p's */
enum { BC_SLOWEST, BC_RANK0 };

static double bc_value(const BcTimes *t, int rep, int k, int how) {
    const double *r = t->all + (size_t)rep * t->P * t->nv;
    if (how >= BC_RANK0) return r[(size_t)(how - BC_RANK0) * t->nv + k];
    double m = r[k];
    for (int p = 1; p < t->P; p++) m = fmax(m, r[(size_t)p * t->nv + k]);
    return m;
}

static int bc_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the median over the repetitions of number k (the slowest rank's, or one rank's) */
static double bc_median(const BcTimes *t, int k, int how) {
    double *v = RS_MALLOC((size_t)t->n * sizeof(double));
    for (int i = 0; i < t->n; i++) v[i] = bc_value(t, i, k, how);
    qsort(v, (size_t)t->n, sizeof *v, bc_cmp);
    double m = t->n % 2 ? v[t->n / 2] : 0.5 * (v[t->n / 2 - 1] + v[t->n / 2]);
    free(v);
    return m;
}

typedef void (*BcRun)(BcEnv *e, void *ctx);                /* one repetition, marks included */
typedef void (*BcRead)(BcEnv *e, void *ctx, double *v);    /* its nv numbers, after it ran */

/* warm-up, then repetitions until --reps or the time rule; number `clock` (of the slowest rank, or
 * rank 0's) is the repetition's time for the rule */
static BcTimes bc_repeat(BcEnv *e, BcRun run, BcRead read, void *ctx, int nv, int clock, int how) {
    const BenchOptions *o = e->o;
    BcTimes t = {.nv = nv, .P = e->P, .all = RS_CALLOC((size_t)o->reps * e->P * nv, sizeof(double))};
    double *slots = RS_MALLOC((size_t)e->P * nv * sizeof(double)), spent = 0;
    for (int i = 0; i < o->warmup + o->reps; i++) {
        bc_sync(e);
        comm_barrier(e->comm, e->comm->world);
        run(e, ctx);
        memset(slots, 0, (size_t)e->P * nv * sizeof(double));
        read(e, ctx, slots + (size_t)e->rank * nv);
        comm_allreduce_sum_f64(e->comm, e->comm->world, slots, (int64_t)e->P * nv);
        if (i < o->warmup) continue;
        memcpy(t.all + (size_t)t.n * e->P * nv, slots, (size_t)e->P * nv * sizeof(double));
        spent += bc_value(&t, t.n, clock, how) / 1e3;
        t.n++;
        if (t.n >= 3 && spent > o->max_s) break;
    }
    free(slots);
    return t;
}

/* dst (n elements, activation type, or fp32 when f32) = uniform in [lo, hi), never all zero */
static void bc_fill(BcEnv *e, void *dst, int64_t n, uint64_t seed, float lo, float hi, int f32) {
#ifdef RS_WITH_CUDA
    if (!e->cpu) {
        if (f32) cuda_bench_fill_f32(dst, n, seed, lo, hi);
        else cuda_bench_fill_bf16(dst, n, seed, lo, hi);
        return;
    }
#endif
    RS_CHECK(e->be->act_size == 4, "the cpu backend's activations are fp32");
    float *h = RS_MALLOC((size_t)n * sizeof(float));
    Rng r;
    rng_init(&r, seed, (uint64_t)e->rank);
    for (int64_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * (float)rng_uniform(&r);
    e->be->to_device(dst, h, (size_t)n * sizeof(float));
    free(h);
    (void)f32;
}

/* a seed per (case, rank, buffer) */
static uint64_t bc_seed(const BcEnv *e, int ci, int buf) {
    return e->o->seed * 1000003u + (uint64_t)ci * 7919u + (uint64_t)e->rank * 104729u + (uint64_t)buf;
}

/* A one-layer config whose CP buffers (model_acts.c's CP table) fit the case; P ranks. */
static void bc_config(Config *cfg, const BcEnv *e, int64_t T, int P) {
    config_init_defaults(cfg);
    cfg->data.seq_len = T;
    cfg->data.micro_batch = 1;
    cfg->parallel.cp = P;
    cfg->parallel.dp = 1;
    cfg->device.kind = e->cpu ? DEVICE_KIND_CPU : DEVICE_KIND_CUDA;
    cfg->model.num_hidden_layers = 1;
    cfg->model.layer_types.n = 0;
    cfg->parallel.gdn_chain_staged = e->o->gdn_chain_staged;
    cfg->parallel.ring_calls = e->o->ring_calls;
    cfg->parallel.ring_keep_kv = e->o->ring_keep_kv;
    cfg->checkpoint.gdn_keep = e->o->gdn_keep;
}

/* The CP context of P ranks (P = 1: one process's, no communication) with one document's metadata. */
static void bc_cp_begin(Cp *cp, BcEnv *e, const Config *cfg, int P) {
    cp_init(cp, P > 1 ? e->comm : NULL, e->be, cfg);
    const CpLayout *L = &cp->L;
    int32_t *pos = RS_MALLOC((size_t)L->T_local * sizeof(int32_t));
    for (int f = 0; f < L->nlocal; f++)
        for (int64_t i = 0; i < L->frag_len; i++)
            pos[f * L->frag_len + i] = (int32_t)((int64_t)L->frag_global[f] * L->frag_len + i);
    cp_batch_begin(cp, 0, pos, pos); /* one document: doc_pos = pos */
    free(pos);
}

static void bc_free_all(const Backend *be, void **bufs, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (bufs[i]) be->free(bufs[i]);
}

static json_t *bc_row(const char *cname, const char *impl, int gpus, double ms_f, double ms_fb, int reps) {
    return json_pack("{ss ss ss si sf sf si}", "case", cname, "impl", impl, "family", "ringscan", "gpus", gpus,
                     "ms_fwd", ms_f, "ms_fwdbwd", ms_fb, "reps", reps);
}

/* ---- ring attention ----------------------------------------------------------------- */

typedef struct {
    Cp         cp;
    CpAttnDims d;
    int        P;
    void      *q, *kv, *dout, *out, *dq, *dkv;
    float     *lse;
} BcRing;

static void bc_ring_step_mark(void *ctx, int pass, int t, int phase) {
    void **c = ctx; /* {env, ring} */
    BcEnv *e = c[0];
    BcRing *a = c[1];
    bc_mark(e, BC_STEP_MARK0 + (pass * a->P + t) * CP_MARK_COUNT + phase);
}

static void bc_ring_run(BcEnv *e, void *ctx) {
    BcRing *a = ctx;
    bc_mark(e, 0);
    cp_ring_forward(&a->cp, 0, a->out, a->lse, a->q, a->kv, &a->d);
    bc_mark(e, 1);
    cp_ring_backward(&a->cp, 0, a->dq, a->dkv, a->dout, a->out, a->lse, a->q, a->kv, &a->d);
    bc_mark(e, 2);
}

/* v = [fwd, fwd+bwd, then, with the step marks on, per (pass, step): compute, communication or
 * exposed wait] */
static void bc_ring_read(BcEnv *e, void *ctx, double *v) {
    BcRing *a = ctx;
    v[0] = bc_ms(e, 0, 1);
    v[1] = bc_ms(e, 0, 2);
    if (!a->cp.step_mark) return; /* the one-GPU run: no step marks */
    for (int s = 0; s < 2 * a->P; s++) {
        int m = BC_STEP_MARK0 + s * CP_MARK_COUNT;
        v[2 + 2 * s] = bc_ms(e, m + CP_MARK_POSTED, m + CP_MARK_COMPUTED);
        v[3 + 2 * s] = bc_ms(e, m + CP_MARK_BEGIN, m + CP_MARK_POSTED) + bc_ms(e, m + CP_MARK_COMPUTED, m + CP_MARK_END);
    }
}

static void bc_ring_setup(BcRing *a, BcEnv *e, const json_t *c, int ci, int P) {
    memset(a, 0, sizeof *a);
    const Backend *be = e->be;
    int64_t T = json_integer_value(json_object_get(c, "T"));
    a->d = (CpAttnDims){.nh = (int)json_integer_value(json_object_get(c, "nh")),
                        .nkv = (int)json_integer_value(json_object_get(c, "nkv")),
                        .hd = (int)json_integer_value(json_object_get(c, "hd"))};
    a->P = P;
    Config cfg;
    bc_config(&cfg, e, T, P);
    cfg.model.num_attention_heads = a->d.nh;
    cfg.model.num_key_value_heads = a->d.nkv;
    cfg.model.head_dim = a->d.hd;
    cfg.model.full_attention_interval = 1;
    bc_cp_begin(&a->cp, e, &cfg, P);
    config_free(&cfg);
    const int64_t rows = a->cp.L.T_local, qd = (int64_t)a->d.nh * a->d.hd, kv2 = 2 * (int64_t)a->d.nkv * a->d.hd;
    const size_t es = (size_t)be->act_size;
    a->q = be->alloc((size_t)(rows * qd) * es);
    a->out = be->alloc((size_t)(rows * qd) * es);
    a->dout = be->alloc((size_t)(rows * qd) * es);
    a->dq = be->alloc((size_t)(rows * qd) * es);
    a->kv = be->alloc((size_t)(rows * kv2) * es);
    a->dkv = be->alloc((size_t)(rows * kv2) * es);
    a->lse = be->alloc((size_t)(rows * a->d.nh) * sizeof(float));
    bc_fill(e, a->q, rows * qd, bc_seed(e, ci, 1), -1, 1, 0);
    bc_fill(e, a->kv, rows * kv2, bc_seed(e, ci, 2), -1, 1, 0);
    bc_fill(e, a->dout, rows * qd, bc_seed(e, ci, 3), -1, 1, 0);
}

static void bc_ring_free(BcRing *a, const Backend *be) {
    void *bufs[] = {a->q, a->out, a->dout, a->dq, a->kv, a->dkv, a->lse};
    bc_free_all(be, bufs, sizeof bufs / sizeof bufs[0]);
    cp_free(&a->cp);
}

/* the exchanges alone: the K|V block and the dK|dV partial to the next rank, from the ring's own buffers */
static void bc_exchange_run(BcEnv *e, void *ctx) {
    BcRing *a = ctx;
    Cp *cp = &a->cp;
    const int P = a->P, r = cp->L.rank;
    const int64_t el = cp->L.T_local * 2 * (int64_t)a->d.nkv * a->d.hd;
    CommHandle h = {0};
    bc_mark(e, 0);
    comm_isendrecv(cp->comm, COMM_CP, a->kv, (r + 1) % P, cp->ring_keep_kv ? cp->kv_kept : cp->kv_recv[1],
                   (r - 1 + P) % P, el * e->be->act_size, 21, &h);
    comm_wait(cp->comm, &h);
    bc_mark(e, 1);
    comm_isendrecv(cp->comm, COMM_CP, cp->dkv_buf[0], (r + 1) % P, cp->dkv_buf[1], (r - 1 + P) % P,
                   el * (int64_t)sizeof(float), 22, &h);
    comm_wait(cp->comm, &h);
    bc_mark(e, 2);
}

static void bc_two_read(BcEnv *e, void *ctx, double *v) {
    (void)ctx;
    v[0] = bc_ms(e, 0, 1);
    v[1] = bc_ms(e, 1, 2);
}

/* [{"pass", "t", "compute_ms", KEY}] from number 2 on of `t` (the slowest rank's medians) */
static json_t *bc_steps_json(const BcTimes *t, int P, const char *key) {
    json_t *a = json_array();
    for (int s = 0; s < 2 * P; s++)
        json_array_append_new(a, json_pack("{ss si sf sf}", "pass", s < P ? "fwd" : "bwd", "t", s % P, "compute_ms",
                                           bc_median(t, 2 + 2 * s, BC_SLOWEST), key,
                                           bc_median(t, 3 + 2 * s, BC_SLOWEST)));
    return a;
}

/* the cuDNN route's calls so far (cuda_attention_cudnn_counts: fwd cuDNN, fwd ours, bwd cuDNN, bwd ours); zeros
 * where the ring runs ours alone */
static void bc_routed(const BcEnv *e, int64_t n[4]) {
    memset(n, 0, 4 * sizeof *n);
#ifdef RS_WITH_CUDA
    if (!e->cpu && e->o->attn_impl != ATTN_KERNEL_RINGSCAN) cuda_attention_cudnn_counts(n);
#endif
}

static void bc_ring_case(BcEnv *e, const json_t *c, int ci, json_t *rows) {
    const char *cname = json_string_value(json_object_get(c, "name"));
    const int P = e->P, nv = 2 + 4 * P;
    BcRing a;
    void *ctx[2] = {e, &a};
    bc_ring_setup(&a, e, c, ci, P);
    a.cp.step_mark = bc_ring_step_mark;
    a.cp.step_mark_ctx = ctx;
    const int64_t calls0 = a.cp.count.attn_kernel_calls[0];
    int64_t routed[2][4];
    bc_routed(e, routed[0]);
    BcTimes over = bc_repeat(e, bc_ring_run, bc_ring_read, &a, nv, 1, BC_SLOWEST);
    bc_routed(e, routed[1]);
    const int runs = e->o->warmup + over.n; /* each run one forward and one backward */
    const int fwd_calls = comm_allreduce_max_int(e->comm, e->comm->world,
                                                 (int)((a.cp.count.attn_kernel_calls[0] - calls0) / runs));
    e->comm->serial = 1; /* every exchange waited right after posting it */
    BcTimes ser = bc_repeat(e, bc_ring_run, bc_ring_read, &a, nv, 1, BC_SLOWEST);
    e->comm->serial = 0;
    json_t *cp_row = bc_row(cname, "ringscan-cp", P, bc_median(&over, 0, BC_SLOWEST),
                            bc_median(&over, 1, BC_SLOWEST), over.n);
    json_object_set_new(cp_row, "steps", bc_steps_json(&over, P, "exposed_wait_ms"));
    json_object_set_new(cp_row, "fwd_calls", json_integer(fwd_calls)); /* per forward, the most on a rank */
    json_int_t per_run[4]; /* rank 0's calls through cuDNN and ours, per run */
    for (int i = 0; i < 4; i++) per_run[i] = (json_int_t)((routed[1][i] - routed[0][i]) / runs);
    json_object_set_new(cp_row, "routed", json_pack("{sI sI sI sI}", "fwd_cudnn", per_run[0], "fwd_ours", per_run[1],
                                                    "bwd_cudnn", per_run[2], "bwd_ours", per_run[3]));
    json_t *ser_row = bc_row(cname, "ringscan-cp-serial", P, bc_median(&ser, 0, BC_SLOWEST),
                             bc_median(&ser, 1, BC_SLOWEST), ser.n);
    json_object_set_new(ser_row, "steps", bc_steps_json(&ser, P, "comm_ms"));
    if (P > 1) {
        BcTimes x = bc_repeat(e, bc_exchange_run, bc_two_read, &a, 2, 1, BC_SLOWEST);
        int64_t el = a.cp.L.T_local * 2 * (int64_t)a.d.nkv * a.d.hd;
        json_object_set_new(cp_row, "exchange_alone",
                            json_pack("{sI sf sI sf}", "kv_bytes", (json_int_t)(el * e->be->act_size), "kv_ms",
                                      bc_median(&x, 0, BC_SLOWEST), "dkv_bytes", (json_int_t)(el * 4), "dkv_ms",
                                      bc_median(&x, 1, BC_SLOWEST)));
        free(x.all);
    }
    free(over.all);
    free(ser.all);
    const RingCalls how = a.cp.ring_calls;
    const int kept = a.cp.ring_keep_kv;
    bc_ring_free(&a, e->be);

    bc_ring_setup(&a, e, c, ci, 1);
    BcTimes one = bc_repeat(e, bc_ring_run, bc_ring_read, &a, 2, 1, BC_RANK0);
    json_t *one_row = bc_row(cname, "ringscan-1gpu", 1, bc_median(&one, 0, BC_RANK0), bc_median(&one, 1, BC_RANK0),
                             one.n);
    free(one.all);
    bc_ring_free(&a, e->be);
    json_t *made[3] = {cp_row, ser_row, one_row};
    for (int i = 0; i < 3; i++) {
        json_object_set_new(made[i], "attn_impl", json_string(attn_kernel_names[e->o->attn_impl]));
        json_object_set_new(made[i], "ring_calls", json_string(ring_calls_names[how]));
        json_object_set_new(made[i], "ring_kv", json_string(kept ? "kept" : "passed"));
        json_array_append_new(rows, made[i]);
    }
}

/* ---- the GDN layer ------------------------------------------------------------------- */

typedef struct {
    Cp        cp;
    CpGdnDims d;
    int       kda;                                                /* a KDA core: g, dg (rows, H, K) */
    int       multi, Kd, Vd, kept_kind;
    int       steps, phases;                                      /* the core's steps (cp_gdn_steps), phases */
    char      phase_name[BC_GDN_PHASES][24];
    int       phase_mark[BC_GDN_PHASES + 1];                      /* the marks that bound each phase */
    int64_t   rows, n;
    size_t    kept_one;
    void     *proj, *conv, *halo, *qk, *core, *w;                 /* activations, weights */
    void     *dcore, *dqk, *dconv, *dproj;                        /* their gradients */
    float    *rstd, *g, *beta, *states, *M, *dg, *dbeta, *dw;     /* fp32 */
    void     *kept;
    int32_t  *doc_pos;                                            /* local rows, backend memory */
} BcGdn;

#define BC_AT(p, off) ((void *)((char *)(p) + (int64_t)(off) * es))

/* Marks: 0 start, 1 forward done, 2 backward done, 3 halo_fwd done, 4 conv_fwd done (the core's
 * forward begins), then the core's later steps (Cp.step_mark), 4 + 2 steps after its backward, 5 + 2
 * steps after conv_bwd. */
static int bc_gdn_step_mark_index(const BcGdn *a, int pass, int t) { return 4 + pass * (a->steps - 1) + t; }

static void bc_gdn_step_mark(void *ctx, int pass, int t, int phase) {
    void **c = ctx; /* {env, layer} */
    (void)phase;
    if (t > 0) bc_mark(c[0], bc_gdn_step_mark_index(c[1], pass, t)); /* step 0 begins where the phase before ends */
}

static void bc_gdn_run(BcEnv *e, void *ctx) {
    BcGdn *a = ctx;
    const Backend *be = e->be;
    const CpGdnDims *d = &a->d;
    const int es = be->act_size, ld2 = 2 * a->Kd, nl = a->cp.L.nlocal;
    const int64_t tail = (int64_t)(d->Kc - 1) * d->Cc, n = a->n;
    void *mark_ctx[2] = {e, a};
    a->cp.step_mark = bc_gdn_step_mark;
    a->cp.step_mark_ctx = mark_ctx;
    const CpGdnCore core = {.q = a->qk, .k = BC_AT(a->qk, a->Kd), .v = BC_AT(a->conv, 2 * a->Kd), .g = a->g,
                            .beta = a->beta, .ldq = ld2, .ldv = d->Cc, .ldo = a->Vd,
                            .states = a->multi ? a->states : NULL, .M = a->M, .kept = a->kept,
                            .kept_bytes = a->kept_one, .kept_kind = a->kept_kind, .kda = a->kda};
    const CpGdnGrads grads = {.dq = a->dqk, .dk = BC_AT(a->dqk, a->Kd), .dv = BC_AT(a->dconv, 2 * a->Kd),
                              .dg = a->dg, .dbeta = a->dbeta, .dout = a->dcore};
    bc_mark(e, 0);
    if (a->multi) cp_gdn_halo_forward(&a->cp, 0, a->halo, a->proj, d->Cc, d);
    bc_mark(e, 3);
    for (int f = 0; f < nl; f++)
        be->conv1d_silu_forward(BC_AT(a->conv, f * n * d->Cc), BC_AT(a->proj, f * n * d->Cc),
                                a->multi ? BC_AT(a->halo, f * tail) : NULL, a->w, a->doc_pos + f * n, n, d->Cc, d->Kc,
                                d->Cc, d->Cc);
    be->l2norm_forward(a->qk, a->rstd, a->conv, a->rows, 2 * d->nk, d->dk, d->Cc, ld2);
    bc_mark(e, 4);
    cp_gdn_forward(&a->cp, 0, a->core, &core, 1, d);
    bc_mark(e, 1);
    cp_gdn_backward(&a->cp, 0, &grads, &core, d);
    bc_mark(e, 4 + 2 * a->steps);
    be->l2norm_backward(a->dconv, a->dqk, a->qk, a->rstd, a->rows, 2 * d->nk, d->dk, d->Cc, ld2);
    for (int f = 0; f < nl; f++)
        be->conv1d_silu_backward(BC_AT(a->dproj, f * n * d->Cc), a->multi ? BC_AT(a->cp.halo_send, f * tail) : NULL,
                                 a->dw, BC_AT(a->dconv, f * n * d->Cc), BC_AT(a->proj, f * n * d->Cc),
                                 a->multi ? BC_AT(a->halo, f * tail) : NULL, a->w, a->doc_pos + f * n, n, d->Cc, d->Kc,
                                 d->Cc, d->Cc);
    bc_mark(e, 5 + 2 * a->steps);
    if (a->multi) cp_gdn_halo_backward(&a->cp, 0, a->dproj, d->Cc, a->cp.halo_send, d);
    bc_mark(e, 2);
    a->cp.step_mark = NULL; /* mark_ctx is this call's */
}

/* Appends phase `name``sfx`, ending at mark `end`. */
static void bc_gdn_phase(BcGdn *a, const char *name, const char *sfx, int end) {
    snprintf(a->phase_name[a->phases], sizeof a->phase_name[a->phases], "%s%s", name, sfx);
    a->phase_mark[++a->phases] = end;
}

/* The phases' names and bounding marks for the core's steps at this layout. */
static void bc_gdn_phases(BcGdn *a) {
    const char *const *steps = cp_gdn_steps(&a->cp, &a->steps);
    RS_CHECK(a->steps <= BC_GDN_STEPS, "the GDN core has %d steps, bench cp knows %d", a->steps, BC_GDN_STEPS);
    a->phases = 0;
    a->phase_mark[0] = 0;
    bc_gdn_phase(a, "halo", "_fwd", 3);
    bc_gdn_phase(a, "conv", "_fwd", 4);
    for (int t = 0; t < a->steps; t++)
        bc_gdn_phase(a, steps[t], "_fwd", t + 1 < a->steps ? bc_gdn_step_mark_index(a, 0, t + 1) : 1);
    for (int t = 0; t < a->steps; t++)
        bc_gdn_phase(a, steps[t], "_bwd", t + 1 < a->steps ? bc_gdn_step_mark_index(a, 1, t + 1) : 4 + 2 * a->steps);
    bc_gdn_phase(a, "conv", "_bwd", 5 + 2 * a->steps);
    bc_gdn_phase(a, "halo", "_bwd", 2);
}

/* v = [fwd, fwd+bwd, the phases] */
static void bc_gdn_read(BcEnv *e, void *ctx, double *v) {
    const BcGdn *a = ctx;
    v[0] = bc_ms(e, 0, 1);
    v[1] = bc_ms(e, 0, 2);
    for (int p = 0; p < a->phases; p++) v[2 + p] = bc_ms(e, a->phase_mark[p], a->phase_mark[p + 1]);
}

static void bc_gdn_setup(BcGdn *a, BcEnv *e, const json_t *c, int ci, int P, int kda) {
    memset(a, 0, sizeof *a);
    a->kda = kda;
    const Backend *be = e->be;
    int64_t T = json_integer_value(json_object_get(c, "T"));
    int H = (int)json_integer_value(json_object_get(c, "H")), K = (int)json_integer_value(json_object_get(c, "K"));
    int V = (int)json_integer_value(json_object_get(c, "V"));
    a->d = (CpGdnDims){.nk = H, .nv = H, .dk = K, .dv = V, .Cc = 2 * H * K + H * V, .Kc = BC_CONV_KERNEL};
    a->Kd = H * K;
    a->Vd = H * V;
    Config cfg;
    bc_config(&cfg, e, T, P);
    ModelConfig *m = &cfg.model;
    m->linear_num_key_heads = H;
    m->linear_num_value_heads = H;
    m->linear_key_head_dim = K;
    m->linear_value_head_dim = V;
    m->linear_conv_kernel_dim = BC_CONV_KERNEL;
    m->full_attention_interval = 2; /* the one layer is a GDN (KDA) layer */
    m->linear_attention = kda ? LINEAR_ATTN_KDA : LINEAR_ATTN_GDN; /* the CP buffers' sizes (model_acts.c) */
    bc_cp_begin(&a->cp, e, &cfg, P);
    config_free(&cfg);
    if (P > 1 && e->o->gdn_cp >= 0) cp_gdn_set_method(&a->cp, (CpGdnMethod)e->o->gdn_cp); /* --gdn-cp */
    bc_gdn_phases(a);
    a->multi = P > 1;
    a->rows = a->cp.L.T_local;
    a->n = a->cp.L.frag_len;
    const int nl = a->cp.L.nlocal;
    const size_t es = (size_t)be->act_size, f4 = sizeof(float);
    const int64_t rows = a->rows, Cc = a->d.Cc, state = (int64_t)H * K * V;
    a->proj = be->alloc((size_t)(rows * Cc) * es);
    a->conv = be->alloc((size_t)(rows * Cc) * es);
    a->dproj = be->alloc((size_t)(rows * Cc) * es);
    a->dconv = be->alloc((size_t)(rows * Cc) * es);
    a->halo = be->alloc((size_t)(nl * (BC_CONV_KERNEL - 1) * Cc) * es);
    a->w = be->alloc((size_t)(Cc * BC_CONV_KERNEL) * es);
    a->dw = be->alloc((size_t)(Cc * BC_CONV_KERNEL) * f4);
    a->qk = be->alloc((size_t)(rows * 2 * a->Kd) * es);
    a->dqk = be->alloc((size_t)(rows * 2 * a->Kd) * es);
    a->core = be->alloc((size_t)(rows * a->Vd) * es);
    a->dcore = be->alloc((size_t)(rows * a->Vd) * es);
    a->rstd = be->alloc((size_t)(rows * 2 * H) * f4);
    const int64_t gw = kda ? (int64_t)H * K : H; /* g's row width */
    a->g = be->alloc((size_t)(rows * gw) * f4);
    a->dg = be->alloc((size_t)(rows * gw) * f4);
    a->beta = be->alloc((size_t)(rows * H) * f4);
    a->dbeta = be->alloc((size_t)(rows * H) * f4);
    a->states = be->alloc((size_t)(nl * state) * f4);
    a->M = be->alloc((size_t)(nl * H * K * K) * f4);
    a->kept_kind = model_gdn_kept_kind(e->o->gdn_keep, kda, 0); /* as in a recomputed layer */
    if (e->o->gdn_keep != GDN_KEEP_NONE) {
        a->kept_one = (kda ? be->kda_kept_bytes : be->gdn_kept_bytes)(a->n, H, K, V, a->kept_kind);
        a->kept = be->alloc(a->kept_one * (size_t)nl);
    }
    a->doc_pos = a->cp.batch.doc_pos_dev + (int64_t)a->cp.L.rank * a->cp.batch.rows;
    bc_fill(e, a->proj, rows * Cc, bc_seed(e, ci, 11), -1, 1, 0);
    bc_fill(e, a->w, Cc * BC_CONV_KERNEL, bc_seed(e, ci, 12), -0.5f, 0.5f, 0);
    if (kda) { /* g = kimi_linear's gate of f uniform in [-1, 1) (f in dqk, the gate's b in dbeta: scratch); A_log and
                * dt_bias the same on every rank */
        float *A_log = RS_MALLOC((size_t)H * f4), *dt_bias = RS_MALLOC((size_t)(H * K) * f4);
        bench_kda_gate_params(A_log, dt_bias, H, K, e->o->seed);
        float *A_log_d = be->alloc((size_t)H * f4), *dt_bias_d = be->alloc((size_t)(H * K) * f4);
        be->to_device(A_log_d, A_log, (size_t)H * f4);
        be->to_device(dt_bias_d, dt_bias, (size_t)(H * K) * f4);
        free(A_log);
        free(dt_bias);
        bc_fill(e, a->dqk, rows * H * K, bc_seed(e, ci, 13), -1, 1, 0);
        bc_fill(e, a->dbeta, rows * H, bc_seed(e, ci, 16), -1, 1, 0);
        be->kda_gates_forward(a->beta, a->g, a->dbeta, a->dqk, A_log_d, dt_bias_d, rows, H, K, H, H * K);
        be->free(A_log_d);
        be->free(dt_bias_d);
    } else
        bc_fill(e, a->g, rows * H, bc_seed(e, ci, 13), -0.1f, -0.001f, 1);
    bc_fill(e, a->beta, rows * H, bc_seed(e, ci, 14), 0.05f, 0.95f, 1); /* KDA: in place of the gate's sigmoid(b) */
    bc_fill(e, a->dcore, rows * a->Vd, bc_seed(e, ci, 15), -1, 1, 0);
}

static void bc_gdn_free(BcGdn *a, const Backend *be) {
    void *bufs[] = {a->proj, a->conv, a->dproj, a->dconv, a->halo, a->w, a->dw, a->qk, a->dqk, a->core, a->dcore,
                    a->rstd, a->g, a->beta, a->dg, a->dbeta, a->states, a->M, a->kept};
    bc_free_all(be, bufs, sizeof bufs / sizeof bufs[0]);
    cp_free(&a->cp);
}

/* The exchanges alone, from the CP context's own buffers: the entry states' (the chain: one hand-off, every
 * sample's state, with the next rank; the hybrid: its all-gather of one [M | H] slot per rank; the scan: its
 * all-gather of every local fragment's) and the halo's tails. Their bytes per rank. */
static int64_t bc_state_bytes(const BcGdn *a) {
    const int64_t hh = (int64_t)a->d.nv * a->d.dk * a->d.dv, mm = (int64_t)a->d.nv * a->d.dk * a->d.dk;
    const CpGdnMethod m = a->cp.gdn_method;
    return (m == CP_GDN_CHAIN ? hh : m == CP_GDN_HYBRID ? mm + hh : a->cp.L.nlocal * (mm + hh)) *
           a->cp.batch.samples * (int64_t)sizeof(float);
}
static int64_t bc_halo_bytes(const BcGdn *a, const Backend *be) {
    return (int64_t)a->cp.batch.samples * a->cp.L.nlocal * (a->d.Kc - 1) * a->d.Cc * be->act_size;
}

static void bc_state_alone_run(BcEnv *e, void *ctx) {
    BcGdn *a = ctx;
    Cp *cp = &a->cp;
    CommHandle h = {0};
    bc_mark(e, 0);
    if (cp->gdn_method == CP_GDN_CHAIN) { /* to the next rank, from the one before (P = 2: the other) */
        const int P = cp->L.P, r = cp->L.rank;
        comm_isendrecv(cp->comm, COMM_CP, cp->scan_send, (r + 1) % P, cp->scan_recv, (r + P - 1) % P,
                       bc_state_bytes(a), 41, &h);
    } else
        comm_iallgather(cp->comm, COMM_CP, cp->scan_send, cp->scan_recv, bc_state_bytes(a), &h);
    comm_wait(cp->comm, &h);
    bc_mark(e, 1);
    comm_iallgather(cp->comm, COMM_CP, cp->halo_send, cp->halo_recv, bc_halo_bytes(a, e->be), &h);
    comm_wait(cp->comm, &h);
    bc_mark(e, 2);
}

static json_t *bc_phases_json(const BcGdn *a, const BcTimes *t, int how) {
    json_t *o = json_object();
    for (int p = 0; p < a->phases; p++)
        json_object_set_new(o, a->phase_name[p], json_real(bc_median(t, 2 + p, how)));
    return o;
}

/* every rank's own phases (the slowest-rank medians hide which rank waits): [{name: ms}] x P */
static json_t *bc_phases_by_rank_json(const BcGdn *a, const BcTimes *t) {
    json_t *arr = json_array();
    for (int r = 0; r < t->P; r++) json_array_append_new(arr, bc_phases_json(a, t, BC_RANK0 + r));
    return arr;
}

static void bc_gdn_case(BcEnv *e, const json_t *c, int ci, json_t *rows, int kda) {
    const char *cname = json_string_value(json_object_get(c, "name"));
    BcGdn a;
    bc_gdn_setup(&a, e, c, ci, e->P, kda);
    BcTimes t = bc_repeat(e, bc_gdn_run, bc_gdn_read, &a, 2 + a.phases, 1, BC_SLOWEST);
    json_t *cp_row = bc_row(cname, "ringscan-cp", e->P, bc_median(&t, 0, BC_SLOWEST), bc_median(&t, 1, BC_SLOWEST), t.n);
    json_object_set_new(cp_row, "phases", bc_phases_json(&a, &t, BC_SLOWEST));
    json_object_set_new(cp_row, "phases_by_rank", bc_phases_by_rank_json(&a, &t));
    free(t.all);
    if (e->P > 1) {
        BcTimes x = bc_repeat(e, bc_state_alone_run, bc_two_read, &a, 2, 1, BC_SLOWEST);
        json_t *alone = json_pack("{ss sI sf sI sf}", "state_op",
                                  a.cp.gdn_method == CP_GDN_CHAIN ? "send/recv" : "all-gather",
                                  "state_bytes_per_rank", (json_int_t)bc_state_bytes(&a), "state_ms",
                                  bc_median(&x, 0, BC_SLOWEST), "halo_bytes_per_rank",
                                  (json_int_t)bc_halo_bytes(&a, e->be), "halo_ms", bc_median(&x, 1, BC_SLOWEST));
        json_object_set_new(cp_row, "exchange_alone", alone);
        free(x.all);
    }
    bc_gdn_free(&a, e->be);
    bc_gdn_setup(&a, e, c, ci, 1, kda);
    t = bc_repeat(e, bc_gdn_run, bc_gdn_read, &a, 2 + a.phases, 1, BC_RANK0);
    json_t *one_row = bc_row(cname, "ringscan-1gpu", 1, bc_median(&t, 0, BC_RANK0), bc_median(&t, 1, BC_RANK0), t.n);
    json_object_set_new(one_row, "phases", bc_phases_json(&a, &t, BC_RANK0));
    free(t.all);
    bc_gdn_free(&a, e->be);
    json_array_append_new(rows, cp_row);
    json_array_append_new(rows, one_row);
}

/* ---- main --------------------------------------------------------------------------------- */

/* A bad value found once P is known: rank 0 says so, every rank leaves MPI, exit 2. */
static noreturn void bc_bad(Comm *comm, const char *opt, const char *val, const char *what) {
    if (comm->rank == 0)
        fprintf(stderr, "ringscan bench: %s %s: %s\n  hint: `ringscan bench --help` shows the options\n", opt, val,
                what);
    comm_finalize(comm);
    exit(RS_EXIT_USAGE);
}

static void bc_check_T(Comm *comm, const char *opt, const int64_t *T, int n, int P) {
    for (int i = 0; i < n; i++)
        if (T[i] % (128 * P)) {
            char val[32], why[160];
            snprintf(val, sizeof val, "%lld", (long long)T[i]);
            snprintf(why, sizeof why, "must be a multiple of 128 x P = %d (zigzag fragments of whole 64-token "
                     "chunks on %d ranks)", 128 * P, P);
            bc_bad(comm, opt, val, why);
        }
}

int bench_cp_main(const BenchOptions *o) {
    Comm comm;
    comm_init(&comm, NULL, NULL);
    const int P = comm.world_size;
    if (o->cp_parts & BENCH_CP_ATTN) bc_check_T(&comm, "--T", o->T, o->nT, P);
    if (o->cp_parts & (BENCH_CP_GDN | BENCH_CP_KDA)) bc_check_T(&comm, "--gdn-T", o->gdn_T, o->n_gdn_T, P);
    if (BC_STEP_MARK0 + 2 * P * CP_MARK_COUNT > BC_MARKS) {
        char val[16];
        snprintf(val, sizeof val, "%d", P);
        bc_bad(&comm, "ranks", val, "bench cp times at most 9 ranks (its timing marks)");
    }

    if (o->cp_cpu && o->attn_impl != ATTN_KERNEL_RINGSCAN)
        bc_bad(&comm, "--attn-impl", attn_kernel_names[o->attn_impl], "cuDNN's attention needs --device cuda");

    /* the device, before any CUDA context (request files need none) */
    char device[256] = "cpu";
    if (!o->cp_cpu && !o->write_requests) {
#ifdef RS_WITH_CUDA
        char why[512];
        int sms;
        double mem;
        if (cuda_backend_probe(why, sizeof why) == 0)
            bc_bad(&comm, "--device", "cuda", "no usable GPU (--device cpu runs the cpu backend)");
        if (cuda_bench_device(device, sizeof device, &sms, &mem) != 0)
            bc_bad(&comm, "--device", "cuda", "cannot read device 0");
#else
        bc_bad(&comm, "--device", "cuda", "this ringscan was built without the cuda backend (--device cpu runs "
               "the cpu backend)");
#endif
    }
#ifdef RS_WITH_CUDA
    /* the KDA layer's entries on cuda, before any peer runs (the cpu backend has them all) */
    char missing[512], why_kda[768];
    if ((o->cp_parts & BENCH_CP_KDA) && !o->cp_cpu && !o->write_requests &&
        bench_kda_missing(&backend_cuda, runtime_device()->sizes, missing, sizeof missing)) {
        snprintf(why_kda, sizeof why_kda, "this ringscan's cuda backend lacks the Kimi Delta Attention entries the KDA "
                 "layer calls (NULL: %s; kernels/cuda/kda/ registers them; --device cpu runs the cpu backend's)",
                 missing);
        bc_bad(&comm, "--parts", "kda", why_kda);
    }
#endif

    enum { NPART = 3 };
    json_t *req[NPART] = {bench_request(o, "cp_attn"), bench_request(o, "cp_gdn"), bench_request(o, "cp_kda")};
    const char *part_names[NPART] = {"cp_attn", "cp_gdn", "cp_kda"};
    const char *scripts[NPART] = {"cp_attn_torch.py", "cp_gdn_fla.py", "cp_kda_fla.py"};
    const int parts[NPART] = {BENCH_CP_ATTN, BENCH_CP_GDN, BENCH_CP_KDA};
    bench_attn_cases(o, json_object_get(req[0], "cases"));
    BenchOptions g = *o; /* the GDN and KDA cases: --gdn-T, one document */
    memcpy(g.T, o->gdn_T, sizeof g.T);
    g.nT = o->n_gdn_T;
    g.doc_len[0] = 0;
    g.n_doc_len = 1;
    for (int k = 1; k < NPART; k++) {
        bench_gdn_cases(&g, json_object_get(req[k], "cases"));
        json_object_set_new(req[k], "conv_kernel", json_integer(BC_CONV_KERNEL));
    }
    for (int k = 0; k < NPART; k++) json_object_set_new(req[k], "P", json_integer(P));

    if (comm.rank == 0 && fsio_mkdirs(o->out_dir) != 0) {
        fprintf(stderr, "ringscan bench: --out %s: cannot create: %s\n", o->out_dir, strerror(errno));
        comm_abort(&comm, RS_EXIT_USAGE);
    }
    if (o->write_requests) {
        for (int k = 0; k < NPART && comm.rank == 0; k++) {
            if (!(o->cp_parts & parts[k])) continue;
            char path[4200];
            snprintf(path, sizeof path, "%s/request_%s.json", o->out_dir, part_names[k]);
            bench_write_json(req[k], path);
            printf("wrote %s (%zu cases, P = %d)\n", path, json_array_size(json_object_get(req[k], "cases")), P);
        }
        for (int k = 0; k < NPART; k++) json_decref(req[k]);
        comm_finalize(&comm);
        return RS_EXIT_OK;
    }

    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    if (comm.rank == 0) {
        printf("ringscan bench cp | %s | %d ranks, %s | commit %s | attention kernel %s\n", date, P, device,
               build_info_git_sha(), attn_kernel_names[o->attn_impl]);
        printf("timing: %s, a barrier before each repetition, %d warm-up run(s), median of up to %d runs (at least 3 "
               "once %.0f s are spent); a CP run counts as its slowest rank's\n",
               o->cp_cpu ? "the host clock (cpu backend)" : "CUDA events on the compute stream", o->warmup, o->reps,
               o->max_s);
        fflush(stdout);
    }

    /* the peers: rank 0 alone starts them (torchrun, P processes) while the others wait */
    json_t *peer[NPART] = {NULL, NULL, NULL};
    int failed = 0;
    if (o->peer) {
        for (int k = 0; k < NPART && comm.rank == 0; k++) {
            if (!(o->cp_parts & parts[k])) continue;
            printf("peer %s: %s/%s on %d processes ...\n", part_names[k], o->peer_dir, scripts[k], P);
            fflush(stdout);
            double t0 = bench_clock();
            peer[k] = bench_peer_run(o, part_names[k], scripts[k], P, req[k]);
            printf("peer %s: %.1f s\n", part_names[k], bench_clock() - t0);
            if (json_object_get(peer[k], "error")) {
                failed = 1;
                printf("peer %s failed: %s\n", part_names[k], json_string_value(json_object_get(peer[k], "error")));
            }
        }
        comm_barrier(&comm, comm.world);
    }

    /* the run's start as training's (lib/backend/runtime.h): one CP group of P ranks; on cuda GPU <local rank>,
     * from here on the comm_i* operations NCCL on device buffers, and ours or --attn-impl cudnn*: the ring's
     * calls routed per call */
    Config rc;
    config_init_defaults(&rc);
    rc.parallel.dp = 1;
    rc.parallel.cp = P;
    rc.device.kind = o->cp_cpu ? DEVICE_KIND_CPU : DEVICE_KIND_CUDA;
    rc.device.attention_kernel = o->attn_impl;
    rc.device.cudnn_library = (char *)(o->cudnn_lib ? o->cudnn_lib : "");
    char why[4096];
    BcEnv e = {.comm = &comm, .o = o, .P = P, .rank = comm.rank, .cpu = o->cp_cpu,
               .be = runtime_open(&rc, &comm, why, sizeof why)};
    if (!e.be) bc_bad(&comm, "--attn-impl", attn_kernel_names[o->attn_impl], why);
    if (why[0] && comm.rank == 0) printf("%s\n", why);
#ifdef RS_WITH_CUDA
    if (!o->cp_cpu) {
        bench_attn_tune_apply(o); /* --attn-tune: our kernel's backward */
        e.tm = cuda_bench_timer_create();
    }
#endif

    json_t *ours[NPART] = {json_array(), json_array(), json_array()};
    for (int k = 0; k < NPART; k++) {
        if (!(o->cp_parts & parts[k])) continue;
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(req[k], "cases"), i, c) {
            if (comm.rank == 0) {
                printf("ringscan %s %s ...", part_names[k], json_string_value(json_object_get(c, "name")));
                fflush(stdout);
            }
            double t0 = bench_clock();
            if (k == 0) bc_ring_case(&e, c, (int)i, ours[k]);
            else bc_gdn_case(&e, c, 100 * k + (int)i, ours[k], k == 2);
            if (comm.rank == 0) printf(" %.1f s\n", bench_clock() - t0);
        }
    }
#ifdef RS_WITH_CUDA
    if (e.tm) cuda_bench_timer_free(e.tm);
#endif

    if (comm.rank == 0) {
        json_t *all = json_pack("{ss ss ss ss si}", "schema", "ringscan-bench-cp/1", "date", date, "commit",
                                build_info_git_sha(), "device", device, "P", P);
        json_object_set_new(all, "backend", json_string(o->cp_cpu ? "cpu" : "cuda"));
        json_object_set_new(all, "attn_impl", json_string(attn_kernel_names[o->attn_impl]));
        json_object_set_new(all, "attn_tune", bench_tune_json(bench_attn_tune_names, o->attn_tune, BENCH_ATTN_TUNE_N));
        for (int k = 0; k < NPART; k++) {
            if (!(o->cp_parts & parts[k])) continue;
            json_t *table = json_array();
            bench_cp_print(stdout, k, req[k], ours[k], peer[k], P, BC_CONV_KERNEL, table);
            json_t *part = json_pack("{sO sO so}", "request", req[k], "ringscan", ours[k], "table", table);
            if (peer[k]) json_object_set(part, "peer", peer[k]);
            if (k >= 1) json_object_set_new(part, "gdn_keep", json_string(gdn_keep_names[o->gdn_keep]));
            if (k >= 1 && P == 2)
                json_object_set_new(part, "gdn_chain", json_string(o->gdn_chain_staged && o->gdn_keep == GDN_KEEP_STATES
                                                                       ? "staged" : "whole"));
            if (k >= 1 && P > 1) { /* the state passing's schedule: --gdn-cp, or what training runs here */
                Config gc;
                config_init_defaults(&gc);
                gc.parallel.cp = P;
                gc.parallel.gdn_chain_staged = o->gdn_chain_staged;
                gc.checkpoint.gdn_keep = o->gdn_keep;
                const int gm = o->gdn_cp >= 0 ? o->gdn_cp : (int)cp_gdn_method(&gc);
                json_object_set_new(part, "gdn_cp", json_string(cp_gdn_method_names[gm]));
                config_free(&gc);
            }
            json_object_set_new(all, part_names[k], part);
        }
        char path[4200];
        snprintf(path, sizeof path, "%s/bench.json", o->out_dir);
        bench_write_json(all, path);
        printf("\nresults: %s\n", path);
        json_decref(all);
    }
    for (int k = 0; k < NPART; k++) {
        json_decref(req[k]);
        json_decref(ours[k]);
        json_decref(peer[k]);
    }
    failed = comm_allreduce_max_int(&comm, comm.world, failed);
    comm_finalize(&comm);
    if (failed && comm.rank == 0) fprintf(stderr, "ringscan bench: a peer failed (its rows say why); exit 1\n");
    return failed ? RS_EXIT_FAIL : RS_EXIT_OK;
}
