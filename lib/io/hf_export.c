/*
 * hf_export.c — `ringscan export`: the weights of a run as a Hugging Face
 * Qwen3NextForCausalLM folder (hf.h, "Export").
 *
 * Steps: read the fp32 internal weights (a run's newest verified checkpoint,
 * one checkpoint directory, or a Hugging Face folder through the import);
 * assign the HF tensors, in state-dict order, to shards of at most
 * --shard-gib (one file, model.safetensors, when everything fits); for each
 * shard gather the rows of its tensors (hf_layout.c), convert to the export
 * dtype (bf16: round to nearest even) and write it durably into OUT.tmp.<pid>;
 * then the index (sharded only) and config.json; fsync; rename to OUT. One
 * shard is in memory at a time. A failure removes the temporary directory.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>

#include "core/error.h"
#include "fsio.h"
#include "hf.h"

static double hf_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint16_t hf_f32_to_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40); /* NaN stays a (quiet) NaN */
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

/* config.json (docs/design/model.md). */
static json_t *hf_config_json(const Config *cfg, StDtype dtype, HfFormat format, const char *source) {
    const ModelConfig *m = &cfg->model;
    const int q35 = format == HF_FORMAT_QWEN3_5;
    json_t *j = json_object();
#define SETI(k, v) json_object_set_new(j, k, json_integer((json_int_t)(v)))
#define SETR(k, v) json_object_set_new(j, k, json_real(v))
    const int kda = m->linear_attention == LINEAR_ATTN_KDA; /* no transformers class: a model_type of its own (hf.h) */
    json_object_set_new(j, "architectures", json_pack("[s]", kda   ? "RingscanKdaHybridForCausalLM"
                                                             : q35 ? "Qwen3_5ForCausalLM"
                                                                   : "Qwen3NextForCausalLM"));
    json_object_set_new(j, "model_type", json_string(kda ? "ringscan_kda_hybrid" : q35 ? "qwen3_5_text" : "qwen3_next"));
    SETI("vocab_size", m->vocab_size);
    SETI("hidden_size", m->hidden_size);
    SETI("intermediate_size", m->intermediate_size);
    SETI("num_hidden_layers", m->num_hidden_layers);
    SETI("num_attention_heads", m->num_attention_heads);
    SETI("num_key_value_heads", m->num_key_value_heads);
    SETI("head_dim", m->head_dim);
    json_object_set_new(j, "hidden_act", json_string(hidden_act_names[m->hidden_act]));
    SETI("max_position_embeddings", m->max_position_embeddings > 0 ? m->max_position_embeddings : cfg->data.seq_len);
    SETR("initializer_range", m->initializer_range);
    SETR("rms_norm_eps", m->rms_norm_eps);
    json_object_set_new(j, "tie_word_embeddings", json_boolean(m->tie_word_embeddings));
    json_object_set_new(j, "attention_bias", json_false());
    SETR("attention_dropout", 0.0);
    if (q35) {
        /* Qwen3.5 keeps RoPE in rope_parameters only, with Qwen3-VL's interleaved sections over the rotary
         * pairs (text: three equal position ids, so plain RoPE whatever the split; the published split
         * [11, 11, 10] of 32 pairs, the same proportions here) */
        const int64_t pairs = config_rotary_dim(cfg) / 2;
        json_object_set_new(j, "attn_output_gate", json_true());
        json_object_set_new(j, "rope_parameters",
                            json_pack("{ss sf sf s[III] sb}", "rope_type", "default", "rope_theta", m->rope_theta,
                                      "partial_rotary_factor", m->partial_rotary_factor, "mrope_section",
                                      (json_int_t)((pairs + 2) / 3), (json_int_t)((pairs + 1) / 3),
                                      (json_int_t)(pairs / 3), "mrope_interleaved", 1));
    } else {
        SETR("rope_theta", m->rope_theta);
        SETR("partial_rotary_factor", m->partial_rotary_factor);
        json_object_set_new(j, "rope_parameters", json_pack("{ss sf sf}", "rope_type", "default", "rope_theta",
                                                            m->rope_theta, "partial_rotary_factor",
                                                            m->partial_rotary_factor));
    }
    SETI("linear_conv_kernel_dim", m->linear_conv_kernel_dim);
    SETI("linear_key_head_dim", m->linear_key_head_dim);
    SETI("linear_value_head_dim", m->linear_value_head_dim);
    SETI("linear_num_key_heads", m->linear_num_key_heads);
    SETI("linear_num_value_heads", m->linear_num_value_heads);
    SETI("full_attention_interval", m->full_attention_interval);
    if (kda) { /* what the KDA tensors are, also as kimi_linear's config names them (its layer numbers from 1) */
        json_object_set_new(j, "linear_attention", json_string("kda"));
        json_t *kl = json_array(), *fl = json_array();
        for (int l = 0; l < m->num_hidden_layers; l++)
            json_array_append_new(config_layer_kind(cfg, l) == LAYER_KIND_LINEAR ? kl : fl, json_integer(l + 1));
        json_object_set_new(j, "linear_attn_config",
                            json_pack("{so so sI sI sI}", "kda_layers", kl, "full_attn_layers", fl, "num_heads",
                                      (json_int_t)m->linear_num_value_heads, "head_dim",
                                      (json_int_t)m->linear_value_head_dim, "short_conv_kernel_size",
                                      (json_int_t)m->linear_conv_kernel_dim));
    }
    json_t *types = json_array(), *dense = json_array();
    for (int l = 0; l < m->num_hidden_layers; l++) {
        json_array_append_new(types, json_string(layer_kind_names[config_layer_kind(cfg, l)]));
        json_array_append_new(dense, json_integer(l));
    }
    json_object_set_new(j, "layer_types", types);
    if (q35) json_decref(dense); /* Qwen3.5 dense has no experts to place */
    else {
        json_object_set_new(j, "mlp_only_layers", dense); /* every layer dense (docs/design/model.md) */
        SETI("decoder_sparse_step", 1);
        SETI("num_experts", 0);
        json_object_set_new(j, "output_router_logits", json_false());
    }
    json_object_set_new(j, "use_cache", json_true());
    json_object_set_new(j, "dtype", json_string(dtype == ST_DTYPE_BF16 ? "bfloat16" : "float32"));
    json_object_set_new(j, "ringscan_source", fsio_json_path(source));
#undef SETI
#undef SETR
    return j;
}

