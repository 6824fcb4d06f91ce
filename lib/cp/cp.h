/*
 * cp.h — context parallelism: one sample's tokens cut across the ranks of a
 * CP group, in one zigzag layout that both layer kinds use.
 *
 * Layout (cp_layout.c). A sample of T tokens is cut into 2P segments of
 * s = T / 2P tokens; CP rank r holds segments r and 2P-1-r, stored locally as
 * [seg r | seg 2P-1-r]. Each local piece is a *fragment*: a
 * run of tokens contiguous in the sample, with a global index (its segment).
 * With P = 1 there is one fragment, the whole sample, so the single-process
 * run is the P = 1 case of the same code, not a separate path. Positions
 * (RoPE) and document boundaries are global: pos[t] is the token's place in
 * the sample and doc_pos[t] the number of tokens of its document before it,
 * read from the data as they are (lib/data/data.h), never renumbered.
 *
 * The batch's metadata (cp_layout.c). At the start of each micro-batch every
 * CP rank's pos/doc_pos rows are all-gathered once (CpBatch), so every rank
 * knows the global document boundaries and derives the same schedule from
 * them: which block pairs of the ring are skipped, where each fragment's
 * document started, which fragments reset the GDN state. Nothing of the
 * schedule is decided from local data alone, so every rank posts the same
 * sequence of messages.
 *
 * Gated DeltaNet (cp_gdn.c): each fragment's entry state is the previous
 * fragment's exit, an affine map of it, handed on by one of three schedules
 * (CpGdnMethod, chosen by cp_gdn_method from the world shape): the chain
 * (P = 2: between the two ranks, staged after state passes where the chunk
 * states are kept), the hybrid (P = 3, 4: the first halves chained by state
 * passes, the second halves folded from their transitions) or the prefix scan
 * over all-gathered [M | H] slots (P >= 5); the conv halo by an all-gather of
 * every fragment's tail (docs/design/gdn-cp.md).
 * Softmax attention (cp_ring.c): P ring steps of the zigzag rule, partial
 * outputs merged online in fp32 by LSE, fp32 dK|dV partials carried around
 * the ring in the backward (docs/design/ring-attention.md).
 *
 * Callers: lib/model/model_block.c (through Model.cp), bench/bench_cp.c, lib/run/train.c and
 * tests/parity/parity_step.c (layout, reading a rank's rows), tests/cp.
 */
#ifndef RS_CP_H
#define RS_CP_H

#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "config/config.h"

/* The zigzag layout of one sample on one CP rank. */
typedef struct {
    int     P, rank;         /* CP size, this rank's place in the CP group */
    int64_t T;               /* tokens per sample */
    int64_t T_local;         /* tokens per sample on this rank = T / P */
    int     nglobal;         /* fragments per sample: 1 when P == 1, else 2P */
    int     nlocal;          /* fragments per sample on this rank: 1 or 2 */
    int64_t frag_len;        /* tokens per fragment: T when P == 1, else T / 2P */
    int     frag_global[2];  /* global index of local fragment f (its segment) */
} CpLayout;

void cp_layout_init(CpLayout *L, int64_t T, int P, int rank);
/* The rank holding global fragment g, and (when f is not NULL) its local index there. */
int cp_layout_owner(const CpLayout *L, int g, int *f);

/* Every CP rank's token metadata of the current micro-batch, gathered. Each micro-batch of a step
 * has its own slot (host and backend memory), so its upload runs behind the work queued before it
 * and nothing is overwritten before the step's end. */
typedef struct {
    int32_t  samples;
    int64_t  rows;                    /* local rows of the micro-batch = samples x T_local */
    int      slots;                   /* micro-batches per step (train.grad_accum) */
    int32_t *host_all, *dev_all;      /* (slots, 2, P, rows) [pos | doc_pos]: host_alloc, alloc */
    int32_t *pos, *doc_pos;           /* (P, rows) the current slot's host copies, rank-major */
    int32_t *pos_dev, *doc_pos_dev;   /* the same in backend memory (kernel arguments) */
    uint8_t *frag_resets;             /* (samples, nglobal): a document starts inside fragment g */
    uint8_t *frag_starts_doc;         /* (samples, nglobal): fragment g's first token starts a document */
} CpBatch;

