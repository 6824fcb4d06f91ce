/*
 * test_conv.c — per-op tests of the cpu causal depthwise conv1d + SiLU
 * (kernels/cpu/cpu_conv.c), run by build/test_ops under pytest.
 *
 * A case is a packed sample (document lengths), a global pre-conv input X of
 * it, and a fragment [lo, hi) of its rows that the kernel sees as `inp`, with
 * the Kc-1 rows before lo as `halo` (or NULL). The float64 reference works on
 * global rows with its own document index per row: tap b of row g reads
 * X[g-b] when row g-b is readable (>= lo, or >= lo-Kc+1 when a halo is
 * passed) and in the same document as g, else 0; then SiLU. Gradients are
 * central finite differences of L = sum(y * R) with respect to X (the
 * fragment rows give dinp, the halo rows dhalo) and w.
 *
 * Bounds (relative L2 error; measured maxima in brackets):
 *   forward vs float64:                1e-6  [8.6e-8] at most Kc = 4 fp32
 *                                             products and an fp32 exp
 *   dinp, dhalo vs float64 central FD: 1e-6  [2.2e-7] FD error ~1e-10
 *   dw vs float64 central FD:          2e-6  [4.0e-7] fp32 sums over <= 130
 *                                             tokens
 *   two backward calls: dinp, dhalo    0     written, not accumulated
 *                       dw vs 2x       2e-6  [3.2e-7]
 *   halo property (fragment vs whole): 0     the same fp32 operations in the
 *                                             same order: bitwise equal
 * Inputs are NaN-poisoned where they must not be read (ld gaps, halo rows
 * before the sample), outputs are NaN-poisoned before the call (dinp and
 * dhalo entirely, since they are written).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test_strided.h"
#include "test_util.h"

typedef struct {
    const char *name;
    int C, Kc;
    int docs[12];   /* document lengths of the packed sample, 0-terminated */
    int64_t lo, hi; /* the fragment: global rows [lo, hi) */
    int halo;       /* pass the Kc-1 rows before lo as the halo (else NULL) */
    int pad;        /* extra NaN-poisoned columns in ldi and ldo */
} ConvCase;

typedef struct {
    const ConvCase *c;
    int64_t T;            /* fragment rows */
    int ldi, ldo;
    int32_t *doc_pos;     /* (T) kernel metadata */
    int32_t *doc_id;      /* (hi) document index of every global row, reference only */
    double *X;            /* (hi, C) global pre-conv input */
    double *w;            /* (C, Kc) */
    double *R;            /* (T, C) */
    double *ref_y;        /* (T, C) reference scratch */
    float *inpf, *halof, *wf;
} ConvData;

static float *conv_alloc_poisoned(int64_t n) {
    float *x = test_alloc(n * (int64_t)sizeof(float) + 4);
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

static int conv_setup(ConvData *a, const ConvCase *c, uint64_t seed) {
    memset(a, 0, sizeof(*a));
    a->c = c;
    const int C = c->C, Kc = c->Kc;
    const int64_t hi = c->hi, lo = c->lo, T = hi - lo;
    a->T = T;
    a->ldi = C + c->pad;
    a->ldo = C + 2 * c->pad;
    a->doc_id = test_alloc(hi * 4 + 4);
    a->doc_pos = test_alloc(T * 4 + 4);
    int64_t start = 0;
    int id = 0;
    for (int64_t g = 0; g < hi; g++) {
        while (c->docs[id] && start + c->docs[id] <= g) start += c->docs[id++];
        if (!c->docs[id]) {
            EXPECT(0, "%s: row %lld beyond the sample", c->name, (long long)g);
            return 0;
        }
        a->doc_id[g] = id;
        if (g >= lo) a->doc_pos[g - lo] = (int32_t)(g - start);
    }
    test_rng_seed(seed);
    float *tmp = test_alloc(hi * C * 4 + Kc * C * 4 + 4);
    a->X = test_alloc(hi * C * 8 + 8);
    a->w = test_alloc(C * Kc * 8 + 8);
    a->R = test_alloc(T * C * 8 + 8);
    a->ref_y = test_alloc(T * C * 8 + 8);
    test_fill_normal(tmp, hi * C, 1.0); test_to_double(a->X, tmp, hi * C);
    test_fill_normal(tmp, C * Kc, 0.7); test_to_double(a->w, tmp, C * Kc);
    test_fill_normal(tmp, T * C, 1.0); test_to_double(a->R, tmp, T * C);
    a->inpf = conv_alloc_poisoned(T * a->ldi);
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < C; i++) a->inpf[t * a->ldi + i] = (float)a->X[(lo + t) * C + i];
    a->wf = test_alloc(C * Kc * 4 + 4);
    test_to_float(a->wf, a->w, C * Kc);
    if (c->halo) {
        a->halof = conv_alloc_poisoned((Kc - 1) * C); /* rows before the sample stay NaN: never read */
        for (int r = 0; r < Kc - 1; r++) {
            const int64_t g = lo - (Kc - 1) + r;
            if (g >= 0)
                for (int i = 0; i < C; i++) a->halof[r * C + i] = (float)a->X[g * C + i];
        }
    }
    return 1;
}

