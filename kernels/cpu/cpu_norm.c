/*
 * cpu_norm.c — the cpu backend's normalisations, forward and backward:
 *   RMSNorm        y = x * rstd * (1 + w) (zero_centred: the layer norms and q/k norms of
 *                  Qwen3-Next) or x * rstd * w (plain), rstd = 1/sqrt(mean(x^2) + eps), over rows
 *                  of D, nh rows per token (nh = 1 for the layer norms, heads for q_norm/k_norm,
 *                  whose rows sit inside the wider attention projection: ldi, ldo).
 *   L2 norm        y = x * rstd, rstd = 1/sqrt(sum(x^2) + 1e-6) (eps on the SUM, docs/design/model.md),
 *                  per head of the GDN q and k.
 *   gated RMSNorm  y = w * (x * rstd) * silu(z), rstd over dv per (token, value head), plain w
 *                  shared by the heads (the GDN output norm, docs/design/model.md).
 *   GDN split      the L2 norm of q, k with the v and z copies the GDN layer makes after its conv
 *                  (here the L2 norm and two copies, bitwise the unfused calls; called by cpu_conv.c's
 *                  gdn_conv_split_*, the Backend entry that fuses the conv with it).
 * Implements the Backend entries of the same names (lib/backend/backend.h) but the split; reached through
 * backend_cpu by the model code and called directly by tests/unit/test_norm.c.
 *
 * Numerics: fp32 in and out. Row reductions (sums of squares, the dot products of the backward)
 * accumulate in double in index order; the rstd handed back is rounded to fp32 and the forward
 * itself uses that rounded value, so forward and backward see the same statistic. Parameter
 * gradients are summed over (token, head) in double, in that order, and added to the fp32 dw
 * once per call, in column blocks of NORM_DW_BLOCK held on the stack (no allocation).
 *
 * Decisions where backend.h is silent:
 *   - rmsnorm_backward: dinp rows have the layout of inp (ldi), dout rows that of out (ldo).
 *   - l2norm_backward: dinp has the layout of inp (ldi); dout and out that of out (ldo).
 *   - x, out and dx of the gated RMSNorm are dense (T, nv*dv); only z/dz have a stride (ldz).
 *   - The backward may run in place: dinp may be dout in l2norm_backward (same ld), dx may be
 *     dout in gated_rmsnorm_backward. Parameter gradients are summed first, and each row's dot
 *     product is taken before that row is written.
 */
#include <math.h>
#include <stdint.h>

#include "cpu_dense_math.h"
#include "cpu_kernels.h"
#include "core/error.h"

#define NORM_DW_BLOCK 64  /* dw columns accumulated at once, in double, on the stack */
#define L2NORM_EPS 1e-6   /* fixed by the model (docs/design/model.md), added to the sum of squares */

/* ---- RMSNorm ------------------------------------------------------------------------------ */

static inline float norm_scale(const float *w, int d, int zero_centred) {
    return zero_centred ? 1.0f + w[d] : w[d];
}

void cpu_rmsnorm_forward(void *out_ /* (T,ldo) nh rows of D */, float *rstd /* (T,nh) */,
                         const void *inp_ /* (T,ldi) nh rows of D */, const void *w_ /* (D) */, int64_t T,
                         int nh, int D, int ldi, int ldo, float eps, int zero_centred) {
    RS_CHECK(T >= 0 && nh > 0 && D > 0, "T %lld nh %d D %d", (long long)T, nh, D);
    RS_CHECK(ldi >= nh * D && ldo >= nh * D, "ldi %d ldo %d < nh*D = %d", ldi, ldo, nh * D);
    float *out = out_;
    const float *inp = inp_, *w = w_;
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            const float *x = inp + t * ldi + (int64_t)h * D;
            float *y = out + t * ldo + (int64_t)h * D;
            double ss = 0.0;
            for (int d = 0; d < D; d++) ss += (double)x[d] * x[d];
            float r = (float)(1.0 / sqrt(ss / D + (double)eps));
            rstd[t * nh + h] = r;
            for (int d = 0; d < D; d++) y[d] = x[d] * r * norm_scale(w, d, zero_centred);
        }
    }
}

