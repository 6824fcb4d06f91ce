/*
 * cpu_attention.c — block softmax attention and the LSE merge, the primitives ring attention is built on
 * (cpu backend: fp32, plain loops, deterministic; the oracle the cuda kernels are tested against).
 * Called through backend_cpu (lib/backend/backend.h: attention_forward, attention_backward,
 * attention_merge) by the softmax layer and the ring schedule (lib/cp/cp_ring.c), and by
 * tests/unit/test_attention.c.
 *
 * One call: the queries of one block of rows against the keys/values of another. Query i sees key j iff
 * they share a document (pos - doc_pos agree) and, when `causal`, pos_k[j] <= pos_q[i]; scale hd^-1/2;
 * query head h reads kv head h / (nh / nkv). No order of pos inside a block is assumed (zigzag blocks,
 * packed documents).
 *
 * Forward: query tiles of ATTN_ROWS rows, key tiles of ATTN_KEYS; an fp32 online softmax per row, so the
 * Tq x Tk scores never exist and scratch is O(ATTN_ROWS hd) on the stack; out = acc / l, lse = m + log l,
 * a row with no key out = 0 and lse = -inf (never +inf or NaN). A key tile is skipped when no document can
 * own a query and a key of the pair (the tiles' ranges of document starts do not overlap) or when causal
 * and every key is in the future; the backward skips the same tiles.
 * Backward, given the FINAL merged out and lse: P = exp(S - lse), D = rowsum(dout out), dS = P (dP - D),
 * dq, dk, dv accumulate (+=); rows with lse = -inf contribute nothing. dq of a tile is summed in an fp32
 * stack buffer and added once; dk/dv are added in place in (query tile, head, row) order.
 * Merge: running (out, lse) += partial, -inf on either side handled by branches, both finite by the
 * log1p form, so finite and -inf inputs never make a NaN (a NaN coming in propagates).
 * The hint (lib/backend/attn_hint.h), when given, is compared with the rows (fatal on a difference), so
 * every hint the ring computes is checked wherever the ring runs on the cpu.
 *
 * The math in full: docs/design/attention-kernels.md. Limits: hd <= ATTN_HD_MAX (stack scratch), checked;
 * out must not alias q.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "core/error.h"

#define ATTN_ROWS   16  /* query rows per tile */
#define ATTN_KEYS   64  /* keys per tile */
#define ATTN_HD_MAX 512 /* largest head dim (stack scratch); Qwen3-Next uses 256 */

/* the range of positions and document starts over rows [t0, t0+n) of a block */
typedef struct {
    int64_t pos_min, pos_max;
    int64_t doc_min, doc_max; /* document start = pos - doc_pos */
} AttnSpan;

static AttnSpan attention_span_of(const int32_t *pos /* (T) */, const int32_t *doc_pos /* (T) */, int64_t t0,
                                  int64_t n) {
    AttnSpan s = {INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN};
    for (int64_t t = t0; t < t0 + n; t++) {
        int64_t p = pos[t], d = (int64_t)pos[t] - doc_pos[t];
        if (p < s.pos_min) s.pos_min = p;
        if (p > s.pos_max) s.pos_max = p;
        if (d < s.doc_min) s.doc_min = d;
        if (d > s.doc_max) s.doc_max = d;
    }
    return s;
}

/* 1 when no query of the tile `qs` can see any key of the tile `ks` (the rule in the header) */
static int attention_tile_is_masked(const AttnSpan *qs, const AttnSpan *ks, int causal) {
    if (qs->doc_max < ks->doc_min || ks->doc_max < qs->doc_min) return 1;
    return causal && ks->pos_min > qs->pos_max;
}

static int attention_pair_sees(int32_t pos_q, int32_t doc_pos_q, int32_t pos_k, int32_t doc_pos_k, int causal) {
    if ((int64_t)pos_q - doc_pos_q != (int64_t)pos_k - doc_pos_k) return 0;
    return !causal || pos_k <= pos_q;
}