/* float64 reference over global rows: y[t] for rows lo+t of the fragment */
static void ref_conv(double *y /* (T,C) */, const ConvData *a) {
    const ConvCase *c = a->c;
    const int C = c->C, Kc = c->Kc;
    const int64_t first = c->halo ? c->lo - (Kc - 1) : c->lo; /* first readable global row */
    for (int64_t t = 0; t < a->T; t++) {
        const int64_t g = c->lo + t;
        for (int i = 0; i < C; i++) {
            double u = 0;
            for (int j = 0; j < Kc; j++) {
                const int64_t src = g - (Kc - 1 - j);
                if (src < 0 || src < first || a->doc_id[src] != a->doc_id[g]) continue;
                u += a->w[i * Kc + j] * a->X[src * C + i];
            }
            y[t * C + i] = u / (1 + exp(-u));
        }
    }
}

static double conv_loss(void *ctx, double *x) {
    (void)x;
    ConvData *a = ctx;
    ref_conv(a->ref_y, a);
    double L = 0;
    for (int64_t i = 0; i < a->T * a->c->C; i++) L += a->ref_y[i] * a->R[i];
    return L;
}

static void conv_check_gaps(const char *what, const float *x, int64_t T, int w, int ld) {
    for (int64_t t = 0; t < T; t++)
        for (int i = w; i < ld; i++)
            if (!isnan(x[t * ld + i])) {
                EXPECT(0, "%s: gap element (%lld,%d) was written", what, (long long)t, i);
                return;
            }
}

static void conv_unpack(float *dst /* (T,w) */, const float *src /* (T,ld) */, int64_t T, int w, int ld) {
    for (int64_t t = 0; t < T; t++) memcpy(dst + t * w, src + t * ld, (size_t)w * sizeof(float));
}