/* dxhat = dout * s, xhat = x * rstd:  dinp += rstd * (dxhat - xhat * mean(dxhat * xhat));
 * dw += sum over rows of dout * xhat (the same for 1 + w and w). */
void cpu_rmsnorm_backward(void *dinp_ /* (T,ldi) += */, float *dw /* (D) += */, const void *dout_ /* (T,ldo) */,
                          const void *inp_ /* (T,ldi) */, const void *w_ /* (D) */, const float *rstd /* (T,nh) */,
                          int64_t T, int nh, int D, int ldi, int ldo, int zero_centred) {
    RS_CHECK(T >= 0 && nh > 0 && D > 0, "T %lld nh %d D %d", (long long)T, nh, D);
    RS_CHECK(ldi >= nh * D && ldo >= nh * D, "ldi %d ldo %d < nh*D = %d", ldi, ldo, nh * D);
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_, *w = w_;
    for (int d0 = 0; d0 < D; d0 += NORM_DW_BLOCK) {
        int d1 = d0 + NORM_DW_BLOCK < D ? d0 + NORM_DW_BLOCK : D;
        double acc[NORM_DW_BLOCK] = {0};
        for (int64_t t = 0; t < T; t++) {
            for (int h = 0; h < nh; h++) {
                const float *x = inp + t * ldi + (int64_t)h * D;
                const float *dy = dout + t * ldo + (int64_t)h * D;
                float r = rstd[t * nh + h];
                for (int d = d0; d < d1; d++) acc[d - d0] += (double)dy[d] * (x[d] * r);
            }
        }
        for (int d = d0; d < d1; d++) dw[d] += (float)acc[d - d0];
    }
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            const float *x = inp + t * ldi + (int64_t)h * D;
            const float *dy = dout + t * ldo + (int64_t)h * D;
            float *dx = dinp + t * ldi + (int64_t)h * D;
            float r = rstd[t * nh + h];
            double dot = 0.0;
            for (int d = 0; d < D; d++) dot += (double)(dy[d] * norm_scale(w, d, zero_centred)) * (x[d] * r);
            float mean_dot = (float)(dot / D);
            for (int d = 0; d < D; d++)
                dx[d] += r * (dy[d] * norm_scale(w, d, zero_centred) - x[d] * r * mean_dot);
        }
    }
}

/* ---- L2 norm ------------------------------------------------------------------------------ */

void cpu_l2norm_forward(void *out_ /* (T,ldo) nh rows of D */, float *rstd /* (T,nh) */,
                        const void *inp_ /* (T,ldi) nh rows of D */, int64_t T, int nh, int D, int ldi, int ldo) {
    RS_CHECK(T >= 0 && nh > 0 && D > 0, "T %lld nh %d D %d", (long long)T, nh, D);
    RS_CHECK(ldi >= nh * D && ldo >= nh * D, "ldi %d ldo %d < nh*D = %d", ldi, ldo, nh * D);
    float *out = out_;
    const float *inp = inp_;
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            const float *x = inp + t * ldi + (int64_t)h * D;
            float *y = out + t * ldo + (int64_t)h * D;
            double ss = 0.0;
            for (int d = 0; d < D; d++) ss += (double)x[d] * x[d];
            float r = (float)(1.0 / sqrt(ss + L2NORM_EPS));
            rstd[t * nh + h] = r;
            for (int d = 0; d < D; d++) y[d] = x[d] * r;
        }
    }
}

