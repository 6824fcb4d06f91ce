/*
 * backend_bf16emu.c — `backend_cpu_bf16`, a test backend: the cpu kernels, with every
 * activation-type output rounded to bf16 (round to nearest even) after the kernel wrote it, i.e.
 * the cuda backend's storage precision on the cpu's arithmetic. fp32 outputs (statistics, gates,
 * states, parameter gradients, attention's dq/dk/dv, the merge) stay fp32, as on cuda.
 * build/parity_step --device cpu-bf16 runs the model on it (with the GEMM and norm weights rounded
 * to bf16 too, as the cuda backend's compute copy is), so the whole-model gap between cuda and
 * cpu can be split into what bf16 storage alone costs (cpu-bf16 vs cpu, no GPU needed) and what
 * the cuda kernels add (cuda vs cpu-bf16). tests/cuda/README.md reports both.
 *
 * One emulated run is one draw of the rounding: cuda sums in other orders, so its fp32 values before
 * each bf16 store differ in the low bits and a different set of elements rounds up. For most tensors
 * the draws agree closely; a gradient that sums many terms with heavy cancellation (a linear layer's
 * A_log: sum over tokens and channels of dg g) varies from draw to draw by several times. After
 * bf16emu_set_draw(seed) with seed > 0 every store rounds stochastically instead (up with probability
 * the discarded fraction, from a hash of seed, call and element: the same bits on every run), an
 * independent draw of an error of the same size; compare_bf16.py --draws reads a few such runs as the
 * spread that a cuda run's error is judged against.
 *
 * Not a product backend: no caller outside tests/parity.
 */
#include "backend_bf16emu.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu_kernels.h"

