/*
 * hf_import.c — the weights of a run's start, from a Hugging Face folder or a
 * ringscan checkpoint (hf.h, "Import"), and opening a ringscan checkpoint for
 * its weights and config (export and eval read through it too).
 *
 * A Hugging Face folder: config.json, and model.safetensors or the shards of
 * model.safetensors.index.json. Every HF tensor of the config's state dict
 * (model_params_build_hf) is read in its own dtype (F32, BF16 or F16), its
 * shape checked against the config's, converted to fp32 (exactly) and its
 * rows scattered into the internal layout (hf_layout.c).
 *
 * A ringscan checkpoint: the internal tensors of model.safetensors, read with
 * the config's shapes. Only weights are taken; the optimizer starts fresh.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "core/error.h"
#include "fsio.h"
#include "hf.h"

#define HF_JSON_MAX ((int64_t)256 << 20)

static int hf_exists(const char *dir, const char *name, int want_dir) {
    char p[PATH_MAX + 64];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && (want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

int hf_is_ringscan(const char *path) { return hf_exists(path, "ckpt", 1) || hf_exists(path, CKPT_MANIFEST, 0); }

/* ---- a ringscan checkpoint ------------------------------------------------------ */

int hf_ckpt_open(HfCkpt *c, const char *path, char *err, size_t err_len) {
    memset(c, 0, sizeof *c);
    config_init_defaults(&c->cfg);
    int rc;
    json_t *state;
    if (hf_exists(path, CKPT_MANIFEST, 0)) { /* one step directory */
        const char *base = strrchr(path, '/');
        char name[PATH_MAX];
        snprintf(name, sizeof name, "%s", base && base[1] ? base + 1 : path);
        for (size_t n = strlen(name); n > 0 && name[n - 1] == '/'; n--) name[n - 1] = 0;
        long long step = -1;
        char tail = 0;
        if (sscanf(name, "step_%8lld%c", &step, &tail) != 1 || strlen(name) != 13) {
            fsio_errf(err, err_len, "%s holds manifest.json but is not named step_NNNNNNNN: not a ringscan checkpoint "
                                    "directory", path);
            config_free(&c->cfg);
            return RS_EXIT_USAGE;
        }
        if ((rc = ckpt_verify_dir(path, step, &c->manifest, err, err_len))) {
            config_free(&c->cfg);
            return rc;
        }
        char mp[PATH_MAX + 32];
        snprintf(mp, sizeof mp, "%s/model.safetensors", path);
        if (access(mp, F_OK) != 0 && ckpt_load_dir(&c->ck, path, step, err, err_len) == 0) { /* sharded */
            c->have_ck = 1;
        } else if ((rc = safetensors_open(&c->own, mp, err, err_len))) {
            json_decref(c->manifest);
            config_free(&c->cfg);
            return rc;
        }
        snprintf(c->dir, sizeof c->dir, "%s", path);
        c->step = step;
        c->model = c->have_ck ? NULL : &c->own;
        state = json_object_get(c->manifest, "state");
    } else {
        if ((rc = ckpt_load(&c->ck, path, err, err_len))) {
            config_free(&c->cfg);
            return rc;
        }
        c->have_ck = 1;
        snprintf(c->dir, sizeof c->dir, "%s", c->ck.dir);
        c->step = c->ck.step;
        c->model = ckpt_file(&c->ck, "model.safetensors");
        state = c->ck.state;
        if (!c->model && !ckpt_is_sharded(&c->ck)) {
            fsio_errf(err, err_len, "checkpoint %s has no model.safetensors: not a ringscan training checkpoint",
                      c->dir);
            hf_ckpt_close(c);
            return RS_EXIT_USAGE;
        }
    }
    const char *yaml = json_string_value(json_object_get(state, "config_yaml"));
    if (!yaml) {
        fsio_errf(err, err_len, "%s/manifest.json: the state has no config_yaml: not a ringscan training checkpoint",
                  c->dir);
        hf_ckpt_close(c);
        return RS_EXIT_USAGE;
    }
    ConfigErrors ce = {0};
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s (saved config)", c->dir);
    if (config_load_yaml(&c->cfg, where, yaml, strlen(yaml), &ce) != 0) {
        fsio_errf(err, err_len, "the config saved in %s does not load: %s", c->dir, ce.text);
        config_errors_free(&ce);
        hf_ckpt_close(c);
        return RS_EXIT_USAGE;
    }
    config_errors_free(&ce);
    return 0;
}