static void conv_test_case(const ConvCase *c, uint64_t seed) {
    ConvData a;
    if (!conv_setup(&a, c, seed)) return;
    const int C = c->C, Kc = c->Kc;
    const int64_t T = a.T, lo = c->lo;
    char what[200], tag[120];
    snprintf(tag, sizeof tag, "%s (T %lld C %d Kc %d halo %s)", c->name, (long long)T, C, Kc,
             c->halo ? "yes" : "NULL");

    /* forward */
    float *out = conv_alloc_poisoned(T * a.ldo), *y = test_alloc(T * C * 4 + 4);
    cpu_conv1d_silu_forward(out, a.inpf, a.halof, a.wf, a.doc_pos, T, C, Kc, a.ldi, a.ldo);
    ref_conv(a.ref_y, &a);
    conv_unpack(y, out, T, C, a.ldo);
    snprintf(what, sizeof what, "%s fwd", tag);
    test_check_rel(what, y, a.ref_y, T * C, 1e-6);
    conv_check_gaps(what, out, T, C, a.ldo);

    /* backward: dinp and dhalo poisoned entirely (they are written), dw starts at 0 */
    const int nh = c->halo ? Kc - 1 : 0;
    float *dout = conv_alloc_poisoned(T * a.ldo);
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < C; i++) dout[t * a.ldo + i] = (float)a.R[t * C + i];
    float *dinp = conv_alloc_poisoned(T * a.ldi), *dhalo = c->halo ? conv_alloc_poisoned(nh * C) : NULL;
    float *dw = test_alloc(C * Kc * 4 + 4);
    cpu_conv1d_silu_backward(dinp, dhalo, dw, dout, a.inpf, a.halof, a.wf, a.doc_pos, T, C, Kc, a.ldi, a.ldo);

    /* FD over the global rows [lo - nh, hi) (dhalo rows first, then dinp rows) and over w */
    const int64_t g0 = lo - nh;
    double *fd = test_alloc((T + nh) * C * 8 + 8);
    float *got = test_alloc((T + nh) * C * 4 + 4);
    int64_t n_halo_live = 0;
    for (int r = 0; r < nh; r++) {
        if (g0 + r < 0) { /* a halo row before the sample: nothing reads it, its gradient is 0 */
            for (int i = 0; i < C; i++) fd[r * C + i] = 0;
            continue;
        }
        n_halo_live++;
        test_fd_grad(fd + r * C, conv_loss, &a, a.X + (g0 + r) * C, C, NULL, 0, 1e-5);
    }
    test_fd_grad(fd + nh * C, conv_loss, &a, a.X + lo * C, T * C, NULL, 0, 1e-5);
    if (nh) {
        snprintf(what, sizeof what, "%s dhalo vs FD (%lld live rows)", tag, (long long)n_halo_live);
        test_check_rel(what, dhalo, fd, nh * C, 1e-6);
    }
    conv_unpack(got, dinp, T, C, a.ldi);
    snprintf(what, sizeof what, "%s dinp vs FD", tag);
    test_check_rel(what, got, fd + nh * C, T * C, 1e-6);
    conv_check_gaps(what, dinp, T, C, a.ldi);
    double *fdw = test_alloc(C * Kc * 8 + 8);
    test_fd_grad(fdw, conv_loss, &a, a.w, C * Kc, NULL, 0, 1e-5);
    snprintf(what, sizeof what, "%s dw vs FD", tag);
    test_check_rel(what, dw, fdw, C * Kc, 2e-6);

    /* a second call: dinp and dhalo are written again (same values), dw accumulates */
    float *dinp1 = test_alloc(T * C * 4 + 4), *dhalo1 = test_alloc(nh * C * 4 + 4), *dw2 = test_alloc(C * Kc * 4 + 4);
    memcpy(dinp1, got, (size_t)(T * C) * sizeof(float));
    if (nh) memcpy(dhalo1, dhalo, (size_t)(nh * C) * sizeof(float));
    for (int i = 0; i < C * Kc; i++) dw2[i] = 2.0f * dw[i];
    cpu_conv1d_silu_backward(dinp, dhalo, dw, dout, a.inpf, a.halof, a.wf, a.doc_pos, T, C, Kc, a.ldi, a.ldo);
    conv_unpack(got, dinp, T, C, a.ldi);
    snprintf(what, sizeof what, "%s dinp second call (=)", tag);
    test_check_rel_f(what, got, dinp1, T * C, 0);
    if (nh) {
        snprintf(what, sizeof what, "%s dhalo second call (=)", tag);
        test_check_rel_f(what, dhalo, dhalo1, nh * C, 0);
    }
    snprintf(what, sizeof what, "%s dw after two calls vs 2x (+=)", tag);
    test_check_rel_f(what, dw, dw2, C * Kc, 2e-6);
}

/* documents 10,1,2,30,3,1,1,60: boundaries at 10 11 13 43 46 47 48 108 (1-token documents at 10, 46, 47) */
#define DOCS_C {10, 1, 2, 30, 3, 1, 1, 60, 1000}

TEST(conv_forward_backward_whole) {
    /* fragments starting at row 0 (no halo), every kernel width, several lengths */
    const int Ts[4] = {1, 5, 33, 130}, Kcs[3] = {1, 2, 4};
    int n = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int ki = 0; ki < 3; ki++) {
            ConvCase c = {"whole_one_doc", 3, Kcs[ki], {1000}, 0, Ts[ti], 0, 0};
            conv_test_case(&c, 100 + n++);
            ConvCase d = {"whole_docs", 4, Kcs[ki], DOCS_C, 0, Ts[ti], 0, 1};
            conv_test_case(&d, 100 + n++);
        }
}

