/*
 * backend_cpu.c — the cpu backend's Backend table (lib/backend/backend.h): fp32
 * activations, the kernels of kernels/cpu. The initializer names every entry,
 * and a kernel whose signature drifts from the table fails to compile.
 */
#include "backend/backend.h"
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
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .memory_stats = cpu_memory_stats,
    .to_device_async = cpu_to_device_async,
    .copyq_create = cpu_copyq_create,
    .copyq_destroy = cpu_copyq_destroy,
    .copyq_to_host = cpu_copyq_to_host,
    .copyq_to_device = cpu_copyq_to_device,
    .copyq_wait = cpu_copyq_wait,
    .copy_2d = cpu_copy_2d,
    .add_2d = cpu_add_2d,
    .add_f32 = cpu_add_f32,
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
    .gdn_split_forward = cpu_gdn_split_forward,
    .gdn_split_backward = cpu_gdn_split_backward,
    .gdn_gates_forward = cpu_gdn_gates_forward,
    .gdn_gates_backward = cpu_gdn_gates_backward,
    .gdn_chunk_forward = cpu_gdn_chunk_forward,
    .gdn_chunk_backward = cpu_gdn_chunk_backward,
    .gdn_chunk_backward_stage = cpu_gdn_chunk_backward_stage,
    .gdn_dkept_bytes = cpu_gdn_dkept_bytes,
    .gdn_kept_bytes = cpu_gdn_kept_bytes,
    .gdn_chunk_prep = cpu_gdn_chunk_prep,
    .gdn_chunk_transition = cpu_gdn_chunk_transition,
    .gdn_chunk_dstate = cpu_gdn_chunk_dstate,
    .gdn_state_affine = cpu_gdn_state_affine,
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

static size_t cpu_no_gdn_workspace(int64_t frag, int cp, int nv, int dim_k, int dim_v, int kept_states) { return 0; }
static size_t cpu_no_attention_workspace(int kernel, int64_t rows, int nh, int nkv, int hd) { return 0; }

const BackendSizes backend_cpu_sizes = {
    .gdn_kept_bytes = cpu_gdn_kept_bytes,
    .gdn_dkept_bytes = cpu_gdn_dkept_bytes,
    .gdn_workspace_bytes = cpu_no_gdn_workspace,
    .attention_workspace_bytes = cpu_no_attention_workspace,
};
