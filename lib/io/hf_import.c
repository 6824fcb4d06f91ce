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
    /* both there: model.safetensors, as transformers loads it (the index is read only without it) */
    if (!hf_exists(dir, "model.safetensors", 0) && hf_exists(dir, "model.safetensors.index.json", 0)) {
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

/* The name tensor `hf_name` (a text model's name, docs/design/model.md) has in the folder: in a composite
 * Qwen3.5 folder model.X is model.language_model.X (lm_head.weight stays). */
static void hf_file_name(char *dst, size_t n, const char *hf_name, const HfKind *kind) {
    if (kind->composite && !strncmp(hf_name, "model.", 6)) snprintf(dst, n, "model.language_model.%s", hf_name + 6);
    else snprintf(dst, n, "%s", hf_name);
}

/* HF tensor `m` of the folder into dst (fp32, HF layout, hf.numel floats). */
static int hf_folder_read(float *dst, const HfFolder *f, const HfKind *kind, const HfMap *m, const char *what,
                          char *err, size_t err_len) {
    const SafetensorsFile *file = NULL;
    const StTensor *t = NULL;
    char name[PARAM_NAME_MAX + 64];
    hf_file_name(name, sizeof name, m->hf.name, kind);
    for (int i = 0; i < f->n && !t; i++)
        if ((t = safetensors_find(&f->files[i], name))) file = &f->files[i];
    char want[128], got[128];
    st_format_shape(want, sizeof want, m->hf.ndim, m->hf.shape);
    if (!t) {
        fsio_errf(err, err_len, "%s: the Hugging Face folder has no tensor %s (the config needs it, shape %s)", what,
                  name, want);
        return RS_EXIT_USAGE;
    }
    st_format_shape(got, sizeof got, t->ndim, t->shape);
    int same = t->ndim == m->hf.ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == m->hf.shape[d];
    if (!same) {
        fsio_errf(err, err_len, "%s: tensor %s in %s has shape %s; the config needs %s", what, name, file->path,
                  got, want);
        return RS_EXIT_USAGE;
    }
    if (t->dtype != ST_DTYPE_F32 && t->dtype != ST_DTYPE_BF16 && t->dtype != ST_DTYPE_F16) {
        fsio_errf(err, err_len, "%s: tensor %s in %s is %s; import reads F32, BF16 or F16", what, name,
                  file->path, st_dtype_names[t->dtype]);
        return RS_EXIT_USAGE;
    }
    int rc;
    if (t->dtype == ST_DTYPE_F32) rc = safetensors_read(file, name, t->dtype, t->ndim, t->shape, dst, err, err_len);
    else {
        uint16_t *h = RS_MALLOC((size_t)m->hf.numel * 2 + 1);
        rc = safetensors_read(file, name, t->dtype, t->ndim, t->shape, h, err, err_len);
        for (int64_t i = 0; !rc && i < m->hf.numel; i++) {
            if (t->dtype == ST_DTYPE_BF16) {
                uint32_t bits = (uint32_t)h[i] << 16;
                memcpy(&dst[i], &bits, 4);
            } else dst[i] = hf_half_to_f32(h[i]);
        }
        free(h);
    }
    if (!rc && (rc = hf_check_finite(dst, m->hf.numel, name, file->path, err, err_len))) {
        char inner[4096];
        snprintf(inner, sizeof inner, "%s", err);
        fsio_errf(err, err_len, "%s: %s", what, inner);
    }
    return rc;
}

/* Every tensor of the folder is one the config knows, except those set aside: mtp.* (the multi-token-
 * prediction layer) and, in a composite folder, model.visual.* (the vision tower). `note` names them. */
static int hf_folder_check_names(const HfFolder *f, const HfLayout *lay, const HfKind *kind, const char *what,
                                 char *note, size_t note_len, char *err, size_t err_len) {
    int64_t mtp = 0, visual = 0;
    char name[PARAM_NAME_MAX + 64];
    for (int i = 0; i < f->n; i++)
        for (int64_t j = 0; j < f->files[i].n; j++) {
            const char *fname = f->files[i].tensors[j].name;
            if (!strncmp(fname, "mtp.", 4)) {
                mtp++;
                continue;
            }
            if (kind->composite && !strncmp(fname, "model.visual.", 13)) {
                visual++;
                continue;
            }
            int known = 0;
            for (int k = 0; k < lay->n && !known; k++) {
                hf_file_name(name, sizeof name, lay->t[k].hf.name, kind);
                known = !strcmp(name, fname);
            }
            if (!known) {
                fsio_errf(err, err_len, "%s: tensor %s in %s is not part of the %s model the config describes (a MoE "
                                        "expert, another layer type, another number of layers, or an lm_head of "
                                        "tied embeddings?)",
                          what, fname, f->files[i].path, hf_format_names[lay->format]);
                return RS_EXIT_USAGE;
            }
        }
    if (note && note_len) {
        char v[160] = "", m[160] = "";
        if (visual) snprintf(v, sizeof v, " %lld tensors of model.visual.* (the vision tower: ringscan trains the "
                                          "language model)", (long long)visual);
        if (mtp) snprintf(m, sizeof m, "%s %lld tensors of mtp.* (the multi-token-prediction layer, which transformers "
                                       "does not load either)", visual ? " and" : "", (long long)mtp);
        snprintf(note, note_len, "%s%s%s%s", visual || mtp ? what : "", visual || mtp ? ": left aside" : "", v, m);
    }
    return 0;
}

static int hf_import_folder(float *params, const ParamTable *ptab, const Config *cfg, const char *dir,
                            const HfKind *kind, const char *what, char *note, size_t note_len, char *err,
                            size_t err_len) {
    HfFolder f;
    int rc = hf_folder_open(&f, dir, err, err_len);
    if (rc) return rc;
    HfLayout lay;
    hf_layout_build(&lay, cfg, ptab, kind->format);
    rc = hf_folder_check_names(&f, &lay, kind, what, note, note_len, err, err_len);
    for (int i = 0; !rc && i < lay.n; i++) {
        const HfMap *m = &lay.t[i];
        float *buf = RS_MALLOC((size_t)m->hf.numel * sizeof(float) + 1);
        rc = hf_folder_read(buf, &f, kind, m, what, err, err_len);
        if (!rc) hf_layout_scatter(params, &lay, m, buf, ptab);
        free(buf);
    }
    hf_layout_free(&lay);
    hf_folder_close(&f);
    return rc;
}

int hf_import(float *params, const ParamTable *ptab, const Config *cfg, const char *src, const char *what,
              char *note, size_t note_len, char *err, size_t err_len) {
    struct stat st;
    if (note && note_len) note[0] = 0;
    if (stat(src, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fsio_errf(err, err_len, "%s = \"%s\": %s; expected a Hugging Face model folder, a ringscan run directory or "
                                "a checkpoint directory (RUN/ckpt/step_N)",
                  what, src, errno == ENOENT ? "no such directory" : "not a directory");
        return RS_EXIT_USAGE;
    }
    char inner[4096], where[PATH_MAX + 64];
    if (hf_is_ringscan(src)) {
        HfCkpt c;
        int rc = hf_ckpt_open(&c, src, err, err_len); /* on failure, nothing to close */
        if (!rc) {
            snprintf(where, sizeof where, "%s (its saved config)", c.dir);
            rc = hf_config_compare(cfg, &c.cfg, where, err, err_len);
            if (!rc) rc = hf_ckpt_read_params(params, ptab, &c, err, err_len);
            hf_ckpt_close(&c);
        }
        if (rc) {
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
    /* config.json first: the folder's model must be the config's, checked as export checks it */
    Config fc;
    HfKind kind;
    config_init_defaults(&fc);
    int rc = hf_read_config(&fc, &kind, src, err, err_len);
    if (!rc) {
        snprintf(where, sizeof where, "%s/config.json", src);
        rc = hf_config_compare(cfg, &fc, where, err, err_len);
    }
    config_free(&fc);
    if (rc) {
        snprintf(inner, sizeof inner, "%s", err);
        fsio_errf(err, err_len, "%s: %s", what, inner);
        return rc;
    }
    return hf_import_folder(params, ptab, cfg, src, &kind, what, note, note_len, err, err_len);
}

/* ---- config.json -> the model keys -------------------------------------------------- */

/* The model_type of a folder, and the object holding its language model's keys. */
static int hf_config_kind(HfKind *kind, json_t **text, json_t *j, const char *path, ConfigErrors *ce) {
    const char *type = json_string_value(json_object_get(j, "model_type"));
    memset(kind, 0, sizeof *kind);
    *text = j;
    if (!type) {
        config_errors_add(ce, "%s: model_type is missing; ringscan reads qwen3_next, qwen3_5_text, qwen3_5 (dense) "
                              "and ringscan_kda_hybrid folders", path);
        return -1;
    }
    if (!strcmp(type, "qwen3_next")) return 0;
    if (!strcmp(type, "ringscan_kda_hybrid")) { /* ringscan's own KDA export (hf.h) */
        kind->kda = 1;
        return 0;
    }
    if (!strcmp(type, "kimi_linear")) {
        config_errors_add(ce, "%s: model_type is \"kimi_linear\", a Kimi Linear checkpoint: its full-attention layers "
                              "are multi-head latent attention (MLA) and its MLPs mixture-of-experts, which ringscan "
                              "does not build; ringscan trains Kimi Delta Attention layers inside its own hybrid "
                              "(model.linear_attention: kda, with gated softmax attention and a dense MLP), and reads "
                              "and writes their tensors in kimi_linear's names in folders of model_type "
                              "ringscan_kda_hybrid (docs/design/kda.md)", path);
        return -1;
    }
    if (strstr(type, "moe")) {
        config_errors_add(ce, "%s: model_type is \"%s\", a mixture-of-experts model; ringscan trains dense models "
                              "(qwen3_next with every layer in mlp_only_layers, qwen3_5_text, qwen3_5)", path, type);
        return -1;
    }
    kind->format = HF_FORMAT_QWEN3_5;
    if (!strcmp(type, "qwen3_5_text")) return 0;
    if (strcmp(type, "qwen3_5")) {
        config_errors_add(ce, "%s: model_type is \"%s\"; ringscan reads qwen3_next, qwen3_5_text, qwen3_5 (dense) "
                              "and ringscan_kda_hybrid folders", path, type);
        return -1;
    }
    kind->composite = 1;
    *text = json_object_get(j, "text_config");
    const char *tt = json_string_value(json_object_get(*text, "model_type"));
    if (!json_is_object(*text) || (tt && strcmp(tt, "qwen3_5_text"))) {
        config_errors_add(ce, "%s: model_type \"qwen3_5\" needs a text_config object of model_type qwen3_5_text%s%s",
                          path, tt ? "; it has " : "", tt ? tt : "");
        return -1;
    }
    return 0;
}

/* A real from t[key] or t.rope_parameters[key] (both present: they must agree); NULL when absent. */
static json_t *hf_config_real(json_t *t, const char *key, const char *path, ConfigErrors *ce) {
    json_t *top = json_object_get(t, key), *rp = json_object_get(json_object_get(t, "rope_parameters"), key);
    if (top && !json_is_number(top)) config_errors_add(ce, "%s: %s is not a number", path, key);
    if (rp && !json_is_number(rp)) config_errors_add(ce, "%s: rope_parameters.%s is not a number", path, key);
    if (json_is_number(top) && json_is_number(rp) && json_number_value(top) != json_number_value(rp))
        config_errors_add(ce, "%s: %s is %g but rope_parameters.%s is %g: which one the model was trained with is "
                              "not clear", path, key, json_number_value(top), key, json_number_value(rp));
    return json_is_number(rp) ? rp : json_is_number(top) ? top : NULL;
}

int hf_read_config(Config *cfg, HfKind *kind_out, const char *dir, char *err, size_t err_len) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *j;
    int rc = hf_read_json(&j, path, err, err_len);
    if (rc) return rc;
    ConfigErrors ce = {0};
    HfKind kind;
    json_t *t;
    if (hf_config_kind(&kind, &t, j, path, &ce) == 0) {
        const char *pre = kind.composite ? "text_config." : "";
        size_t set_len = 64 + (size_t)CONFIG_LIST_MAX * 24;
        char *set = RS_MALLOC(set_len);
        int k = 0;
        static const char *const ints[] = {
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", NULL};
        for (int i = 0; ints[i]; i++) {
            json_t *v = json_object_get(t, ints[i]);
            if (!json_is_integer(v)) config_errors_add(&ce, "%s: %s%s is missing or not an integer", path, pre, ints[i]);
            else {
                snprintf(set, set_len, "model.%s=%lld", ints[i], (long long)json_integer_value(v));
                config_apply_set(cfg, set, k++, &ce);
            }
        }
        /* the linear layers' mixer: KDA only in ringscan's own KDA folders, which say so */
        const char *la = json_string_value(json_object_get(t, "linear_attention"));
        if (kind.kda && (!la || strcmp(la, "kda")))
            config_errors_add(&ce, "%s: model_type ringscan_kda_hybrid but linear_attention is %s%s%s, not \"kda\"", path,
                              la ? "\"" : "", la ? la : "missing", la ? "\"" : "");
        config_apply_set(cfg, kind.kda ? "model.linear_attention=kda" : "model.linear_attention=gdn", k++, &ce);
        static const char *const reals[] = {"rms_norm_eps", "rope_theta", "partial_rotary_factor", NULL};
        for (int i = 0; reals[i]; i++) {
            json_t *v = i == 0 ? json_object_get(t, reals[i]) : hf_config_real(t, reals[i], path, &ce);
            if (!v) { /* transformers' defaults (Qwen3NextConfig, Qwen3_5TextConfig) are ringscan's */
                snprintf(set, set_len, "model.%s=%s", reals[i], i == 0 ? "1e-6" : i == 1 ? "10000" : "0.25");
            } else if (!json_is_number(v)) {
                config_errors_add(&ce, "%s: %s%s is not a number", path, pre, reals[i]);
                continue;
            } else snprintf(set, set_len, "model.%s=%.17g", reals[i], json_number_value(v));
            config_apply_set(cfg, set, k++, &ce);
        }
        /* RoPE: plain (default) only; Qwen3.5's interleaved multimodal sections rotate text, whose three
         * position ids are equal, exactly as plain RoPE does, so mrope_section is accepted as it is */
        static const char *const scal[] = {"rope_parameters", "rope_scaling", NULL};
        for (int i = 0; scal[i]; i++) {
            json_t *rs = json_object_get(t, scal[i]);
            if (!rs || json_is_null(rs)) continue;
            const char *rt = json_string_value(json_object_get(rs, "rope_type"));
            if (!rt) rt = json_string_value(json_object_get(rs, "type"));
            if (!json_is_object(rs)) config_errors_add(&ce, "%s: %s%s is not an object", path, pre, scal[i]);
            else if (rt && strcmp(rt, "default"))
                config_errors_add(&ce, "%s: %s%s.rope_type is \"%s\"; ringscan computes plain RoPE (rope_type "
                                       "\"default\"), not a scaled one", path, pre, scal[i], rt);
        }
        /* tie: a composite folder carries it twice; they must agree. Absent: transformers' default, false */
        json_t *tie = json_object_get(t, "tie_word_embeddings"), *tie_top = kind.composite ?
            json_object_get(j, "tie_word_embeddings") : NULL;
        if ((tie && !json_is_boolean(tie)) || (tie_top && !json_is_boolean(tie_top)))
            config_errors_add(&ce, "%s: tie_word_embeddings is not true or false", path);
        else if (tie && tie_top && json_is_true(tie) != json_is_true(tie_top))
            config_errors_add(&ce, "%s: tie_word_embeddings is %s but text_config.tie_word_embeddings is %s: whether "
                                   "lm_head is the embedding is not clear", path, json_is_true(tie_top) ? "true" : "false",
                              json_is_true(tie) ? "true" : "false");
        if (!tie) tie = tie_top;
        config_apply_set(cfg, json_is_true(tie) ? "model.tie_word_embeddings=true" : "model.tie_word_embeddings=false",
                         k++, &ce);
        const char *act = json_string_value(json_object_get(t, "hidden_act"));
        if (json_object_get(t, "hidden_act") && (!act || strcmp(act, "silu")))
            config_errors_add(&ce, "%s: %shidden_act is %s%s%s; ringscan's MLP is SiLU-gated (\"silu\")", path, pre,
                              act ? "\"" : "", act ? act : "not a string", act ? "\"" : "");
        json_t *ab = json_object_get(t, "attention_bias"), *gate = json_object_get(t, "attn_output_gate");
        if (ab && !json_is_false(ab))
            config_errors_add(&ce, "%s: %sattention_bias is not false; ringscan's projections have no biases", path, pre);
        if (gate && !json_is_true(gate))
            config_errors_add(&ce, "%s: %sattn_output_gate is not true; ringscan's attention always has its sigmoid "
                                   "output gate (q_proj holds query and gate)", path, pre);
        json_t *fai = json_object_get(t, "full_attention_interval");
        if (fai && !json_is_integer(fai))
            config_errors_add(&ce, "%s: %sfull_attention_interval is not an integer", path, pre);
        snprintf(set, set_len, "model.full_attention_interval=%lld", fai ? (long long)json_integer_value(fai) : 4LL);
        config_apply_set(cfg, set, k++, &ce);
        json_t *lt = json_object_get(t, "layer_types");
        if (lt && !json_is_array(lt)) config_errors_add(&ce, "%s: %slayer_types is not a list", path, pre);
        size_t n = (size_t)snprintf(set, set_len, "model.layer_types=[");
        if (json_is_array(lt)) {
            size_t i;
            json_t *v;
            json_array_foreach(lt, i, v) {
                /* each name one YAML scalar: "a, b" or "]" stays one (refused) item */
                const char *s = json_is_string(v) ? json_string_value(v) : "(not a string)";
                char q[64];
                if (strlen(s) > 20 || config_yaml_quote(q, sizeof q, s)) snprintf(q, sizeof q, "\"(another kind)\"");
                if (n < set_len) n += (size_t)snprintf(set + n, set_len - n, "%s%s", i ? ", " : "", q);
            }
        }
        if (n < set_len) snprintf(set + n, set_len - n, "]");
        config_apply_set(cfg, set, k++, &ce); /* absent: derived from the interval, as transformers does */
        /* every layer must be dense: MoE layers have no ringscan counterpart */
        json_t *ne = json_object_get(t, "num_experts");
        if (ne && !json_is_integer(ne)) config_errors_add(&ce, "%s: %snum_experts is not an integer", path, pre);
        if (kind.format == HF_FORMAT_QWEN3_5) {
            if (json_integer_value(ne) > 0)
                config_errors_add(&ce, "%s: %snum_experts is %lld: a mixture-of-experts model; ringscan trains dense "
                                       "models", path, pre, (long long)json_integer_value(ne));
        } else {
            json_t *mlp_only = json_object_get(t, "mlp_only_layers"), *step = json_object_get(t, "decoder_sparse_step");
            int64_t experts = json_is_integer(ne) ? json_integer_value(ne) : 512; /* transformers' default */
            int64_t sparse = json_is_integer(step) ? json_integer_value(step) : 1;
            for (int64_t l = 0; ce.count == 0 && experts > 0 && l < cfg->model.num_hidden_layers; l++) {
                int dense = sparse <= 0 || (l + 1) % sparse != 0;
                size_t i;
                json_t *v;
                json_array_foreach(mlp_only, i, v) dense |= json_integer_value(v) == l;
                if (!dense)
                    config_errors_add(&ce, "%s: layer %lld is a mixture-of-experts layer (not in mlp_only_layers, "
                                           "num_experts %lld); ringscan models are dense in every layer",
                                      path, (long long)l, (long long)experts);
            }
        }
        free(set);
    }
    if (ce.count == 0) config_validate(cfg, &ce);
    json_decref(j);
    if (ce.count) {
        fsio_errf(err, err_len, "%s does not describe a ringscan model: %s", path, ce.text);
        config_errors_free(&ce);
        return RS_EXIT_USAGE;
    }
    config_errors_free(&ce);
    if (kind_out) *kind_out = kind;
    return 0;
}

/* ---- the source's model against the config being trained ----------------------------- */

int hf_config_compare(const Config *want, const Config *got, const char *where, char *err, size_t err_len) {
    const ModelConfig *a = &want->model, *b = &got->model;
    struct { const char *key; int64_t w, g; } ints[] = {
        {"vocab_size", a->vocab_size, b->vocab_size},
        {"hidden_size", a->hidden_size, b->hidden_size},
        {"intermediate_size", a->intermediate_size, b->intermediate_size},
        {"num_hidden_layers", a->num_hidden_layers, b->num_hidden_layers},
        {"num_attention_heads", a->num_attention_heads, b->num_attention_heads},
        {"num_key_value_heads", a->num_key_value_heads, b->num_key_value_heads},
        {"head_dim", a->head_dim, b->head_dim},
        {"linear_num_key_heads", a->linear_num_key_heads, b->linear_num_key_heads},
        {"linear_num_value_heads", a->linear_num_value_heads, b->linear_num_value_heads},
        {"linear_key_head_dim", a->linear_key_head_dim, b->linear_key_head_dim},
        {"linear_value_head_dim", a->linear_value_head_dim, b->linear_value_head_dim},
        {"linear_conv_kernel_dim", a->linear_conv_kernel_dim, b->linear_conv_kernel_dim},
        {"hidden_act", a->hidden_act, b->hidden_act},
        {"attention_bias", a->attention_bias, b->attention_bias},
    };
    const char *hint = "\n  hint: nothing was read; set the config's model keys to the source's (or take a source of "
                       "this model)";
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (ints[i].w != ints[i].g) {
            fsio_errf(err, err_len, "%s has %s = %lld; the config being trained has model.%s = %lld: the weights "
                                    "would not fit or would mean something else%s",
                      where, ints[i].key, (long long)ints[i].g, ints[i].key, (long long)ints[i].w, hint);
            return RS_EXIT_USAGE;
        }
    if (a->linear_attention != b->linear_attention) {
        fsio_errf(err, err_len, "%s has linear_attention = %s; the config being trained has model.linear_attention = "
                                "%s: its linear layers' weights are another mixer's%s",
                  where, linear_attention_names[b->linear_attention], linear_attention_names[a->linear_attention], hint);
        return RS_EXIT_USAGE;
    }
    for (int l = 0; l < a->num_hidden_layers; l++) {
        LayerKind kw = config_layer_kind(want, l), kg = config_layer_kind(got, l);
        if (kw != kg) {
            fsio_errf(err, err_len, "%s has layer %d of kind %s (layer_types / full_attention_interval); the config "
                                    "being trained makes it %s: its mixer's weights would be another layer kind's%s",
                      where, l, layer_kind_names[kg], layer_kind_names[kw], hint);
            return RS_EXIT_USAGE;
        }
    }
    struct { const char *key; double w, g; } reals[] = {
        {"rms_norm_eps", a->rms_norm_eps, b->rms_norm_eps},
        {"rope_theta", a->rope_theta, b->rope_theta},
        {"partial_rotary_factor", a->partial_rotary_factor, b->partial_rotary_factor},
    };
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++)
        if (fabs(reals[i].w - reals[i].g) > 1e-9 * fabs(reals[i].g)) {
            fsio_errf(err, err_len, "%s has %s = %.9g; the config being trained has model.%s = %.9g: the model "
                                    "would compute something other than what its weights were trained for%s",
                      where, reals[i].key, reals[i].g, reals[i].key, reals[i].w, hint);
            return RS_EXIT_USAGE;
        }
    if (a->tie_word_embeddings != b->tie_word_embeddings) {
        fsio_errf(err, err_len, "%s has tie_word_embeddings = %s; the config being trained has "
                                "model.tie_word_embeddings = %s: %s%s",
                  where, b->tie_word_embeddings ? "true" : "false", a->tie_word_embeddings ? "true" : "false",
                  b->tie_word_embeddings ? "the source has no lm_head of its own to start from"
                                         : "the source's trained lm_head would be dropped", hint);
        return RS_EXIT_USAGE;
    }
    return 0;
}
