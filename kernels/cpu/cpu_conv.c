/*
 * cpu_conv.c — the causal depthwise conv1d + SiLU of the Gated DeltaNet layer (docs/design/model.md),
 * cpu backend: fp32, plain loops, deterministic. Called through backend_cpu (lib/backend/backend.h:
 * conv1d_silu_forward, conv1d_silu_backward) by the GDN layer over its [q|k|v] channels, and by
 * tests/unit/test_conv.c. The GDN layer's conv and split fused (gdn_conv_split_forward/backward) are
 * here the oracle of the cuda kernel: the conv and cpu_norm.c's gdn_split in sequence through a scratch
 * (T, Cc) buffer, the same values bitwise as the unfused calls.
 *
 * Per channel c and token t, with lookback b = Kc-1-j for tap j (tap Kc-1 the current token):
 *   u[t,c] = sum_j w[c,j] x(t-b, c),   y[t,c] = silu(u[t,c]) = u sigmoid(u)
 *   x(t-b) = inp[t-b] when t-b >= 0, else halo[Kc-1 + t-b] (the previous CP fragment's last Kc-1
 *            pre-conv rows; halo NULL = zeros),
 * and every tap with b > doc_pos[t] reads 0 (it lies before the token's document), so a document starting
 * inside the first Kc-1 rows ignores the halo. Taps are summed in fp32 from the oldest to the current.
 *
 * Backward recomputes u and, with du = dout silu'(u), silu'(u) = s (1 + u (1 - s)), s = sigmoid(u):
 * dinp[t-b] (or dhalo[Kc-1+t-b] when t-b < 0) gets w[c,j] du[t,c] and dw[c,j] += du[t,c] x(t-b, c), for
 * every tap the forward used. Tokens are walked in increasing t and scatter into the rows they read: row
 * t is written (=) by its own tap b = 0 before later tokens add to it, so dinp is written, not
 * accumulated, each element summing its terms in the order b = 0 .. Kc-1. dhalo (when not NULL) is
 * zeroed first; it does not depend on the halo values, so with halo NULL it is still the gradient of
 * those rows. dw accumulates (+=) in token order.
 *
 * Layout: inp/dinp rows of stride ldi, out/dout ldo, halo/dhalo dense (Kc-1, C), w (C, Kc) row-major (the
 * HF conv1d.weight [C,1,Kc]). dinp must not alias inp. Kc <= CONV_KC_MAX, checked.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "core/error.h"

#define CONV_KC_MAX 16

static void conv_check_sizes(int64_t T, int C, int Kc, int ldi, int ldo) {
    RS_CHECK(T >= 0 && C > 0, "conv1d_silu: T = %lld, C = %d", (long long)T, C);
    RS_CHECK(Kc >= 1 && Kc <= CONV_KC_MAX, "conv1d_silu: Kc = %d (the cpu kernel supports 1..%d)", Kc, CONV_KC_MAX);
    RS_CHECK(ldi >= C && ldo >= C, "conv1d_silu: ldi = %d, ldo = %d, need >= C = %d", ldi, ldo, C);
}

/* The rows token t reads, by lookback b = 0..Kc-1: rows[b] = x(t-b) as a pointer to C values, or NULL
 * where the tap reads zeros (before the document, or a halo row with halo NULL). Returns the largest
 * usable lookback, min(Kc-1, doc_pos[t]). */
static int conv_rows_of(const float *rows[CONV_KC_MAX], const float *inp /* (T,ldi) */,
                        const float *halo /* (Kc-1,C) or NULL */, int64_t t, int32_t doc_pos, int C, int Kc,
                        int ldi) {
    RS_CHECK(doc_pos >= 0, "conv1d_silu: doc_pos[%lld] = %d < 0", (long long)t, doc_pos);
    const int nb = doc_pos < Kc - 1 ? doc_pos : Kc - 1;
    for (int b = 0; b < Kc; b++) {
        if (b > nb) rows[b] = NULL;
        else if (t - b >= 0) rows[b] = inp + (t - b) * ldi;
        else rows[b] = halo ? halo + (Kc - 1 + t - b) * (int64_t)C : NULL;
    }
    return nb;
}

/* u[t,c] from the rows of conv_rows_of, oldest tap first */
static float conv_preact(const float *const rows[CONV_KC_MAX], const float *wc /* (Kc) */, int c, int nb, int Kc) {
    float u = 0.0f;
    for (int b = nb; b >= 0; b--)
        if (rows[b]) u += wc[Kc - 1 - b] * rows[b][c];
    return u;
}

void cpu_conv1d_silu_forward(void *out_ /* (T,ldo) */, const void *inp_ /* (T,ldi) */,
                             const void *halo_ /* (Kc-1,C) or NULL */, const void *w_ /* (C,Kc) */,
                             const int32_t *doc_pos /* (T) */, int64_t T, int C, int Kc, int ldi, int ldo) {
    conv_check_sizes(T, C, Kc, ldi, ldo);
    float *out = out_;
    const float *inp = inp_, *halo = halo_, *w = w_;
    const float *rows[CONV_KC_MAX];
    for (int64_t t = 0; t < T; t++) {
        const int nb = conv_rows_of(rows, inp, halo, t, doc_pos[t], C, Kc, ldi);
        float *ot = out + t * ldo;
        for (int c = 0; c < C; c++) {
            const float u = conv_preact(rows, w + (int64_t)c * Kc, c, nb, Kc);
            ot[c] = u / (1.0f + expf(-u));
        }
    }
}