static int hf_write_json(const char *path, const json_t *j, char *err, size_t err_len) {
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    RS_CHECK(text != NULL, "json_dumps failed");
    size_t n = strlen(text);
    text = RS_REALLOC(text, n + 2);
    text[n++] = '\n';
    int rc = fsio_write_file_durable(path, text, (int64_t)n, err, err_len);
    free(text);
    return rc;
}

/* OUT must be missing or an empty directory. */
static int hf_check_out(const char *out, char *err, size_t err_len) {
    struct stat st;
    if (stat(out, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) {
        fsio_errf(err, err_len, "%s exists and is not a directory; nothing was written", out);
        return RS_EXIT_USAGE;
    }
    DIR *d = opendir(out);
    if (!d) {
        fsio_errf(err, err_len, "cannot read %s: %s", out, strerror(errno));
        return RS_EXIT_FAIL;
    }
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) != NULL) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    if (n) {
        fsio_errf(err, err_len, "%s is not empty (%d entr%s); export writes a new folder and replaces "
                                "nothing\n  hint: name a new directory, or remove %s first", out, n,
                  n == 1 ? "y" : "ies", out);
        return RS_EXIT_USAGE;
    }
    return 0;
}

/* The shard files: shard_of[i] for every HF tensor, and their names. */
static int hf_plan_shards(int32_t *shard_of, const HfLayout *lay, int64_t esize, double shard_gib) {
    const int64_t cap = (int64_t)(shard_gib * (double)(1LL << 30));
    int32_t s = 0;
    int64_t used = 0;
    for (int i = 0; i < lay->n; i++) {
        int64_t b = lay->t[i].hf.numel * esize;
        if (used > 0 && used + b > cap) {
            s++;
            used = 0;
        }
        shard_of[i] = s;
        used += b;
    }
    return s + 1;
}

static void hf_shard_name(char *buf, size_t n, int s, int shards) {
    if (shards == 1) snprintf(buf, n, "model.safetensors");
    else snprintf(buf, n, "model-%05d-of-%05d.safetensors", s + 1, shards);
}

