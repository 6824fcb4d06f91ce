/*
 * model_params.h — every parameter tensor of the model, as one table.
 *
 * The table is the single source of truth for parameter memory: `plan`
 * counts it, the allocator carves one flat buffer from it (llm.c's
 * fill_in_parameter_sizes), checkpoints write it, AdamW reads each tensor's
 * weight-decay group from it, and the exporter maps it to Hugging Face names.
 *
 * Internal layout (chosen for one GEMM per projection; the exporter permutes
 * rows into the Hugging Face interleaved layouts, docs/design/model.md).
 * Weights are [out, in], y = x W^T.
 *   GDN layer   linear_attn.in_proj   [Cc + Vd + 2nv, H]  rows [q | k | v | z | b | a],
 *                                      heads in global order (q, k: nk heads of dk;
 *                                      v, z: nv heads of dv; b, a: nv)
 *               linear_attn.conv1d    [Cc, Kc]   channels [q | k | v] (HF: [Cc, 1, Kc])
 *               linear_attn.dt_bias   [nv]
 *               linear_attn.A_log     [nv]
 *               linear_attn.norm      [dv]       gated RMSNorm, plain scale
 *               linear_attn.out_proj  [H, Vd]
 *   KDA layer   (model.linear_attention kda; docs/design/kda.md; nk = nv, dk = dv)
 *               linear_attn.in_proj   [Cc + 2dv + nv, H]  rows [q | k | v | f_a | g_a | b]
 *               linear_attn.conv1d    [Cc, Kc]   channels [q | k | v] (HF: q_conv1d, k_conv1d, v_conv1d)
 *               linear_attn.f_b_proj  [nv·dk, dv]  the decay gate's up projection (f_a's output in)
 *               linear_attn.g_b_proj  [Vd, dv]     the output gate's up projection (g_a's output in)
 *               linear_attn.dt_bias   [nv·dk]    per key channel
 *               linear_attn.A_log     [nv]
 *               linear_attn.o_norm    [dv]       RMSNorm with a sigmoid gate, plain scale
 *               linear_attn.o_proj    [H, Vd]
 *   attention   self_attn.in_proj     [2·nh·hd + 2·nkv·hd, H]  rows [q | gate | k | v]
 *               self_attn.q_norm      [hd]       zero-centred
 *               self_attn.k_norm      [hd]       zero-centred
 *               self_attn.o_proj      [H, nh·hd]
 *   every layer input_layernorm [H], post_attention_layernorm [H] (zero-centred),
 *               mlp.gate_up [2I, H] rows [gate | up], mlp.down_proj [H, I]
 *   global      embed_tokens [V, H], norm [H] (zero-centred), lm_head [V, H] (untied)
 * with Kd = nk·dk, Vd = nv·dv, Cc = 2·Kd + Vd.
 *
 * Callers: lib/plan/plan.c (counts), the model and checkpoint code (later).
 */
#ifndef RS_MODEL_PARAMS_H
#define RS_MODEL_PARAMS_H

#include <stdint.h>

#include "config/config.h"

/* Weight-decay groups (train.decay_* keys switch the non-matrix ones). */
typedef enum {
    PARAM_GROUP_MATRIX,    /* projections and MLP: always decayed */
    PARAM_GROUP_EMBEDDING, /* embed_tokens, lm_head */
    PARAM_GROUP_NORM,      /* zero-centred RMSNorm weights (scale 1 + w, init 0): decay pulls the scale to 1 */
    PARAM_GROUP_GDN_GATE,  /* A_log, dt_bias */
    PARAM_GROUP_CONV,      /* GDN conv1d */
    PARAM_GROUP_NORM_SCALE, /* plain-scale norms (scale w, init 1: the GDN gated norm linear_attn.norm):
                               decay would pull the scale to 0, so train.decay_norm_scales is off by default */
    PARAM_GROUP_COUNT,
} ParamGroup;

/* Initialisation rules of the spec (docs/design/model.md). */
typedef enum {
    PARAM_INIT_NORMAL, /* N(0, initializer_range) */
    PARAM_INIT_ZEROS,  /* zero-centred RMSNorm weights */
    PARAM_INIT_ONES,   /* GDN gated norm weight, dt_bias */
    PARAM_INIT_A_LOG,  /* log(U(0, 16)) */
} ParamInit;

#define PARAM_NAME_MAX 96
#define PARAM_ALIGN    64 /* elements: every tensor starts 256-byte aligned in fp32 */

typedef struct {
    char    name[PARAM_NAME_MAX]; /* "model.layers.3.linear_attn.in_proj" */
    int32_t layer;                /* -1 for embed_tokens, norm, lm_head */
    int32_t ndim;
    int64_t shape[2];
    int64_t numel;
    int64_t offset; /* first element in the flat parameter buffer (aligned) */
    int32_t group;  /* ParamGroup */
    int32_t init;   /* ParamInit */
} ParamTensor;

/* The buffer is cut into buckets, in order: embed_tokens, each layer, then model.norm and lm_head (the
 * head); bucket b is [bucket_start[b], bucket_start[b + 1]). They are the gradient reduction's units and,
 * with parallel.shard, the sharding's: each bucket is then padded to a multiple of pieces x PARAM_ALIGN
 * and rank r owns [start + r len / pieces, start + (r + 1) len / pieces) of every bucket. */
typedef struct {
    int32_t      n;
    ParamTensor *t;
    int64_t      count;        /* parameters (sum of numel) */
    int64_t      buffer_numel; /* flat buffer length, with alignment and shard padding */
    int32_t      pieces;       /* ranks the buckets are cut over: the world with sharding, else 1 */
    int32_t      n_buckets;    /* num_hidden_layers + 2 */
    int64_t     *bucket_start; /* (n_buckets + 1) elements; the last is buffer_numel */
    int64_t      shard_pad;    /* elements of padding the buckets' cut added (counted by plan) */
} ParamTable;

void model_params_build(ParamTable *tab, const Config *cfg);
/* parallel.shard as it runs: SHARD_NONE in a world of one rank */
int  model_shard_stage(const Config *cfg);
void model_params_free(ParamTable *tab);
int  model_params_find(const ParamTable *tab, const char *name); /* index or -1 */

/* The Hugging Face state dict of the same model (names and shapes only), for
 * export and for checking that the counts agree. */
typedef struct {
    char    name[PARAM_NAME_MAX];
    int32_t ndim;
    int64_t shape[3];
    int64_t numel;
} HfTensor;

typedef struct {
    int32_t   n;
    HfTensor *t;
    int64_t   count;
} HfTable;

void model_params_build_hf(HfTable *tab, const Config *cfg);
void model_params_free_hf(HfTable *tab);

/* Sums used by plan. */
typedef struct {
    int64_t total;       /* every parameter */
    int64_t embedding;   /* embed_tokens (a lookup, not a matmul) */
    int64_t matmul;      /* parameters that take part in a GEMM per token (incl. lm_head, tied or not) */
    int64_t per_group[PARAM_GROUP_COUNT];
} ParamCounts;

void model_params_count(ParamCounts *c, const ParamTable *tab, const Config *cfg);

extern const char *const param_group_names[PARAM_GROUP_COUNT];

#endif