void hf_ckpt_close(HfCkpt *c) {
    if (c->have_ck) ckpt_close(&c->ck);
    if (c->manifest) {
        json_decref(c->manifest);
        if (c->model == &c->own) safetensors_close(&c->own);
    }
    config_free(&c->cfg);
    memset(c, 0, sizeof *c);
}

/* Weights read for an import or an export must be finite: a NaN or Inf (a diverged run, a broken
 * conversion) would train or ship silently. 0, or RS_EXIT_USAGE naming the tensor, the file, the first
 * non-finite element and how many there are. */
static int hf_check_finite(const float *v, int64_t n, const char *tensor, const char *file, char *err,
                           size_t err_len) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]) && bad++ == 0) first = i;
    if (!bad) return 0;
    fsio_errf(err, err_len, "tensor %s in %s holds %lld value%s that %s not finite (the first, element %lld, is %g); "
                            "weights must be finite\n  hint: nothing was read into a run or written; take an earlier "
                            "checkpoint, or fix the file",
              tensor, file, (long long)bad, bad == 1 ? "" : "s", bad == 1 ? "is" : "are", (long long)first,
              (double)v[first]);
    return RS_EXIT_USAGE;
}

int hf_ckpt_read_params(float *params, const ParamTable *ptab, const HfCkpt *c, char *err, size_t err_len) {
    if (!c->model) { /* a sharded checkpoint (parallel.shard): every rank's slices, gathered here */
        int rc = ckpt_shard_read(&c->ck, "", ptab, params, NULL, NULL, err, err_len);
        for (int i = 0; i < ptab->n && !rc; i++)
            rc = hf_check_finite(params + ptab->t[i].offset, ptab->t[i].numel, ptab->t[i].name, c->ck.dir, err,
                                 err_len);
        return rc;
    }
    for (int i = 0; i < ptab->n; i++) {
        const ParamTensor *p = &ptab->t[i];
        int64_t shape[2] = {p->shape[0], p->shape[1]};
        int rc = safetensors_read(c->model, p->name, ST_DTYPE_F32, p->ndim, shape, params + p->offset, err, err_len);
        if (!rc) rc = hf_check_finite(params + p->offset, p->numel, p->name, c->model->path, err, err_len);
        if (rc) return rc;
    }
    return 0;
}

/* ---- a Hugging Face folder ----------------------------------------------------- */

typedef struct {
    int              n;
    SafetensorsFile *files;
} HfFolder;

static void hf_folder_close(HfFolder *f) {
    for (int i = 0; i < f->n; i++) safetensors_close(&f->files[i]);
    free(f->files);
    memset(f, 0, sizeof *f);
}

static int hf_read_json(json_t **out, const char *path, char *err, size_t err_len) {
    char *text = NULL;
    int64_t len = 0;
    int missing = 0;
    int rc = fsio_read_file(path, HF_JSON_MAX, &text, &len, &missing, err, err_len);
    if (rc) return missing ? RS_EXIT_USAGE : rc;
    json_error_t je;
    *out = json_loadb(text, (size_t)len, 0, &je);
    free(text);
    if (!*out || !json_is_object(*out)) {
        fsio_errf(err, err_len, "%s:%d: not a JSON object: %s", path, je.line, *out ? "(another JSON value)" : je.text);
        json_decref(*out);
        return RS_EXIT_USAGE;
    }
    return 0;
}

