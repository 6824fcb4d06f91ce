/*
 * hf.h — Hugging Face export and import of the model's weights, and opening a ringscan checkpoint for its
 * weights alone. Names, shapes and row layouts: docs/design/model.md.
 *
 * Two folder formats (HfFormat), the same model: Qwen3-Next (Qwen3NextForCausalLM, model_type qwen3_next)
 * and Qwen3.5 dense (Qwen3_5ForCausalLM, model_type qwen3_5_text; or the composite Qwen3_5ForConditional-
 * Generation, model_type qwen3_5, whose language model sits under model.language_model.* beside the
 * vision tower model.visual.*). They differ only in how the GDN input projection is cut into tensors.
 *
 * A model with Kimi Delta Attention layers (model.linear_attention kda; docs/design/kda.md) has no transformers
 * class: it exports in the Qwen3-Next layout (attention, MLP, norms, embeddings as there) with each KDA layer's
 * tensors under linear_attn. in kimi_linear's KimiDeltaAttention names (q_proj, k_proj, v_proj, q_conv1d,
 * k_conv1d, v_conv1d, f_a_proj, f_b_proj, b_proj, g_a_proj, g_b_proj, A_log [nv], dt_bias [nv*dk], o_norm,
 * o_proj), config.json's model_type "ringscan_kda_hybrid" (nothing loads it as another model) with
 * "linear_attention": "kda" and a kimi_linear-style linear_attn_config. A kimi_linear folder itself (MLA attention,
 * MoE MLPs) is refused by name. --format qwen3_5 has no KDA layout.
 *
 * The layout (hf_layout.c). Every Hugging Face tensor of the state dict is a set of rows of one internal
 * parameter (model_params.h), all of one width. Qwen3-Next: HF row r of `in_proj_qkvz` / `in_proj_ba` is
 * row hf_layout_src_row(r) of the internal linear_attn.in_proj [q | k | v | z | b | a] (grouped by key
 * head). Qwen3.5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` are plain row ranges of it. Both:
 * `q_proj` rows interleave [q_h | gate_h] per head into self_attn.in_proj [q | gate | k | v], `k_proj`
 * and `v_proj` are its last two blocks; `gate_proj` / `up_proj` the halves of mlp.gate_up;
 * `conv1d.weight` [Cc, 1, Kc] is conv1d [Cc, Kc] row for row; 1-D tensors are rows of width 1. Export
 * gathers these rows, import scatters them back, so export -> import -> export is bitwise.
 *
 * The folder's config.json (hf_read_config, the one reader both export and import use): every key that
 * changes what the weights mean is read and checked (dims, layer_types, rope, norms, tie, no experts);
 * the import then refuses a folder whose model differs from the config being trained
 * (hf_config_compare, also used for a ringscan checkpoint's saved config), before any tensor is read.
 *
 * Export (hf_export.c): config.json and model.safetensors, or model-0000i-of-0000n.safetensors shards
 * with model.safetensors.index.json, in the format asked for; written into OUT.tmp.<pid> and renamed to
 * OUT at the end, so OUT is never half written (it must be missing or an empty directory).
 *
 * Import (hf_import.c): the weights of a run's start (model.init_from) from such a folder (F32, BF16 or
 * F16; sharded or not), a ringscan run directory (its newest verified checkpoint) or one checkpoint
 * directory. Every tensor the config needs must be there with the config's shape (else one error naming
 * the tensor, the file and both shapes); an unknown tensor is an error too, except those set aside and
 * named in the import's note: `mtp.*` (the multi-token-prediction layer, which transformers does not
 * load either) and, in a composite folder, `model.visual.*` (the vision tower).
 *
 * Return values: 0, RS_EXIT_USAGE (bad input: nothing written) or RS_EXIT_FAIL (an I/O failure), with one
 * message in `err`. Callers: cmd/ringscan.c (`export`), lib/run/train.c (model.init_from), lib/run/eval.c
 * (the weights of `eval`), tests/parity/parity_step.c (--hf).
 */
#ifndef RS_HF_H
#define RS_HF_H

#include <limits.h>
#include <stdio.h>

#include "ckpt.h"
#include "config/config.h"
#include "model/model_params.h"
#include "safetensors.h"

/* ---- formats and layout ------------------------------------------------------ */

typedef enum { HF_FORMAT_QWEN3_NEXT, HF_FORMAT_QWEN3_5, HF_FORMAT_COUNT } HfFormat;
extern const char *const hf_format_names[HF_FORMAT_COUNT]; /* "qwen3_next", "qwen3_5" */

/* What a folder's config.json says it is. */
typedef struct {
    HfFormat format;
    int      composite; /* qwen3_5 with a vision tower: the language model under model.language_model. */
    int      kda;       /* model_type ringscan_kda_hybrid: KDA linear layers (the qwen3_next layout otherwise) */
} HfKind;

typedef enum {
    HF_ROWS_RANGE,    /* internal row = base + r */
    HF_ROWS_GDN_QKVZ, /* in_proj_qkvz: grouped by key head */
    HF_ROWS_GDN_BA,   /* in_proj_ba: grouped by key head */
    HF_ROWS_ATTN_Q,   /* q_proj: per head [q | gate] */
} HfRows;