TEST(conv_forward_backward_fragments) {
    const ConvCase cases[] = {
        /* the halo rows 8,9,10 end with a 1-token document; the fragment's document starts at its row 0 */
        {"frag_doc_at_start", 4, 4, DOCS_C, 11, 44, 1, 0},
        /* the fragment's first row has doc_pos 1: only the last halo row is read, and only by row 0 */
        {"frag_doc_at_minus1", 4, 4, DOCS_C, 12, 45, 1, 2},
        /* documents start at fragment rows 2, 3, 4 (inside the first Kc-1 rows) */
        {"frag_docs_inside_halo_reach", 5, 4, DOCS_C, 44, 49, 1, 0},
        {"frag_t1", 4, 4, DOCS_C, 47, 48, 1, 0},
        {"frag_long", 3, 4, DOCS_C, 20, 150, 1, 3},
        {"frag_long_kc2", 3, 2, DOCS_C, 20, 150, 1, 0},
        {"frag_kc1", 3, 1, DOCS_C, 20, 53, 1, 1},
        /* halo NULL: the rows before the fragment read zeros */
        {"frag_no_halo", 4, 4, DOCS_C, 20, 53, 0, 2},
        /* halo rows before the sample's start (row -1, -2): NaN, never read, gradient 0 */
        {"frag_lo1", 4, 4, DOCS_C, 1, 34, 1, 0},
        {"frag_one_doc", 8, 4, {1000}, 64, 130, 1, 0},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) conv_test_case(&cases[i], 200 + i);
}

/* The conv over [T1, Tg) with halo = rows [T1-Kc+1, T1) equals rows [T1, Tg) of the conv over [0, Tg);
 * its dinp equals the whole backward's dinp on those rows, its dhalo equals what the whole backward gives
 * the halo rows when only outputs [T1, Tg) carry a gradient, and so does dw. */
static void conv_test_halo_property(int C, int Kc, const int *docs, int64_t Tg, int64_t T1, uint64_t seed) {
    const int nh = Kc - 1;
    const int64_t T = Tg - T1;
    int32_t *doc_pos = test_alloc(Tg * 4);
    int64_t start = 0;
    int id = 0;
    for (int64_t g = 0; g < Tg; g++) {
        while (start + docs[id] <= g) start += docs[id++];
        doc_pos[g] = (int32_t)(g - start);
    }
    test_rng_seed(seed);
    float *X = test_alloc(Tg * C * 4), *w = test_alloc(C * Kc * 4), *R = test_alloc(Tg * C * 4);
    test_fill_normal(X, Tg * C, 1.0);
    test_fill_normal(w, C * Kc, 0.7);
    test_fill_normal(R, Tg * C, 1.0);
    char what[160], tag[100];
    snprintf(tag, sizeof tag, "halo C %d Kc %d T1 %lld doc_pos[T1] %d", C, Kc, (long long)T1, doc_pos[T1]);

    float *y_all = test_alloc(Tg * C * 4), *y_frag = test_alloc(T * C * 4);
    cpu_conv1d_silu_forward(y_all, X, NULL, w, doc_pos, Tg, C, Kc, C, C);
    cpu_conv1d_silu_forward(y_frag, X + T1 * C, X + (T1 - nh) * C, w, doc_pos + T1, T, C, Kc, C, C);
    snprintf(what, sizeof what, "%s: fwd fragment vs whole", tag);
    test_check_rel_f(what, y_frag, y_all + T1 * C, T * C, 0);

    /* the whole backward with the gradient only on outputs [T1, Tg) */
    float *R_tail = test_alloc(Tg * C * 4);
    memcpy(R_tail + T1 * C, R + T1 * C, (size_t)(T * C) * sizeof(float));
    float *dinp_all = test_alloc(Tg * C * 4), *dw_all = test_alloc(C * Kc * 4);
    cpu_conv1d_silu_backward(dinp_all, NULL, dw_all, R_tail, X, NULL, w, doc_pos, Tg, C, Kc, C, C);
    float *dinp = conv_alloc_poisoned(T * C), *dhalo = conv_alloc_poisoned(nh * C), *dw = test_alloc(C * Kc * 4);
    cpu_conv1d_silu_backward(dinp, dhalo, dw, R + T1 * C, X + T1 * C, X + (T1 - nh) * C, w, doc_pos + T1, T, C, Kc,
                             C, C);
    snprintf(what, sizeof what, "%s: dinp fragment vs whole", tag);
    test_check_rel_f(what, dinp, dinp_all + T1 * C, T * C, 0);
    if (nh) {
        snprintf(what, sizeof what, "%s: dhalo vs the whole dinp of the halo rows", tag);
        test_check_rel_f(what, dhalo, dinp_all + (T1 - nh) * C, nh * C, 0);
    }
    snprintf(what, sizeof what, "%s: dw fragment vs whole", tag);
    test_check_rel_f(what, dw, dw_all, C * Kc, 0);

    /* halo NULL reads zeros: the same as passing zero rows, and dhalo is still their gradient */
    float *zeros = test_alloc(nh * C * 4 + 4), *y0 = test_alloc(T * C * 4), *y1 = test_alloc(T * C * 4);
    float *dh0 = conv_alloc_poisoned(nh * C), *dh1 = conv_alloc_poisoned(nh * C);
    float *di0 = test_alloc(T * C * 4), *di1 = test_alloc(T * C * 4);
    float *dw0 = test_alloc(C * Kc * 4), *dw1 = test_alloc(C * Kc * 4);
    cpu_conv1d_silu_forward(y0, X + T1 * C, NULL, w, doc_pos + T1, T, C, Kc, C, C);
    cpu_conv1d_silu_forward(y1, X + T1 * C, zeros, w, doc_pos + T1, T, C, Kc, C, C);
    cpu_conv1d_silu_backward(di0, dh0, dw0, R + T1 * C, X + T1 * C, NULL, w, doc_pos + T1, T, C, Kc, C, C);
    cpu_conv1d_silu_backward(di1, dh1, dw1, R + T1 * C, X + T1 * C, zeros, w, doc_pos + T1, T, C, Kc, C, C);
    snprintf(what, sizeof what, "%s: halo NULL vs zero rows (fwd, dinp, dhalo, dw)", tag);
    test_check_rel_f(what, y0, y1, T * C, 0);
    test_check_rel_f(what, di0, di1, T * C, 0);
    if (nh) test_check_rel_f(what, dh0, dh1, nh * C, 0);
    test_check_rel_f(what, dw0, dw1, C * Kc, 0);

    /* when the fragment starts a document, no tap may read the halo: NaN rows change nothing */
    if (doc_pos[T1] == 0 && nh) {
        float *nan_halo = conv_alloc_poisoned(nh * C), *y2 = test_alloc(T * C * 4);
        cpu_conv1d_silu_forward(y2, X + T1 * C, nan_halo, w, doc_pos + T1, T, C, Kc, C, C);
        snprintf(what, sizeof what, "%s: NaN halo ignored at a document start", tag);
        test_check_rel_f(what, y2, y_all + T1 * C, T * C, 0);
        float *dw3 = test_alloc(C * Kc * 4), *di3 = test_alloc(T * C * 4);
        cpu_conv1d_silu_backward(di3, dhalo, dw3, R + T1 * C, X + T1 * C, nan_halo, w, doc_pos + T1, T, C, Kc, C,
                                 C);
        test_check_rel_f(what, dw3, dw_all, C * Kc, 0);
        for (int i = 0; i < nh * C; i++)
            EXPECT(dhalo[i] == 0.0f, "%s: dhalo[%d] = %g, want 0 (no tap reaches the halo)", what, i, dhalo[i]);
    }
}