/* Gathers, converts and writes shard s into dir. */
static int hf_write_shard(const char *dir, int s, int shards, const int32_t *shard_of, const HfLayout *lay,
                          const float *params, const ParamTable *ptab, StDtype dtype, FILE *progress, char *err,
                          size_t err_len) {
    const int64_t es = st_dtype_size(dtype);
    int n = 0;
    int64_t bytes = 0;
    for (int i = 0; i < lay->n; i++)
        if (shard_of[i] == s) n++, bytes += lay->t[i].hf.numel * es;
    StTensor *ts = RS_CALLOC((size_t)n, sizeof *ts);
    char *data = RS_MALLOC((size_t)bytes + 1), *at = data;
    double t0 = hf_now();
    int k = 0;
    for (int i = 0; i < lay->n; i++) {
        if (shard_of[i] != s) continue;
        const HfMap *m = &lay->t[i];
        if (dtype == ST_DTYPE_F32) hf_layout_gather((float *)(void *)at, lay, m, params, ptab);
        else {
            float *f32 = RS_MALLOC((size_t)m->hf.numel * sizeof(float) + 1);
            hf_layout_gather(f32, lay, m, params, ptab);
            for (int64_t e = 0; e < m->hf.numel; e++) ((uint16_t *)(void *)at)[e] = hf_f32_to_bf16(f32[e]);
            free(f32);
        }
        StTensor *t = &ts[k++];
        t->name = m->hf.name;
        t->dtype = dtype;
        t->ndim = m->hf.ndim;
        for (int d = 0; d < m->hf.ndim; d++) t->shape[d] = m->hf.shape[d];
        t->data = at;
        at += m->hf.numel * es;
    }
    char name[64], path[PATH_MAX + 160];
    hf_shard_name(name, sizeof name, s, shards);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_t *meta = json_pack("{ss}", "format", "pt"); /* transformers reads only "pt"-format files */
    int rc = safetensors_write_file(path, ts, n, meta, NULL, err, err_len);
    json_decref(meta);
    free(data);
    free(ts);
    if (!rc && progress)
        fprintf(progress, "export: %s: %d tensors, %.3f GiB (%.1f s)\n", name, n, (double)bytes / (1 << 30),
                hf_now() - t0), fflush(progress);
    return rc;
}