float bf16emu_round(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x; /* inf, NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static uint64_t emu_draw_seed, emu_draw_calls;

void bf16emu_set_draw(uint64_t seed) {
    emu_draw_seed = seed;
    emu_draw_calls = 0;
}

/* splitmix64's finaliser: a well-mixed 64-bit hash of x */
static uint64_t emu_hash(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* x rounded to bf16 stochastically: up with probability (x's low 16 bits) / 2^16 */
static float emu_round_stochastic(float x, uint64_t h) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u = (uint32_t)(((uint64_t)u + (h & 0xffffu)) & 0xffff0000u); /* a carry into the exponent rounds up to it */
    memcpy(&x, &u, 4);
    return x;
}

/* rows x cols floats at stride ld, rounded in place (nearest even, or a stochastic draw: bf16emu_set_draw) */
static void emu_round(void *p, int64_t rows, int64_t cols, int64_t ld) {
    float *f = p;
    if (emu_draw_seed) {
        uint64_t call = emu_hash(emu_draw_seed ^ emu_hash(++emu_draw_calls));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                uint64_t h = emu_hash(call + (uint64_t)(r * cols + c));
                f[r * ld + c] = emu_round_stochastic(f[r * ld + c], h);
            }
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) f[r * ld + c] = bf16emu_round(f[r * ld + c]);
}

static void emu_add_2d(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src) {
    cpu_add_2d(dst, src, rows, cols, ld_dst, ld_src);
    emu_round(dst, rows, cols, ld_dst);
}
static void emu_act_from_f32(void *dst, const float *src, int64_t n) {
    cpu_act_from_f32(dst, src, n);
    emu_round(dst, 1, n, n);
}
static void emu_embedding_forward(void *out, const int32_t *tokens, const void *wte, int64_t T, int C) {
    cpu_embedding_forward(out, tokens, wte, T, C);
    emu_round(out, T, C, C);
}
static void emu_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int64_t T, int nh, int D,
                                int ldi, int ldo, float eps, int zc) {
    cpu_rmsnorm_forward(out, rstd, inp, w, T, nh, D, ldi, ldo, eps, zc);
    emu_round(out, T, (int64_t)nh * D, ldo);
}
static void emu_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                                 const float *rstd, int64_t T, int nh, int D, int ldi, int ldo, int zc) {
    cpu_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, T, nh, D, ldi, ldo, zc);
    emu_round(dinp, T, (int64_t)nh * D, ldi);
}
static void emu_matmul_forward(void *out, const void *inp, const void *w, int64_t T, int IC, int OC, int ldi, int ldo,
                               int acc) {
    cpu_matmul_forward(out, inp, w, T, IC, OC, ldi, ldo, acc);
    emu_round(out, T, OC, ldo);
}
static void emu_matmul_forward_residual(void *out, const void *inp, const void *w, const void *resid, int64_t T,
                                       int IC, int OC, int ldi, int ldo, int ldr) {
    cpu_matmul_forward_residual(out, inp, w, resid, T, IC, OC, ldi, ldo, ldr);
    emu_round(out, T, OC, ldo);
}
static void emu_matmul_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w, int64_t T,
                                int IC, int OC, int ldi, int ldo, int acc) {
    cpu_matmul_backward(dinp, dw, dout, inp, w, T, IC, OC, ldi, ldo, acc);
    if (dinp) emu_round(dinp, T, IC, ldi);
}
static void emu_conv_forward(void *out, const void *inp, const void *halo, const void *w, const int32_t *doc_pos,
                             int64_t T, int C, int Kc, int ldi, int ldo) {
    cpu_conv1d_silu_forward(out, inp, halo, w, doc_pos, T, C, Kc, ldi, ldo);
    emu_round(out, T, C, ldo);
}
static void emu_conv_backward(void *dinp, void *dhalo, float *dw, const void *dout, const void *inp, const void *halo,
                              const void *w, const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo) {
    cpu_conv1d_silu_backward(dinp, dhalo, dw, dout, inp, halo, w, doc_pos, T, C, Kc, ldi, ldo);
    emu_round(dinp, T, C, ldi);
    if (dhalo) emu_round(dhalo, Kc - 1, C, C);
}
static void emu_l2norm_forward(void *out, float *rstd, const void *inp, int64_t T, int nh, int D, int ldi, int ldo) {
    cpu_l2norm_forward(out, rstd, inp, T, nh, D, ldi, ldo);
    emu_round(out, T, (int64_t)nh * D, ldo);
}
static void emu_l2norm_backward(void *dinp, const void *dout, const void *out, const float *rstd, int64_t T, int nh,
                                int D, int ldi, int ldo) {
    cpu_l2norm_backward(dinp, dout, out, rstd, T, nh, D, ldi, ldo);
    emu_round(dinp, T, (int64_t)nh * D, ldi);
}
static void emu_gdn_split_forward(void *qk, float *qk_rstd, void *v, void *z, const void *conv, const void *zin,
                                  int64_t T, int nk, int dk, int Vd, int ldc, int ldz) {
    cpu_gdn_split_forward(qk, qk_rstd, v, z, conv, zin, T, nk, dk, Vd, ldc, ldz);
    emu_round(qk, T, (int64_t)2 * nk * dk, (int64_t)2 * nk * dk); /* v, z: copies of rounded values */
}
static void emu_gdn_split_backward(void *dconv, void *dzout, const void *dqk, const void *qk, const float *qk_rstd,
                                   const void *dv, const void *dz, int64_t T, int nk, int dk, int Vd, int ldc, int ldz) {
    cpu_gdn_split_backward(dconv, dzout, dqk, qk, qk_rstd, dv, dz, T, nk, dk, Vd, ldc, ldz);
    emu_round(dconv, T, (int64_t)2 * nk * dk, ldc);
}
/* the fused GDN conv + split: the rounded unfused pair through a scratch buffer (the cuda kernel rounds the
 * conv output and its gradient to bf16 where the unfused pair stores them) */
