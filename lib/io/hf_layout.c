/*
 * hf_layout.c — which internal parameter rows every Hugging Face tensor
 * holds (hf.h, "The layout"). Export gathers by it, import scatters by it.
 *
 * Internal rows (model_params.h), with Kd = nk·dk, Vd = nv·dv, Cc = 2Kd + Vd,
 * r = nv / nk, qd = nh·hd:
 *   linear_attn.in_proj  [q 0..Kd | k Kd.. | v 2Kd.. | z Cc.. | b Cc+Vd.. | a Cc+Vd+nv..]
 *   self_attn.in_proj    [q 0..qd | gate qd.. | k 2qd.. | v 2qd+kvd..]
 *   mlp.gate_up          [gate 0..I | up I..2I]
 * HF rows, Qwen3-Next (HF_FORMAT_QWEN3_NEXT):
 *   in_proj_qkvz  nk groups of w = 2dk + 2r·dv: [q_g | k_g | v of heads g·r..g·r+r-1 | z of the same]
 *   in_proj_ba    nk groups of 2r: [b of heads g·r.. | a of the same]
 * Qwen3.5 (HF_FORMAT_QWEN3_5; transformers' Qwen3_5GatedDeltaNet splits in_proj_qkv's output as
 * [query Kd | key Kd | value Vd] in head order, the conv1d channel order, and z, b, a per value head):
 *   in_proj_qkv   rows 0..Cc        in_proj_z  rows Cc..Cc+Vd
 *   in_proj_b     rows Cc+Vd..      in_proj_a  rows Cc+Vd+nv..
 * Both:
 *   q_proj        nh groups of 2hd: [q_h | gate_h]
 * The Qwen3.5 state dict is the Qwen3-Next one (model_params_build_hf) with in_proj_qkvz replaced by
 * in_proj_qkv, in_proj_z and in_proj_ba by in_proj_b, in_proj_a.
 * KDA layers (model.linear_attention kda), plain row ranges, rd = dv (the low-rank gates' rank):
 *   q_proj, k_proj, v_proj, f_a_proj, g_a_proj, b_proj   in_proj rows 0, Kd, 2Kd, Cc, Cc+dv, Cc+2dv ..
 *   q_conv1d, k_conv1d, v_conv1d                         conv1d rows 0, Kd, 2Kd ..
 *   f_b_proj, g_b_proj, A_log, dt_bias, o_norm, o_proj   their internal tensors whole
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "hf.h"

const char *const hf_format_names[HF_FORMAT_COUNT] = {"qwen3_next", "qwen3_5"};

/* The internal tensor and rows behind HF tensor `hf` (names of model_params_build_hf). */
static void hf_layout_map(HfMap *m, const HfLayout *lay, const Config *cfg, const ParamTable *ptab) {
    const ModelConfig *mc = &cfg->model;
    const char *name = m->hf.name;
    char internal[PARAM_NAME_MAX];
    snprintf(internal, sizeof internal, "%s", name);
    char *dot = strrchr(internal, '.');
    if (dot && !strcmp(dot, ".weight")) *dot = 0;
    m->kind = HF_ROWS_RANGE;
    m->base = 0;
    m->width = m->hf.ndim == 1 ? 1 : m->hf.shape[m->hf.ndim - 1];
    m->rows = m->hf.numel / m->width;
    int64_t qd = lay->nh * lay->hd, kvd = mc->num_key_value_heads * mc->head_dim;
    char *leaf = strrchr(internal, '.');
    leaf = leaf ? leaf + 1 : internal;
    const int64_t Kd = lay->nk * lay->dk, Vd = lay->nv * lay->dv, Cc = 2 * Kd + Vd;
    if (mc->linear_attention == LINEAR_ATTN_KDA && strstr(name, ".linear_attn.")) {
        /* KDA (hf.h): row blocks of in_proj [q | k | v | f_a | g_a | b] and conv1d [q | k | v]; the rest 1:1 */
        static const char *const proj[6] = {"q_proj", "k_proj", "v_proj", "f_a_proj", "g_a_proj", "b_proj"};
        static const char *const conv[3] = {"q_conv1d", "k_conv1d", "v_conv1d"};
        const int64_t pbase[6] = {0, Kd, 2 * Kd, Cc, Cc + lay->dv, Cc + 2 * lay->dv}, cbase[3] = {0, Kd, 2 * Kd};
        int hit = 0;
        for (int i = 0; i < 6 && !hit; i++)
            if (!strcmp(leaf, proj[i])) hit = 1, m->base = pbase[i], strcpy(leaf, "in_proj");
        for (int i = 0; i < 3 && !hit; i++)
            if (!strcmp(leaf, conv[i])) hit = 1, m->base = cbase[i], strcpy(leaf, "conv1d");
    } else if (!strcmp(leaf, "in_proj_qkv") || !strcmp(leaf, "in_proj_z") || !strcmp(leaf, "in_proj_b") ||
        !strcmp(leaf, "in_proj_a")) { /* Qwen3.5: plain row ranges */
        m->base = leaf[8] == 'q' ? 0 : leaf[8] == 'z' ? Cc : leaf[8] == 'b' ? Cc + Vd : Cc + Vd + lay->nv;
        strcpy(leaf, "in_proj");
    } else if (!strcmp(leaf, "in_proj_qkvz") || !strcmp(leaf, "in_proj_ba")) {
        m->kind = leaf[8] == 'q' ? HF_ROWS_GDN_QKVZ : HF_ROWS_GDN_BA;
        strcpy(leaf, "in_proj");
    } else if (!strcmp(leaf, "q_proj") || !strcmp(leaf, "k_proj") || !strcmp(leaf, "v_proj")) {
        m->kind = leaf[0] == 'q' ? HF_ROWS_ATTN_Q : HF_ROWS_RANGE;
        m->base = leaf[0] == 'k' ? 2 * qd : leaf[0] == 'v' ? 2 * qd + kvd : 0;
        strcpy(leaf, "in_proj");
    } else if (!strcmp(leaf, "gate_proj") || !strcmp(leaf, "up_proj")) {
        m->base = leaf[0] == 'u' ? mc->intermediate_size : 0;
        strcpy(leaf, "gate_up");
    }
    m->param = model_params_find(ptab, internal);
    RS_CHECK(m->param >= 0, "HF tensor %s has no internal parameter %s", name, internal);
}

