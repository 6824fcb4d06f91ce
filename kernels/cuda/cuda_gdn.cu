/*
 * cuda_gdn.cu — PLACEHOLDER until the Gated DeltaNet kernels land (issue #6, branch wt/cuda-gdn): every
 * entry stops the program with a fatal error naming itself, so nothing can
 * run on a kernel that does not exist yet. This whole file is replaced.
 */
#include "cuda_common.h"
#include "cuda_kernels.h"

extern "C" void cuda_gdn_chunk_forward(void *o, float *S_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo) {
    RS_FATAL("cuda_gdn_chunk_forward: the cuda kernel is not built yet (issue #6)");
}

extern "C" void cuda_gdn_chunk_backward(void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dS0, const void *dout, const float *dS_final, const void *q, const void *k, const void *v, const float *g, const float *beta, const float *S0, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv, int ldo) {
    RS_FATAL("cuda_gdn_chunk_backward: the cuda kernel is not built yet (issue #6)");
}

extern "C" void cuda_gdn_chunk_transition(float *M, float *H, const void *k, const void *v, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldv) {
    RS_FATAL("cuda_gdn_chunk_transition: the cuda kernel is not built yet (issue #6)");
}

extern "C" void cuda_gdn_chunk_dstate(float *dS0, const void *dout, const void *q, const void *k, const float *g, const float *beta, const int32_t *doc_pos, int64_t T, int nk, int nv, int dim_k, int dim_v, int ldq, int ldo) {
    RS_FATAL("cuda_gdn_chunk_dstate: the cuda kernel is not built yet (issue #6)");
}

extern "C" void cuda_gdn_state_affine(float *S_out, const float *M, const float *S_in, const float *H, int transpose_M, int nv, int dim_k, int dim_v) {
    RS_FATAL("cuda_gdn_state_affine: the cuda kernel is not built yet (issue #6)");
}