/* Opens model.safetensors, or every shard the index names (each once). */
static int hf_folder_open(HfFolder *f, const char *dir, char *err, size_t err_len) {
    memset(f, 0, sizeof *f);
    char path[PATH_MAX + 64];
    if (hf_exists(dir, "model.safetensors.index.json", 0)) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        json_t *idx;
        int rc = hf_read_json(&idx, path, err, err_len);
        if (rc) return rc;
        json_t *map = json_object_get(idx, "weight_map");
        if (!json_is_object(map)) {
            fsio_errf(err, err_len, "%s: no \"weight_map\" object", path);
            json_decref(idx);
            return RS_EXIT_USAGE;
        }
        const char *key;
        json_t *v;
        const char **names = RS_CALLOC(json_object_size(map) + 1, sizeof *names);
        int n = 0;
        json_object_foreach(map, key, v) {
            const char *file = json_string_value(v);
            if (!file || strchr(file, '/') || file[0] == '.') {
                fsio_errf(err, err_len, "%s: weight_map[\"%s\"] is not a file name of the folder", path, key);
                free(names);
                json_decref(idx);
                return RS_EXIT_USAGE;
            }
            int seen = 0;
            for (int i = 0; i < n; i++) seen |= !strcmp(names[i], file);
            if (!seen) names[n++] = file;
        }
        f->files = RS_CALLOC((size_t)n + 1, sizeof *f->files);
        for (int i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            if ((rc = safetensors_open(&f->files[f->n], path, err, err_len))) break;
            f->n++;
        }
        free(names);
        json_decref(idx);
        if (rc) hf_folder_close(f);
        return rc;
    }
    if (!hf_exists(dir, "model.safetensors", 0)) {
        fsio_errf(err, err_len, "%s holds neither model.safetensors nor model.safetensors.index.json: not a Hugging "
                                "Face model folder", dir);
        return RS_EXIT_USAGE;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f->files = RS_CALLOC(1, sizeof *f->files);
    int rc = safetensors_open(&f->files[0], path, err, err_len);
    if (!rc) f->n = 1;
    return rc;
}