static void emu_gdn_conv_split_forward(void *qk, float *qk_rstd, void *v, void *z, const void *proj, const void *halo,
                                       const void *w, const int32_t *doc_pos, int64_t T, int nk, int dk, int Vd,
                                       int Kc, int ldp) {
    const int Cc = 2 * nk * dk + Vd;
    float *conv = RS_MALLOC((size_t)(T > 0 ? T : 1) * (size_t)Cc * sizeof(float));
    emu_conv_forward(conv, proj, halo, w, doc_pos, T, Cc, Kc, ldp, Cc);
    emu_gdn_split_forward(qk, qk_rstd, v, z, conv, (const float *)proj + Cc, T, nk, dk, Vd, Cc, ldp);
    free(conv);
}
static void emu_gdn_conv_split_backward(void *dproj, void *dhalo, float *dw, const void *dqk, const void *qk,
                                        const float *qk_rstd, const void *dv, const void *dz, const void *proj,
                                        const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int nk,
                                        int dk, int Vd, int Kc, int ldp) {
    const int Cc = 2 * nk * dk + Vd;
    float *dconv = RS_MALLOC((size_t)(T > 0 ? T : 1) * (size_t)Cc * sizeof(float));
    emu_gdn_split_backward(dconv, (float *)dproj + Cc, dqk, qk, qk_rstd, dv, dz, T, nk, dk, Vd, Cc, ldp);
    emu_conv_backward(dproj, dhalo, dw, dconv, proj, halo, w, doc_pos, T, Cc, Kc, ldp, Cc);
    free(dconv);
}
static void emu_gates_backward(void *db, void *da, float *dA, float *ddt, const float *dbeta, const float *dg,
                               const void *b, const void *a, const float *A_log, const float *dt_bias, int64_t T,
                               int nv, int ld) {
    cpu_gdn_gates_backward(db, da, dA, ddt, dbeta, dg, b, a, A_log, dt_bias, T, nv, ld);
    emu_round(db, T, nv, ld);
    emu_round(da, T, nv, ld);
}
static void emu_gdn_forward(void *o, float *S_final, const void *q, const void *k, const void *v, const float *g,
                            const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv,
                            int dk, int dv, int ldq, int ldv, int ldo, void *kept, int kept_kind) {
    cpu_gdn_chunk_forward(o, S_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dk, dv, ldq, ldv, ldo, kept, kept_kind);
    if (o) emu_round(o, T, (int64_t)nv * dv, ldo);
}
static void emu_gdn_backward(void *dq, void *dk_, void *dv_, float *dg, float *dbeta, float *dS0, const void *dout,
                             const float *dS_final, const void *q, const void *k, const void *v, const float *g,
                             const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv,
                             int dk, int dv, int ldq, int ldv, int ldo, const void *kept, int kept_kind) {
    cpu_gdn_chunk_backward(dq, dk_, dv_, dg, dbeta, dS0, dout, dS_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dk,
                           dv, ldq, ldv, ldo, kept, kept_kind);
    emu_round(dq, T, (int64_t)nk * dk, ldq);
    emu_round(dk_, T, (int64_t)nk * dk, ldq);
    emu_round(dv_, T, (int64_t)nv * dv, ldv);
}
static void emu_gdn_backward_stage(int stage, void *dkept, void *dq, void *dk_, void *dv_, float *dg, float *dbeta,
                                   float *dS0, const void *dout, const float *dS_final, const void *q, const void *k,
                                   const void *v, const float *g, const float *beta, const float *S0,
                                   const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int dv, int ldq, int ldv,
                                   int ldo, const void *kept, int kept_kind) {
    cpu_gdn_backward_stage_of(emu_gdn_backward, stage, dkept, dq, dk_, dv_, dg, dbeta, dS0, dout, dS_final, q, k, v, g,
                              beta, S0, doc_pos, T, nk, nv, dk, dv, ldq, ldv, ldo, kept, kept_kind);
}
/* KDA: the same rounding as GDN's entries (o and dq/dk/dv are activations; g, beta, states fp32); the gates'
 * db and df are activation gradients */