/* How the GDN core hands the entry states (and their gradients) through the CP group
 * (docs/design/gdn-cp.md, "Choosing a schedule"). LOCAL: P = 1. SCAN: every fragment's transition, one
 * all-gather, the fold. CHAIN: P = 2, cp_gdn_chain.c (staged or whole); at P >= 3 the staged chain of all
 * 2P fragments (cp_gdn_hybrid.c with every fragment chained; for measurement). HYBRID: cp_gdn_hybrid.c,
 * fragments 0 .. P-1 chained by state passes, P .. 2P-1 folded from their transitions after one all-gather. */
typedef enum { CP_GDN_LOCAL, CP_GDN_SCAN, CP_GDN_CHAIN, CP_GDN_HYBRID, CP_GDN_METHODS } CpGdnMethod;
extern const char *const cp_gdn_method_names[CP_GDN_METHODS + 1]; /* "local", "scan", "chain", "hybrid", NULL */

/* Work counters of one micro-batch step, per layer (reset by cp_counters_reset). */
typedef struct {
    int64_t *attn_forwards;       /* (L) ring forwards (the attention core ran) */
    int64_t *attn_kernel_calls;   /* (L) block-attention forward kernel calls */
    int64_t *ring_hops_fwd;       /* (L) K|V exchanges of forward rings */
    int64_t *ring_passes_fwd;     /* (L) forward ring passes with communication (P > 1) */
    int64_t *ring_passes_bwd;     /* (L) backward ring passes with communication (P > 1) */
    int64_t *scan_allgathers_fwd; /* (L) GDN entry-state passes over the CP group, forward: the scan's all-gather,
                                   * or the chain's or the hybrid's hand-offs; one per communicating forward */
    int64_t *scan_allgathers_bwd; /* (L) the same for the state gradients (one per backward with P > 1) */
    int64_t *halo_exchanges;      /* (L) conv halo all-gathers, forward and backward */
    int64_t *gdn_forwards;        /* (L) chunked delta-rule forward calls */
} CpCounters;

/* The phases of one ring step that Cp.step_mark sees, in order: the step begins; its K|V exchange
 * is posted (with Comm.serial: posted and completed); its attention calls are enqueued; its
 * exchanges (K|V, and in the backward the dK|dV partial) are completed. pass 0 is the forward,
 * 1 the backward; t the step. The GDN core (cp_gdn_forward / cp_gdn_backward) calls it with
 * CP_MARK_BEGIN only, at the start of each of its steps (cp_gdn_steps names them). On cuda the
 * callback runs on the host as the work is enqueued (it records an event on the compute stream);
 * on cpu as the work is done. */
enum { CP_MARK_BEGIN, CP_MARK_POSTED, CP_MARK_COMPUTED, CP_MARK_END, CP_MARK_COUNT };
typedef void (*CpStepMark)(void *ctx, int pass, int t, int phase);

/* The CP context the model runs with: comm, layout, the batch's metadata and the
 * communication buffers (sized by model_acts.c's CP table, so `plan` counts them). */
