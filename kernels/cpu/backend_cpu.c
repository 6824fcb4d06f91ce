/*
 * backend_cpu.c — the cpu backend's Backend table (lib/backend.h): fp32
 * activations, the kernels of kernels/cpu. The initializer names every entry,
 * and a kernel whose signature drifts from the table fails to compile.
 */
#include "backend.h"
#include "cpu_kernels.h"

const Backend backend_cpu = {
    .name = "cpu",
    .act_size = 4,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset_zero = cpu_memset_zero,
    .copy = cpu_copy,
    .to_device = cpu_to_device,
    .to_host = cpu_to_host,
    .copy_2d = cpu_copy_2d,
    .act_from_f32 = cpu_act_from_f32,
    .act_to_f32 = cpu_act_to_f32,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .conv1d_silu_forward = cpu_conv1d_silu_forward,
    .conv1d_silu_backward = cpu_conv1d_silu_backward,
    .l2norm_forward = cpu_l2norm_forward,
    .l2norm_backward = cpu_l2norm_backward,
    .gdn_gates_forward = cpu_gdn_gates_forward,
    .gdn_gates_backward = cpu_gdn_gates_backward,
    .gdn_chunk_forward = cpu_gdn_chunk_forward,
    .gdn_chunk_backward = cpu_gdn_chunk_backward,
    .gated_rmsnorm_forward = cpu_gated_rmsnorm_forward,
    .gated_rmsnorm_backward = cpu_gated_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_merge = cpu_attention_merge,
    .sigmoid_gate_forward = cpu_sigmoid_gate_forward,
    .sigmoid_gate_backward = cpu_sigmoid_gate_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .lm_head_loss = cpu_lm_head_loss,
    .adamw_update = cpu_adamw_update,
    .sum_squares = cpu_sum_squares,
};
