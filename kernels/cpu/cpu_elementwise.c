/*
 * cpu_elementwise.c — the cpu backend's per-element and per-row ops without reductions over a
 * row: the token embedding, the Gated DeltaNet gates (beta, g), Kimi Delta Attention's gates (beta, g per
 * key channel), the sigmoid output gate of the softmax attention (and of KDA's output norm), and the SwiGLU of
 * the MLP. Forward and backward of each.
 *
 * Implements the Backend entries of the same names (lib/backend/backend.h); reached through backend_cpu
 * by the model code and called directly by tests/unit/test_elementwise.c (the KDA gates: tests/unit/test_kda.c).
 *
 * Numerics: fp32, with a sigmoid that never overflows and softplus linear above 20 (torch's
 * default, docs/design/model.md), see cpu_dense_math.h. Sums over tokens (embedding and gate parameter
 * gradients) run in token order; the gate parameter sums accumulate in double and are added to
 * the fp32 gradient once per call.
 *
 * Decisions where backend.h is silent:
 *   - embedding: a negative token id is a fatal error (the vocabulary size is not passed, so ids
 *     >= V cannot be checked here; the data loader checks them).
 *   - gdn_gates_backward: db and da are written only in their nv columns; they may be column
 *     blocks of one wider buffer with the same ld (the [.. | b | a] projection gradient).
 *   - Backward outputs may alias the incoming gradient (same shape): each element is read before
 *     it is written.
 */
#include <stdint.h>
#include <stdlib.h>

#include "cpu_dense_math.h"
#include "cpu_kernels.h"
#include "core/error.h"

#define GATES_HEAD_BLOCK 64 /* heads whose parameter gradients are summed at once, on the stack */

/* ---- embedding ---------------------------------------------------------------------------- */

void cpu_embedding_forward(void *out_ /* (T,C) */, const int32_t *tokens /* (T) */, const void *wte_ /* (V,C) */,
                           int64_t T, int C) {
    RS_CHECK(T >= 0 && C > 0, "T %lld C %d", (long long)T, C);
    float *out = out_;
    const float *wte = wte_;
    for (int64_t t = 0; t < T; t++) {
        RS_CHECK(tokens[t] >= 0, "token %lld has id %d", (long long)t, tokens[t]);
        const float *row = wte + (int64_t)tokens[t] * C;
        for (int c = 0; c < C; c++) out[t * C + c] = row[c];
    }
}

void cpu_embedding_backward(float *dwte /* (V,C) += */, const void *dout_ /* (T,C) */, const int32_t *tokens /* (T) */,
                            int64_t T, int C) {
    RS_CHECK(T >= 0 && C > 0, "T %lld C %d", (long long)T, C);
    const float *dout = dout_;
    for (int64_t t = 0; t < T; t++) {
        RS_CHECK(tokens[t] >= 0, "token %lld has id %d", (long long)t, tokens[t]);
        float *row = dwte + (int64_t)tokens[t] * C;
        for (int c = 0; c < C; c++) row[c] += dout[t * C + c];
    }
}

/* ---- Gated DeltaNet gates ----------------------------------------------------------------- */

/* beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias) */
void cpu_gdn_gates_forward(float *beta /* (T,nv) */, float *g /* (T,nv) */, const void *b_ /* (T,ld) nv columns */,
                           const void *a_ /* (T,ld) nv columns */, const float *A_log /* (nv) */,
                           const float *dt_bias /* (nv) */, int64_t T, int nv, int ld) {
    RS_CHECK(T >= 0 && nv > 0 && ld >= nv, "T %lld nv %d ld %d", (long long)T, nv, ld);
    const float *b = b_, *a = a_;
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nv; h++) {
            beta[t * nv + h] = cpu_sigmoidf(b[t * ld + h]);
            g[t * nv + h] = -expf(A_log[h]) * cpu_softplusf(a[t * ld + h] + dt_bias[h]);
        }
    }
}

/* db = dbeta beta (1 - beta);  da = dg (-exp(A_log)) softplus'(a + dt_bias);  ddt_bias += da;
 * dA_log += dg g (d g / d A_log = g) */
