/*
 * test_attention.c — per-op tests of the cpu block attention and its LSE merge
 * (kernels/cpu/cpu_attention.c), run by build/test_ops under pytest.
 *
 * Every case describes a packed sample (a list of document lengths) and two
 * blocks of it, each one or two global token ranges concatenated (so zigzag
 * blocks [seg r | seg 2P-1-r] are expressible): the query block and the key
 * block. From that the test derives pos/doc_pos for the kernel and, on its own
 * side, a document index per token for the float64 reference, which builds the
 * dense Tq x Tk score matrix with the mask "same document index and (not
 * causal, or global key index <= global query index)". The kernel reads
 * strided fp32 copies whose gaps (ld > width) hold NaN; its outputs' gaps are
 * NaN before the call and must still be NaN after.
 *
 * Bounds (relative L2 error; measured maxima in brackets):
 *   forward out/lse vs float64:        2e-6  [4.9e-7] fp32 dot products over
 *                                             hd <= 64 and fp32 exp
 *   backward vs float64 central FD:    5e-6  [5.1e-7] fp32 gradients; the FD
 *                                             error (h = 1e-5, float64) ~1e-10
 *   ring splits (forward + merge, and
 *   backward) vs the whole call:       1e-6  [2.2e-7] fp32 against fp32, only
 *                                             the summation order differs
 *   two backward calls vs 2x one call: 1e-6  [3.7e-7] (the += contract)
 * and -inf lse entries must match exactly (a row that sees no key). A wrong
 * mask, GQA mapping, scale or merge weight gives errors of 1e-2 and more.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test_util.h"

typedef struct {
    int64_t lo, hi;
} AttnRange;

typedef struct {
    const char *name;
    int nh, nkv, hd, causal;
    int pad;              /* extra NaN-poisoned columns in every ld */
    int docs[12];         /* document lengths of the packed sample, 0-terminated */
    AttnRange q[2], k[2]; /* query / key block: global token ranges, concatenated ({0,0} = unused) */
} AttnCase;

/* One case, set up. */
typedef struct {
    const AttnCase *c;
    int64_t Tq, Tk;
    int wq, wk;                 /* row widths nh*hd, nkv*hd */
    int ldq, ldk, ldo;
    int32_t *pos_q, *doc_pos_q, *pos_k, *doc_pos_k; /* kernel metadata */
    int32_t *id_q, *id_k;       /* document index per token, for the reference only */
    double *q, *k, *v, *R;      /* dense float64: (Tq,wq), (Tk,wk), (Tk,wk), (Tq,wq) */
    float *qf, *kf, *vf;        /* the same in fp32, strided, NaN in the gaps */
    double *ref_out, *ref_lse, *S; /* reference scratch: (Tq,wq), (Tq,nh), (Tq,Tk) */
} AttnData;

/* pos/doc_pos/doc index of the tokens of a block; returns the token count (fills nothing when pos is NULL) */
static int64_t attn_block_meta(int32_t *pos, int32_t *doc_pos, int32_t *doc_id, const AttnRange r[2],
                               const int *docs) {
    int64_t T = 0;
    for (int b = 0; b < 2; b++)
        for (int64_t g = r[b].lo; g < r[b].hi; g++) {
            int64_t start = 0;
            int id = 0;
            while (docs[id] && start + docs[id] <= g) start += docs[id++];
            if (!docs[id]) {
                fprintf(stderr, "test_attention: token %lld beyond the sample\n", (long long)g);
                return -1;
            }
            if (pos) {
                pos[T] = (int32_t)g;
                doc_pos[T] = (int32_t)(g - start);
                doc_id[T] = id;
            }
            T++;
        }
    return T;
}

static float *attn_alloc_poisoned(int64_t T, int ld) {
    float *x = test_alloc(T * ld * (int64_t)sizeof(float) + 4);
    for (int64_t i = 0; i < T * ld; i++) x[i] = NAN;
    return x;
}

/* strided fp32 copy of a dense float64 (T,w) matrix, NaN in the gaps */
static float *attn_pack(const double *x, int64_t T, int w, int ld) {
    float *y = attn_alloc_poisoned(T, ld);
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < w; i++) y[t * ld + i] = (float)x[t * w + i];
    return y;
}

static void attn_unpack(float *dst /* (T,w) */, const float *src /* (T,ld) */, int64_t T, int w, int ld) {
    for (int64_t t = 0; t < T; t++) memcpy(dst + t * w, src + t * ld, (size_t)w * sizeof(float));
}

