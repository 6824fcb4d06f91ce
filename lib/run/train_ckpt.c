/*
 * train_ckpt.c — the trainer's checkpoints (see train_ckpt.h): which tensors
 * and which state go into ckpt.h's checkpoints, and the identity check on
 * resume.
 */
#include "train_ckpt.h"

#include <math.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"

static const char *const train_identity_keys[] = {
    "model.", "data.format", "data.path", "data.seq_len", "data.shuffle", "run.seed", NULL,
};

/* The resolved config as YAML text (malloc'd). */
static char *train_config_yaml(const Config *cfg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    RS_CHECK(f != NULL, "open_memstream failed");
    config_write_yaml(cfg, f, 0);
    fclose(f);
    return buf;
}

/* FNV-1a over the identity keys and their values. */
static uint64_t train_identity_hash(const Config *cfg) {
    uint64_t h = 1469598103934665603ull;
    char v[CONFIG_VALUE_MAX];
    for (int i = 0; i < config_schema_count; i++) {
        int match = 0;
        for (int j = 0; train_identity_keys[j]; j++)
            if (!strncmp(config_schema[i].path, train_identity_keys[j], strlen(train_identity_keys[j]))) match = 1;
        if (!match) continue;
        config_format_value(cfg, i, v, sizeof v);
        for (const char *s = config_schema[i].path; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
        for (const char *s = v; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    }
    return h;
}

/* ---- the data fingerprint (data.h, DataFingerprint) --------------------------- */

/* state.data: what identifies the data the run reads */
static json_t *train_data_json(const DataSource *src) {
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)src->fp.hash);
    json_t *o = json_pack("{ss sI sI sI sI ss}", "path", src->path, "bytes", (json_int_t)src->fp.bytes, "mtime_ns",
                          (json_int_t)src->fp.mtime_ns, "n_tokens", (json_int_t)src->n_tokens, "n_docs",
                          (json_int_t)src->n_docs, "fingerprint", hash);
    if (src->idx_path)
        json_object_set_new(o, "idx", json_pack("{ss sI sI}", "path", src->idx_path, "bytes",
                                                (json_int_t)src->fp.idx_bytes, "mtime_ns",
                                                (json_int_t)src->fp.idx_mtime_ns));
    return o;
}

/* Compares the data the run opened with the checkpoint's state.data: a different fingerprint is
 * refused (exit 2) unless data.accept_changed was given with --set on this command line. */
static void train_data_check(Trainer *t, const json_t *saved, const char *ckdir) {
    const DataSource *src = data_source(t->data);
    if (!json_is_object(saved)) {
        train_say(t, "note: checkpoint %s holds no data fingerprint (written before ringscan kept one); the data "
                     "cannot be checked against it\n",
                  ckdir);
        return;
    }
    json_t *now = train_data_json(src);
    const char *h0 = json_string_value(json_object_get(saved, "fingerprint"));
    const char *h1 = json_string_value(json_object_get(now, "fingerprint"));
    char diff[2048] = "";
    size_t k = 0;
    static const char *const keys[] = {"fingerprint", "bytes", "n_tokens", "n_docs", "mtime_ns", NULL};
    for (int i = 0; keys[i] && k < sizeof diff; i++) {
        json_t *a = json_object_get(saved, keys[i]), *b = json_object_get(now, keys[i]);
        if (json_equal(a, b)) continue;
        char va[64] = "?", vb[64];
        if (json_is_string(a)) snprintf(va, sizeof va, "%s", json_string_value(a));
        else if (json_is_integer(a)) snprintf(va, sizeof va, "%lld", (long long)json_integer_value(a));
        if (json_is_string(b)) snprintf(vb, sizeof vb, "%s", json_string_value(b));
        else snprintf(vb, sizeof vb, "%lld", (long long)json_integer_value(b));
        k += (size_t)snprintf(diff + k, sizeof diff - k, "    %s: %s -> %s\n", keys[i], va, vb);
    }
    int same = h0 && h1 && !strcmp(h0, h1);
    json_decref(now);
    if (!diff[0]) return;
    if (same) { /* only the time changed: a copy, or a touch; the content we sample is the same */
        train_say(t, "note: data file %s has another mtime than at checkpoint %s, and the same size, documents and "
                     "sampled content; continuing\n",
                  src->path, ckdir);
        return;
    }
    int key = config_find_key("data.accept_changed");
    if (t->cfg->data.accept_changed && t->cfg->source[key].origin == CONFIG_ORIGIN_SET) {
        train_say(t, "warning: data file %s is not the data of checkpoint %s (saved -> now):\n%s"
                     "  continuing on it as --set data.accept_changed=true asks; the resume is not exact\n",
                  src->path, ckdir, diff);
        return;
    }
    train_fail(t, RS_EXIT_USAGE,
               "resume refuses: data file %s is not the data of checkpoint %s (saved -> now):\n%s"
               "  hint: the checkpoint's data position would point into other data, so the resume would not be "
               "exact; put the original file back, or continue on this data with `ringscan resume %s --set "
               "data.accept_changed=true`",
               src->path, ckdir, diff, t->run_dir);
}