void cpu_gdn_gates_backward(void *db_ /* (T,ld) = */, void *da_ /* (T,ld) = */, float *dA_log /* (nv) += */,
                            float *ddt_bias /* (nv) += */, const float *dbeta /* (T,nv) */, const float *dg /* (T,nv) */,
                            const void *b_ /* (T,ld) */, const void *a_ /* (T,ld) */, const float *A_log /* (nv) */,
                            const float *dt_bias /* (nv) */, int64_t T, int nv, int ld) {
    RS_CHECK(T >= 0 && nv > 0 && ld >= nv, "T %lld nv %d ld %d", (long long)T, nv, ld);
    float *db = db_, *da = da_;
    const float *b = b_, *a = a_;
    for (int h0 = 0; h0 < nv; h0 += GATES_HEAD_BLOCK) {
        int h1 = h0 + GATES_HEAD_BLOCK < nv ? h0 + GATES_HEAD_BLOCK : nv;
        double acc_A[GATES_HEAD_BLOCK] = {0}, acc_dt[GATES_HEAD_BLOCK] = {0};
        for (int64_t t = 0; t < T; t++) {
            for (int h = h0; h < h1; h++) {
                float x = a[t * ld + h] + dt_bias[h];
                float A = expf(A_log[h]);
                float dgt = dg[t * nv + h];
                float dat = dgt * -A * cpu_softplus_gradf(x);
                acc_A[h - h0] += (double)dgt * (-A * cpu_softplusf(x));
                acc_dt[h - h0] += dat;
                db[t * ld + h] = dbeta[t * nv + h] * cpu_sigmoid_gradf(b[t * ld + h]);
                da[t * ld + h] = dat;
            }
        }
        for (int h = h0; h < h1; h++) {
            dA_log[h] += (float)acc_A[h - h0];
            ddt_bias[h] += (float)acc_dt[h - h0];
        }
    }
}

/* ---- Kimi Delta Attention gates: a log-decay per key channel ------------------------------ */

/* beta = sigmoid(b); g[t,h,c] = -exp(A_log[h]) softplus(f[t,h dk + c] + dt_bias[h dk + c]) */
void cpu_kda_gates_forward(float *beta /* (T,nv) */, float *g /* (T,nv,dk) */, const void *b_ /* (T,ldb) */,
                           const void *f_ /* (T,ldf) nv*dk columns */, const float *A_log /* (nv) */,
                           const float *dt_bias /* (nv*dk) */, int64_t T, int nv, int dk, int ldb, int ldf) {
    RS_CHECK(T >= 0 && nv > 0 && dk > 0 && ldb >= nv && ldf >= nv * dk, "T %lld nv %d dk %d ldb %d ldf %d",
             (long long)T, nv, dk, ldb, ldf);
    const float *b = b_, *f = f_;
    const int w = nv * dk;
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nv; h++) {
            beta[t * nv + h] = cpu_sigmoidf(b[t * ldb + h]);
            const float A = expf(A_log[h]);
            for (int c = h * dk; c < (h + 1) * dk; c++) g[t * w + c] = -A * cpu_softplusf(f[t * ldf + c] + dt_bias[c]);
        }
    }
}

/* db = dbeta beta (1 - beta); df = dg (-exp(A_log)) softplus'(f + dt_bias); ddt_bias += df summed over tokens;
 * dA_log[h] += sum over tokens and the head's channels of dg g. Sums in double, token order. */
void cpu_kda_gates_backward(void *db_ /* (T,ldb) = */, void *df_ /* (T,ldf) = */, float *dA_log /* (nv) += */,
                            float *ddt_bias /* (nv*dk) += */, const float *dbeta /* (T,nv) */,
                            const float *dg /* (T,nv,dk) */, const void *b_ /* (T,ldb) */, const void *f_ /* (T,ldf) */,
                            const float *A_log /* (nv) */, const float *dt_bias /* (nv*dk) */, int64_t T, int nv, int dk,
                            int ldb, int ldf) {
    RS_CHECK(T >= 0 && nv > 0 && dk > 0 && ldb >= nv && ldf >= nv * dk, "T %lld nv %d dk %d ldb %d ldf %d",
             (long long)T, nv, dk, ldb, ldf);
    float *db = db_, *df = df_;
    const float *b = b_, *f = f_;
    const int w = nv * dk;
    double *acc_dt = RS_CALLOC((size_t)w, sizeof(double)), *acc_A = RS_CALLOC((size_t)nv, sizeof(double));
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nv; h++) {
            const float A = expf(A_log[h]);
            db[t * ldb + h] = dbeta[t * nv + h] * cpu_sigmoid_gradf(b[t * ldb + h]);
            for (int c = h * dk; c < (h + 1) * dk; c++) {
                const float x = f[t * ldf + c] + dt_bias[c], dgt = dg[t * w + c];
                const float dft = dgt * -A * cpu_softplus_gradf(x);
                acc_A[h] += (double)dgt * (-A * cpu_softplusf(x));
                acc_dt[c] += dft;
                df[t * ldf + c] = dft;
            }
        }
    }
    for (int h = 0; h < nv; h++) dA_log[h] += (float)acc_A[h];
    for (int c = 0; c < w; c++) ddt_bias[c] += (float)acc_dt[c];
    free(acc_dt);
    free(acc_A);
}