/* the gaps of a strided output must still hold the NaN put there before the call */
static void attn_check_gaps(const char *what, const float *x, int64_t T, int w, int ld) {
    for (int64_t t = 0; t < T; t++)
        for (int i = w; i < ld; i++)
            if (!isnan(x[t * ld + i])) {
                EXPECT(0, "%s: gap element (%lld,%d) was written", what, (long long)t, i);
                return;
            }
}

static int attn_setup(AttnData *a, const AttnCase *c, uint64_t seed) {
    memset(a, 0, sizeof(*a));
    a->c = c;
    a->Tq = attn_block_meta(NULL, NULL, NULL, c->q, c->docs);
    a->Tk = attn_block_meta(NULL, NULL, NULL, c->k, c->docs);
    if (a->Tq < 0 || a->Tk < 0) {
        EXPECT(0, "%s: bad case", c->name);
        return 0;
    }
    a->wq = c->nh * c->hd;
    a->wk = c->nkv * c->hd;
    a->ldq = a->wq + c->pad;
    a->ldo = a->wq + 2 * c->pad;
    a->ldk = a->wk + c->pad;
    int64_t Tq = a->Tq, Tk = a->Tk;
    a->pos_q = test_alloc((Tq + 1) * 4);
    a->doc_pos_q = test_alloc((Tq + 1) * 4);
    a->id_q = test_alloc((Tq + 1) * 4);
    a->pos_k = test_alloc((Tk + 1) * 4);
    a->doc_pos_k = test_alloc((Tk + 1) * 4);
    a->id_k = test_alloc((Tk + 1) * 4);
    attn_block_meta(a->pos_q, a->doc_pos_q, a->id_q, c->q, c->docs);
    attn_block_meta(a->pos_k, a->doc_pos_k, a->id_k, c->k, c->docs);

    test_rng_seed(seed);
    float *tmp = test_alloc((Tq > Tk ? Tq : Tk) * (int64_t)a->wq * 4 + 4);
    a->q = test_alloc(Tq * a->wq * 8 + 8);
    a->k = test_alloc(Tk * a->wk * 8 + 8);
    a->v = test_alloc(Tk * a->wk * 8 + 8);
    a->R = test_alloc(Tq * a->wq * 8 + 8);
    /* q, k ~ N(0, 1.5^2) gives scores ~ N(0, 2.25): softmax neither flat nor one-hot */
    test_fill_normal(tmp, Tq * a->wq, 1.5); test_to_double(a->q, tmp, Tq * a->wq);
    test_fill_normal(tmp, Tk * a->wk, 1.0); test_to_double(a->k, tmp, Tk * a->wk);
    test_fill_normal(tmp, Tk * a->wk, 1.0); test_to_double(a->v, tmp, Tk * a->wk);
    test_fill_normal(tmp, Tq * a->wq, 1.0); test_to_double(a->R, tmp, Tq * a->wq);
    a->qf = attn_pack(a->q, Tq, a->wq, a->ldq);
    a->kf = attn_pack(a->k, Tk, a->wk, a->ldk);
    a->vf = attn_pack(a->v, Tk, a->wk, a->ldk);
    a->ref_out = test_alloc(Tq * a->wq * 8 + 8);
    a->ref_lse = test_alloc(Tq * c->nh * 8 + 8);
    a->S = test_alloc(Tq * Tk * 8 + 8);
    return 1;
}

/* float64 dense reference: S = q k^T / sqrt(hd) with the mask, softmax per row, out = P v */
static void ref_attention(double *out /* (Tq,wq) */, double *lse /* (Tq,nh) */, const AttnData *a) {
    const AttnCase *c = a->c;
    const int64_t Tq = a->Tq, Tk = a->Tk;
    const int hd = c->hd, group = c->nh / c->nkv;
    double *S = a->S;
    for (int g = 0; g < c->nkv; g++)
        for (int hh = 0; hh < group; hh++) {
            const int h = g * group + hh; /* query heads g*group .. g*group+group-1 share kv head g */
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t j = 0; j < Tk; j++) {
                    int visible = a->id_q[i] == a->id_k[j] && (!c->causal || a->pos_k[j] <= a->pos_q[i]);
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += a->q[i * a->wq + h * hd + d] * a->k[j * a->wk + g * hd + d];
                    S[i * Tk + j] = visible ? s / sqrt((double)hd) : -INFINITY;
                }
            for (int64_t i = 0; i < Tq; i++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < Tk; j++) mx = fmax(mx, S[i * Tk + j]);
                double *o = out + i * a->wq + h * hd;
                for (int d = 0; d < hd; d++) o[d] = 0;
                if (mx == -INFINITY) {
                    lse[i * c->nh + h] = -INFINITY;
                    continue;
                }
                for (int64_t j = 0; j < Tk; j++) sum += exp(S[i * Tk + j] - mx);
                lse[i * c->nh + h] = mx + log(sum);
                for (int64_t j = 0; j < Tk; j++) {
                    double p = exp(S[i * Tk + j] - lse[i * c->nh + h]);
                    for (int d = 0; d < hd; d++) o[d] += p * a->v[j * a->wk + g * hd + d];
                }
            }
        }
}