static float hf_half_to_f32(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* HF tensor `m` of the folder into dst (fp32, HF layout, hf.numel floats). */
static int hf_folder_read(float *dst, const HfFolder *f, const HfMap *m, const char *what, char *err, size_t err_len) {
    const SafetensorsFile *file = NULL;
    const StTensor *t = NULL;
    for (int i = 0; i < f->n && !t; i++)
        if ((t = safetensors_find(&f->files[i], m->hf.name))) file = &f->files[i];
    char want[128], got[128];
    st_format_shape(want, sizeof want, m->hf.ndim, m->hf.shape);
    if (!t) {
        fsio_errf(err, err_len, "%s: the Hugging Face folder has no tensor %s (the config needs it, shape %s)", what,
                  m->hf.name, want);
        return RS_EXIT_USAGE;
    }
    st_format_shape(got, sizeof got, t->ndim, t->shape);
    int same = t->ndim == m->hf.ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == m->hf.shape[d];
    if (!same) {
        fsio_errf(err, err_len, "%s: tensor %s in %s has shape %s; the config needs %s", what, m->hf.name, file->path,
                  got, want);
        return RS_EXIT_USAGE;
    }
    if (t->dtype != ST_DTYPE_F32 && t->dtype != ST_DTYPE_BF16 && t->dtype != ST_DTYPE_F16) {
        fsio_errf(err, err_len, "%s: tensor %s in %s is %s; import reads F32, BF16 or F16", what, m->hf.name,
                  file->path, st_dtype_names[t->dtype]);
        return RS_EXIT_USAGE;
    }
    int rc;
    if (t->dtype == ST_DTYPE_F32) rc = safetensors_read(file, m->hf.name, t->dtype, t->ndim, t->shape, dst, err, err_len);
    else {
        uint16_t *h = RS_MALLOC((size_t)m->hf.numel * 2 + 1);
        rc = safetensors_read(file, m->hf.name, t->dtype, t->ndim, t->shape, h, err, err_len);
        for (int64_t i = 0; !rc && i < m->hf.numel; i++) {
            if (t->dtype == ST_DTYPE_BF16) {
                uint32_t bits = (uint32_t)h[i] << 16;
                memcpy(&dst[i], &bits, 4);
            } else dst[i] = hf_half_to_f32(h[i]);
        }
        free(h);
    }
    if (!rc && (rc = hf_check_finite(dst, m->hf.numel, m->hf.name, file->path, err, err_len))) {
        char inner[4096];
        snprintf(inner, sizeof inner, "%s", err);
        fsio_errf(err, err_len, "%s: %s", what, inner);
    }
    return rc;
}

/* Every tensor of the folder is one the config knows (mtp.* aside). */
static int hf_folder_check_names(const HfFolder *f, const HfLayout *lay, const char *what, char *err, size_t err_len) {
    for (int i = 0; i < f->n; i++)
        for (int64_t j = 0; j < f->files[i].n; j++) {
            const char *name = f->files[i].tensors[j].name;
            if (!strncmp(name, "mtp.", 4)) continue;
            int known = 0;
            for (int k = 0; k < lay->n && !known; k++) known = !strcmp(lay->t[k].hf.name, name);
            if (!known) {
                fsio_errf(err, err_len, "%s: tensor %s in %s is not part of the model the config describes (a MoE "
                                        "expert, another layer type, or another number of layers?)",
                          what, name, f->files[i].path);
                return RS_EXIT_USAGE;
            }
        }
    return 0;
}

static int hf_import_folder(float *params, const ParamTable *ptab, const Config *cfg, const char *dir,
                            const char *what, char *err, size_t err_len) {
    HfFolder f;
    int rc = hf_folder_open(&f, dir, err, err_len);
    if (rc) return rc;
    HfLayout lay;
    hf_layout_build(&lay, cfg, ptab);
    rc = hf_folder_check_names(&f, &lay, what, err, err_len);
    for (int i = 0; !rc && i < lay.n; i++) {
        const HfMap *m = &lay.t[i];
        float *buf = RS_MALLOC((size_t)m->hf.numel * sizeof(float) + 1);
        rc = hf_folder_read(buf, &f, m, what, err, err_len);
        if (!rc) hf_layout_scatter(params, &lay, m, buf, ptab);
        free(buf);
    }
    hf_layout_free(&lay);
    hf_folder_close(&f);
    return rc;
}

int hf_import(float *params, const ParamTable *ptab, const Config *cfg, const char *src, const char *what,
              char *err, size_t err_len) {
    struct stat st;
    if (stat(src, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fsio_errf(err, err_len, "%s = \"%s\": %s; expected a Hugging Face model folder, a ringscan run directory or "
                                "a checkpoint directory (RUN/ckpt/step_N)",
                  what, src, errno == ENOENT ? "no such directory" : "not a directory");
        return RS_EXIT_USAGE;
    }
    if (hf_is_ringscan(src)) {
        HfCkpt c;
        int rc = hf_ckpt_open(&c, src, err, err_len); /* on failure, nothing to close */
        if (!rc) {
            rc = hf_ckpt_read_params(params, ptab, &c, err, err_len);
            hf_ckpt_close(&c);
        }
        if (rc) {
            char inner[4096];
            snprintf(inner, sizeof inner, "%s", err);
            fsio_errf(err, err_len, "%s = \"%s\": %s", what, src, inner);
        }
        return rc;
    }
    if (!hf_exists(src, "config.json", 0)) {
        fsio_errf(err, err_len, "%s = \"%s\" holds no config.json, ckpt/ or manifest.json: neither a Hugging Face model "
                                "folder nor a ringscan run or checkpoint directory",
                  what, src);
        return RS_EXIT_USAGE;
    }
    return hf_import_folder(params, ptab, cfg, src, what, err, err_len);
}

/* ---- config.json -> the model keys -------------------------------------------------- */

int hf_read_config(Config *cfg, const char *dir, char *err, size_t err_len) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *j;
    int rc = hf_read_json(&j, path, err, err_len);
    if (rc) return rc;
    const char *type = json_string_value(json_object_get(j, "model_type"));
    if (!type || strcmp(type, "qwen3_next")) {
        fsio_errf(err, err_len, "%s: model_type is %s%s%s; ringscan reads qwen3_next", path, type ? "\"" : "",
                  type ? type : "missing", type ? "\"" : "");
        json_decref(j);
        return RS_EXIT_USAGE;
    }
    static const char *const ints[] = {
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
        "linear_value_head_dim", "linear_conv_kernel_dim", NULL};
    ConfigErrors ce = {0};
    char set[16384];
    int k = 0;
    for (int i = 0; ints[i]; i++) {
        json_t *v = json_object_get(j, ints[i]);
        if (!json_is_integer(v)) config_errors_add(&ce, "%s: %s is missing or not an integer", path, ints[i]);
        else {
            snprintf(set, sizeof set, "model.%s=%lld", ints[i], (long long)json_integer_value(v));
            config_apply_set(cfg, set, k++, &ce);
        }
    }
    json_t *rp = json_object_get(j, "rope_parameters");
    static const char *const reals[] = {"rms_norm_eps", "rope_theta", "partial_rotary_factor", NULL};
    for (int i = 0; reals[i]; i++) {
        json_t *v = json_object_get(j, reals[i]);
        if (!v && i > 0) v = json_object_get(rp, reals[i]);
        if (!json_is_number(v)) continue; /* the defaults hold */
        snprintf(set, sizeof set, "model.%s=%.17g", reals[i], json_number_value(v));
        config_apply_set(cfg, set, k++, &ce);
    }
    json_t *tie = json_object_get(j, "tie_word_embeddings");
    if (json_is_boolean(tie)) {
        snprintf(set, sizeof set, "model.tie_word_embeddings=%s", json_is_true(tie) ? "true" : "false");
        config_apply_set(cfg, set, k++, &ce);
    }
    json_t *lt = json_object_get(j, "layer_types");
    if (json_is_array(lt)) {
        size_t n = 0, i;
        json_t *v;
        n += (size_t)snprintf(set, sizeof set, "model.layer_types=[");
        json_array_foreach(lt, i, v) {
            if (n < sizeof set) n += (size_t)snprintf(set + n, sizeof set - n, "%s%s", i ? ", " : "",
                                                      json_is_string(v) ? json_string_value(v) : "?");
        }
        if (n < sizeof set) snprintf(set + n, sizeof set - n, "]");
        config_apply_set(cfg, set, k++, &ce);
    }
    /* every layer must be dense: MoE layers have no ringscan counterpart */
    json_t *ne = json_object_get(j, "num_experts"), *mlp_only = json_object_get(j, "mlp_only_layers");
    json_t *step = json_object_get(j, "decoder_sparse_step");
    int64_t experts = json_is_integer(ne) ? json_integer_value(ne) : 512; /* transformers' default */
    int64_t sparse = json_is_integer(step) ? json_integer_value(step) : 1;
    for (int64_t l = 0; ce.count == 0 && experts > 0 && l < cfg->model.num_hidden_layers; l++) {
        int dense = sparse <= 0 || (l + 1) % sparse != 0;
        size_t i;
        json_t *v;
        json_array_foreach(mlp_only, i, v) dense |= json_integer_value(v) == l;
        if (!dense)
            config_errors_add(&ce, "%s: layer %lld is a mixture-of-experts layer (not in mlp_only_layers, num_experts "
                                   "%lld); ringscan models are dense in every layer",
                              path, (long long)l, (long long)experts);
    }
    if (ce.count == 0) config_validate(cfg, &ce);
    json_decref(j);
    if (ce.count) {
        fsio_errf(err, err_len, "%s does not describe a ringscan model: %s", path, ce.text);
        config_errors_free(&ce);
        return RS_EXIT_USAGE;
    }
    config_errors_free(&ce);
    return 0;
}
