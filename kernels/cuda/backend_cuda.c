/*
 * backend_cuda.c — the cuda backend's Backend table (lib/backend.h): bf16
 * activations (act_size 2), fp32 statistics, states and parameter gradients,
 * the kernels of kernels/cuda (cuda_kernels.h). The initializer names every
 * entry, and a kernel whose signature drifts from the table fails to compile.
 *
 * Before the first call the process picks its GPU with
 * cuda_backend_init(local_rank) (cuda_backend.h); lib/train.c does.
 *
 * Files: cuda_memory.cu (memory), cuda_matmul.cu (cuBLASLt GEMMs),
 * cuda_norm.cu (RMSNorm, L2 norm, gated RMSNorm), cuda_elementwise.cu
 * (embedding, gates, sigmoid gate, SwiGLU), cuda_conv.cu, cuda_rope.cu,
 * cuda_loss.cu (fused lm_head + CE), cuda_optim.cu (AdamW, sum of squares),
 * cuda_attention.cu, cuda_gdn.cu; cuda_backend.cu and cuda_stream.cu hold the
 * process-wide state.
 */
#include "backend.h"
#include "cuda_kernels.h"

const Backend backend_cuda = {
    .name = "cuda",
    .act_size = 2,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .memset_zero = cuda_memset_zero,
    .copy = cuda_copy,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .copy_2d = cuda_copy_2d,
    .add_2d = cuda_add_2d,
    .add_f32 = cuda_add_f32,
    .act_from_f32 = cuda_act_from_f32,
    .act_to_f32 = cuda_act_to_f32,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .conv1d_silu_forward = cuda_conv1d_silu_forward,
    .conv1d_silu_backward = cuda_conv1d_silu_backward,
    .l2norm_forward = cuda_l2norm_forward,
    .l2norm_backward = cuda_l2norm_backward,
    .gdn_gates_forward = cuda_gdn_gates_forward,
    .gdn_gates_backward = cuda_gdn_gates_backward,
    .gdn_chunk_forward = cuda_gdn_chunk_forward,
    .gdn_chunk_backward = cuda_gdn_chunk_backward,
    .gdn_chunk_transition = cuda_gdn_chunk_transition,
    .gdn_chunk_dstate = cuda_gdn_chunk_dstate,
    .gdn_state_affine = cuda_gdn_state_affine,
    .gated_rmsnorm_forward = cuda_gated_rmsnorm_forward,
    .gated_rmsnorm_backward = cuda_gated_rmsnorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_merge = cuda_attention_merge,
    .sigmoid_gate_forward = cuda_sigmoid_gate_forward,
    .sigmoid_gate_backward = cuda_sigmoid_gate_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .lm_head_loss = cuda_lm_head_loss,
    .adamw_update = cuda_adamw_update,
    .sum_squares = cuda_sum_squares,
};