/* L = sum(out * R) of the reference; the FD helper perturbs q, k or v in place through the same pointers */
static double attn_loss(void *ctx, double *x) {
    (void)x;
    AttnData *a = ctx;
    ref_attention(a->ref_out, a->ref_lse, a);
    double L = 0;
    for (int64_t i = 0; i < a->Tq * a->wq; i++) L += a->ref_out[i] * a->R[i];
    return L;
}

/* lse: the -inf entries must match exactly, the finite ones within `bound` */
static void attn_check_lse(const char *what, const float *got, const double *want, int64_t n, double bound) {
    float *gf = test_alloc(n * 4 + 4);
    double *wf = test_alloc(n * 8 + 8);
    int64_t nf = 0, nempty = 0;
    for (int64_t i = 0; i < n; i++) {
        if (want[i] == -INFINITY) {
            nempty++;
            EXPECT(got[i] == -INFINITY, "%s: entry %lld is %g, want -inf (row sees no key)", what, (long long)i,
                   got[i]);
        } else {
            EXPECT(isfinite(got[i]), "%s: entry %lld is %g, want %g", what, (long long)i, got[i], want[i]);
            gf[nf] = got[i];
            wf[nf++] = want[i];
        }
    }
    printf("%s: %lld of %lld (row, head) see no key\n", what, (long long)nempty, (long long)n);
    if (nf) test_check_rel(what, gf, wf, nf, bound);
}

/* kernel forward into fresh NaN-poisoned buffers */
static void attn_kernel_forward(float **out, float **lse, const AttnData *a) {
    const AttnCase *c = a->c;
    *out = attn_alloc_poisoned(a->Tq, a->ldo);
    *lse = attn_alloc_poisoned(a->Tq, c->nh);
    const AttnHint h = attn_hint_rows(a->pos_q, a->doc_pos_q, a->Tq, a->pos_k, a->doc_pos_k, a->Tk);
    cpu_attention_forward(*out, *lse, a->qf, a->kf, a->vf, a->pos_q, a->doc_pos_q, a->pos_k, a->doc_pos_k, &h, a->Tq,
                          a->Tk, c->nh, c->nkv, c->hd, a->ldq, a->ldk, a->ldo, c->causal);
}

static void attn_test_forward(const AttnCase *c, uint64_t seed) {
    AttnData a;
    if (!attn_setup(&a, c, seed)) return;
    float *out, *lse;
    attn_kernel_forward(&out, &lse, &a);
    ref_attention(a.ref_out, a.ref_lse, &a);
    char what[160];
    float *dense = test_alloc(a.Tq * a.wq * 4 + 4);
    attn_unpack(dense, out, a.Tq, a.wq, a.ldo);
    snprintf(what, sizeof what, "%s fwd out (Tq %lld Tk %lld nh %d nkv %d hd %d)", c->name, (long long)a.Tq,
             (long long)a.Tk, c->nh, c->nkv, c->hd);
    test_check_rel(what, dense, a.ref_out, a.Tq * a.wq, 2e-6);
    snprintf(what, sizeof what, "%s fwd lse", c->name);
    attn_check_lse(what, lse, a.ref_lse, a.Tq * c->nh, 2e-6);
    attn_check_gaps(c->name, out, a.Tq, a.wq, a.ldo);
}

/* ---- forward ---- */

#define R1(a, b) {{a, b}, {0, 0}}
#define R2(a, b, c, d) {{a, b}, {c, d}}

TEST(attention_forward_causal_self) {
    /* one document, Tq = Tk, the same positions; T in {1, 33, 130}, hd in {16, 64}, GQA and not */
    const int Ts[3] = {1, 33, 130}, hds[2] = {16, 64}, heads[2][2] = {{4, 2}, {2, 2}};
    int n = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int hi = 0; hi < 2; hi++)
            for (int gi = 0; gi < 2; gi++) {
                AttnCase c = {"causal_self", heads[gi][0], heads[gi][1], hds[hi], 1, 0, {1000},
                              R1(0, Ts[ti]), R1(0, Ts[ti])};
                attn_test_forward(&c, 100 + n++);
            }
}

