/*
 * model_acts.h — the activation buffers of one micro-batch, per layer, and
 * which of them each checkpoint policy keeps from forward to backward.
 *
 * This is the activation half of the size tables (model_params.h is the
 * other): `plan` sums it, and the model allocates its saved activations from
 * it, so the estimate and the program cannot disagree about what is kept.
 * Peaks measured later are compared against `peak[]` (torchtitan's "tracker
 * accuracy"); the assumptions behind the transient terms are written next to
 * them in model_acts.c.
 *
 * Policies (checkpoint.activations):
 *   none   keep everything the backward reads, every layer, every row: the
 *          whole-rows buffers and the per-token ones (ln1, the projections
 *          before the conv / the norms, the mixer's output, h, the MLP's),
 *          so the backward recomputes nothing; the row chunks only bound the
 *          per-token scratch (the conv output, its halo, the gradients) and
 *          the size of each kernel call;
 *   full   keep each block's input x; the backward recomputes the whole block,
 *          attention, ring passes and the GDN all-gather included, and each
 *          row chunk's per-token work once more right before its backward;
 *   remat  keep x, plus attention's output and LSE (softmax layers) and the
 *          CP entry states and conv halo (GDN layers): what came out of
 *          communication or attention. The recompute reruns only local,
 *          linear-cost work, and the per-token work per chunk as under full.
 *
 * A per-token buffer therefore has T rows under none and R (one chunk) under
 * full and remat: ActBuffer.policy_bytes holds its size under each policy,
 * ActBuffer.rows / bytes the size under the config's own policy (what
 * model.c allocates); every sum below is per policy.
 *
 * checkpoint.keep_layers N (selective): under full or remat the last N layers
 * keep what none keeps, whole, and their backward recomputes nothing; the
 * table marks it in the buffers' keep bits (the config's policy's bit is set
 * on every buffer none keeps of those layers), so the config's policy's sums
 * are the mixed policy's and the other policies' columns stay pure. The last
 * N because the backward starts there: the allocation is one arena, so which
 * layers does not change the peak, but a kept layer's buffers are read first
 * and the remat layers' recompute runs last, beside the smaller live set.
 * auto: plan_resolve (lib/plan), the one rule plan prints and the model
 * allocates.
 *
 * checkpoint.input_rows whole: under full or remat a layer that recomputes
 * holds its input side (ln1, rstd1, the in_proj output; KDA's f) with every
 * row, not kept: T rows in the recompute's scratch, written by the recompute
 * and read by the backward, which then reruns no in_proj. chunk: one chunk,
 * as the other per-token buffers. auto: plan_resolve.
 *
 * Sizes are for one rank: tokens = data.micro_batch × data.seq_len / cp;
 * activations are fp32 on cpu and bf16 on cuda, statistics (RMSNorm rstd,
 * LSE, gates) are fp32 on both.
 */
#ifndef RS_MODEL_ACTS_H
#define RS_MODEL_ACTS_H

#include <stdint.h>

#include "config/config.h"

#define ACT_KEEP_NONE  (1u << ACT_POLICY_NONE)
#define ACT_KEEP_FULL  (1u << ACT_POLICY_FULL)
#define ACT_KEEP_REMAT (1u << ACT_POLICY_REMAT)
#define ACT_KEEP_ALL   (ACT_KEEP_NONE | ACT_KEEP_FULL | ACT_KEEP_REMAT)

#define GDN_CHUNK 64 /* chunk length of the chunked gated delta rule */
/* chunk scratch (forward buffers and gradients) of checkpoint.chunk_rows 0's rule in model_acts_build (1 GiB gives the
 * 1B model, H 1536, I 4096, 10,432-row chunks on cuda, its GDN layers without conv output buffers); plan_resolve
 * (lib/plan) grows it, up to PLAN_CHUNK_BYTES_MAX, where memory allows */
#define ACT_CHUNK_BYTES_RULE (1LL << 30)
#define ACT_ALIGN 256 /* bytes; model.c starts every carved buffer on this */

typedef struct {
    char    name[48];  /* "ln1", "attn_lse", ... */
    int32_t layer;     /* -1 for the head (final norm, loss) */
    int64_t rows;      /* under the config's policy: tokens, one chunk's, or fragments (CP states) */
    int64_t cols;      /* elements per row */
    int32_t elt;       /* bytes per element */
    int64_t bytes;     /* under the config's policy: what model.c allocates */
    uint32_t keep;     /* ACT_KEEP_* bits: kept until backward under that policy */
    int64_t policy_bytes[ACT_POLICY_COUNT]; /* bytes under each policy (a per-token buffer: T rows where
                                               kept, one chunk elsewhere) */
    uint8_t chunk;     /* a row chunk's scratch wherever the policy does not keep it */
} ActBuffer;

