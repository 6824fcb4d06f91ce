/*
 * cuda_kernels.h — the cuda backend's kernels: bf16 activations and GEMM
 * operands, fp32 accumulation, fp32 statistics, recurrent states and
 * parameter gradients (lib/backend/backend.h documents every entry; `void *` is bf16
 * here, `float *` fp32). Every kernel runs on cuda_stream() (cuda_common.h)
 * and is checked against the cpu kernel of the same name by build/test_cuda.
 *
 * Files: attention/ (block attention: forward.cu, backward.cu, merge.cu, the
 * tile plan tiles.cu), gdn/ (chunked gated delta rule, its CP transition,
 * state gradient and fold link: gdn.cu and its per-stage .cuh files); the rest
 * of the entries live in the files the backend table (cuda_backend_table.c) names.
 */
#ifndef RS_CUDA_KERNELS_H
#define RS_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/attn_hint.h"

#ifdef __cplusplus
extern "C" {
#endif

void *cuda_alloc(size_t bytes);
void cuda_free(void *p);
void cuda_memset_zero(void *p, size_t bytes);
void cuda_copy(void *dst, const void *src, size_t bytes);
void cuda_to_device(void *dst, const void *host, size_t bytes);
void cuda_to_host(void *host, const void *src, size_t bytes);
void *cuda_host_alloc(size_t bytes);
void cuda_host_free(void *p);
void cuda_to_device_async(void *dst, const void *host, size_t bytes);
void cuda_copy_2d(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src);
void cuda_add_2d(void *dst, const void *src, int64_t rows, int cols, int ld_dst, int ld_src);
void cuda_add_f32(float *dst, const float *src, int64_t n);
void cuda_act_from_f32(void *dst, const float *src, int64_t n);
void cuda_act_to_f32(float *dst, const void *src, int64_t n);
void cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, int64_t T, int C);
void cuda_embedding_backward(float *dwte, const void *dout, const int32_t *tokens, int64_t T, int C);
void cuda_rmsnorm_forward(void *out, float *rstd, const void *inp, const void *w, int64_t T, int nh, int D, int ldi, int ldo, float eps, int zero_centred);
void cuda_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w, const float *rstd, int64_t T, int nh, int D, int ldi, int ldo, int zero_centred);
void cuda_matmul_forward(void *out, const void *inp, const void *w, int64_t T, int IC, int OC, int ldi, int ldo, int accumulate);
void cuda_matmul_forward_residual(void *out, const void *inp, const void *w, const void *resid, int64_t T, int IC, int OC, int ldi, int ldo, int ldr);
void cuda_matmul_backward(void *dinp, float *dw, const void *dout, const void *inp, const void *w, int64_t T, int IC, int OC, int ldi, int ldo, int accumulate_dinp);
void cuda_conv1d_silu_forward(void *out, const void *inp, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo);
void cuda_conv1d_silu_backward(void *dinp, void *dhalo, float *dw, const void *dout, const void *inp, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int C, int Kc, int ldi, int ldo);
void cuda_l2norm_forward(void *out, float *rstd, const void *inp, int64_t T, int nh, int D, int ldi, int ldo);
void cuda_l2norm_backward(void *dinp, const void *dout, const void *out, const float *rstd, int64_t T, int nh, int D, int ldi, int ldo);
void cuda_gdn_conv_split_forward(void *qk, float *qk_rstd, void *v, void *z, const void *proj, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int nk, int dk, int Vd, int Kc, int ldp);
void cuda_gdn_conv_split_backward(void *dproj, void *dhalo, float *dw, const void *dqk, const void *qk, const float *qk_rstd, const void *dv, const void *dz, const void *proj, const void *halo, const void *w, const int32_t *doc_pos, int64_t T, int nk, int dk, int Vd, int Kc, int ldp);
void cuda_gdn_gates_forward(float *beta, float *g, const void *b, const void *a, const float *A_log, const float *dt_bias, int64_t T, int nv, int ld);
void cuda_gdn_gates_backward(void *db, void *da, float *dA_log, float *ddt_bias, const float *dbeta, const float *dg, const void *b, const void *a, const float *A_log, const float *dt_bias, int64_t T, int nv, int ld);
void cuda_gdn_chunk_forward(void *o, float *S_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, void *kept, int kept_flags);
void cuda_gdn_chunk_backward(void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_kind);
size_t cuda_gdn_kept_bytes(int64_t T, int nv, int dim_k, int dim_v, int states);
void cuda_gdn_chunk_backward_stage(int stage, void *dkept, void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_kind);
size_t cuda_gdn_dkept_bytes(int64_t T, int nv, int dim_k, int dim_v);
/* the delta rule's workspace at its largest for fragments of frag tokens at CP size cp (BackendSizes) */
size_t cuda_gdn_workspace_bytes(int64_t frag, int cp, int nv, int dim_k, int dim_v, int kept_kind);
void cuda_gated_rmsnorm_forward(void *out, float *rstd, const void *x, const void *z, const void *w, int64_t T, int nv, int dv, int ldz, float eps);
void cuda_gated_rmsnorm_backward(void *dx, void *dz, float *dw, const void *dout, const void *x, const void *z, const void *w, const float *rstd, int64_t T, int nv, int dv, int ldz);
void cuda_rope_forward(void *x, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta);
void cuda_rope_backward(void *dx, const int32_t *pos, int64_t T, int nh, int hd, int rd, int ld, float theta);
void cuda_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal);
void cuda_attention_backward(float *dq, float *dk, float *dv, const void *dout, const void *out, const float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, const AttnHint *hint, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal);
void cuda_attention_merge(float *out, float *lse, const void *out_b, const float *lse_b, int64_t T, int nh, int hd, int ldb);
void cuda_sigmoid_gate_forward(void *out, const void *x, const void *gate, int64_t T, int D, int ldg);
void cuda_sigmoid_gate_backward(void *dx, void *dgate, const void *dout, const void *x, const void *gate, int64_t T, int D, int ldg);
void cuda_swiglu_forward(void *out, const void *gate_up, int64_t T, int inter);
void cuda_swiglu_backward(void *dgate_up, void *out, const void *dout, const void *gate_up, int64_t T, int inter);
void cuda_lm_head_loss(float *losses, void *dx, float *dw, const void *x, const void *w, const int32_t *targets, float grad_scale, float *workspace, int64_t rows, int64_t T, int C, int V);
void cuda_loss_rows(float *losses, float *logits, const int32_t *targets, int64_t row0, int64_t n, int V, float grad_scale, int want_grad);
void cuda_adamw_update(float *param, float *m, float *v, void *compute, const float *grad, int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int step);
double cuda_sum_squares(const float *x, int64_t n);