TEST(attention_forward_noncausal) {
    const int Ts[3] = {1, 33, 130}, hds[2] = {16, 64}, heads[2][2] = {{4, 2}, {4, 4}};
    int n = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int hi = 0; hi < 2; hi++)
            for (int gi = 0; gi < 2; gi++) {
                AttnCase c = {"noncausal", heads[gi][0], heads[gi][1], hds[hi], 0, 0, {1000},
                              R1(0, Ts[ti]), R1(0, Ts[ti])};
                attn_test_forward(&c, 200 + n++);
            }
}

/* documents 5,1,1,40,17,1,65 cover [0,130): boundaries at 5 6 7 47 64 65, 1-token documents at 5, 6, 64 */
#define DOCS_A {5, 1, 1, 40, 17, 1, 65, 1000}

TEST(attention_forward_documents) {
    const AttnCase cases[] = {
        {"docs_causal", 4, 2, 16, 1, 0, DOCS_A, R1(0, 130), R1(0, 130)},
        {"docs_causal_hd64", 2, 2, 64, 1, 0, DOCS_A, R1(0, 130), R1(0, 130)},
        {"docs_noncausal", 4, 2, 16, 0, 0, DOCS_A, R1(0, 130), R1(0, 130)},
        {"docs_noncausal_hd64", 4, 4, 64, 0, 0, DOCS_A, R1(0, 130), R1(0, 130)},
        /* the block starts mid-document (doc_pos[0] = 3) and ends mid-document */
        {"docs_block_mid_doc", 4, 2, 16, 1, 0, DOCS_A, R1(3, 120), R1(3, 120)},
        /* starts inside the 17-token document; a 1-token document at local row 4 */
        {"docs_block_mid_doc2", 4, 2, 64, 1, 0, DOCS_A, R1(60, 131), R1(60, 131)},
        {"docs_33", 4, 2, 16, 1, 0, DOCS_A, R1(0, 33), R1(0, 33)},
        {"docs_1tok", 4, 2, 16, 1, 0, DOCS_A, R1(5, 6), R1(5, 6)},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) attn_test_forward(&cases[i], 300 + i);
}

/* documents 20,150,30 cover [0,200): boundaries at 20 and 170. With P = 2, s = 50, the zigzag blocks are
 * rank 0 = [0,50) + [150,200) and rank 1 = [50,100) + [100,150). */
#define DOCS_B {20, 150, 30, 1000}

TEST(attention_forward_ring_blocks) {
    const AttnCase cases[] = {
        /* keys entirely before the queries; keys 10..19 are in another document */
        {"keys_before", 4, 2, 16, 1, 0, DOCS_B, R1(100, 161), R1(10, 73)},
        {"keys_before_hd64", 2, 2, 64, 1, 0, DOCS_B, R1(100, 161), R1(10, 73)},
        /* keys entirely after the queries with causal: every row empty, out 0, lse -inf */
        {"keys_after_causal", 4, 2, 16, 1, 0, DOCS_B, R1(0, 50), R1(60, 110)},
        /* the same without causal: rows of document 1 see them, rows of document 0 see nothing */
        {"keys_after_noncausal", 4, 2, 16, 0, 0, DOCS_B, R1(0, 50), R1(60, 110)},
        /* zigzag: rank 0's queries against rank 1's keys (only B_0 rows of document 1 see anything) */
        {"zigzag_q0_k1", 4, 2, 16, 1, 0, DOCS_B, R2(0, 50, 150, 200), R2(50, 100, 100, 150)},
        /* rank 1's queries against rank 0's keys: keys 150..169 share the document but lie in the future */
        {"zigzag_q1_k0", 4, 2, 64, 1, 0, DOCS_B, R2(50, 100, 100, 150), R2(0, 50, 150, 200)},
        /* step 0: the local block against itself */
        {"zigzag_diag", 4, 2, 16, 1, 0, DOCS_B, R2(0, 50, 150, 200), R2(0, 50, 150, 200)},
        {"zigzag_diag_noncausal", 4, 4, 16, 0, 0, DOCS_B, R2(0, 50, 150, 200), R2(0, 50, 150, 200)},
        /* queries much shorter than keys and the reverse */
        {"q1_k130", 4, 2, 16, 1, 0, DOCS_B, R1(140, 141), R1(10, 140)},
        {"q130_k1", 4, 2, 16, 1, 0, DOCS_B, R1(10, 140), R1(40, 41)},
        /* an empty key block (Tk = 0): every row empty */
        {"no_keys", 4, 2, 16, 0, 0, DOCS_B, R1(10, 43), R1(0, 0)},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) attn_test_forward(&cases[i], 400 + i);
}

