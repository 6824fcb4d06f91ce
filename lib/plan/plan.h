/*
 * plan.h — what a run will need, computed from the config alone.
 *
 * `ringscan plan CONFIG` prints it; `submit` refuses a run that does not fit;
 * the trainer compares its measured peak memory with it. Every number comes
 * from the size tables of the model (model_params.h, model_acts.h), never
 * from a second hand-written formula.
 *
 * Conventions (also printed):
 *   - memory is per rank (one GPU, or one cpu process), in bytes;
 *   - FLOPs are per token of training (forward + backward), 2 per multiply-add;
 *     dense = 6 x matmul parameters; attention is counted causal (half the
 *     T x T pairs, Megatron's convention) with the non-causal count beside it;
 *     one document is assumed to span the whole sample (the upper bound);
 *   - communication is bytes sent per rank per optimizer step.
 */
#ifndef RS_PLAN_H
#define RS_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "model/model_acts.h"
#include "model/model_params.h"

typedef enum {
    PLAN_MEM_WEIGHTS_BF16,
    PLAN_MEM_MASTER,
    PLAN_MEM_GRADS,
    PLAN_MEM_ADAMW,
    PLAN_MEM_ACTIVATIONS,
    PLAN_MEM_CP_RING,
    PLAN_MEM_CP_SCAN,
    PLAN_MEM_WORKSPACE,
    PLAN_MEM_RUNTIME,
    PLAN_MEM_COUNT,
} PlanMem;

typedef enum {
    PLAN_COMM_GRAD_ALLREDUCE,
    PLAN_COMM_RING_P2P,
    PLAN_COMM_GDN_STATES,
    PLAN_COMM_HALO_ALLGATHER,
    PLAN_COMM_COUNT,
} PlanComm;

typedef struct {
    /* layout */
    int64_t world, dp, cp;
    int64_t tokens_per_rank;   /* per micro-batch */
    int64_t tokens_per_step;   /* global */
    int64_t segment_tokens;    /* seq_len / (2 cp) */
    int32_t n_linear, n_full;
    /* parameters */
    ParamCounts params;
    int32_t     shard;         /* parallel.shard as it runs (model_shard_stage) */
    int64_t     buffer_numel;  /* the flat parameter buffer, padding included */
    int64_t     shard_pad;     /* of it, the buckets' padding for sharding */
    int64_t     grad_numel;    /* fp32 gradient elements per rank (model.c's buffers) */
    int64_t     weights_numel; /* compute-copy elements per rank (shard weights: the head's and embed_tokens'
                                * buckets, two layer slots and the rank's pieces; else the buffer) */
    double      weight_gather; /* shard weights: bytes per rank per step of the layers' all-gathers (forward and
                                * backward, every micro-batch; model_shard.c's slots), else 0 */
    int64_t     hf_params;     /* sum of the Hugging Face state-dict shapes */
    /* memory, bytes per rank, for each policy */
    int64_t mem[ACT_POLICY_COUNT][PLAN_MEM_COUNT];
    int64_t total[ACT_POLICY_COUNT];
    int64_t capacity;          /* device.memory_gib */
    int64_t cudnn_workspace;   /* of it in workspaces: the cuDNN route's (device.attention_kernel cudnn*), else 0 */
    int64_t cudnn_call_rows;   /* the rows of the largest call it is sized for */
    ActTable acts;
    /* FLOPs per token */
    double flops_dense;        /* 6 N_matmul */
    double flops_attn_causal;  /* training, causal half */
    double flops_attn_full;    /* training, all T x T pairs */
    double flops_gdn;          /* chunked delta rule core, training */
    double flops_model;        /* dense + attn_causal + gdn */
    double flops_recompute[ACT_POLICY_COUNT]; /* extra hardware FLOPs of the recompute */
    /* host memory (checkpoint.offload: host), bytes */
    bool    offload;
    int64_t tasks_per_node;
    int64_t host_offload[ACT_POLICY_COUNT];  /* per rank: the offloaded kept activations (page-locked) */
    int64_t host_runtime;                    /* per rank: the process (cuda context, NCCL, MPI, data) */
    int64_t host_rank_device[ACT_POLICY_COUNT]; /* per rank, cpu only: its "device" memory is host memory */
    int64_t host_staging;                    /* per node: the checkpoint staging (master, AdamW m, v: rank 0's, or
                                              * with parallel.shard every rank's pieces) */
    int64_t host_node[ACT_POLICY_COUNT];     /* tasks_per_node x per rank + staging */
    int64_t host_capacity;                   /* device.host_memory_gib, or MemTotal here; -1: unknown */
    char    host_source[160];                /* where host_capacity came from */
    /* communication, bytes sent per rank per step, per policy */
    double comm[ACT_POLICY_COUNT][PLAN_COMM_COUNT];
} Plan;

void plan_build(Plan *p, const Config *cfg);
/* FLOPs of the chunked gated delta rule per chunk of C tokens and value head (FLA's kernel split,
 * docs/design/gdn-kernels.md, "FLOPs counted": 11.3 and 32.5 MFLOP at C = 64, K = V = 128); the backward counts its
 * recompute of the WY factors and chunk states. Also used by `ringscan bench gdn`. */
void plan_gdn_chunk_flops(double C, double K, double V, double *fwd, double *bwd);
void plan_free(Plan *p);
/* device memory fits, and with checkpoint.offload: host the node's host memory too */
bool plan_fits(const Plan *p, ActPolicy policy);
/* cfg with checkpoint.keep_layers and checkpoint.chunk_rows as they run, each a number: keep_layers auto is the
 * most layers (the last ones) whose plan total under the config's policy fits device.memory_gib less
 * PLAN_KEEP_MARGIN of it (and host memory), else 0, every layer under none; then chunk_rows 0 is the rows of the
 * largest chunk scratch among PLAN_CHUNK_BYTES_MAX, half of it, ... down to twice model_acts.c's rule
 * (ACT_CHUNK_BYTES_RULE) that still fits so beside those layers, else the rule's (at most a fragment). Larger
 * chunks run the per-token kernels in fewer, longer calls (docs/performance.md). plan_build, model.c and
 * cp_layout.c build from it: the one figure plan prints and the model allocates. */
#define PLAN_KEEP_MARGIN 0.05 /* plan's totals meet the measured use within 0.5% (docs/performance.md table 6) */
#define PLAN_CHUNK_BYTES_MAX (4LL << 30)
Config plan_resolve(const Config *cfg);
/* parallel.shard: the first stage (none, optimizer, gradients, weights) whose plan fits with `policy`, or -1; need[st]:
 * each stage's total per rank (-1: not counted: weights is not built, or a world of one) */
int  plan_shard_fit(const Config *cfg, ActPolicy policy, int64_t need[SHARD_COUNT]);
bool plan_host_fits(const Plan *p, ActPolicy policy);

/* Human report; returns the exit code: 0 fits, 1 does not fit. */
int  plan_print(const Plan *p, const Config *cfg, FILE *f);
/* The same numbers as one JSON object. */
void plan_print_json(const Plan *p, const Config *cfg, FILE *f);

extern const char *const plan_mem_names[PLAN_MEM_COUNT];
extern const char *const plan_comm_names[PLAN_COMM_COUNT];

#endif