typedef struct Cp {
    Comm          *comm;   /* NULL: one process, P must be 1 */
    const Backend *be;
    CpLayout       L;
    CpBatch        batch;
    int            layers;
    RingCalls      ring_calls; /* how cp_ring.c calls a ring step's attention: parallel.ring_calls (cp_init);
                                  tests and bench may change it */
    int            ring_keep_kv; /* P = 2 with parallel.ring_keep_kv: the forward keeps the received K|V per
                                    softmax layer (kv_kept) for the backward */
    int           *kv_slot;      /* (layers) the layer's slot in kv_kept, -1 for a GDN layer */
    CpGdnMethod    gdn_method;   /* cp_gdn_method of the config (cp_init); tests and bench change it with
                                    cp_gdn_set_method */
    uint8_t       *kv_kept_ok;   /* (layers) 1 from a forward's keeping to the backward that reads it */
    CpCounters     count;
    /* ring buffers (activation type unless fp32 is said) */
    void  *kv_recv[2];   /* (rows, 2 kvd) the K|V blocks arriving (NULL with ring_keep_kv) */
    void  *kv_kept;      /* (softmax layers, rows, 2 kvd) with ring_keep_kv: each layer's received block */
    float *run_out;      /* (rows, qd) fp32 running output */
    float *run_lse;      /* (rows, nh) fp32 running LSE */
    float *lse_empty;    /* (rows, nh) fp32 all -inf: "no key seen yet", the running LSE's start */
    void  *blk_out;      /* (rows, qd) one call's output */
    float *blk_lse;      /* (rows, nh) one call's LSE */
    float *dq_acc;       /* (rows, qd) fp32 */
    float *dkv_local;    /* (rows, 2 kvd) fp32 this step's dK|dV contributions */
    float *dkv_buf[2];   /* (rows, 2 kvd) fp32 partials travelling the ring */
    /* scan buffers */
    float *scan_send;    /* (samples, nlocal, nv, dk, dk + dv) fp32 [M | H] or [M | dE]; P = 2: the chain's
                          * (samples, nv, dk, dv) hand-over, then rank 1's own H_2 or dL_2 */
    float *scan_recv;    /* (P, samples, nlocal, nv, dk, dk + dv); P = 2: what the chain's two hand-offs bring */
    float *fold[2];      /* (nv, dk, dv) fp32 ping-pong of the fold */
    float *dstate;       /* (samples, nlocal, nv, dk, dv) fp32 the gradients arriving at the fragments' ends */
    void  *gdn_dkept;    /* (samples x gdn_dkept_frags) x gdn_dkept_one bytes: the staged schedules' backward stages
                          * (the chain at P = 2 and the hybrid: parallel.gdn_chain_staged, checkpoint.gdn_keep states;
                          * else NULL: the cp 2 chain runs whole, P >= 3 the scan) */
    int    gdn_dkept_frags; /* local fragments per sample gdn_dkept holds: 2 (the chain), or 1 (the hybrid: the first,
                             * A; its folded second fragments run their backward whole) */
    size_t gdn_dkept_one; /* backend.h gdn_dkept_bytes of one fragment */
    void  *gdn_dkept_own; /* gdn_dkept allocated by cp_gdn_set_method (outside the arena, which plan counts), or NULL */
    uint8_t *gdn_fwd_hybrid; /* (layers) 1 when the layer's last communicating forward ran cp_gdn_hybrid.c, which
                              * leaves the M of its folded fragments only: its backward must run it too */
    void  *halo_send;    /* (samples, nlocal, Kc-1, Cc) pre-conv tails, or their gradients */
    void  *halo_recv;    /* (P, samples, nlocal, Kc-1, Cc) */
    void  *arena;
    /* Measurement only: `ringscan bench cp` (bench/bench_cp.c) sets these; the model never does and
     * cp_init zeroes them, so training runs with no callback. */
    CpStepMark step_mark; /* ring: called at each phase of each step (NULL: not called) */
    void  *step_mark_ctx;
} Cp;

/* ---- cp_layout.c ---- */
/* Builds the layout for samples of data.seq_len tokens and allocates the communication buffers
 * for micro-batches of data.micro_batch samples (sizes from model_acts.c's CP table). comm may be
 * NULL only when parallel.cp == 1. */
void cp_init(Cp *cp, Comm *comm, const Backend *be, const Config *cfg);
void cp_free(Cp *cp);
void cp_counters_reset(Cp *cp);
/* The counters as a JSON object {"attn_forwards": [per layer], ...}, one key per CpCounters
 * field (metrics.jsonl's "counters", parity_step's counters line); the caller owns it. */
