/*
 * model_params.c — builds the parameter table (our layout) and the Hugging
 * Face state-dict table (export layout) from the model config. See
 * model_params.h for the layout and docs/design/model.md for the
 * HF names and shapes.
 */
#include "model_params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

const char *const param_group_names[PARAM_GROUP_COUNT] = {"matrix", "embedding", "norm", "gdn_gate", "conv",
                                                           "norm_scale"};

static void params_add(ParamTable *tab, int32_t *cap, int layer, const char *name, int64_t d0, int64_t d1,
                       ParamGroup group, ParamInit init) {
    if (tab->n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        tab->t = RS_REALLOC(tab->t, (size_t)*cap * sizeof *tab->t);
    }
    ParamTensor *p = &tab->t[tab->n++];
    memset(p, 0, sizeof *p);
    if (layer >= 0)
        snprintf(p->name, sizeof p->name, "model.layers.%d.%s", layer, name);
    else
        snprintf(p->name, sizeof p->name, "%s", name);
    p->layer = layer;
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
    p->numel = d0 * (d1 > 0 ? d1 : 1);
    p->offset = tab->buffer_numel;
    p->group = group;
    p->init = init;
    tab->count += p->numel;
    tab->buffer_numel += (p->numel + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
}

int model_shard_stage(const Config *cfg) {
    return cfg->parallel.dp * cfg->parallel.cp > 1 ? cfg->parallel.shard : SHARD_NONE;
}

/* Closes the bucket that ends here: with sharding, pads it to a multiple of pieces x PARAM_ALIGN. */
static void params_end_bucket(ParamTable *tab) {
    int64_t start = tab->bucket_start[tab->n_buckets], unit = (int64_t)tab->pieces * PARAM_ALIGN;
    int64_t len = tab->buffer_numel - start, padded = (len + unit - 1) / unit * unit;
    tab->shard_pad += padded - len;
    tab->buffer_numel = start + padded;
    tab->bucket_start[++tab->n_buckets] = tab->buffer_numel;
}

void model_params_build(ParamTable *tab, const Config *cfg) {
    const ModelConfig *m = &cfg->model;
    int64_t H = m->hidden_size, I = m->intermediate_size, V = m->vocab_size;
    int64_t Kd = m->linear_num_key_heads * m->linear_key_head_dim;
    int64_t Vd = m->linear_num_value_heads * m->linear_value_head_dim;
    int64_t nv = m->linear_num_value_heads, Cc = 2 * Kd + Vd;
    int64_t qd = m->num_attention_heads * m->head_dim, kvd = m->num_key_value_heads * m->head_dim;
    int32_t cap = 0;
    memset(tab, 0, sizeof *tab);
    tab->pieces = model_shard_stage(cfg) != SHARD_NONE ? (int32_t)(cfg->parallel.dp * cfg->parallel.cp) : 1;
    tab->bucket_start = RS_CALLOC((size_t)m->num_hidden_layers + 3, sizeof *tab->bucket_start);

    params_add(tab, &cap, -1, "model.embed_tokens", V, H, PARAM_GROUP_EMBEDDING, PARAM_INIT_NORMAL);
    params_end_bucket(tab);
    for (int l = 0; l < m->num_hidden_layers; l++) {
        params_add(tab, &cap, l, "input_layernorm", H, 0, PARAM_GROUP_NORM, PARAM_INIT_ZEROS);
        if (config_layer_kind(cfg, l) == LAYER_KIND_LINEAR && m->linear_attention == LINEAR_ATTN_KDA) {
            /* Kimi Delta Attention (docs/design/kda.md): in_proj rows [q | k | v | f_a | g_a | b], the low-rank
             * gates' rank the head width dv (kimi_linear's head_dim) */
            const int64_t dv = m->linear_value_head_dim, Kg = nv * m->linear_key_head_dim;
            params_add(tab, &cap, l, "linear_attn.in_proj", Cc + 2 * dv + nv, H, PARAM_GROUP_MATRIX, PARAM_INIT_NORMAL);
            params_add(tab, &cap, l, "linear_attn.conv1d", Cc, m->linear_conv_kernel_dim, PARAM_GROUP_CONV,
                       PARAM_INIT_NORMAL);
            params_add(tab, &cap, l, "linear_attn.f_b_proj", Kg, dv, PARAM_GROUP_MATRIX, PARAM_INIT_NORMAL);
            params_add(tab, &cap, l, "linear_attn.g_b_proj", Vd, dv, PARAM_GROUP_MATRIX, PARAM_INIT_NORMAL);
            params_add(tab, &cap, l, "linear_attn.dt_bias", Kg, 0, PARAM_GROUP_GDN_GATE, PARAM_INIT_ONES);
            params_add(tab, &cap, l, "linear_attn.A_log", nv, 0, PARAM_GROUP_GDN_GATE, PARAM_INIT_A_LOG);
            params_add(tab, &cap, l, "linear_attn.o_norm", dv, 0, PARAM_GROUP_NORM_SCALE, PARAM_INIT_ONES);
            params_add(tab, &cap, l, "linear_attn.o_proj", H, Vd, PARAM_GROUP_MATRIX, PARAM_INIT_NORMAL);
        } else if (config_layer_kind(cfg, l) == LAYER_KIND_LINEAR) {
            params_add(tab, &cap, l, "linear_attn.in_proj", Cc + Vd + 2 * nv, H, PARAM_GROUP_MATRIX, PARAM_INIT_NORMAL);
            params_add(tab, &cap, l, "linear_attn.conv1d", Cc, m->linear_conv_kernel_dim, PARAM_GROUP_CONV,
                       PARAM_INIT_NORMAL);
            params_add(tab, &cap, l, "linear_attn.dt_bias", nv, 0, PARAM_GROUP_GDN_GATE, PARAM_INIT_ONES);
            params_add(tab, &cap, l, "linear_attn.A_log", nv, 0, PARAM_GROUP_GDN_GATE, PARAM_INIT_A_LOG);
            params_add(tab, &cap, l, "linear_attn.norm", m->linear_value_head_dim, 0, PARAM_GROUP_NORM_SCALE,
                       PARAM_INIT_ONES);
            params_add(tab, &cap, l, "linear_attn.out_proj", H, Vd, PARAM_GROUP_MATRIX, PARAM_INIT_NORMAL);
        } else {
            params_add(tab, &cap, l, "self_attn.in_proj", 2 * qd + 2 * kvd, H, PARAM_GROUP_MATRIX, PARAM_INIT_NORMAL);
            params_add(tab, &cap, l, "self_attn.q_norm", m->head_dim, 0, PARAM_GROUP_NORM, PARAM_INIT_ZEROS);
            params_add(tab, &cap, l, "self_attn.k_norm", m->head_dim, 0, PARAM_GROUP_NORM, PARAM_INIT_ZEROS);
            params_add(tab, &cap, l, "self_attn.o_proj", H, qd, PARAM_GROUP_MATRIX, PARAM_INIT_NORMAL);
        }
        params_add(tab, &cap, l, "post_attention_layernorm", H, 0, PARAM_GROUP_NORM, PARAM_INIT_ZEROS);
        params_add(tab, &cap, l, "mlp.gate_up", 2 * I, H, PARAM_GROUP_MATRIX, PARAM_INIT_NORMAL);
        params_add(tab, &cap, l, "mlp.down_proj", H, I, PARAM_GROUP_MATRIX, PARAM_INIT_NORMAL);
        params_end_bucket(tab);
    }
    params_add(tab, &cap, -1, "model.norm", H, 0, PARAM_GROUP_NORM, PARAM_INIT_ZEROS);
    if (!m->tie_word_embeddings) params_add(tab, &cap, -1, "lm_head", V, H, PARAM_GROUP_EMBEDDING, PARAM_INIT_NORMAL);
    params_end_bucket(tab);
}

void model_params_free(ParamTable *tab) {
    free(tab->t);
    free(tab->bucket_start);
    memset(tab, 0, sizeof *tab);
}

int model_params_find(const ParamTable *tab, const char *name) {
    for (int i = 0; i < tab->n; i++)
        if (strcmp(tab->t[i].name, name) == 0) return i;
    return -1;
}

static void hf_add(HfTable *tab, int32_t *cap, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    if (tab->n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        tab->t = RS_REALLOC(tab->t, (size_t)*cap * sizeof *tab->t);
    }
    HfTensor *t = &tab->t[tab->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->numel = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    tab->count += t->numel;
}

void model_params_build_hf(HfTable *tab, const Config *cfg) {
    const ModelConfig *m = &cfg->model;
    int64_t H = m->hidden_size, I = m->intermediate_size, V = m->vocab_size;
    int64_t nk = m->linear_num_key_heads, nv = m->linear_num_value_heads;
    int64_t dk = m->linear_key_head_dim, dv = m->linear_value_head_dim;
    int64_t nh = m->num_attention_heads, nkv = m->num_key_value_heads, hd = m->head_dim;
    int32_t cap = 0;
    char n[PARAM_NAME_MAX];
    memset(tab, 0, sizeof *tab);
    hf_add(tab, &cap, "model.embed_tokens.weight", 2, V, H, 0);
    for (int l = 0; l < m->num_hidden_layers; l++) {
#define HF(suffix, ndim, a, b, c)                                               \
    do {                                                                        \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                 \
        hf_add(tab, &cap, n, ndim, a, b, c);                                    \
    } while (0)
        HF("input_layernorm.weight", 1, H, 0, 0);
        HF("post_attention_layernorm.weight", 1, H, 0, 0);
        HF("mlp.gate_proj.weight", 2, I, H, 0);
        HF("mlp.up_proj.weight", 2, I, H, 0);
        HF("mlp.down_proj.weight", 2, H, I, 0);
        if (config_layer_kind(cfg, l) == LAYER_KIND_LINEAR && m->linear_attention == LINEAR_ATTN_KDA) {
            /* kimi_linear's KimiDeltaAttention state dict (its checkpoints' names), under linear_attn. */
            const int64_t Kc = m->linear_conv_kernel_dim;
            HF("linear_attn.q_proj.weight", 2, nk * dk, H, 0);
            HF("linear_attn.k_proj.weight", 2, nk * dk, H, 0);
            HF("linear_attn.v_proj.weight", 2, nv * dv, H, 0);
            HF("linear_attn.q_conv1d.weight", 3, nk * dk, 1, Kc);
            HF("linear_attn.k_conv1d.weight", 3, nk * dk, 1, Kc);
            HF("linear_attn.v_conv1d.weight", 3, nv * dv, 1, Kc);
            HF("linear_attn.f_a_proj.weight", 2, dv, H, 0);
            HF("linear_attn.f_b_proj.weight", 2, nv * dk, dv, 0);
            HF("linear_attn.b_proj.weight", 2, nv, H, 0);
            HF("linear_attn.g_a_proj.weight", 2, dv, H, 0);
            HF("linear_attn.g_b_proj.weight", 2, nv * dv, dv, 0);
            HF("linear_attn.A_log", 1, nv, 0, 0);
            HF("linear_attn.dt_bias", 1, nv * dk, 0, 0);
            HF("linear_attn.o_norm.weight", 1, dv, 0, 0);
            HF("linear_attn.o_proj.weight", 2, H, nv * dv, 0);
        } else if (config_layer_kind(cfg, l) == LAYER_KIND_LINEAR) {
            HF("linear_attn.in_proj_qkvz.weight", 2, 2 * nk * dk + 2 * nv * dv, H, 0);
            HF("linear_attn.in_proj_ba.weight", 2, 2 * nv, H, 0);
            HF("linear_attn.conv1d.weight", 3, 2 * nk * dk + nv * dv, 1, m->linear_conv_kernel_dim);
            HF("linear_attn.dt_bias", 1, nv, 0, 0);
            HF("linear_attn.A_log", 1, nv, 0, 0);
            HF("linear_attn.norm.weight", 1, dv, 0, 0);
            HF("linear_attn.out_proj.weight", 2, H, nv * dv, 0);
        } else {
            HF("self_attn.q_proj.weight", 2, nh * hd * 2, H, 0);
            HF("self_attn.k_proj.weight", 2, nkv * hd, H, 0);
            HF("self_attn.v_proj.weight", 2, nkv * hd, H, 0);
            HF("self_attn.o_proj.weight", 2, H, nh * hd, 0);
            HF("self_attn.q_norm.weight", 1, hd, 0, 0);
            HF("self_attn.k_norm.weight", 1, hd, 0, 0);
        }
#undef HF
    }
    hf_add(tab, &cap, "model.norm.weight", 1, H, 0, 0);
    if (!m->tie_word_embeddings) hf_add(tab, &cap, "lm_head.weight", 2, V, H, 0);
}

void model_params_free_hf(HfTable *tab) {
    free(tab->t);
    memset(tab, 0, sizeof *tab);
}

void model_params_count(ParamCounts *c, const ParamTable *tab, const Config *cfg) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < tab->n; i++) {
        const ParamTensor *p = &tab->t[i];
        c->total += p->numel;
        c->per_group[p->group] += p->numel;
        if (strcmp(p->name, "model.embed_tokens") == 0)
            c->embedding += p->numel;
        else if (p->ndim == 2 && p->group != PARAM_GROUP_CONV)
            c->matmul += p->numel;
    }
    /* a tied head is still a [V, H] GEMM per token */
    if (cfg->model.tie_word_embeddings) c->matmul += cfg->model.vocab_size * cfg->model.hidden_size;
}