static double train_ckpt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The manifest's state object: where the run is and what it is (the config, the data). */
static json_t *train_ckpt_state(const Trainer *t) {
    const Config *cfg = t->cfg;
    char *yaml = train_config_yaml(cfg);
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)train_identity_hash(cfg));
    json_t *state = json_object();
    json_object_set_new(state, "step", json_integer(t->step));
    json_object_set_new(state, "samples_consumed", json_integer(t->samples));
    json_object_set_new(state, "tokens_consumed", json_integer(t->samples * cfg->data.seq_len));
    json_object_set_new(state, "seed", json_integer(cfg->run.seed));
    json_object_set_new(state, "world", json_pack("{sI sI}", "dp", (json_int_t)cfg->parallel.dp, "cp",
                                                  (json_int_t)cfg->parallel.cp));
    json_object_set_new(state, "identity_hash", json_string(hash));
    json_object_set_new(state, "data", train_data_json(data_source(t->data)));
    json_object_set_new(state, "config_yaml", json_string(yaml));
    free(yaml);
    return state;
}

/* Without sharding: rank 0 writes model.safetensors and optim.safetensors whole. */
static int train_ckpt_save_whole(Trainer *t, char *err, size_t err_len) {
    Model *m = &t->model;
    int rc = 0;
    if (t->comm->rank != 0) return 0;
    size_t bytes = (size_t)m->ptab.buffer_numel * sizeof(float);
    float *hp = RS_MALLOC(bytes), *hm = RS_MALLOC(bytes), *hv = RS_MALLOC(bytes);
    model_get_full(m, 0, hp);
    model_get_full(m, 1, hm);
    model_get_full(m, 2, hv);
    int n = m->ptab.n;
    StTensor *tp = RS_CALLOC((size_t)n, sizeof *tp), *to = RS_CALLOC((size_t)(2 * n), sizeof *to);
    char *names = RS_CALLOC((size_t)(2 * n), PARAM_NAME_MAX + 2);
    for (int i = 0; i < n; i++) {
        const ParamTensor *p = &m->ptab.t[i];
        StTensor base = {.name = p->name, .dtype = ST_DTYPE_F32, .ndim = p->ndim};
        base.shape[0] = p->shape[0];
        base.shape[1] = p->shape[1];
        tp[i] = base;
        tp[i].data = hp + p->offset;
        char *mn = names + (size_t)(2 * i) * (PARAM_NAME_MAX + 2), *vn = mn + PARAM_NAME_MAX + 2;
        snprintf(mn, PARAM_NAME_MAX + 2, "m.%s", p->name);
        snprintf(vn, PARAM_NAME_MAX + 2, "v.%s", p->name);
        to[2 * i] = base;
        to[2 * i].name = mn;
        to[2 * i].data = hm + p->offset;
        to[2 * i + 1] = base;
        to[2 * i + 1].name = vn;
        to[2 * i + 1].data = hv + p->offset;
    }
    json_t *state = train_ckpt_state(t);
    CkptFile files[2] = {{"model.safetensors", tp, n, NULL}, {"optim.safetensors", to, 2 * n, NULL}};
    rc = ckpt_save(t->run_dir, t->step, files, 2, state, t->cfg->checkpoint.keep, err, err_len);
    json_decref(state);
    free(names);
    free(tp);
    free(to);
    free(hp);
    free(hm);
    free(hv);
    return rc;
}