TEST(attention_forward_ld_strides) {
    /* ld = width + pad (q, k, v) and width + 2 pad (out); gaps hold NaN and must neither leak nor be written */
    const AttnCase cases[] = {
        {"ld_causal", 4, 2, 16, 1, 3, DOCS_A, R1(0, 130), R1(0, 130)},
        {"ld_gqa_hd64", 4, 2, 64, 1, 17, DOCS_A, R1(0, 33), R1(0, 33)},
        {"ld_ring", 4, 4, 16, 0, 5, DOCS_B, R2(50, 100, 100, 150), R2(0, 50, 150, 200)},
        {"ld_empty", 2, 2, 16, 1, 1, DOCS_B, R1(0, 50), R1(60, 110)},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) attn_test_forward(&cases[i], 500 + i);
}

/* ---- the ring property: attention over key pieces + merge = attention over all keys ---- */

static void attn_fill_neg_inf(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = -INFINITY;
}

/* Runs the key block in pieces [cuts[p], cuts[p+1]) of local key rows, merges them into a running (out, lse)
 * in the order `order`, and compares with the single call over all keys. */
static void attn_test_split_forward(const AttnCase *c, const int64_t *cuts, int npieces, const int *order,
                                    uint64_t seed) {
    AttnData a;
    if (!attn_setup(&a, c, seed)) return;
    const int64_t Tq = a.Tq;
    const int nh = c->nh, hd = c->hd;
    float *out, *lse;
    attn_kernel_forward(&out, &lse, &a);
    float *whole = test_alloc(Tq * a.wq * 4 + 4);
    attn_unpack(whole, out, Tq, a.wq, a.ldo);
    double *whole_lse = test_alloc(Tq * nh * 8 + 8);
    test_to_double(whole_lse, lse, Tq * nh);

    float *run_out = test_alloc(Tq * a.wq * 4 + 4); /* zeros */
    float *run_lse = test_alloc(Tq * nh * 4 + 4);
    attn_fill_neg_inf(run_lse, Tq * nh);
    float *pout = attn_alloc_poisoned(Tq, a.ldo), *plse = attn_alloc_poisoned(Tq, nh);
    char what[160];
    for (int i = 0; i < npieces; i++) {
        const int p = order[i];
        const int64_t lo = cuts[p], hi = cuts[p + 1];
        const AttnHint h = attn_hint_rows(a.pos_q, a.doc_pos_q, Tq, a.pos_k + lo, a.doc_pos_k + lo, hi - lo);
        cpu_attention_forward(pout, plse, a.qf, a.kf + lo * a.ldk, a.vf + lo * a.ldk, a.pos_q, a.doc_pos_q,
                              a.pos_k + lo, a.doc_pos_k + lo, &h, Tq, hi - lo, nh, c->nkv, hd, a.ldq, a.ldk, a.ldo,
                              c->causal);
        int64_t empty = 0;
        for (int64_t e = 0; e < Tq * nh; e++) empty += plse[e] == -INFINITY;
        printf("%s: piece [%lld,%lld): %lld of %lld (row, head) see no key\n", c->name, (long long)lo, (long long)hi,
               (long long)empty, (long long)(Tq * nh));
        cpu_attention_merge(run_out, run_lse, pout, plse, Tq, nh, hd, a.ldo);
    }
    snprintf(what, sizeof what, "%s merged %d pieces out vs whole", c->name, npieces);
    test_check_rel_f(what, run_out, whole, Tq * a.wq, 1e-6);
    snprintf(what, sizeof what, "%s merged %d pieces lse vs whole", c->name, npieces);
    attn_check_lse(what, run_lse, whole_lse, Tq * nh, 1e-6);
}