static float attention_dot(const float *a /* (hd) */, const float *b /* (hd) */, int hd) {
    float s = 0.0f;
    for (int d = 0; d < hd; d++) s += a[d] * b[d];
    return s;
}

static void attention_check_sizes(int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo) {
    RS_CHECK(Tq >= 0 && Tk >= 0, "attention: Tq = %lld, Tk = %lld", (long long)Tq, (long long)Tk);
    RS_CHECK(nh > 0 && nkv > 0 && nh % nkv == 0, "attention: nh = %d must be a positive multiple of nkv = %d", nh,
             nkv);
    RS_CHECK(hd > 0 && hd <= ATTN_HD_MAX, "attention: hd = %d (the cpu kernel supports 1..%d)", hd, ATTN_HD_MAX);
    RS_CHECK(ldq >= nh * hd && ldo >= nh * hd && ldk >= nkv * hd,
             "attention: ldq = %d, ldo = %d (need >= %d), ldk = %d (need >= %d)", ldq, ldo, nh * hd, ldk, nkv * hd);
}

/* A given hint must be the summary of the call's rows (lib/backend/attn_hint.h): nothing here routes by it, but the
 * cpu runs of the ring (tests, cp_check) thereby check every hint lib/cp/cp_ring.c computes. NULL: nothing to
 * check. */
static void attention_check_hint(const char *entry, const AttnHint *hint, const int32_t *pos_q,
                                 const int32_t *doc_pos_q, int64_t Tq, const int32_t *pos_k, const int32_t *doc_pos_k,
                                 int64_t Tk) {
    if (!hint) return;
    const AttnHint rows = attn_hint_rows(pos_q, doc_pos_q, Tq, pos_k, doc_pos_k, Tk);
    const int f = attn_hint_differs(hint, &rows);
    RS_CHECK(f < 0, "%s: the caller's hint says %s = %d, the rows (Tq %lld, Tk %lld) give %d", entry,
             attn_hint_field_name(f), attn_hint_field(hint, f), (long long)Tq, (long long)Tk,
             attn_hint_field(&rows, f));
}