/* With sharding (ckpt_shard.c): rank 0 begins the save, every rank writes shard-RRRRR.safetensors (its
 * slices of the master weights and both moments) into the step's temporary directory at once, and rank 0
 * finishes it with every file's size and crc32 in the manifest. Nothing is gathered. */
static int train_ckpt_save_sharded(Trainer *t, char *err, size_t err_len) {
    Model *m = &t->model;
    Comm *c = t->comm;
    CkptSave sv;
    int rc = 0;
    if (c->rank == 0) rc = ckpt_save_begin(&sv, t->run_dir, t->step, err, err_len);
    if ((rc = comm_allreduce_max_int(c, c->world, rc))) return rc;
    char tmp[CKPT_PATH_MAX];
    if (c->rank == 0) snprintf(tmp, sizeof tmp, "%s", sv.tmp);
    comm_bcast(c, c->world, tmp, sizeof tmp, 0);

    /* this rank's slices: tensor ∩ piece, for the master weights, m and v */
    comm_set_context(c, (int)t->cfg->model.num_hidden_layers, "checkpoint shard write");
    const size_t sbytes = (size_t)m->shard_numel * sizeof(float);
    float *h[3] = {RS_MALLOC(sbytes), RS_MALLOC(sbytes), RS_MALLOC(sbytes)};
    t->be->to_host(h[0], m->params, sbytes);
    t->be->to_host(h[1], m->adam_m, sbytes);
    t->be->to_host(h[2], m->adam_v, sbytes);
    StTensor *ts = RS_CALLOC((size_t)(3 * m->ptab.n), sizeof *ts);
    char *names = RS_CALLOC((size_t)(3 * m->ptab.n), PARAM_NAME_MAX + 32);
    int64_t nt = 0;
    static const char *const prefix[3] = {"", "m.", "v."};
    for (int i = 0; i < m->ptab.n; i++) {
        const ParamTensor *p = &m->ptab.t[i];
        int64_t a, n, sh;
        model_shard_piece(m, model_param_bucket(m, i), &a, &n, &sh);
        const int64_t x0 = p->offset > a ? p->offset : a;
        const int64_t x1 = p->offset + p->numel < a + n ? p->offset + p->numel : a + n;
        if (x1 <= x0) continue;
        for (int k = 0; k < 3; k++, nt++) {
            char *name = names + (size_t)nt * (PARAM_NAME_MAX + 32);
            ckpt_shard_slice_name(name, PARAM_NAME_MAX + 32, prefix[k], p->name, x0 - p->offset);
            ts[nt] = (StTensor){.name = name, .dtype = ST_DTYPE_F32, .ndim = 1, .data = h[k] + sh + (x0 - a)};
            ts[nt].shape[0] = x1 - x0;
        }
    }
    CkptWritten mine;
    memset(&mine, 0, sizeof mine);
    snprintf(mine.name, sizeof mine.name, "shard-%05d.safetensors", c->rank);
    char path[CKPT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", tmp, mine.name);
    StWriteInfo info;
    char mine_err[2048] = "";
    rc = safetensors_write_file(path, ts, nt, NULL, &info, mine_err, sizeof mine_err);
    if (rc) RS_WARN("writing this rank's checkpoint shard: %s", mine_err);
    else {
        mine.size = info.size;
        mine.crc32 = info.crc32;
    }
    free(names);
    free(ts);
    for (int k = 0; k < 3; k++) free(h[k]);

    comm_set_context(c, -1, "checkpoint shard list");
    int written = comm_allreduce_max_int(c, c->world, rc);
    CkptWritten *all = RS_CALLOC((size_t)c->world_size, sizeof *all);
    comm_allgather(c, c->world, &mine, all, (int64_t)sizeof mine);
    if (c->rank == 0) {
        if (written) {
            snprintf(err, err_len, "%s", rc ? mine_err : "another rank could not write its shard (its message above)");
            ckpt_save_abort(&sv);
            rc = written;
        } else {
            json_t *state = train_ckpt_state(t);
            json_object_set_new(state, "shard", json_pack("{ss sI}", "stage", shard_names[m->shard], "pieces",
                                                          (json_int_t)m->ptab.pieces));
            rc = ckpt_save_finish(&sv, NULL, 0, all, c->world_size, state, t->cfg->checkpoint.keep, err, err_len);
            json_decref(state);
        }
    }
    free(all);
    return comm_allreduce_max_int(c, c->world, rc);
}

void train_ckpt_save(Trainer *t) {
    char err[4096] = "";
    double t0 = train_ckpt_now();
    int rc = t->model.shard != SHARD_NONE ? train_ckpt_save_sharded(t, err, sizeof err)
                                          : train_ckpt_save_whole(t, err, sizeof err);
    rc = comm_allreduce_max_int(t->comm, t->comm->world, rc);
    if (rc) {
        char kept[PATH_MAX + 160];
        if (t->last_ckpt >= 0)
            snprintf(kept, sizeof kept, "the newest complete checkpoint, step %lld, is intact: `ringscan resume %s` "
                                        "continues from it once the cause is fixed",
                     (long long)t->last_ckpt, t->run_dir);
        else
            snprintf(kept, sizeof kept, "no checkpoint was written before: `ringscan train` starts the run over once "
                                        "the cause is fixed");
        train_fail(t, rc, "checkpoint of step %lld failed, so the run stops: %s\n  hint: %s", (long long)t->step, err,
                   kept);
    }
    t->last_ckpt = t->step;
    const double mib = 12.0 * (double)t->model.ptab.buffer_numel / (1 << 20);
    if (t->model.shard != SHARD_NONE)
        train_say(t, "checkpoint step_%08lld written (%d shards of %.1f MiB, %.0f ms)\n", (long long)t->step,
                  t->comm->world_size, mib / t->comm->world_size, (train_ckpt_now() - t0) * 1e3);
    else
        train_say(t, "checkpoint step_%08lld written (%.1f MiB, %.0f ms)\n", (long long)t->step, mib,
                  (train_ckpt_now() - t0) * 1e3);
}

/* Whether two spellings name one directory: the same text without trailing '/', or the same real path. */
static int train_ckpt_same_dir(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    while (na > 1 && a[na - 1] == '/') na--;
    while (nb > 1 && b[nb - 1] == '/') nb--;
    if (na == nb && !strncmp(a, b, na)) return 1;
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

/* The options of a resume that it cannot honour as asked (train_ckpt.h): refused, exit 2. */
static void train_ckpt_check_options(Trainer *t, const Config *stored, TrainResume *r) {
    Config *cfg = t->cfg;
    if (cfg->source[config_find_key("run.out_dir")].origin == CONFIG_ORIGIN_SET &&
        !train_ckpt_same_dir(cfg->run.out_dir, t->run_dir))
        train_fail(t, RS_EXIT_USAGE,
                   "resume refuses run.out_dir = \"%s\": a resume continues the run in its own directory, %s (the "
                   "command's argument)\n  hint: to continue the run elsewhere, copy %s there and resume the copy",
                   cfg->run.out_dir, t->run_dir, t->run_dir);
    free(cfg->run.out_dir);
    cfg->run.out_dir = RS_STRDUP(t->run_dir); /* what config.resolved.yaml records: where the run is */

    if (cfg->run.stop_after_step > 0 && cfg->run.stop_after_step <= r->step)
        train_fail(t, RS_EXIT_USAGE,
                   "resume refuses run.stop_after_step = %lld: checkpoint %s is at step %lld already, so the run "
                   "would never stop there\n  hint: set it after step %lld, or leave it out to run to train.steps",
                   (long long)cfg->run.stop_after_step, r->ck.dir, (long long)r->step, (long long)r->step);

    const ParallelConfig *ps = &stored->parallel, *pn = &cfg->parallel;
    int64_t before = ps->dp * stored->data.micro_batch * stored->train.grad_accum;
    int64_t now = pn->dp * cfg->data.micro_batch * cfg->train.grad_accum;
    r->batch_before = before;
    if (before != now && !t->allow_batch_change)
        train_fail(t, RS_EXIT_USAGE,
                   "resume refuses to change the global batch: parallel.dp x data.micro_batch x train.grad_accum = "
                   "%lld x %lld x %lld = %lld samples per step in checkpoint %s, %lld x %lld x %lld = %lld now\n"
                   "  hint: keep the product to resume on another number of ranks (e.g. half the dp and twice "
                   "train.grad_accum); or pass --allow-batch-change to train with the new batch from step %lld on",
                   (long long)ps->dp, (long long)stored->data.micro_batch, (long long)stored->train.grad_accum,
                   (long long)before, r->ck.dir, (long long)pn->dp, (long long)cfg->data.micro_batch,
                   (long long)cfg->train.grad_accum, (long long)now, (long long)r->step + 1);
}

void train_ckpt_load(Trainer *t, TrainResume *r) {
    char err[4096];
    memset(r, 0, sizeof *r);
    if (ckpt_load(&r->ck, t->run_dir, err, sizeof err) != 0)
        train_fail(t, RS_EXIT_USAGE, "cannot resume %s: %s", t->run_dir, err);
    json_t *state = r->ck.state;
    json_t *js = json_object_get(state, "step"), *jn = json_object_get(state, "samples_consumed");
    json_t *jy = json_object_get(state, "config_yaml");
    if (!json_is_integer(js) || !json_is_integer(jn) || !json_is_string(jy))
        train_fail(t, RS_EXIT_USAGE, "%s/manifest.json: the state lacks step, samples_consumed or config_yaml: not a "
                                     "ringscan training checkpoint",
                   r->ck.dir);
    r->step = json_integer_value(js);
    r->samples = json_integer_value(jn);
    if (r->step < 0 || r->samples < 0)
        train_fail(t, RS_EXIT_USAGE, "%s/manifest.json: the state says step %lld, samples_consumed %lld; expected "
                                     "both >= 0: not a checkpoint ringscan wrote",
                   r->ck.dir, (long long)r->step, (long long)r->samples);
    snprintf(r->dir, sizeof r->dir, "%s", r->ck.dir);

    Config stored;
    ConfigErrors ce = {0};
    config_init_defaults(&stored);
    const char *yaml = json_string_value(jy);
    char where[PATH_MAX + 64];
    snprintf(where, sizeof where, "%s (saved config)", r->ck.dir);
    if (config_load_yaml(&stored, where, yaml, strlen(yaml), &ce) != 0)
        train_fail(t, RS_EXIT_USAGE, "the config saved in %s does not load:\n%s", r->ck.dir, ce.text);
    char diff[8192] = "";
    int nd = config_diff(&stored, t->cfg, train_identity_keys, diff, sizeof diff);
    if (nd > 0)
        train_fail(t, RS_EXIT_USAGE,
                   "resume refuses: %d model/data key%s differ from checkpoint %s (saved -> now):\n%s"
                   "  hint: these keys define the model and its data; start a new run to change them",
                   nd, nd == 1 ? "" : "s", r->ck.dir, diff);
    config_errors_free(&ce);
    train_ckpt_check_options(t, &stored, r);
    config_free(&stored);
    train_data_check(t, json_object_get(state, "data"), r->ck.dir);
    if (r->step >= t->cfg->train.steps)
        train_fail(t, RS_EXIT_USAGE, "checkpoint %s is at step %lld, and train.steps = %lld: nothing left to run "
                                     "(raise it with --set train.steps=N)",
                   r->ck.dir, (long long)r->step, (long long)t->cfg->train.steps);
}

void train_ckpt_restore(Trainer *t, TrainResume *r) {
    Model *m = &t->model;
    char err[4096];
    size_t bytes = (size_t)m->ptab.buffer_numel * sizeof(float);
    const char *prefix[3] = {"", "m.", "v."};
    const char *file[3] = {"model.safetensors", "optim.safetensors", "optim.safetensors"};
    const int sharded = ckpt_is_sharded(&r->ck);
    /* the moments of a sharded run: only this rank's pieces of each tensor are read (the weights whole: the
     * compute copy is) */
    int64_t *lo = NULL, *hi = NULL;
    if (m->shard != SHARD_NONE) {
        lo = RS_CALLOC((size_t)m->ptab.n, sizeof *lo);
        hi = RS_CALLOC((size_t)m->ptab.n, sizeof *hi);
        for (int i = 0; i < m->ptab.n; i++) {
            const ParamTensor *p = &m->ptab.t[i];
            int64_t a, n, sh;
            model_shard_piece(m, model_param_bucket(m, i), &a, &n, &sh);
            lo[i] = (a > p->offset ? a : p->offset) - p->offset;
            hi[i] = (a + n < p->offset + p->numel ? a + n : p->offset + p->numel) - p->offset;
            if (hi[i] < lo[i]) hi[i] = lo[i];
        }
    }
    for (int k = 0; k < 3; k++) {
        float *host = RS_CALLOC(1, bytes); /* (untouched pages of a large calloc are never committed) */
        if (sharded) {
            if (ckpt_shard_read(&r->ck, prefix[k], &m->ptab, host, k ? lo : NULL, k ? hi : NULL, err, sizeof err))
                train_fail(t, RS_EXIT_USAGE, "cannot resume from %s: %s", r->ck.dir, err);
        } else
            for (int i = 0; i < m->ptab.n; i++) {
                const ParamTensor *p = &m->ptab.t[i];
                char name[PARAM_NAME_MAX + 2];
                snprintf(name, sizeof name, "%s%s", prefix[k], p->name);
                int64_t shape[2] = {p->shape[0], p->shape[1]};
                if (ckpt_read(&r->ck, file[k], name, ST_DTYPE_F32, p->ndim, shape, host + p->offset, err, sizeof err))
                    train_fail(t, RS_EXIT_USAGE, "cannot resume from %s: %s", r->ck.dir, err);
            }
        /* the crc says the file is as written, not that it is sound: a NaN or Inf (or a negative second
         * moment) would make the first update NaN and the next save a checkpoint of NaN weights */
        for (int i = 0; i < m->ptab.n; i++) {
            const ParamTensor *p = &m->ptab.t[i];
            const float *v = host + p->offset;
            int64_t bad = 0, first = -1;
            for (int64_t j = 0; j < p->numel; j++)
                if ((!isfinite(v[j]) || (k == 2 && v[j] < 0.0f)) && bad++ == 0) first = j;
            if (bad)
                train_fail(t, RS_EXIT_USAGE, "cannot resume from %s: tensor %s%s in %s holds %lld value%s that %s not "
                           "finite%s (the first, element %lld, is %g)\n  hint: nothing was trained and no checkpoint "
                           "written; take an earlier checkpoint (move this step directory aside)",
                           r->ck.dir, prefix[k], p->name, sharded ? "the shards" : file[k], (long long)bad,
                           bad == 1 ? "" : "s", bad == 1 ? "is" : "are", k == 2 ? " or not >= 0" : "", (long long)first,
                           (double)v[first]);
        }
        model_set_full(m, k, host);
        free(host);
    }
    free(lo);
    free(hi);
    t->step = r->step;
    t->samples = r->samples;
    t->last_ckpt = r->step;
    ckpt_close(&r->ck);
}