struct json_t *cp_counters_json(const Cp *cp);
/* Gathers every CP rank's pos/doc_pos of micro-batch `micro` of the step (this rank's rows =
 * samples x T_local, HOST memory; MPI, blocking), queues their upload into the micro-batch's slot
 * (to_device_async: the host does not wait for the GPU) and derives the per-fragment document
 * facts. Called once per micro-batch, before its forward. */
void cp_batch_begin(Cp *cp, int micro, const int32_t *pos, const int32_t *doc_pos);
/* First local row (within the micro-batch) of local fragment f of sample s. */
static inline int64_t cp_frag_row(const Cp *cp, int s, int f) {
    return (int64_t)s * cp->L.T_local + (int64_t)f * cp->L.frag_len;
}
/* Reads this rank's rows of global sample g through `read` (data_span_read or a test's
 * reader): fragment by fragment, into rows laid out as cp_frag_row says. */
typedef int (*CpReadSpan)(void *ctx, int64_t g, int64_t t0, int64_t len, int32_t *tokens, int32_t *targets,
                          int32_t *pos, int32_t *doc_pos);
int cp_read_sample(const CpLayout *L, CpReadSpan read, void *ctx, int64_t g, int32_t *tokens, int32_t *targets,
                   int32_t *pos, int32_t *doc_pos);

/* ---- cp_gdn*.c (the core at every P: cp_gdn.c; the halo at P > 1: cp_gdn_halo.c) ---- */
/* Dims of a GDN layer as the scan needs them. */
typedef struct {
    int nk, nv, dk, dv; /* key/value heads and head dims */
    int Cc, Kc;         /* conv channels [q|k|v] and kernel width */
} CpGdnDims;

/* halo (samples x nlocal, Kc-1, Cc) = the last Kc-1 pre-conv rows of each local fragment's
 * predecessor (zeros for the sample's first fragment), from proj (rows, ldp) columns [0, Cc), or,
 * with proj NULL, from halo_send, which the caller filled with its fragments' tails (the model's
 * row chunks compute them on their own). One all-gather of every fragment's tail. */
void cp_gdn_halo_forward(Cp *cp, int layer, void *halo, const void *proj, int ldp, const CpGdnDims *d);
/* dproj's tail rows of each local fragment += the halo gradient its successor computed;
 * dhalo (samples x nlocal, Kc-1, Cc) holds this rank's fragments' halo gradients. With dproj
 * NULL only the exchange: cp_gdn_halo_grad then gives each tail's gradient. */
void cp_gdn_halo_backward(Cp *cp, int layer, void *dproj, int ldp, const void *dhalo, const CpGdnDims *d);
/* After cp_gdn_halo_backward: the gradient (Kc-1, Cc) of local fragment f of sample s's last Kc-1
 * pre-conv rows, from its successor; NULL for the sample's last fragment. */
const void *cp_gdn_halo_grad(const Cp *cp, int s, int f, const CpGdnDims *d);
/* One GDN layer's delta-rule core over this rank's rows, as gdn_chunk_forward / gdn_chunk_backward
 * take it (backend.h): local fragment i = s x nlocal + f starts at row cp_frag_row(s, f) of every
 * row pointer; doc_pos is the CP batch's. */
typedef struct {
    const void  *q, *k;          /* (rows, ldq) nk heads of dk */
    const void  *v;              /* (rows, ldv) nv heads of dv */
    const float *g, *beta;       /* (rows, nv) */
    int          ldq, ldv, ldo;  /* ldo: the output's and its gradient's */
    float       *states;         /* (samples x nlocal, nv, dk, dv) fp32 each fragment's entry state; NULL when P = 1 */
    float       *M;              /* (samples x nlocal, nv, dk, dk) fp32 the transitions the backward reads (P > 1) */
    void        *kept;           /* fragment i's gdn_chunk_forward keep at kept + i x kept_bytes; NULL: none */
    size_t       kept_bytes;
    int          kept_kind;      /* the kept buffers' kind: backend.h GDN_KEPT_STATES | GDN_KEPT_TINV (GDN only) */
    int          kda;            /* Kimi Delta Attention: g (and dg) (rows, nv, dk), the Backend's kda_chunk_* entries
                                  * in place of gdn_chunk_*; the schedules are the same (backend.h) */
} CpGdnCore;