typedef struct {
    HfTensor hf;    /* name and HF shape */
    int32_t  param; /* index in the ParamTable */
    int64_t  rows, width; /* rows x width = hf.numel */
    HfRows   kind;
    int64_t  base;  /* HF_ROWS_RANGE */
} HfMap;

typedef struct {
    int32_t n;
    HfMap  *t;     /* in model_params_build_hf order */
    int64_t nk, nv, dk, dv, nh, hd; /* the dims the row maps need */
    HfFormat format;
} HfLayout;

void    hf_layout_build(HfLayout *lay, const Config *cfg, const ParamTable *ptab, HfFormat format);
void    hf_layout_free(HfLayout *lay);
/* The row of internal parameter m->param that HF row r of m holds. */
int64_t hf_layout_src_row(const HfLayout *lay, const HfMap *m, int64_t r);
/* dst (HF tensor m, hf.numel floats) = its rows of the internal buffer (fp32, ptab layout); and back. */
void    hf_layout_gather(float *dst, const HfLayout *lay, const HfMap *m, const float *params, const ParamTable *ptab);
void    hf_layout_scatter(float *params, const HfLayout *lay, const HfMap *m, const float *src, const ParamTable *ptab);

/* ---- a ringscan checkpoint's weights ---------------------------------------- */

typedef struct {
    char     dir[PATH_MAX]; /* RUN/ckpt/step_NNNNNNNN */
    int64_t  step;
    Config   cfg;           /* the config saved with it (state.config_yaml) */
    Ckpt     ck;            /* given a run directory: the loaded checkpoint */
    int      have_ck;
    json_t  *manifest;      /* given a step directory: its verified manifest */
    SafetensorsFile own;    /* given a step directory: its model.safetensors */
    const SafetensorsFile *model; /* model.safetensors of either; NULL: a sharded checkpoint, in ck */
} HfCkpt;

/* Whether `path` is a ringscan run directory (has ckpt/) or checkpoint directory (has manifest.json). */
int  hf_is_ringscan(const char *path);
/* Opens the newest verified checkpoint of a run directory, or one step directory, and its config. */
int  hf_ckpt_open(HfCkpt *c, const char *path, char *err, size_t err_len);
void hf_ckpt_close(HfCkpt *c);
/* Reads every parameter (fp32, internal layout) into params (ptab->buffer_numel floats). */
int  hf_ckpt_read_params(float *params, const ParamTable *ptab, const HfCkpt *c, char *err, size_t err_len);

/* ---- export ------------------------------------------------------------------- */

typedef struct {
    StDtype  dtype;    /* ST_DTYPE_F32 or ST_DTYPE_BF16 */
    HfFormat format;   /* the folder written */
    double  shard_gib; /* largest file before sharding, > 0 */
    FILE   *progress;  /* progress lines, or NULL */
} HfExportOptions;

/* Exports fp32 internal-layout params of the model `cfg` to out_dir. `source` names where they came
 * from (config.json's "ringscan_source"). */
int hf_export_params(const float *params, const ParamTable *ptab, const Config *cfg, const char *source,
                     const char *out_dir, const HfExportOptions *o, char *err, size_t err_len);
/* `ringscan export SRC OUT`: SRC a run directory, a checkpoint directory or a Hugging Face folder. */
int hf_export(const char *src, const char *out_dir, const HfExportOptions *o, char *err, size_t err_len);

/* ---- import ------------------------------------------------------------------- */

/* Reads the weights of a Hugging Face folder, a run directory or a checkpoint directory into params
 * (fp32, internal layout, ptab->buffer_numel floats) for the model `cfg`, after checking that the
 * source's model (config.json, or the checkpoint's saved config) is cfg's. `what` names the source in
 * messages (e.g. "model.init_from"). `note` (may be NULL) receives one line naming the tensors left
 * aside and why, or "". */
int hf_import(float *params, const ParamTable *ptab, const Config *cfg, const char *src, const char *what,
              char *note, size_t note_len, char *err, size_t err_len);

/* Reads a Hugging Face folder's config.json into cfg's model keys (the other keys keep their values),
 * so that a folder can be exported or checked without a ringscan config, and says which format it is
 * (kind may be NULL). Refuses, naming the file and the key: invalid JSON, another model type, a MoE
 * model, attention biases, another activation, RoPE scaling, an attention without its output gate,
 * inconsistent layer_types, and anything config_validate refuses. */
int hf_read_config(Config *cfg, HfKind *kind, const char *dir, char *err, size_t err_len);

/* 0 when `got`'s model (read from `where`, e.g. "DIR/config.json") has the weights of `want`'s: every
 * dimension, the layer kinds, rms_norm_eps, rope_theta, partial_rotary_factor, tie_word_embeddings,
 * hidden_act and attention_bias; else RS_EXIT_USAGE naming the first key that differs, both values and
 * what would go wrong. */
int hf_config_compare(const Config *want, const Config *got, const char *where, char *err, size_t err_len);

#endif