TEST(conv_halo_property) {
    const int docs[] = DOCS_C;
    /* Kc = 4: T1 = Kc-1; documents starting at T1 (10, 11), at T1-1 (12), at T1+2..T1+4 (44), at T1+1 (45, 46) */
    const int64_t T1s4[] = {3, 10, 11, 12, 13, 44, 45, 46, 47, 100};
    for (int i = 0; i < (int)(sizeof T1s4 / sizeof T1s4[0]); i++) conv_test_halo_property(5, 4, docs, 120, T1s4[i], 300 + i);
    const int64_t T1s2[] = {1, 10, 11, 44, 47, 100};
    for (int i = 0; i < (int)(sizeof T1s2 / sizeof T1s2[0]); i++) conv_test_halo_property(5, 2, docs, 120, T1s2[i], 400 + i);
    conv_test_halo_property(3, 1, docs, 60, 11, 500);
}

/* gdn_conv_split_forward/backward (the GDN layer's conv fused with the split after it) are, on cpu, the conv and
 * the split through a scratch buffer: bitwise those two calls, on proj rows [q|k|v|z|gates] whose gates' columns
 * and pads must stay untouched, with a halo, its gradient and documents (one starting inside the halo's reach) */
TEST(gdn_conv_split_is_conv_then_split) {
    const int64_t T = 29;
    const int nk = 2, dk = 8, Vd = 12, Kc = 4, Kd2 = 2 * nk * dk, Cc = Kd2 + Vd, ldp = Cc + Vd + 6;
    int32_t doc_pos[29];
    for (int64_t t = 0; t < T; t++) doc_pos[t] = t < 2 ? 7 + (int)t : t < 11 ? (int)t - 2 : (int)t - 11;
    TestStrided proj = test_strided_new(T, Cc + Vd, ldp);
    test_strided_fill_normal(&proj, 1.0);
    float *halo = test_alloc((Kc - 1) * Cc * (int64_t)sizeof(float)), *w = test_alloc(Cc * Kc * (int64_t)sizeof(float));
    test_fill_normal(halo, (Kc - 1) * Cc, 1.0);
    test_fill_normal(w, Cc * Kc, 0.7);
    TestStrided qk = test_strided_new(T, Kd2, Kd2), v = test_strided_new(T, Vd, Vd), z = test_strided_new(T, Vd, Vd);
    float *rstd = test_alloc(T * 2 * nk * (int64_t)sizeof(float));
    cpu_gdn_conv_split_forward(qk.p, rstd, v.p, z.p, proj.p, halo, w, doc_pos, T, nk, dk, Vd, Kc, ldp);
    float *conv = test_alloc(T * Cc * (int64_t)sizeof(float)), *qk0 = test_alloc(T * Kd2 * (int64_t)sizeof(float));
    float *rstd0 = test_alloc(T * 2 * nk * (int64_t)sizeof(float)), *v0 = test_alloc(T * Vd * (int64_t)sizeof(float));
    float *z0 = test_alloc(T * Vd * (int64_t)sizeof(float));
    cpu_conv1d_silu_forward(conv, proj.p, halo, w, doc_pos, T, Cc, Kc, ldp, Cc);
    cpu_gdn_split_forward(qk0, rstd0, v0, z0, conv, proj.p + Cc, T, nk, dk, Vd, Cc, ldp);
    EXPECT(!memcmp(qk.p, qk0, (size_t)(T * Kd2) * 4), "gdn_conv_split fwd qk differs from conv + split");
    EXPECT(!memcmp(rstd, rstd0, (size_t)(T * 2 * nk) * 4), "gdn_conv_split fwd rstd differs");
    EXPECT(!memcmp(v.p, v0, (size_t)(T * Vd) * 4), "gdn_conv_split fwd v differs");
    EXPECT(!memcmp(z.p, z0, (size_t)(T * Vd) * 4), "gdn_conv_split fwd z differs");
    test_strided_intact("gdn_conv_split fwd qk", &qk);

    float *dqk = test_alloc(T * Kd2 * (int64_t)sizeof(float)), *dv = test_alloc(T * Vd * (int64_t)sizeof(float));
    float *dz = test_alloc(T * Vd * (int64_t)sizeof(float)), *dw = test_alloc(Cc * Kc * (int64_t)sizeof(float));
    float *dw0 = test_alloc(Cc * Kc * (int64_t)sizeof(float));
    test_fill_normal(dqk, T * Kd2, 1.0);
    test_fill_normal(dv, T * Vd, 1.0);
    test_fill_normal(dz, T * Vd, 1.0);
    test_fill_normal(dw, Cc * Kc, 0.1);
    memcpy(dw0, dw, (size_t)(Cc * Kc) * 4);
    TestStrided dproj = test_strided_new(T, Cc + Vd, ldp), dproj0 = test_strided_new(T, Cc + Vd, ldp);
    float *dhalo = conv_alloc_poisoned((Kc - 1) * Cc), *dhalo0 = conv_alloc_poisoned((Kc - 1) * Cc);
    cpu_gdn_conv_split_backward(dproj.p, dhalo, dw, dqk, qk.p, rstd, dv, dz, proj.p, halo, w, doc_pos, T, nk, dk, Vd,
                                Kc, ldp);
    float *dconv = test_alloc(T * Cc * (int64_t)sizeof(float));
    cpu_gdn_split_backward(dconv, dproj0.p + Cc, dqk, qk.p, rstd, dv, dz, T, nk, dk, Vd, Cc, ldp);
    cpu_conv1d_silu_backward(dproj0.p, dhalo0, dw0, dconv, proj.p, halo, w, doc_pos, T, Cc, Kc, ldp, Cc);
    for (int64_t t = 0; t < T; t++)
        EXPECT(!memcmp(dproj.p + t * ldp, dproj0.p + t * ldp, (size_t)(Cc + Vd) * 4),
               "gdn_conv_split bwd dproj row %lld differs from split + conv", (long long)t);
    EXPECT(!memcmp(dhalo, dhalo0, (size_t)((Kc - 1) * Cc) * 4), "gdn_conv_split bwd dhalo differs");
    EXPECT(!memcmp(dw, dw0, (size_t)(Cc * Kc) * 4), "gdn_conv_split bwd dw differs");
    test_strided_intact("gdn_conv_split bwd dproj (the gates' columns untouched)", &dproj);
}
