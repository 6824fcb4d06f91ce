/*
 * cuda_attention.cu — PLACEHOLDER until the attention kernels land (issue #6, branch wt/cuda-attn): every
 * entry stops the program with a fatal error naming itself, so nothing can
 * run on a kernel that does not exist yet. This whole file is replaced.
 */
#include "cuda_common.h"
#include "cuda_kernels.h"

extern "C" void cuda_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal) {
    RS_FATAL("cuda_attention_forward: the cuda kernel is not built yet (issue #6)");
}

extern "C" void cuda_attention_backward(float *dq, float *dk, float *dv, const void *dout, const void *out, const float *lse, const void *q, const void *k, const void *v, const int32_t *pos_q, const int32_t *doc_pos_q, const int32_t *pos_k, const int32_t *doc_pos_k, int64_t Tq, int64_t Tk, int nh, int nkv, int hd, int ldq, int ldk, int ldo, int causal) {
    RS_FATAL("cuda_attention_backward: the cuda kernel is not built yet (issue #6)");
}

extern "C" void cuda_attention_merge(float *out, float *lse, const void *out_b, const float *lse_b, int64_t T, int nh, int hd, int ldb) {
    RS_FATAL("cuda_attention_merge: the cuda kernel is not built yet (issue #6)");
}