int hf_export_params(const float *params, const ParamTable *ptab, const Config *cfg, const char *source,
                     const char *out_dir, const HfExportOptions *o, char *err, size_t err_len) {
    if (o->dtype != ST_DTYPE_F32 && o->dtype != ST_DTYPE_BF16) {
        fsio_errf(err, err_len, "dtype %s; expected F32 or BF16", st_dtype_names[o->dtype]);
        return RS_EXIT_USAGE;
    }
    if (o->format != HF_FORMAT_QWEN3_NEXT && o->format != HF_FORMAT_QWEN3_5) {
        fsio_errf(err, err_len, "format %d; expected qwen3_next or qwen3_5", (int)o->format);
        return RS_EXIT_USAGE;
    }
    if (o->format == HF_FORMAT_QWEN3_5 && cfg->model.linear_attention == LINEAR_ATTN_KDA) {
        fsio_errf(err, err_len, "the model has Kimi Delta Attention layers (model.linear_attention: kda), which the "
                                "Qwen3.5 layout has no place for; export it with --format qwen3_next (the Qwen3-Next "
                                "layout with kimi_linear's KDA tensor names, model_type ringscan_kda_hybrid); nothing "
                                "was written");
        return RS_EXIT_USAGE;
    }
    int rc = hf_check_out(out_dir, err, err_len);
    if (rc) return rc;
    char out[PATH_MAX], tmp[PATH_MAX + 64], made[PATH_MAX] = "";
    snprintf(out, sizeof out, "%s", out_dir);
    for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());
    if ((rc = fsio_mkdirs_parent(tmp, made, sizeof made, err, err_len))) return rc;
    if (mkdir(tmp, 0755) != 0) {
        fsio_errf(err, err_len, "cannot create %s: %s", tmp, strerror(errno));
        fsio_rmdirs_made(tmp, made);
        return RS_EXIT_FAIL;
    }
    HfLayout lay;
    hf_layout_build(&lay, cfg, ptab, o->format);
    const int64_t es = st_dtype_size(o->dtype);
    int32_t *shard_of = RS_CALLOC((size_t)lay.n + 1, sizeof *shard_of);
    int shards = hf_plan_shards(shard_of, &lay, es, o->shard_gib);
    int64_t total = 0;
    for (int i = 0; i < lay.n; i++) total += lay.t[i].hf.numel * es;
    if (o->progress)
        fprintf(o->progress, "export: %s -> %s (%s): %d tensors, %lld parameters, %.3f GiB of %s in %d file%s\n",
                source, out, hf_format_names[o->format], lay.n, (long long)ptab->count, (double)total / (1 << 30),
                o->dtype == ST_DTYPE_BF16 ? "bf16" : "fp32", shards, shards == 1 ? "" : "s"), fflush(o->progress);
    for (int s = 0; !rc && s < shards; s++)
        rc = hf_write_shard(tmp, s, shards, shard_of, &lay, params, ptab, o->dtype, o->progress, err, err_len);
    char path[PATH_MAX + 256], name[64];
    if (!rc && shards > 1) {
        json_t *idx = json_object(), *map = json_object();
        json_object_set_new(idx, "metadata", json_pack("{sI}", "total_size", (json_int_t)total));
        for (int i = 0; i < lay.n; i++) {
            hf_shard_name(name, sizeof name, shard_of[i], shards);
            json_object_set_new(map, lay.t[i].hf.name, json_string(name));
        }
        json_object_set_new(idx, "weight_map", map);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
        rc = hf_write_json(path, idx, err, err_len);
        json_decref(idx);
    }
    if (!rc) {
        json_t *cj = hf_config_json(cfg, o->dtype, o->format, source);
        snprintf(path, sizeof path, "%s/config.json", tmp);
        rc = hf_write_json(path, cj, err, err_len);
        json_decref(cj);
    }
    if (!rc) rc = fsio_fsync_dir(tmp, err, err_len);
    if (!rc && rename(tmp, out) != 0) { /* replaces a missing or empty OUT only */
        fsio_errf(err, err_len, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
        rc = errno == ENOTEMPTY || errno == EEXIST ? RS_EXIT_USAGE : RS_EXIT_FAIL;
    }
    if (!rc) {
        char parent[PATH_MAX];
        rc = fsio_dirname(parent, sizeof parent, out, err, err_len);
        if (!rc) rc = fsio_fsync_dir(parent, err, err_len);
    } else {
        char ignored[256];
        fsio_remove_tree(tmp, ignored, sizeof ignored);
        fsio_rmdirs_made(tmp, made);
    }
    if (!rc && o->progress) fprintf(o->progress, "export: done: %s\n", out), fflush(o->progress);
    free(shard_of);
    hf_layout_free(&lay);
    return rc;
}

int hf_export(const char *src, const char *out_dir, const HfExportOptions *o, char *err, size_t err_len) {
    int rc;
    Config cfg;
    HfCkpt c;
    int ringscan = hf_is_ringscan(src);
    char source[PATH_MAX + 64];
    if (ringscan) {
        if ((rc = hf_ckpt_open(&c, src, err, err_len))) return rc;
        snprintf(source, sizeof source, "%s (step %lld)", c.dir, (long long)c.step);
    } else {
        struct stat st;
        char cj[PATH_MAX + 16];
        snprintf(cj, sizeof cj, "%s/config.json", src);
        if (stat(cj, &st) != 0) {
            fsio_errf(err, err_len, "%s is neither a ringscan run directory (ckpt/), a checkpoint directory "
                                    "(manifest.json) nor a Hugging Face folder (config.json)", src);
            return RS_EXIT_USAGE;
        }
        config_init_defaults(&cfg);
        if ((rc = hf_read_config(&cfg, NULL, src, err, err_len))) {
            config_free(&cfg);
            return rc;
        }
        snprintf(source, sizeof source, "%s", src);
    }
    const Config *mc = ringscan ? &c.cfg : &cfg;
    ParamTable ptab;
    char note[1024] = "";
    model_params_build(&ptab, mc);
    float *params = RS_CALLOC((size_t)ptab.buffer_numel + 1, sizeof(float));
    rc = ringscan ? hf_ckpt_read_params(params, &ptab, &c, err, err_len)
                  : hf_import(params, &ptab, mc, src, "export", note, sizeof note, err, err_len);
    if (!rc && note[0] && o->progress) fprintf(o->progress, "%s\n", note), fflush(o->progress);
    if (!rc) rc = hf_export_params(params, &ptab, mc, source, out_dir, o, err, err_len);
    free(params);
    model_params_free(&ptab);
    if (ringscan) hf_ckpt_close(&c);
    else config_free(&cfg);
    return rc;
}