TEST(attention_merge_ring_property) {
    const AttnCase docs = {"ring_docs_causal", 4, 2, 16, 1, 0, DOCS_A, R1(0, 130), R1(0, 130)};
    const AttnCase docs64 = {"ring_docs_noncausal_hd64", 4, 4, 64, 0, 3, DOCS_A, R1(3, 120), R1(3, 120)};
    const AttnCase zig = {"ring_zigzag_q1_k0", 4, 2, 16, 1, 2, DOCS_B, R2(50, 100, 100, 150), R2(0, 50, 150, 200)};
    const AttnCase after = {"ring_keys_after_noncausal", 2, 2, 16, 0, 1, DOCS_B, R1(0, 50), R1(60, 110)};
    const int64_t two[3] = {0, 64, 130}, three[4] = {0, 40, 90, 130}, three_b[4] = {0, 30, 77, 117};
    const int64_t zig2[3] = {0, 50, 100}, zig3[4] = {0, 13, 50, 100}, after3[4] = {0, 1, 25, 50};
    const int up2[2] = {0, 1}, down2[2] = {1, 0}, up3[3] = {0, 1, 2}, mix3[3] = {2, 0, 1};
    attn_test_split_forward(&docs, two, 2, up2, 600);
    attn_test_split_forward(&docs, two, 2, down2, 600);
    attn_test_split_forward(&docs, three, 3, up3, 600);
    attn_test_split_forward(&docs, three, 3, mix3, 600);
    attn_test_split_forward(&docs64, three_b, 3, mix3, 601);
    attn_test_split_forward(&zig, zig2, 2, down2, 602); /* piece [50,100) = keys 150..199: every row empty */
    attn_test_split_forward(&zig, zig3, 3, up3, 602);
    attn_test_split_forward(&after, after3, 3, mix3, 603);
}

TEST(attention_merge_inf) {
    /* (running lse, partial lse) per (row, head): every -inf combination, equal, far apart, large magnitude */
    const float pairs[10][2] = {
        {-INFINITY, -INFINITY}, {-INFINITY, 1.5f}, {2.0f, -INFINITY}, {3.0f, 3.0f},      {80.0f, -20.0f},
        {-50.0f, 40.0f},        {0.3f, 0.7f},      {-INFINITY, -INFINITY}, {1e4f, 1e4f + 0.5f}, {-3.0f, -2.0f},
    };
    const int T = 5, nh = 2, hd = 8, ldb = nh * hd + 3;
    test_rng_seed(700);
    float *out = test_alloc(T * nh * hd * 4), *lse = test_alloc(T * nh * 4), *lse_b = test_alloc(T * nh * 4);
    float *out_b = attn_alloc_poisoned(T, ldb);
    double *want = test_alloc(T * nh * hd * 8), *want_lse = test_alloc(T * nh * 8);
    test_fill_normal(out, T * nh * hd, 1.0);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const int e = t * nh + h;
            const double L = pairs[e][0], Lb = pairs[e][1];
            float *o = out + e * hd, *ob = out_b + t * ldb + h * hd;
            test_fill_normal(ob, hd, 1.0);
            lse[e] = (float)L;
            lse_b[e] = (float)Lb;
            /* an empty running row: 0 where nothing arrives (it must stay 0), NaN where a partial arrives
             * (it must be replaced without being read) */
            if (L == -INFINITY)
                for (int d = 0; d < hd; d++) o[d] = Lb == -INFINITY ? 0.0f : NAN;
            if (Lb == -INFINITY)
                for (int d = 0; d < hd; d++) ob[d] = NAN; /* must not be read */
            double Ln = L, wa = 1, wb = 0;
            if (Lb != -INFINITY && L == -INFINITY) Ln = Lb, wa = 0, wb = 1;
            else if (Lb != -INFINITY) {
                double mx = fmax(L, Lb);
                Ln = mx + log(exp(L - mx) + exp(Lb - mx));
                wa = exp(L - Ln);
                wb = exp(Lb - Ln);
            }
            want_lse[e] = Ln;
            for (int d = 0; d < hd; d++) want[e * hd + d] = (wa != 0 ? wa * o[d] : 0) + (wb != 0 ? wb * ob[d] : 0);
        }
    cpu_attention_merge(out, lse, out_b, lse_b, T, nh, hd, ldb);
    test_check_rel("merge inf out", out, want, T * nh * hd, 1e-6);
    attn_check_lse("merge inf lse", lse, want_lse, T * nh, 1e-6);
    for (int d = 0; d < hd; d++) EXPECT(out[d] == 0.0f, "merge of (-inf, -inf): out[%d] = %g, want 0", d, out[d]);
}

/* ---- backward ---- */

static float *attn_alloc_grad(int64_t T, int w, int ld) {
    float *x = attn_alloc_poisoned(T, ld);
    for (int64_t t = 0; t < T; t++) memset(x + t * ld, 0, (size_t)w * sizeof(float));
    return x;
}