void cpu_attention_forward(void *out_ /* (Tq,ldo) nh heads of hd */, float *lse /* (Tq,nh) */,
                           const void *q_ /* (Tq,ldq) nh heads */, const void *k_ /* (Tk,ldk) nkv heads */,
                           const void *v_ /* (Tk,ldk) nkv heads */, const int32_t *pos_q /* (Tq) */,
                           const int32_t *doc_pos_q /* (Tq) */, const int32_t *pos_k /* (Tk) */,
                           const int32_t *doc_pos_k /* (Tk) */, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh,
                           int nkv, int hd, int ldq, int ldk, int ldo, int causal) {
    attention_check_sizes(Tq, Tk, nh, nkv, hd, ldq, ldk, ldo);
    attention_check_hint("attention_forward", hint, pos_q, doc_pos_q, Tq, pos_k, doc_pos_k, Tk);
    float *out = out_;
    const float *q = q_, *k = k_, *v = v_;
    const float scale = (float)(1.0 / sqrt((double)hd));
    const int group = nh / nkv;

    float acc[ATTN_ROWS][ATTN_HD_MAX]; /* unnormalised output per row */
    float m[ATTN_ROWS], l[ATTN_ROWS];  /* running max and running sum of exp(s - m) */
    float s[ATTN_KEYS];                /* scores of one row against one key tile; -inf = masked */

    for (int64_t i0 = 0; i0 < Tq; i0 += ATTN_ROWS) {
        const int nr = (int)(Tq - i0 < ATTN_ROWS ? Tq - i0 : ATTN_ROWS);
        const AttnSpan qs = attention_span_of(pos_q, doc_pos_q, i0, nr);
        for (int h = 0; h < nh; h++) {
            const int kvh = h / group;
            for (int r = 0; r < nr; r++) {
                m[r] = -INFINITY;
                l[r] = 0.0f;
                memset(acc[r], 0, (size_t)hd * sizeof(float));
            }
            for (int64_t j0 = 0; j0 < Tk; j0 += ATTN_KEYS) {
                const int nk = (int)(Tk - j0 < ATTN_KEYS ? Tk - j0 : ATTN_KEYS);
                const AttnSpan ks = attention_span_of(pos_k, doc_pos_k, j0, nk);
                if (attention_tile_is_masked(&qs, &ks, causal)) continue;
                for (int r = 0; r < nr; r++) {
                    const int64_t i = i0 + r;
                    const float *qi = q + i * ldq + (int64_t)h * hd;
                    float smax = -INFINITY;
                    for (int c = 0; c < nk; c++) {
                        const int64_t j = j0 + c;
                        s[c] = -INFINITY;
                        if (!attention_pair_sees(pos_q[i], doc_pos_q[i], pos_k[j], doc_pos_k[j], causal)) continue;
                        s[c] = scale * attention_dot(qi, k + j * ldk + (int64_t)kvh * hd, hd);
                        if (s[c] > smax) smax = s[c];
                    }
                    if (smax == -INFINITY) continue; /* this row sees nothing in this tile */
                    if (smax > m[r]) {               /* new max: rescale what was summed so far */
                        const float alpha = expf(m[r] - smax); /* 0 when m was -inf */
                        l[r] *= alpha;
                        for (int d = 0; d < hd; d++) acc[r][d] *= alpha;
                        m[r] = smax;
                    }
                    for (int c = 0; c < nk; c++) {
                        if (s[c] == -INFINITY) continue;
                        const float p = expf(s[c] - m[r]);
                        const float *vj = v + (j0 + c) * ldk + (int64_t)kvh * hd;
                        l[r] += p;
                        for (int d = 0; d < hd; d++) acc[r][d] += p * vj[d];
                    }
                }
            }
            for (int r = 0; r < nr; r++) {
                const int64_t i = i0 + r;
                float *oi = out + i * ldo + (int64_t)h * hd;
                if (m[r] == -INFINITY) { /* no key: out 0, lse -inf */
                    memset(oi, 0, (size_t)hd * sizeof(float));
                    lse[i * nh + h] = -INFINITY;
                    continue;
                }
                const float inv = 1.0f / l[r];
                for (int d = 0; d < hd; d++) oi[d] = acc[r][d] * inv;
                lse[i * nh + h] = m[r] + logf(l[r]);
            }
        }
    }
}