/* dinp = rstd * (dout - (dout . y) y), exact also with the eps (rstd^3 x_i x_j = rstd y_i y_j) */
void cpu_l2norm_backward(void *dinp_ /* (T,ldi) = */, const void *dout_ /* (T,ldo) */, const void *out_ /* (T,ldo) */,
                         const float *rstd /* (T,nh) */, int64_t T, int nh, int D, int ldi, int ldo) {
    RS_CHECK(T >= 0 && nh > 0 && D > 0, "T %lld nh %d D %d", (long long)T, nh, D);
    RS_CHECK(ldi >= nh * D && ldo >= nh * D, "ldi %d ldo %d < nh*D = %d", ldi, ldo, nh * D);
    float *dinp = dinp_;
    const float *dout = dout_, *out = out_;
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            const float *dy = dout + t * ldo + (int64_t)h * D;
            const float *y = out + t * ldo + (int64_t)h * D;
            float *dx = dinp + t * ldi + (int64_t)h * D;
            float r = rstd[t * nh + h];
            double dot = 0.0;
            for (int d = 0; d < D; d++) dot += (double)dy[d] * y[d];
            float fdot = (float)dot;
            for (int d = 0; d < D; d++) dx[d] = r * (dy[d] - fdot * y[d]);
        }
    }
}

/* ---- the GDN split after the conv: the L2 norm of q, k and the v, z copies ------------------- */

/* the split half of the fused conv + split (cpu_conv.c's gdn_conv_split_*, the oracle of cuda_gdn_conv_split.cu's): the
 * L2 norm and two copies, in the order and arithmetic of the unfused calls (the cpu model's results are bitwise
 * those of conv1d_silu, l2norm and the copies in sequence) */
void cpu_gdn_split_forward(void *qk /* (T,2nk dk) */, float *qk_rstd /* (T,2nk) */, void *v /* (T,Vd) */,
                           void *z /* (T,Vd) */, const void *conv /* (T,ldc) */, const void *zin /* (T,ldz) */,
                           int64_t T, int nk, int dk, int Vd, int ldc, int ldz) {
    const int Kd2 = 2 * nk * dk;
    RS_CHECK(Vd > 0 && ldc >= Kd2 + Vd && ldz >= Vd, "gdn_split: Vd %d ldc %d ldz %d (need ldc >= %d + Vd)", Vd, ldc,
             ldz, Kd2);
    cpu_l2norm_forward(qk, qk_rstd, conv, T, 2 * nk, dk, ldc, Kd2);
    cpu_copy_2d(v, (const float *)conv + Kd2, T, Vd, Vd, ldc);
    cpu_copy_2d(z, zin, T, Vd, Vd, ldz);
}

void cpu_gdn_split_backward(void *dconv /* (T,ldc) = */, void *dzout /* (T,ldz) = */, const void *dqk /* (T,2nk dk) */,
                            const void *qk /* (T,2nk dk) */, const float *qk_rstd /* (T,2nk) */,
                            const void *dv /* (T,Vd) */, const void *dz /* (T,Vd) */, int64_t T, int nk, int dk,
                            int Vd, int ldc, int ldz) {
    const int Kd2 = 2 * nk * dk;
    RS_CHECK(Vd > 0 && ldc >= Kd2 + Vd && ldz >= Vd, "gdn_split: Vd %d ldc %d ldz %d (need ldc >= %d + Vd)", Vd, ldc,
             ldz, Kd2);
    cpu_copy_2d(dzout, dz, T, Vd, ldz, Vd);
    cpu_l2norm_backward(dconv, dqk, qk, qk_rstd, T, 2 * nk, dk, ldc, Kd2);
    cpu_copy_2d((float *)dconv + Kd2, dv, T, Vd, ldc, Vd);
}

/* ---- gated RMSNorm (GDN output) ----------------------------------------------------------- */