static void attn_kernel_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                 const float *lse, const AttnData *a, int64_t k_lo, int64_t k_hi) {
    const AttnCase *c = a->c;
    const int64_t off = k_lo * a->ldk;
    const AttnHint h =
        attn_hint_rows(a->pos_q, a->doc_pos_q, a->Tq, a->pos_k + k_lo, a->doc_pos_k + k_lo, k_hi - k_lo);
    cpu_attention_backward(dq, dk + off, dv + off, dout, out, lse, a->qf, a->kf + off, a->vf + off, a->pos_q,
                           a->doc_pos_q, a->pos_k + k_lo, a->doc_pos_k + k_lo, &h, a->Tq, k_hi - k_lo, c->nh, c->nkv,
                           c->hd, a->ldq, a->ldk, a->ldo, c->causal);
}

/* dq, dk, dv of one call vs float64 central FD of L = sum(out * R) (nsamp sampled entries each; -1 = all);
 * then a second call into the same buffers must give twice the first (the gradients accumulate). */
static void attn_test_backward_fd(const AttnCase *c, int64_t nsamp, uint64_t seed) {
    AttnData a;
    if (!attn_setup(&a, c, seed)) return;
    float *out, *lse;
    attn_kernel_forward(&out, &lse, &a);
    float *dout = attn_pack(a.R, a.Tq, a.wq, a.ldo);
    float *g[3] = {attn_alloc_grad(a.Tq, a.wq, a.ldq), attn_alloc_grad(a.Tk, a.wk, a.ldk),
                   attn_alloc_grad(a.Tk, a.wk, a.ldk)};
    attn_kernel_backward(g[0], g[1], g[2], dout, out, lse, &a, 0, a.Tk);

    const char *names[3] = {"dq", "dk", "dv"};
    double *xs[3] = {a.q, a.k, a.v};
    const int64_t rows[3] = {a.Tq, a.Tk, a.Tk};
    const int ws[3] = {a.wq, a.wk, a.wk}, lds[3] = {a.ldq, a.ldk, a.ldk};
    float *first[3];
    char what[160];
    for (int w = 0; w < 3; w++) {
        const int64_t n = rows[w] * ws[w];
        const int64_t m = nsamp < 0 || nsamp > n ? n : nsamp;
        int64_t *idx = test_alloc(m * 8 + 8);
        for (int64_t j = 0; j < m; j++) idx[j] = m == n ? j : (int64_t)(test_uniform() * (double)n) % n;
        double *fd = test_alloc(m * 8 + 8);
        float *got = test_alloc(m * 4 + 4);
        test_fd_grad(fd, attn_loss, &a, xs[w], n, idx, m, 1e-5);
        for (int64_t j = 0; j < m; j++) got[j] = g[w][(idx[j] / ws[w]) * lds[w] + idx[j] % ws[w]];
        snprintf(what, sizeof what, "%s %s vs FD (%lld of %lld entries)", c->name, names[w], (long long)m,
                 (long long)n);
        test_check_rel(what, got, fd, m, 5e-6);
        first[w] = test_alloc(n * 4 + 4);
        attn_unpack(first[w], g[w], rows[w], ws[w], lds[w]);
    }
    attn_kernel_backward(g[0], g[1], g[2], dout, out, lse, &a, 0, a.Tk);
    for (int w = 0; w < 3; w++) {
        const int64_t n = rows[w] * ws[w];
        float *twice = test_alloc(n * 4 + 4), *got = test_alloc(n * 4 + 4);
        for (int64_t i = 0; i < n; i++) twice[i] = 2.0f * first[w][i];
        attn_unpack(got, g[w], rows[w], ws[w], lds[w]);
        snprintf(what, sizeof what, "%s %s after two calls vs 2x one call (+=)", c->name, names[w]);
        test_check_rel_f(what, got, twice, n, 1e-6);
        attn_check_gaps(what, g[w], rows[w], ws[w], lds[w]);
    }
}

TEST(attention_backward_fd_documents) {
    const AttnCase cases[] = {
        {"fd_docs_causal", 4, 2, 16, 1, 0, DOCS_A, R1(0, 33), R1(0, 33)},
        {"fd_docs_noncausal_mid_doc_ld", 4, 2, 16, 0, 3, DOCS_A, R1(3, 36), R1(3, 36)},
        {"fd_t1", 4, 2, 16, 1, 0, {1000}, R1(0, 1), R1(0, 1)},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) attn_test_backward_fd(&cases[i], -1, 800 + i);
}

