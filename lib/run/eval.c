/*
 * eval.c — `ringscan eval` (see eval.h): a checkpoint's loss on held-out
 * data, overall and by log-spaced context buckets, on any backend and layout.
 *
 * Per step of dp x micro_batch samples: each rank reads its samples' CP
 * fragments (cp_read_sample, as the trainer does), runs the forward alone
 * (model_forward: no backward, no gradient), reads the per-token losses back and adds
 * them (double) into its buckets by context = min(pos, doc_pos). At the end
 * one all-reduce of the bucket sums and counts over the world.
 *
 * Callers: cmd/eval.c (the command line's options parsed into EvalOptions).
 */
#include "eval.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "backend/runtime.h"
#include "comm/comm.h"
#include "data/data.h"
#include "core/error.h"
#include "io/ckpt.h"
#include "io/fsio.h"
#include "io/hf.h"
#include "model/model.h"

#define EVAL_BUCKETS 48 /* [0,1), [1,2), [2,4), ..., up to 2^46 tokens of context */

/* A failure every rank meets alike: rank 0 says it, all leave MPI and exit. */
static noreturn void eval_fail(Comm *comm, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static noreturn void eval_fail(Comm *comm, int code, const char *fmt, ...) {
    if (comm->rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        fputs("ringscan eval: error: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    comm_finalize(comm);
    exit(code);
}

static int eval_is_run_dir(const char *path) {
    char p[PATH_MAX + 8];
    struct stat st;
    snprintf(p, sizeof p, "%s/ckpt", path);
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int eval_bucket(int64_t ctx) {
    int b = 0;
    while (ctx > 0 && b < EVAL_BUCKETS - 1) ctx >>= 1, b++;
    return b; /* 0 for ctx 0; b for 2^(b-1) <= ctx < 2^b */
}

/* The checkpoint's config with the eval's data and the command line's overrides, validated. */
static void eval_config(Config *cfg, const EvalOptions *a, Comm *comm) {
    ConfigErrors ce = {0};
    char set[4 * PATH_MAX + 32] = "data.path=";
    if (config_yaml_quote(set + 10, sizeof set - 10, a->data) != 0) /* the path as one YAML scalar, exactly */
        eval_fail(comm, RS_EXIT_USAGE, "--data: the path is longer than %d bytes or not UTF-8", PATH_MAX);
    config_apply_set(cfg, set, 0, &ce);
    config_apply_set(cfg, "data.shuffle=false", 1, &ce);
    for (int i = 0; i < a->n_sets; i++) config_apply_set(cfg, a->sets[i], i + 2, &ce);
    if (!ce.count) config_validate(cfg, &ce);
    if (!ce.count) config_validate_world(cfg, comm->world_size, "mpirun", &ce);
    if (ce.count) eval_fail(comm, RS_EXIT_USAGE, "%s", ce.text);
    config_errors_free(&ce);
}

/* The JSON of eval.h. */
static json_t *eval_json(const HfCkpt *c, const Config *cfg, const char *backend, int64_t samples, const double *sum,
                         const double *cnt) {
    double S = 0, N = 0;
    for (int b = 0; b < EVAL_BUCKETS; b++) S += sum[b], N += cnt[b];
    json_t *o = json_object(), *bk = json_array();
    json_object_set_new(o, "format", json_string("ringscan-eval"));
    json_object_set_new(o, "version", json_integer(1));
    json_object_set_new(o, "checkpoint", fsio_json_path(c->dir));
    json_object_set_new(o, "step", json_integer(c->step));
    json_object_set_new(o, "data", fsio_json_path(cfg->data.path));
    json_object_set_new(o, "seq_len", json_integer(cfg->data.seq_len));
    json_object_set_new(o, "samples", json_integer(samples));
    json_object_set_new(o, "tokens", json_integer(samples * cfg->data.seq_len));
    json_object_set_new(o, "predicted_tokens", json_integer((json_int_t)N));
    json_object_set_new(o, "loss", json_real(S / N));
    json_object_set_new(o, "perplexity", json_real(exp(S / N)));
    json_object_set_new(o, "backend", json_string(backend));
    json_object_set_new(o, "world", json_pack("{sI sI}", "dp", (json_int_t)cfg->parallel.dp, "cp",
                                              (json_int_t)cfg->parallel.cp));
    for (int b = 0; b < EVAL_BUCKETS; b++) {
        if (cnt[b] == 0) continue;
        int64_t lo = b == 0 ? 0 : (int64_t)1 << (b - 1), hi = (int64_t)1 << b;
        json_array_append_new(bk, json_pack("{sI sI sI sf}", "from", (json_int_t)lo, "to", (json_int_t)hi, "tokens",
                                            (json_int_t)cnt[b], "loss", sum[b] / cnt[b]));
    }
    json_object_set_new(o, "buckets", bk);
    return o;
}

static void eval_print(const json_t *o, FILE *f) {
    fprintf(f, "eval %s (step %lld) on %s: %lld samples of %lld tokens, %lld predicted\n",
            json_string_value(json_object_get(o, "checkpoint")), (long long)json_integer_value(json_object_get(o, "step")),
            json_string_value(json_object_get(o, "data")), (long long)json_integer_value(json_object_get(o, "samples")),
            (long long)json_integer_value(json_object_get(o, "seq_len")),
            (long long)json_integer_value(json_object_get(o, "predicted_tokens")));
    fprintf(f, "loss %.6f | perplexity %.4f\n  context (tokens)     tokens        loss\n",
            json_real_value(json_object_get(o, "loss")), json_real_value(json_object_get(o, "perplexity")));
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(o, "buckets"), i, b) {
        char range[64];
        snprintf(range, sizeof range, "[%lld, %lld)", (long long)json_integer_value(json_object_get(b, "from")),
                 (long long)json_integer_value(json_object_get(b, "to")));
        fprintf(f, "  %-18s %10lld  %10.6f\n", range, (long long)json_integer_value(json_object_get(b, "tokens")),
                json_real_value(json_object_get(b, "loss")));
    }
}

int eval_run(const EvalOptions *a) {
    Comm comm;
    comm_init(&comm, NULL, NULL);
    char err[8192];
    HfCkpt c;
    if (!hf_is_ringscan(a->src))
        eval_fail(&comm, RS_EXIT_USAGE, "%s is neither a ringscan run directory (ckpt/) nor a checkpoint directory "
                                        "(manifest.json)", a->src);
    /* the output is checked before any work: a directory, a dangling symlink, a place inside ckpt/ */
    char out[PATH_MAX + 64];
    if (a->out) snprintf(out, sizeof out, "%s", a->out);
    else if (eval_is_run_dir(a->src)) snprintf(out, sizeof out, "%s/eval.json", a->src);
    else snprintf(out, sizeof out, "%s/../../eval.json", a->src);
    int orc = ckpt_check_output(out, FSIO_OUT_FILE, a->out ? "eval --out" : "eval's output", err, sizeof err);
    if (orc) eval_fail(&comm, orc, "%s", err);
    if (hf_ckpt_open(&c, a->src, err, sizeof err)) eval_fail(&comm, RS_EXIT_USAGE, "%s", err);
    Config *cfg = &c.cfg;
    eval_config(cfg, a, &comm);
    char why[4096];
    const Backend *be = runtime_open(cfg, &comm, why, sizeof why); /* groups, GPU + NCCL, backend, threads */
    if (!be) eval_fail(&comm, RS_EXIT_USAGE, "%s", why);
    if (why[0] && comm.rank == 0) printf("%s\n", why);
    DataSet *ds;
    if (data_open(&ds, &cfg->data, cfg->model.vocab_size, (uint64_t)cfg->run.seed, err, sizeof err))
        eval_fail(&comm, RS_EXIT_USAGE, "%s", err);
    const int64_t T = cfg->data.seq_len, mb = cfg->data.micro_batch, dp = cfg->parallel.dp;
    const int64_t per_step = dp * mb, epoch = data_samples_per_epoch(ds);
    int64_t want = a->tokens ? (a->tokens - 1) / T + 1 : epoch; /* whole samples, rounded up, no overflow */
    if (want > epoch) want = epoch;
    const int64_t steps = want / per_step;
    if (steps < 1)
        eval_fail(&comm, RS_EXIT_USAGE, "%s holds %lld sample%s of %lld tokens (asked: %lld); one step of "
                                        "parallel.dp x data.micro_batch = %lld samples needs more\n  hint: a smaller "
                                        "data.micro_batch or data.seq_len (--set), or more data",
                  a->data, (long long)epoch, epoch == 1 ? "" : "s", (long long)T, (long long)want, (long long)per_step);

    const int64_t Tl = T / cfg->parallel.cp, rows = mb * Tl;
    Model m;
    model_init(&m, cfg, be, &comm, rows);
    const size_t pbytes = (size_t)m.ptab.buffer_numel * sizeof(float);
    float *host = RS_CALLOC(1, pbytes);
    if (hf_ckpt_read_params(host, &m.ptab, &c, err, sizeof err)) eval_fail(&comm, RS_EXIT_USAGE, "%s", err);
    model_set_full(&m, 0, host);
    free(host);

    int32_t *meta = RS_MALLOC((size_t)rows * 16), *meta_dev = NULL; /* tokens | targets | pos | doc_pos */
    float *losses = RS_MALLOC((size_t)rows * sizeof(float));
    if (cfg->device.kind == DEVICE_KIND_CUDA) meta_dev = be->alloc((size_t)rows * 16);
    int32_t *md = meta_dev ? meta_dev : meta;
    Batch b = {rows, (int32_t)mb, Tl, md, md + rows, md + 2 * rows, md + 3 * rows, meta + 2 * rows, meta + 3 * rows, 0};
    double sum[2 * EVAL_BUCKETS] = {0}, *cnt = sum + EVAL_BUCKETS;
    DataSpanReader rd = {.data = ds};
    for (int64_t s = 0; s < steps; s++) {
        for (int64_t j = 0; j < mb; j++)
            if (cp_read_sample(&m.cp.L, data_span_read, &rd, s * per_step + comm.dp_rank * mb + j, meta + j * Tl,
                               meta + rows + j * Tl, meta + 2 * rows + j * Tl, meta + 3 * rows + j * Tl))
                data_fail(rd.err);
        if (meta_dev) be->to_device(meta_dev, meta, (size_t)rows * 16);
        model_forward(&m, &b);
        model_loss_sum(&m, 1); /* waits for the queued work */
        be->to_host(losses, m.losses, (size_t)rows * sizeof(float));
        for (int64_t t = 0; t < rows; t++) {
            if (meta[rows + t] < 0) continue;
            int32_t p = meta[2 * rows + t], d = meta[3 * rows + t];
            int k = eval_bucket(p < d ? p : d);
            sum[k] += losses[t];
            cnt[k] += 1;
        }
    }
    comm_allreduce_sum_f64(&comm, comm.world, sum, 2 * EVAL_BUCKETS);
    int rc = 0;
    if (comm.rank == 0) {
        json_t *o = eval_json(&c, cfg, be->name, steps * per_step, sum, cnt);
        eval_print(o, stdout);
        char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        size_t n = strlen(text);
        text = RS_REALLOC(text, n + 2);
        text[n++] = '\n';
        char made[PATH_MAX] = ""; /* --out's missing directories, made as export and data synth make theirs */
        rc = fsio_mkdirs_parent(out, made, sizeof made, err, sizeof err);
        if (!rc) rc = fsio_write_file_durable(out, text, (int64_t)n, err, sizeof err);
        if (rc) fsio_rmdirs_made(out, made);
        if (rc) fprintf(stderr, "ringscan eval: error: %s\n", err);
        else printf("wrote %s\n", out);
        free(text);
        json_decref(o);
    }
    free(meta);
    free(losses);
    if (meta_dev) be->free(meta_dev);
    model_free(&m);
    data_close(ds);
    hf_ckpt_close(&c);
    rc = comm_allreduce_max_int(&comm, comm.world, rc);
    comm_finalize(&comm);
    return rc;
}