static void emu_kda_gates_backward(void *db, void *df, float *dA, float *ddt, const float *dbeta, const float *dg,
                                   const void *b, const void *f, const float *A_log, const float *dt_bias, int64_t T,
                                   int nv, int dk, int ldb, int ldf) {
    cpu_kda_gates_backward(db, df, dA, ddt, dbeta, dg, b, f, A_log, dt_bias, T, nv, dk, ldb, ldf);
    emu_round(db, T, nv, ldb);
    emu_round(df, T, (int64_t)nv * dk, ldf);
}
static void emu_kda_forward(void *o, float *S_final, const void *q, const void *k, const void *v, const float *g,
                            const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv,
                            int dk, int dv, int ldq, int ldv, int ldo, void *kept, int kept_flags) {
    cpu_kda_chunk_forward(o, S_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dk, dv, ldq, ldv, ldo, kept, kept_flags);
    if (o) emu_round(o, T, (int64_t)nv * dv, ldo);
}
static void emu_kda_backward(void *dq, void *dk_, void *dv_, float *dg, float *dbeta, float *dS0, const void *dout,
                             const float *dS_final, const void *q, const void *k, const void *v, const float *g,
                             const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv,
                             int dk, int dv, int ldq, int ldv, int ldo, const void *kept, int kept_kind) {
    cpu_kda_chunk_backward(dq, dk_, dv_, dg, dbeta, dS0, dout, dS_final, q, k, v, g, beta, S0, doc_pos, T, nk, nv, dk,
                           dv, ldq, ldv, ldo, kept, kept_kind);
    emu_round(dq, T, (int64_t)nk * dk, ldq);
    emu_round(dk_, T, (int64_t)nk * dk, ldq);
    emu_round(dv_, T, (int64_t)nv * dv, ldv);
}
static void emu_kda_backward_stage(int stage, void *dkept, void *dq, void *dk_, void *dv_, float *dg, float *dbeta,
                                   float *dS0, const void *dout, const float *dS_final, const void *q, const void *k,
                                   const void *v, const float *g, const float *beta, const float *S0,
                                   const int32_t *doc_pos, int64_t T, int nk, int nv, int dk, int dv, int ldq, int ldv,
                                   int ldo, const void *kept, int kept_kind) {
    cpu_gdn_backward_stage_of(emu_kda_backward, stage, dkept, dq, dk_, dv_, dg, dbeta, dS0, dout, dS_final, q, k, v, g,
                              beta, S0, doc_pos, T, nk, nv, dk, dv, ldq, ldv, ldo, kept, kept_kind);
}
static void emu_gated_forward(void *out, float *rstd, const void *x, const void *z, const void *w, int64_t T, int nv,
                              int dv, int ldz, float eps) {
    cpu_gated_rmsnorm_forward(out, rstd, x, z, w, T, nv, dv, ldz, eps);
    emu_round(out, T, (int64_t)nv * dv, (int64_t)nv * dv);
}
static void emu_gated_backward(void *dx, void *dz, float *dw, const void *dout, const void *x, const void *z,
                               const void *w, const float *rstd, int64_t T, int nv, int dv, int ldz) {
    cpu_gated_rmsnorm_backward(dx, dz, dw, dout, x, z, w, rstd, T, nv, dv, ldz);
    emu_round(dx, T, (int64_t)nv * dv, (int64_t)nv * dv);
    emu_round(dz, T, (int64_t)nv * dv, ldz);
}
static void emu_rope_forward(void *x, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta) {
    cpu_rope_forward(x, pos, T, nh, hd, rd, ld, theta);
    emu_round(x, T, (int64_t)nh * hd, ld);
}
static void emu_rope_backward(void *dx, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta) {
    cpu_rope_backward(dx, pos, T, nh, hd, rd, ld, theta);
    emu_round(dx, T, (int64_t)nh * hd, ld);
}
static void emu_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                  const int32_t *pos_q, const int32_t *doc_q, const int32_t *pos_k,
                                  const int32_t *doc_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh,
                                  int nkv, int hd, int ldq, int ldk, int ldo, int causal) {
    cpu_attention_forward(out, lse, q, k, v, pos_q, doc_q, pos_k, doc_k, hint, Tq, Tk, nh, nkv, hd, ldq, ldk, ldo,
                          causal);
    emu_round(out, Tq, (int64_t)nh * hd, ldo);
}
static void emu_sigmoid_gate_forward(void *out, const void *x, const void *gate, int64_t T, int D, int ldg) {
    cpu_sigmoid_gate_forward(out, x, gate, T, D, ldg);
    emu_round(out, T, D, D);
}
static void emu_sigmoid_gate_backward(void *dx, void *dgate, const void *dout, const void *x, const void *gate,
                                      int64_t T, int D, int ldg) {
    cpu_sigmoid_gate_backward(dx, dgate, dout, x, gate, T, D, ldg);
    emu_round(dx, T, D, D);
    emu_round(dgate, T, D, ldg);
}
static void emu_swiglu_forward(void *out, const void *gate_up, int64_t T, int I) {
    cpu_swiglu_forward(out, gate_up, T, I);
    emu_round(out, T, I, I);
}
static void emu_swiglu_backward(void *dgu, void *out, const void *dout, const void *gate_up, int64_t T, int I) {
    cpu_swiglu_backward(dgu, out, dout, gate_up, T, I);
    emu_round(dgu, T, 2 * (int64_t)I, 2 * (int64_t)I);
    if (out) emu_round(out, T, I, I);
}
static void emu_lm_head_loss(float *losses, void *dx, float *dw, const void *x, const void *w, const int32_t *targets,
                             float grad_scale, float *workspace, int64_t rows, int64_t T, int C, int V) {
    cpu_lm_head_loss(losses, dx, dw, x, w, targets, grad_scale, workspace, rows, T, C, V);
    if (dx) emu_round(dx, T, C, C);
}
static void emu_adamw_update(float *param, float *m, float *v, void *compute, const float *grad, int64_t n, float lr,
                             float b1, float b2, float eps, float wd, float gs, int step) {
    cpu_adamw_update(param, m, v, compute, grad, n, lr, b1, b2, eps, wd, gs, step);
    if (compute) emu_round(compute, 1, n, n);
}