void cpu_gated_rmsnorm_forward(void *out_ /* (T,nv*dv) */, float *rstd /* (T,nv) */, const void *x_ /* (T,nv*dv) */,
                               const void *z_ /* (T,ldz) nv heads of dv */, const void *w_ /* (dv) */, int64_t T,
                               int nv, int dv, int ldz, float eps) {
    RS_CHECK(T >= 0 && nv > 0 && dv > 0, "T %lld nv %d dv %d", (long long)T, nv, dv);
    RS_CHECK(ldz >= nv * dv, "ldz %d < nv*dv = %d", ldz, nv * dv);
    float *out = out_;
    const float *xs = x_, *zs = z_, *w = w_;
    const int64_t width = (int64_t)nv * dv;
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nv; h++) {
            const float *x = xs + t * width + (int64_t)h * dv;
            const float *z = zs + t * ldz + (int64_t)h * dv;
            float *y = out + t * width + (int64_t)h * dv;
            double ss = 0.0;
            for (int d = 0; d < dv; d++) ss += (double)x[d] * x[d];
            float r = (float)(1.0 / sqrt(ss / dv + (double)eps));
            rstd[t * nv + h] = r;
            for (int d = 0; d < dv; d++) y[d] = w[d] * (x[d] * r) * cpu_siluf(z[d]);
        }
    }
}

/* n = x rstd, y = w n silu(z):
 *   dz = dout w n silu'(z);  dw += dout n silu(z);
 *   dn = dout w silu(z);     dx = rstd (dn - n mean(dn n)) */
void cpu_gated_rmsnorm_backward(void *dx_ /* (T,nv*dv) = */, void *dz_ /* (T,ldz) = */, float *dw /* (dv) += */,
                                const void *dout_ /* (T,nv*dv) */, const void *x_ /* (T,nv*dv) */,
                                const void *z_ /* (T,ldz) */, const void *w_ /* (dv) */, const float *rstd /* (T,nv) */,
                                int64_t T, int nv, int dv, int ldz) {
    RS_CHECK(T >= 0 && nv > 0 && dv > 0, "T %lld nv %d dv %d", (long long)T, nv, dv);
    RS_CHECK(ldz >= nv * dv, "ldz %d < nv*dv = %d", ldz, nv * dv);
    float *dxs = dx_, *dzs = dz_;
    const float *dout = dout_, *xs = x_, *zs = z_, *w = w_;
    const int64_t width = (int64_t)nv * dv;
    for (int d0 = 0; d0 < dv; d0 += NORM_DW_BLOCK) {
        int d1 = d0 + NORM_DW_BLOCK < dv ? d0 + NORM_DW_BLOCK : dv;
        double acc[NORM_DW_BLOCK] = {0};
        for (int64_t t = 0; t < T; t++) {
            for (int h = 0; h < nv; h++) {
                const float *x = xs + t * width + (int64_t)h * dv;
                const float *z = zs + t * ldz + (int64_t)h * dv;
                const float *dy = dout + t * width + (int64_t)h * dv;
                float r = rstd[t * nv + h];
                for (int d = d0; d < d1; d++) acc[d - d0] += (double)dy[d] * ((x[d] * r) * cpu_siluf(z[d]));
            }
        }
        for (int d = d0; d < d1; d++) dw[d] += (float)acc[d - d0];
    }
    for (int64_t t = 0; t < T; t++) {
        for (int h = 0; h < nv; h++) {
            const float *x = xs + t * width + (int64_t)h * dv;
            const float *z = zs + t * ldz + (int64_t)h * dv;
            const float *dy = dout + t * width + (int64_t)h * dv;
            float *dx = dxs + t * width + (int64_t)h * dv;
            float *dz = dzs + t * ldz + (int64_t)h * dv;
            float r = rstd[t * nv + h];
            double dot = 0.0;
            for (int d = 0; d < dv; d++) dot += (double)(dy[d] * w[d] * cpu_siluf(z[d])) * (x[d] * r);
            float mean_dot = (float)(dot / dv);
            for (int d = 0; d < dv; d++) {
                float n = x[d] * r;
                float dn = dy[d] * w[d] * cpu_siluf(z[d]);
                dz[d] = dy[d] * w[d] * n * cpu_silu_gradf(z[d]);
                dx[d] = r * (dn - n * mean_dot);
            }
        }
    }
}