/* Gradient scratch of one layer's backward. The persistent buffers (the residual stream's gradient
 * and the chunk's gradients) live through the whole backward; the mixers' whole-rows gradients
 * (GDN, attention) are never alive together, so they share one arena: persistent + the larger. */
typedef enum {
    ACT_GRAD_PERSISTENT, /* the residual-stream gradient and the chunk gradients */
    ACT_GRAD_GDN,        /* a GDN mixer's whole-rows gradients */
    ACT_GRAD_ATTN,       /* an attention mixer's whole-rows gradients */
    ACT_GRAD_PHASES,
} ActGradPhase;

typedef struct {
    char    name[32];
    int32_t phase;  /* ActGradPhase */
    int64_t bytes;
} ActGradBuffer;

/* Context-parallel communication buffers (lib/cp/cp.h), transient: one layer at a time. */
typedef enum {
    ACT_CP_RING, /* ring attention: K|V receive buffers, fp32 accumulators, dK|dV partials */
    ACT_CP_SCAN, /* GDN scan: the all-gathered transitions, the fold, the conv halo tails */
    ACT_CP_KINDS,
} ActCpKind;

#define ACT_CP_MAX 17
#define CP_ALIGN   256 /* bytes; cp_init starts every CP buffer on this */

/* When a CP buffer is alive: the ring forward's and the ring backward's own buffers are never
 * alive together (one layer's ring pass ends before any other starts; on cuda the backward's
 * NCCL operations wait for the compute queued before them, and the compute waits for them at
 * the pass's end), so they share memory: cp_init lays both phases over the same bytes. */
typedef enum {
    ACT_CP_ALWAYS,   /* both passes */
    ACT_CP_FORWARD,  /* the ring forward alone */
    ACT_CP_BACKWARD, /* the ring backward alone */
    ACT_CP_PHASES,
} ActCpPhase;

/* Which Cp field (cp.h) a CP buffer becomes: cp_init binds by it. act_cp_names[] holds the field names. */
typedef enum {
    ACT_CP_KV_RECV,
    ACT_CP_KV_KEPT,
    ACT_CP_RUN_OUT,
    ACT_CP_RUN_LSE,
    ACT_CP_LSE_EMPTY,
    ACT_CP_BLK_OUT,
    ACT_CP_BLK_LSE,
    ACT_CP_DQ_ACC,
    ACT_CP_DKV_LOCAL,
    ACT_CP_DKV_BUF,
    ACT_CP_SCAN_SEND,
    ACT_CP_SCAN_RECV,
    ACT_CP_FOLD,
    ACT_CP_DSTATE,
    ACT_CP_GDN_DKEPT,
    ACT_CP_HALO_SEND,
    ACT_CP_HALO_RECV,
    ACT_CP_IDS,
} ActCpId;
extern const char *const act_cp_names[ACT_CP_IDS];

typedef struct {
    int32_t id;        /* ActCpId: cp.h's Cp field it becomes */
    int32_t kind;      /* ActCpKind */
    int32_t phase;     /* ActCpPhase */
    int32_t count;     /* buffers of this shape (2 for the ping-pong ones) */
    int64_t bytes;     /* of one buffer */
} ActCpBuffer;