/* The Qwen3.5 state dict from the Qwen3-Next one: each in_proj_qkvz -> in_proj_qkv, in_proj_z; each
 * in_proj_ba -> in_proj_b, in_proj_a (same place in the order). */
static void hf_layout_qwen3_5(HfTable *hf, const ModelConfig *mc) {
    const int64_t Kd = mc->linear_num_key_heads * mc->linear_key_head_dim, nv = mc->linear_num_value_heads;
    const int64_t Vd = nv * mc->linear_value_head_dim, H = mc->hidden_size;
    int32_t n = 0;
    for (int i = 0; i < hf->n; i++) n += strstr(hf->t[i].name, ".in_proj_qkvz.") || strstr(hf->t[i].name, ".in_proj_ba.");
    HfTensor *t = RS_CALLOC((size_t)(hf->n + n) + 1, sizeof *t);
    int32_t k = 0;
    for (int i = 0; i < hf->n; i++) {
        const HfTensor *s = &hf->t[i];
        const char *at = strstr(s->name, ".in_proj_qkvz."), *ba = strstr(s->name, ".in_proj_ba.");
        if (!at && !ba) {
            t[k++] = *s;
            continue;
        }
        const int prefix = (int)((at ? at : ba) - s->name);
        for (int j = 0; j < 2; j++) {
            HfTensor *d = &t[k++];
            snprintf(d->name, sizeof d->name, "%.*s.in_proj_%s.weight", prefix, s->name,
                     at ? (j ? "z" : "qkv") : (j ? "a" : "b"));
            d->ndim = 2;
            d->shape[0] = at ? (j ? Vd : 2 * Kd + Vd) : nv;
            d->shape[1] = H;
            d->numel = d->shape[0] * H;
        }
    }
    free(hf->t);
    hf->t = t;
    hf->n = k;
}