const Backend backend_cpu_bf16 = {
    .name = "cpu-bf16",
    .act_size = 4,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset_zero = cpu_memset_zero,
    .copy = cpu_copy,
    .to_device = cpu_to_device,
    .to_host = cpu_to_host,
    .copyq_create = cpu_copyq_create,
    .copyq_destroy = cpu_copyq_destroy,
    .copyq_to_host = cpu_copyq_to_host,
    .copyq_to_device = cpu_copyq_to_device,
    .copyq_wait = cpu_copyq_wait,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .memory_stats = cpu_memory_stats,
    .to_device_async = cpu_to_device_async,
    .copy_2d = cpu_copy_2d,
    .add_2d = emu_add_2d,
    .add_f32 = cpu_add_f32,
    .act_from_f32 = emu_act_from_f32,
    .act_to_f32 = cpu_act_to_f32,
    .embedding_forward = emu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = emu_rmsnorm_forward,
    .rmsnorm_backward = emu_rmsnorm_backward,
    .matmul_forward = emu_matmul_forward,
    .matmul_forward_residual = emu_matmul_forward_residual,
    .matmul_backward = emu_matmul_backward,
    .conv1d_silu_forward = emu_conv_forward,
    .conv1d_silu_backward = emu_conv_backward,
    .l2norm_forward = emu_l2norm_forward,
    .l2norm_backward = emu_l2norm_backward,
    .gdn_conv_split_forward = emu_gdn_conv_split_forward,
    .gdn_conv_split_backward = emu_gdn_conv_split_backward,
    .gdn_gates_forward = cpu_gdn_gates_forward,
    .gdn_gates_backward = emu_gates_backward,
    .gdn_chunk_forward = emu_gdn_forward,
    .gdn_chunk_backward = emu_gdn_backward,
    .gdn_chunk_backward_stage = emu_gdn_backward_stage,
    .gdn_dkept_bytes = cpu_gdn_dkept_bytes,
    .gdn_kept_bytes = cpu_gdn_kept_bytes,
    .gdn_chunk_prep = cpu_gdn_chunk_prep,
    .gdn_chunk_transition = cpu_gdn_chunk_transition,
    .gdn_chunk_dstate = cpu_gdn_chunk_dstate,
    .gdn_state_affine = cpu_gdn_state_affine,
    .kda_gates_forward = cpu_kda_gates_forward,
    .kda_gates_backward = emu_kda_gates_backward,
    .kda_chunk_forward = emu_kda_forward,
    .kda_chunk_backward = emu_kda_backward,
    .kda_chunk_backward_stage = emu_kda_backward_stage,
    .kda_dkept_bytes = cpu_kda_dkept_bytes,
    .kda_kept_bytes = cpu_kda_kept_bytes,
    .kda_chunk_prep = cpu_kda_chunk_prep,
    .kda_chunk_transition = cpu_kda_chunk_transition,
    .kda_chunk_dstate = cpu_kda_chunk_dstate,
    .gated_rmsnorm_forward = emu_gated_forward,
    .gated_rmsnorm_backward = emu_gated_backward,
    .rope_forward = emu_rope_forward,
    .rope_backward = emu_rope_backward,
    .attention_forward = emu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_merge = cpu_attention_merge,
    .sigmoid_gate_forward = emu_sigmoid_gate_forward,
    .sigmoid_gate_backward = emu_sigmoid_gate_backward,
    .swiglu_forward = emu_swiglu_forward,
    .swiglu_backward = emu_swiglu_backward,
    .lm_head_loss = emu_lm_head_loss,
    .adamw_update = emu_adamw_update,
    .sum_squares = cpu_sum_squares,
};