void cpu_attention_backward(float *dq /* (Tq,ldq) += */, float *dk /* (Tk,ldk) += */, float *dv /* (Tk,ldk) += */,
                            const void *dout_ /* (Tq,ldo) */, const void *out_ /* (Tq,ldo) final */,
                            const float *lse /* (Tq,nh) final */, const void *q_ /* (Tq,ldq) */,
                            const void *k_ /* (Tk,ldk) */, const void *v_ /* (Tk,ldk) */,
                            const int32_t *pos_q /* (Tq) */, const int32_t *doc_pos_q /* (Tq) */,
                            const int32_t *pos_k /* (Tk) */, const int32_t *doc_pos_k /* (Tk) */,
                            const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk,
                            int ldo, int causal) {
    attention_check_sizes(Tq, Tk, nh, nkv, hd, ldq, ldk, ldo);
    attention_check_hint("attention_backward", hint, pos_q, doc_pos_q, Tq, pos_k, doc_pos_k, Tk);
    const float *dout = dout_, *out = out_, *q = q_, *k = k_, *v = v_;
    const float scale = (float)(1.0 / sqrt((double)hd));
    const int group = nh / nkv;

    float dq_acc[ATTN_ROWS][ATTN_HD_MAX]; /* sum_j dS_ij k_j per row, scaled when added to dq */
    float D[ATTN_ROWS];                   /* rowsum(dout * out) */
    int   live[ATTN_ROWS];                /* lse finite: the row saw some key in some block */

    for (int64_t i0 = 0; i0 < Tq; i0 += ATTN_ROWS) {
        const int nr = (int)(Tq - i0 < ATTN_ROWS ? Tq - i0 : ATTN_ROWS);
        const AttnSpan qs = attention_span_of(pos_q, doc_pos_q, i0, nr);
        for (int h = 0; h < nh; h++) {
            const int kvh = h / group;
            int any = 0;
            for (int r = 0; r < nr; r++) {
                const int64_t i = i0 + r;
                live[r] = lse[i * nh + h] != -INFINITY;
                any |= live[r];
                D[r] = live[r] ? attention_dot(dout + i * ldo + (int64_t)h * hd, out + i * ldo + (int64_t)h * hd, hd)
                               : 0.0f;
                memset(dq_acc[r], 0, (size_t)hd * sizeof(float));
            }
            if (!any) continue;
            for (int64_t j0 = 0; j0 < Tk; j0 += ATTN_KEYS) {
                const int nk = (int)(Tk - j0 < ATTN_KEYS ? Tk - j0 : ATTN_KEYS);
                const AttnSpan ks = attention_span_of(pos_k, doc_pos_k, j0, nk);
                if (attention_tile_is_masked(&qs, &ks, causal)) continue;
                for (int r = 0; r < nr; r++) {
                    if (!live[r]) continue;
                    const int64_t i = i0 + r;
                    const float *qi = q + i * ldq + (int64_t)h * hd;
                    const float *doi = dout + i * ldo + (int64_t)h * hd;
                    const float Li = lse[i * nh + h];
                    for (int c = 0; c < nk; c++) {
                        const int64_t j = j0 + c;
                        if (!attention_pair_sees(pos_q[i], doc_pos_q[i], pos_k[j], doc_pos_k[j], causal)) continue;
                        const int64_t kv_off = j * ldk + (int64_t)kvh * hd;
                        const float *kj = k + kv_off, *vj = v + kv_off;
                        float *dkj = dk + kv_off, *dvj = dv + kv_off;
                        const float p = expf(scale * attention_dot(qi, kj, hd) - Li);
                        const float ds = p * (attention_dot(doi, vj, hd) - D[r]);
                        const float ds_scaled = scale * ds;
                        for (int d = 0; d < hd; d++) {
                            dq_acc[r][d] += ds * kj[d];
                            dkj[d] += ds_scaled * qi[d];
                            dvj[d] += p * doi[d];
                        }
                    }
                }
            }
            for (int r = 0; r < nr; r++) {
                if (!live[r]) continue;
                float *dqi = dq + (i0 + r) * ldq + (int64_t)h * hd;
                for (int d = 0; d < hd; d++) dqi[d] += scale * dq_acc[r][d];
            }
        }
    }
}

void cpu_attention_merge(float *out /* (T,nh*hd) running */, float *lse /* (T,nh) running */,
                         const void *out_b_ /* (T,ldb) partial */, const float *lse_b /* (T,nh) partial */, int64_t T,
                         int nh, int hd, int ldb) {
    RS_CHECK(T >= 0 && nh > 0 && hd > 0 && ldb >= nh * hd, "attention_merge: T = %lld, nh = %d, hd = %d, ldb = %d",
             (long long)T, nh, hd, ldb);
    const float *out_b = out_b_;
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            const float Lb = lse_b[t * nh + h], L = lse[t * nh + h];
            float *o = out + (t * nh + h) * (int64_t)hd;
            const float *ob = out_b + t * ldb + (int64_t)h * hd;
            if (Lb == -INFINITY) continue; /* the partial saw no key */
            if (L == -INFINITY) {          /* nothing merged yet: take the partial */
                memcpy(o, ob, (size_t)hd * sizeof(float));
                lse[t * nh + h] = Lb;
                continue;
            }
            const float e = expf(-fabsf(L - Lb));  /* in (0, 1] */
            const float w_hi = 1.0f / (1.0f + e);  /* weight of the side with the larger lse */
            const float w_lo = e * w_hi;
            const float wa = L >= Lb ? w_hi : w_lo, wb = L >= Lb ? w_lo : w_hi;
            for (int d = 0; d < hd; d++) o[d] = wa * o[d] + wb * ob[d];
            lse[t * nh + h] = (L >= Lb ? L : Lb) + log1pf(e);
        }
    }
}