void hf_layout_build(HfLayout *lay, const Config *cfg, const ParamTable *ptab, HfFormat format) {
    const ModelConfig *mc = &cfg->model;
    memset(lay, 0, sizeof *lay);
    lay->nk = mc->linear_num_key_heads;
    lay->nv = mc->linear_num_value_heads;
    lay->dk = mc->linear_key_head_dim;
    lay->dv = mc->linear_value_head_dim;
    lay->nh = mc->num_attention_heads;
    lay->hd = mc->head_dim;
    lay->format = format;
    HfTable hf;
    model_params_build_hf(&hf, cfg);
    if (format == HF_FORMAT_QWEN3_5) hf_layout_qwen3_5(&hf, mc);
    lay->n = hf.n;
    lay->t = RS_CALLOC((size_t)hf.n, sizeof *lay->t);
    int64_t *covered = RS_CALLOC((size_t)ptab->n, sizeof *covered);
    for (int i = 0; i < hf.n; i++) {
        HfMap *m = &lay->t[i];
        m->hf = hf.t[i];
        hf_layout_map(m, lay, cfg, ptab);
        const ParamTensor *p = &ptab->t[m->param];
        int64_t pw = p->ndim == 1 ? 1 : p->shape[1];
        RS_CHECK(pw == m->width, "%s: row width %lld, internal %s %lld", m->hf.name, (long long)m->width, p->name,
                 (long long)pw);
        covered[m->param] += m->rows * m->width;
    }
    /* every internal element is some HF element (the maps are permutations; tests check the rows) */
    for (int i = 0; i < ptab->n; i++)
        RS_CHECK(covered[i] == ptab->t[i].numel, "internal %s: HF tensors cover %lld of %lld elements",
                 ptab->t[i].name, (long long)covered[i], (long long)ptab->t[i].numel);
    free(covered);
    model_params_free_hf(&hf);
}

void hf_layout_free(HfLayout *lay) {
    free(lay->t);
    memset(lay, 0, sizeof *lay);
}

int64_t hf_layout_src_row(const HfLayout *lay, const HfMap *m, int64_t r) {
    const int64_t nk = lay->nk, nv = lay->nv, dk = lay->dk, dv = lay->dv, hd = lay->hd;
    const int64_t rep = nv / nk, Kd = nk * dk, Vd = nv * dv, Cc = 2 * Kd + Vd;
    switch (m->kind) {
    case HF_ROWS_GDN_QKVZ: {
        const int64_t w = 2 * dk + 2 * rep * dv, g = r / w, o = r % w;
        if (o < dk) return g * dk + o;                       /* q of key head g */
        if (o < 2 * dk) return Kd + g * dk + (o - dk);       /* k of key head g */
        const int64_t u = o - 2 * dk, z = u >= rep * dv;     /* v or z of value head g·rep + j */
        const int64_t j = (u - z * rep * dv) / dv, e = (u - z * rep * dv) % dv;
        return (z ? Cc : 2 * Kd) + (g * rep + j) * dv + e;
    }
    case HF_ROWS_GDN_BA: {
        const int64_t g = r / (2 * rep), o = r % (2 * rep);
        return Cc + Vd + (o < rep ? g * rep + o : nv + g * rep + (o - rep));
    }
    case HF_ROWS_ATTN_Q: {
        const int64_t h = r / (2 * hd), o = r % (2 * hd);
        return o < hd ? h * hd + o : lay->nh * hd + h * hd + (o - hd);
    }
    case HF_ROWS_RANGE:
    default: return m->base + r;
    }
}

void hf_layout_gather(float *dst, const HfLayout *lay, const HfMap *m, const float *params, const ParamTable *ptab) {
    const float *p = params + ptab->t[m->param].offset;
    for (int64_t r = 0; r < m->rows; r++)
        memcpy(dst + r * m->width, p + hf_layout_src_row(lay, m, r) * m->width, (size_t)m->width * sizeof(float));
}

void hf_layout_scatter(float *params, const HfLayout *lay, const HfMap *m, const float *src, const ParamTable *ptab) {
    float *p = params + ptab->t[m->param].offset;
    for (int64_t r = 0; r < m->rows; r++)
        memcpy(p + hf_layout_src_row(lay, m, r) * m->width, src + r * m->width, (size_t)m->width * sizeof(float));
}