void cpu_conv1d_silu_backward(void *dinp_ /* (T,ldi) = */, void *dhalo_ /* (Kc-1,C) = or NULL */,
                              float *dw /* (C,Kc) += */, const void *dout_ /* (T,ldo) */,
                              const void *inp_ /* (T,ldi) */, const void *halo_ /* (Kc-1,C) or NULL */,
                              const void *w_ /* (C,Kc) */, const int32_t *doc_pos /* (T) */, int64_t T, int C,
                              int Kc, int ldi, int ldo) {
    conv_check_sizes(T, C, Kc, ldi, ldo);
    float *dinp = dinp_, *dhalo = dhalo_;
    const float *dout = dout_, *inp = inp_, *halo = halo_, *w = w_;
    if (dhalo && Kc > 1) memset(dhalo, 0, (size_t)(Kc - 1) * (size_t)C * sizeof(float));
    const float *rows[CONV_KC_MAX];
    float *drows[CONV_KC_MAX]; /* where the gradient of rows[b] goes; NULL = dropped */
    for (int64_t t = 0; t < T; t++) {
        const int nb = conv_rows_of(rows, inp, halo, t, doc_pos[t], C, Kc, ldi);
        for (int b = 0; b <= nb; b++) {
            if (t - b >= 0) drows[b] = dinp + (t - b) * ldi;
            else drows[b] = dhalo ? dhalo + (Kc - 1 + t - b) * (int64_t)C : NULL;
        }
        const float *dout_t = dout + t * ldo;
        for (int c = 0; c < C; c++) {
            const float *wc = w + (int64_t)c * Kc;
            float *dwc = dw + (int64_t)c * Kc;
            const float u = conv_preact(rows, wc, c, nb, Kc);
            const float s = 1.0f / (1.0f + expf(-u));
            const float du = dout_t[c] * s * (1.0f + u * (1.0f - s));
            drows[0][c] = wc[Kc - 1] * du; /* b = 0: the first write of dinp[t] */
            dwc[Kc - 1] += du * rows[0][c];
            for (int b = 1; b <= nb; b++) {
                if (drows[b]) drows[b][c] += wc[Kc - 1 - b] * du;
                if (rows[b]) dwc[Kc - 1 - b] += du * rows[b][c];
            }
        }
    }
}

/* ---- the GDN conv + split (backend.h gdn_conv_split_*): the unfused calls through scratch ----------- */

void cpu_gdn_conv_split_forward(void *qk /* (T,2nk dk) */, float *qk_rstd /* (T,2nk) */, void *v /* (T,Vd) */,
                                void *z /* (T,Vd) */, const void *proj /* (T,ldp) [q|k|v|z] */,
                                const void *halo /* (Kc-1,Cc) or NULL */, const void *w /* (Cc,Kc) */,
                                const int32_t *doc_pos /* (T) */, int64_t T, int nk, int dk, int Vd, int Kc, int ldp) {
    const int Cc = 2 * nk * dk + Vd;
    RS_CHECK(T >= 0 && nk > 0 && dk > 0 && Vd > 0 && ldp >= Cc + Vd,
             "gdn_conv_split: T %lld nk %d dk %d Vd %d ldp %d (need ldp >= Cc + Vd = %d)", (long long)T, nk, dk, Vd,
             ldp, Cc + Vd);
    float *conv = RS_MALLOC((size_t)(T > 0 ? T : 1) * (size_t)Cc * sizeof(float)); /* (T,Cc) */
    cpu_conv1d_silu_forward(conv, proj, halo, w, doc_pos, T, Cc, Kc, ldp, Cc);
    cpu_gdn_split_forward(qk, qk_rstd, v, z, conv, (const float *)proj + Cc, T, nk, dk, Vd, Cc, ldp);
    free(conv);
}

void cpu_gdn_conv_split_backward(void *dproj /* (T,ldp) = */, void *dhalo /* (Kc-1,Cc) = or NULL */,
                                 float *dw /* (Cc,Kc) += */, const void *dqk /* (T,2nk dk) */,
                                 const void *qk /* (T,2nk dk) */, const float *qk_rstd /* (T,2nk) */,
                                 const void *dv /* (T,Vd) */, const void *dz /* (T,Vd) */,
                                 const void *proj /* (T,ldp) */, const void *halo /* (Kc-1,Cc) or NULL */,
                                 const void *w /* (Cc,Kc) */, const int32_t *doc_pos /* (T) */, int64_t T, int nk,
                                 int dk, int Vd, int Kc, int ldp) {
    const int Cc = 2 * nk * dk + Vd;
    RS_CHECK(T >= 0 && nk > 0 && dk > 0 && Vd > 0 && ldp >= Cc + Vd,
             "gdn_conv_split: T %lld nk %d dk %d Vd %d ldp %d (need ldp >= Cc + Vd = %d)", (long long)T, nk, dk, Vd,
             ldp, Cc + Vd);
    float *dconv = RS_MALLOC((size_t)(T > 0 ? T : 1) * (size_t)Cc * sizeof(float)); /* (T,Cc) */
    cpu_gdn_split_backward(dconv, (float *)dproj + Cc, dqk, qk, qk_rstd, dv, dz, T, nk, dk, Vd, Cc, ldp);
    cpu_conv1d_silu_backward(dproj, dhalo, dw, dconv, proj, halo, w, doc_pos, T, Cc, Kc, ldp, Cc);
    free(dconv);
}