/* The core's gradients (rows as CpGdnCore's): written dq, dk (rows, ldq), dv (rows, ldv), dg, dbeta
 * (rows, nv); read dout (rows, ldo). */
typedef struct {
    void        *dq, *dk, *dv;
    float       *dg, *dbeta;
    const void  *dout;
} CpGdnGrads;

/* o (rows, ldo) = the chunked delta rule over each local fragment from its entry state (counted in
 * gdn_forwards). With communicate and P > 1 the entry states come from the CP group into c->states
 * (and c->M what the backward needs: the whole cp 2 chain's M_2, the hybrid's folded fragments', the
 * scan's every fragment's) by cp->gdn_method's schedule: the cp 2 chain staged where cp->gdn_dkept and
 * c->kept with its states are, else whole; the hybrid (and the P >= 3 chain) where c->kept with its states
 * is, else the scan (which leaves every M, so the backward may still run the hybrid); without
 * communicate (the remat recompute) c->states are read as the communicating forward left them; P = 1 has none. */
void cp_gdn_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, int communicate, const CpGdnDims *d);
/* gr's gradients = the core's backward, c as the forward left it; with P > 1 the state gradients
 * pass through the CP group by cp->gdn_method's schedule (the hybrid and the P >= 3 chain where
 * cp->gdn_dkept and c->kept with its states are, else the scan; cp->dstate is their buffer). */
void cp_gdn_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, const CpGdnDims *d);
/* The names of the steps of cp_gdn_forward / cp_gdn_backward with cp's method (Cp.step_mark sees
 * each step's start): "head", "relay", "tail" for the chain and the hybrid, else "scan" (nothing at
 * P = 1), "chunk". */
const char *const *cp_gdn_steps(const Cp *cp, int *n);
/* The schedule for this config (the one place it is chosen, from the world shape; docs/design/gdn-cp.md):
 * P = 1 local; P = 2 the chain; P = 3, 4 the hybrid where the passes can be staged
 * (parallel.gdn_chain_staged with checkpoint.gdn_keep states), else the scan; P >= 5 the scan. */
CpGdnMethod cp_gdn_method(const Config *cfg);
/* How many local fragments per sample method m at this config runs the backward of in stages, keeping them in
 * Cp.gdn_dkept (model_acts.c sizes it, cp_init binds it): 2 for the chain, 1 for the hybrid, else 0. */
int cp_gdn_method_staged(CpGdnMethod m, const Config *cfg);
/* cp->gdn_method = m (tests, `bench cp --gdn-cp`): LOCAL only at P = 1, CHAIN / HYBRID at P >= 2 (they need the
 * staged passes' buffers: gdn_dkept is allocated here when cp_init gave none or too few). */
void cp_gdn_set_method(Cp *cp, CpGdnMethod m);
/* Whether cp_gdn_forward with communication wants the fragments' kept buffers (with their chunk states) even
 * where nothing is kept for the backward: the hybrid's and the P >= 3 chain's state passes run alone into them. */
int cp_gdn_forward_needs_kept(const Cp *cp);

/* ---- cp_ring.c (every P) ---- */
typedef struct {
    int nh, nkv, hd; /* query heads, kv heads, head dim */
} CpAttnDims;

/* out (rows, qd), lse (rows, nh) = causal document-masked attention of this rank's queries
 * q (rows, qd) against the keys/values of the whole sample, the blocks kv (rows, 2 kvd) = [k|v]
 * travelling the ring. */
void cp_ring_forward(Cp *cp, int layer, void *out, float *lse, const void *q, const void *kv, const CpAttnDims *d);
/* dq (rows, qd) =, dkv (rows, 2 kvd) = (activation type) from dout and the FINAL out/lse. */
void cp_ring_backward(Cp *cp, int layer, void *dq, void *dkv, const void *dout, const void *out, const float *lse,
                      const void *q, const void *kv, const CpAttnDims *d);

#endif