/* ---- sigmoid output gate (softmax attention) ---------------------------------------------- */

void cpu_sigmoid_gate_forward(void *out_ /* (T,D) */, const void *x_ /* (T,D) */, const void *gate_ /* (T,ldg) */,
                              int64_t T, int D, int ldg) {
    RS_CHECK(T >= 0 && D > 0 && ldg >= D, "T %lld D %d ldg %d", (long long)T, D, ldg);
    float *out = out_;
    const float *x = x_, *gate = gate_;
    for (int64_t t = 0; t < T; t++)
        for (int d = 0; d < D; d++) out[t * D + d] = x[t * D + d] * cpu_sigmoidf(gate[t * ldg + d]);
}

/* dx = dout s;  dgate = dout x s (1 - s) */
void cpu_sigmoid_gate_backward(void *dx_ /* (T,D) = */, void *dgate_ /* (T,ldg) = */, const void *dout_ /* (T,D) */,
                               const void *x_ /* (T,D) */, const void *gate_ /* (T,ldg) */, int64_t T, int D, int ldg) {
    RS_CHECK(T >= 0 && D > 0 && ldg >= D, "T %lld D %d ldg %d", (long long)T, D, ldg);
    float *dx = dx_, *dgate = dgate_;
    const float *dout = dout_, *x = x_, *gate = gate_;
    for (int64_t t = 0; t < T; t++) {
        for (int d = 0; d < D; d++) {
            float gv = gate[t * ldg + d], dy = dout[t * D + d], xv = x[t * D + d];
            dgate[t * ldg + d] = dy * xv * cpu_sigmoid_gradf(gv);
            dx[t * D + d] = dy * cpu_sigmoidf(gv);
        }
    }
}

/* ---- SwiGLU (MLP) ------------------------------------------------------------------------- */

/* out = silu(gate) * up, gate_up rows = [gate | up] */
void cpu_swiglu_forward(void *out_ /* (T,I) */, const void *gate_up_ /* (T,2I) */, int64_t T, int I) {
    RS_CHECK(T >= 0 && I > 0, "T %lld I %d", (long long)T, I);
    float *out = out_;
    const float *gu = gate_up_;
    for (int64_t t = 0; t < T; t++) {
        const float *gate = gu + t * 2 * I, *up = gate + I;
        for (int i = 0; i < I; i++) out[t * I + i] = cpu_siluf(gate[i]) * up[i];
    }
}

/* dgate = dout up silu'(gate);  dup = dout silu(gate);  out (when not NULL) = silu(gate) up, as the forward */
void cpu_swiglu_backward(void *dgate_up_ /* (T,2I) = */, void *out_ /* (T,I) or NULL */, const void *dout_ /* (T,I) */,
                         const void *gate_up_ /* (T,2I) */, int64_t T, int I) {
    RS_CHECK(T >= 0 && I > 0, "T %lld I %d", (long long)T, I);
    float *dgu = dgate_up_, *out = out_;
    const float *dout = dout_, *gu = gate_up_;
    for (int64_t t = 0; t < T; t++) {
        const float *gate = gu + t * 2 * I, *up = gate + I;
        float *dgate = dgu + t * 2 * I, *dup = dgate + I;
        for (int i = 0; i < I; i++) {
            float gv = gate[i], uv = up[i], dy = dout[t * I + i];
            dgate[i] = dy * uv * cpu_silu_gradf(gv);
            dup[i] = dy * cpu_siluf(gv);
            if (out) out[t * I + i] = cpu_siluf(gv) * uv;
        }
    }
}