typedef struct {
    const struct BackendSizes *sizes; /* the backend's buffer sizes the table was built with (runtime_sizes) */
    int64_t    tokens; /* local tokens per micro-batch */
    int64_t    chunk_rows;      /* rows of a layer's per-token chunk (checkpoint.chunk_rows or the rule) */
    int64_t    chunk_row_bytes; /* chunk scratch per row under full / remat: forward buffers + gradients */
    int64_t    frag_rows;       /* rows of a zigzag fragment (the whole micro-batch at cp 1): chunks never span two */
    int64_t    chunk_scratch[ACT_POLICY_COUNT]; /* the chunk scratch: the per-token buffers a policy does not
                                                   keep (the larger layer kind's) + the chunk gradients */
    int32_t    elt;    /* activation element size: 4 cpu, 2 cuda */
    int32_t    keep_layers; /* checkpoint.keep_layers resolved (auto: plan's figure); every layer under none */
    int32_t    first_kept;  /* the first layer that keeps its activations whole: L - keep_layers */
    int32_t    inputs_whole; /* checkpoint.input_rows whole resolved: every layer's input side has every row */
    int32_t    act_kept;     /* checkpoint.mlp_act kept resolved: a kept layer keeps the MLP's act too */
    int64_t    pure_kept;   /* the config's policy's kept bytes with keep_layers 0 (plan: what the kept layers add) */
    int32_t    n;
    ActBuffer *b;
    int64_t kept[ACT_POLICY_COUNT];      /* bytes kept across forward -> backward */
    int64_t recompute[ACT_POLICY_COUNT]; /* largest transient re-materialisation of one layer */
    int32_t        ng;
    ActGradBuffer *g;                    /* gradient scratch buffers */
    int64_t grad_phase[ACT_GRAD_PHASES]; /* bytes per phase */
    int64_t grad_working;                /* persistent + largest phase: the gradient arena */
    int64_t gdn_states;                  /* cuda: the delta rule's workspace; cpu: the per-chunk GDN states of one
                                            layer's backward and their gradients */
    int64_t loss_workspace;              /* logits of one row chunk of the fused lm_head + CE */
    int64_t loss_chunk_rows;
    int64_t peak[ACT_POLICY_COUNT];      /* kept + recompute + grad_working + gdn_states
                                            (the loss workspace is counted by plan as a workspace) */
    int64_t layer_kept_max[ACT_POLICY_COUNT]; /* the largest layer's kept bytes (aligned): an offload slot */
    int64_t head_kept[ACT_POLICY_COUNT];      /* the head's kept bytes (aligned): never offloaded */
    int64_t offload_device[ACT_POLICY_COUNT]; /* checkpoint.offload host: kept bytes on the device
                                                 (2 slots + the head) */
    int64_t offload_host[ACT_POLICY_COUNT];   /* ... and on the host: layers 0 .. L-3 */
    int64_t peak_offload[ACT_POLICY_COUNT];   /* peak with offload: offload_device instead of kept */
    int32_t     ncp;
    ActCpBuffer cp[ACT_CP_MAX];          /* the CP buffers cp_init allocates, by name */
    int64_t     cp_phase[ACT_CP_PHASES]; /* the sum per phase (each buffer on CP_ALIGN bytes) */
    int64_t     cp_bytes[ACT_CP_KINDS];  /* per kind, the forward and backward phases overlaid: plan's
                                            "CP ring"/"CP scan" rows (the scan's are all ALWAYS) */
} ActTable;

/* cfg's checkpoint.keep_layers must be a number and input_rows chunk or whole: callers resolve auto with
 * plan_resolve (lib/plan/plan.h) */
void model_acts_build(ActTable *t, const Config *cfg);
/* layer `layer` keeps every activation its backward reads (none, or one of checkpoint.keep_layers): no recompute */
int  model_acts_layer_keeps(const ActTable *t, int layer);
/* the kind of a delta-rule kept buffer (backend.h GDN_KEPT_*) under checkpoint.gdn_keep `gdn_keep` (GdnKeep):
 * GDN_KEPT_STATES under states; GDN_KEPT_TINV too under wy or states where the buffer lives in the recompute's
 * scratch (a GDN layer, not KDA, not kept whole): there it costs one layer's T nv 128 bytes at a time, where in
 * every layer kept whole it would cost a kept layer sooner than the solve it spares is worth. The benches' cores
 * are recomputed layers' (kept_whole 0). */
int  model_gdn_kept_kind(int gdn_keep, int kda, int kept_whole);
/* model_gdn_kept_kind of layer `layer` ("gdn_kept") under cfg */
int  model_acts_gdn_kept_kind(const ActTable *t, const Config *cfg, int layer);
/* layer `layer`'s input side (ln1, rstd1, the in_proj output) has every row in its backward: a kept layer's, or
 * under checkpoint.input_rows whole the recompute's; its backward reruns no ln1 and no in_proj */
int  model_acts_layer_inputs_whole(const ActTable *t, int layer);
/* layer `layer` keeps the MLP's act from its forward (a kept layer under checkpoint.mlp_act kept); elsewhere act holds
 * one chunk and the layer's backward writes it again (swiglu_backward) */
int  model_acts_layer_keeps_act(const ActTable *t, int layer);
void model_acts_free(ActTable *t);

#endif