/* Gated DeltaNet context parallelism (gdn/gdn.cu) */
void cuda_gdn_chunk_prep(void *kept, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int kept_kind);
void cuda_gdn_chunk_transition(float *M, float *H, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, const void *kept, int kept_kind);
void cuda_gdn_chunk_dstate(float *dS0, const void *dout, const void *q, const void *k, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldo, const void *kept, int kept_kind);
void cuda_gdn_state_affine(float *S_out, const float *M, const float *S_in, const float *H, int transpose_M, int nv, int dim_k, int dim_v);

/* Kimi Delta Attention (kda/kda.cu, kda/kda_gates.cu): the gdn_chunk_* entries with g (T,nv,dim_k) */
void cuda_kda_gates_forward(float *beta, float *g, const void *b, const void *f, const float *A_log, const float *dt_bias, int64_t T, int nv, int dk, int ldb, int ldf);
void cuda_kda_gates_backward(void *db, void *df, float *dA_log, float *ddt_bias, const float *dbeta, const float *dg, const void *b, const void *f, const float *A_log, const float *dt_bias, int64_t T, int nv, int dk, int ldb, int ldf);
void cuda_kda_chunk_forward(void *o, float *S_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, void *kept, int kept_flags);
void cuda_kda_chunk_backward(void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_states);
void cuda_kda_chunk_backward_stage(int stage, void *dkept, void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo, const void *kept, int kept_kind);
size_t cuda_kda_dkept_bytes(int64_t T, int nv, int dim_k, int dim_v);
size_t cuda_kda_kept_bytes(int64_t T, int nv, int dim_k, int dim_v, int states);
/* the KDA kernels' workspace at its largest for fragments of frag tokens at CP size cp (BackendSizes) */
size_t cuda_kda_workspace_bytes(int64_t frag, int cp, int nv, int dim_k, int dim_v, int kept_states);
void cuda_kda_chunk_prep(void *kept, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int kept_states);
void cuda_kda_chunk_transition(float *M, float *H, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, const void *kept, int kept_states);
void cuda_kda_chunk_dstate(float *dS0, const void *dout, const void *q, const void *k, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldo, const void *kept, int kept_states);

#ifdef __cplusplus
}
#endif

#endif