TEST(attention_backward_fd_large) {
    const AttnCase cases[] = {
        {"fd_causal_130_hd64", 2, 2, 64, 1, 0, {1000}, R1(0, 130), R1(0, 130)},
        {"fd_docs_130_gqa", 4, 2, 16, 1, 1, DOCS_A, R1(0, 130), R1(0, 130)},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) attn_test_backward_fd(&cases[i], 96, 850 + i);
}

TEST(attention_backward_fd_ring_blocks) {
    const AttnCase cases[] = {
        {"fd_keys_before", 4, 2, 16, 1, 0, DOCS_B, R1(100, 133), R1(10, 43)},
        {"fd_keys_after_causal", 2, 2, 16, 1, 0, DOCS_B, R1(0, 50), R1(60, 110)}, /* all gradients 0 */
        {"fd_zigzag_q1_k0", 4, 2, 16, 1, 2, DOCS_B, R2(50, 100, 100, 150), R2(0, 50, 150, 200)},
        {"fd_zigzag_q0_k1_hd64", 2, 1, 64, 1, 0, DOCS_B, R2(0, 50, 150, 200), R2(50, 100, 100, 150)},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) attn_test_backward_fd(&cases[i], 128, 900 + i);
}

/* per-piece backward calls with the GLOBAL out/lse, accumulated, equal the single call over all keys */
static void attn_test_split_backward(const AttnCase *c, const int64_t *cuts, int npieces, uint64_t seed) {
    AttnData a;
    if (!attn_setup(&a, c, seed)) return;
    float *out, *lse;
    attn_kernel_forward(&out, &lse, &a);
    float *dout = attn_pack(a.R, a.Tq, a.wq, a.ldo);
    float *gw[3] = {attn_alloc_grad(a.Tq, a.wq, a.ldq), attn_alloc_grad(a.Tk, a.wk, a.ldk),
                    attn_alloc_grad(a.Tk, a.wk, a.ldk)};
    float *gs[3] = {attn_alloc_grad(a.Tq, a.wq, a.ldq), attn_alloc_grad(a.Tk, a.wk, a.ldk),
                    attn_alloc_grad(a.Tk, a.wk, a.ldk)};
    attn_kernel_backward(gw[0], gw[1], gw[2], dout, out, lse, &a, 0, a.Tk);
    for (int p = npieces - 1; p >= 0; p--) /* ring order: latest keys first */
        attn_kernel_backward(gs[0], gs[1], gs[2], dout, out, lse, &a, cuts[p], cuts[p + 1]);
    const char *names[3] = {"dq", "dk", "dv"};
    const int64_t rows[3] = {a.Tq, a.Tk, a.Tk};
    const int ws[3] = {a.wq, a.wk, a.wk}, lds[3] = {a.ldq, a.ldk, a.ldk};
    char what[160];
    for (int w = 0; w < 3; w++) {
        const int64_t n = rows[w] * ws[w];
        float *x = test_alloc(n * 4 + 4), *y = test_alloc(n * 4 + 4);
        attn_unpack(x, gs[w], rows[w], ws[w], lds[w]);
        attn_unpack(y, gw[w], rows[w], ws[w], lds[w]);
        snprintf(what, sizeof what, "%s %s over %d pieces vs whole", c->name, names[w], npieces);
        test_check_rel_f(what, x, y, n, 1e-6);
    }
}

TEST(attention_backward_split) {
    const AttnCase docs = {"bsplit_docs_causal", 4, 2, 16, 1, 0, DOCS_A, R1(0, 130), R1(0, 130)};
    const AttnCase docs64 = {"bsplit_noncausal_hd64", 4, 4, 64, 0, 3, DOCS_A, R1(3, 120), R1(3, 120)};
    const AttnCase zig = {"bsplit_zigzag_q1_k0", 4, 2, 16, 1, 2, DOCS_B, R2(50, 100, 100, 150),
                          R2(0, 50, 150, 200)};
    const int64_t two[3] = {0, 64, 130}, three[4] = {0, 40, 90, 130}, three_b[4] = {0, 30, 77, 117};
    const int64_t zig3[4] = {0, 13, 50, 100};
    attn_test_split_backward(&docs, two, 2, 1000);
    attn_test_split_backward(&docs, three, 3, 1000);
    attn_test_split_backward(&docs64, three_b, 3, 1001);
    attn_test_split_backward(&zig, zig3, 3, 1002);
}
