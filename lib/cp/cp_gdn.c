/*
 * cp_gdn.c — Gated DeltaNet across the CP group: each local fragment's
 * delta-rule core from its entry state (the zigzag chain at P = 2, the prefix
 * scan at P > 2), and the conv halo (see cp.h; the math is research/gdn_cp.md
 * §3-4 and our derivation below).
 *
 * Per value head, a fragment g maps the state entering it to the state
 * leaving it affinely: X_g = M_g E_g + H_g, where (M_g, H_g) is the chunked
 * delta rule run over the fragment from the state [0 | I] (M_g = 0 when a
 * document starts inside: the state is reset, so nothing passes through).
 * The entry state of fragment g is the exit state of g-1 in the same sample:
 *     E_g = X_{g-1},  E_0 = 0 (a sample has nothing before it),
 * and a fragment whose first token starts a document needs no entry (0).
 *
 * Backward. Let dE_g be the gradient of the loss with respect to E_g. The
 * fragment's outputs depend on E_g affinely, and so does its exit state:
 *     dE_g = dL_g + M_g^T dE_{g+1},  dE_{last + 1} = 0,
 * where dL_g is the gradient through the fragment's own outputs
 * (gdn_chunk_dstate: the backward's state pass alone, no S needed), and the
 * gradient arriving at the exit of fragment g is dE_{g+1}.
 * gdn_chunk_backward run with dS_final = dE_{g+1} returns dE_g as its dS0.
 *
 * The chain (P = 2). Rank 0 holds fragments 0 and 3, rank 1 fragments 1 and
 * 2; every sample of the micro-batch moves through each step together.
 *   forward   head   rank 0: fragment 0 from 0, its exit X_0 = E_1 kept to send;
 *                    rank 1: fragment 2's prep, then its transition (M_2, H_2)
 *             relay  E_1 goes to rank 1, which runs fragment 1 from it (its
 *                    exit is E_2) and sends E_3 = M_2 E_2 + H_2 (one affine
 *                    step) back at once; rank 0 computes fragment 3's prep
 *                    meanwhile, then waits for it
 *             tail   rank 0: fragment 3 from E_3; rank 1: fragment 2 from E_2,
 *                    both without prep
 *   (The prep, the WY factors and gate cumsums of every chunk: ~40% of a
 *   forward pass. It goes into the fragment's kept buffer (gdn_chunk_prep),
 *   which the transition and the forward read (GDN_KEPT_PREP_IN), so it is
 *   computed once per fragment and neither tail computes it. Under
 *   checkpoint.gdn_keep none there is no kept buffer and no sharing: the
 *   transition and both tails compute their own prep, as before.)
 *   backward  head   rank 0: dE_3 = dL_3 (gdn_chunk_dstate: fragment 3 is the
 *                    last); rank 1: dL_2 (both from the prep the forward
 *                    kept, as the backwards below)
 *             relay  dE_3 goes to rank 1: dE_2 = dL_2 + M_2^T dE_3 (one affine
 *                    step), then fragment 1's backward with dS_final = dE_2,
 *                    whose dS0 is dE_1, sent back at once; rank 0 meanwhile
 *                    runs fragment 3's backward (dS_final = 0)
 *             tail   rank 0: fragment 0's backward with dS_final = dE_1;
 *                    rank 1: fragment 2's with dE_3
 * Forward: three fragment passes deep (the transition beside fragment 0,
 * fragment 1, fragments 2 | 3, the last two without prep given kept
 * buffers) against the scan's two transitions and two forwards; backward:
 * one dstate (reading the prep its forward kept) and two backwards on each
 * rank, against two of each. Rank 0 gets dE_3 from gdn_chunk_dstate rather than from fragment
 * 3's backward so that rank 1 starts fragment 1's backward after a dstate
 * pass, not a full backward. Each hand-off is one comm_isendrecv between the
 * two ranks (the comm layer's exchange is symmetric: the direction nobody
 * reads carries the sender's buffer, unread), fp32, every sample at once,
 * each rank posting its side when it has the data or is done with the work
 * the exchange would run beside (a post that waits long for the other side
 * occupies the GPU: NCCL waits in a kernel).
 * Only the order of fp32 operations differs from the scan's.
 *
 * The staged chain (P = 2 with cp->gdn_dkept: parallel.gdn_chain_staged, and c->kept with its chunk
 * states: checkpoint.gdn_keep states). The backend runs a fragment's forward as its state pass (o NULL)
 * and then its outputs (GDN_KEPT_STATES_IN), and its backward in three stages (gdn_chunk_backward_stage:
 * dout, state gradient, gradients), so each hand-off leaves after state passes alone and no transition
 * or dL pass is needed:
 *   forward   head   rank 0: fragment 0's state pass (exit E_1); rank 1: the preps of fragments 1, 2
 *             relay  rank 1: E_1 -> fragment 1's state pass -> E_2 -> fragment 2's -> E_3 to rank 0;
 *                    rank 0 meanwhile fragment 0's outputs and fragment 3's prep
 *             tail   rank 0: fragment 3 from E_3, whole; rank 1: the outputs of fragments 1 and 2
 *   backward  head   rank 0: fragment 3's dout and state-gradient stages (dE_3); rank 1: the dout stages
 *                    of fragments 1 and 2 (all it can do before dE_3)
 *             relay  rank 1: dE_3 -> fragment 2's state-gradient stage -> dE_2 -> fragment 1's -> dE_1 to
 *                    rank 0; rank 0 meanwhile fragment 3's gradients stage
 *             tail   rank 0: fragment 0's backward from dE_1, whole; rank 1: the gradients stages of
 *                    fragments 1 and 2
 * Per rank that is the work of one GPU's two fragments plus nothing but waiting (rank 1 in the forward's
 * head and the backward's, for a state pass), against one transition (prep + [M | H] pass) and one dL
 * pass more per rank in the chain above. The price: the backward's stages of rank 1's two fragments live
 * at once in cp->gdn_dkept (model_acts.c counts it). Against the chain above only fp32 orders differ
 * (E_3 from E_2 through fragment 2's pass rather than M_2 E_2 + H_2).
 *
 * The scan (P > 2). One all-gather per pass of fixed-size slots [M | H]
 * (forward) or [M | dL] (backward) per local fragment, fp32; every rank
 * folds, in global order with the same code, the fragments it needs:
 *     E_g = F_{g-1}( ... F_{j+1}(H_j) ... ),  F_i(S) = M_i S + H_i,
 * from the last fragment j < g that resets (or fragment 0), and the mirror
 * with M^T from the first fragment after g that resets (or the last); then
 * one full forward (backward) per fragment. Given kept buffers, each
 * fragment's prep is computed once, before its transition, and its forward
 * reads it.
 *
 * Without communication (P = 1, or the remat recompute, which keeps the entry
 * states the forward received) each fragment runs from the states as they are.
 *
 * The conv halo is one all-gather of every fragment's last Kc-1 pre-conv rows;
 * its gradient goes back by a second one and is added into the owner's rows.
 *
 * Callers: lib/model/model_block.c (GDN layers), bench/bench_cp.c, tests/cp.
 */
#include <string.h>

#include "cp.h"
#include "core/error.h"

#define CP_AT(p, off) ((void *)((char *)(p) + (int64_t)(off) * es))

enum { CP_TAG_CHAIN_FWD0 = 31, CP_TAG_CHAIN_FWD1 = 32, CP_TAG_CHAIN_BWD0 = 33, CP_TAG_CHAIN_BWD1 = 34 };

static const char *const cp_gdn_chain_steps[] = {"head", "relay", "tail"};
static const char *const cp_gdn_scan_steps[] = {"scan", "chunk"};

const char *const *cp_gdn_steps(const CpLayout *L, int *n) {
    *n = L->P == 2 ? 3 : 2;
    return L->P == 2 ? cp_gdn_chain_steps : cp_gdn_scan_steps;
}

static void cp_gdn_mark(Cp *cp, int pass, int t) {
    if (cp->step_mark) cp->step_mark(cp->step_mark_ctx, pass, t, CP_MARK_BEGIN);
}

/* Sizes of the scan's slots: per local fragment [M (nv,dk,dk) | H or dL (nv,dk,dv)], fp32. */
typedef struct {
    int64_t mm, hh, slot, per_rank;
} CpScanSizes;

static CpScanSizes cp_scan_sizes(const Cp *cp, const CpGdnDims *d) {
    CpScanSizes z;
    z.mm = (int64_t)d->nv * d->dk * d->dk;
    z.hh = (int64_t)d->nv * d->dk * d->dv;
    z.slot = z.mm + z.hh;
    z.per_rank = (int64_t)cp->batch.samples * cp->L.nlocal * z.slot;
    return z;
}

/* ---- one fragment's delta rule ---------------------------------------------------------- */

/* The first local row of local fragment i (= s x nlocal + f), and its doc_pos rows (backend memory) */
static int64_t cp_gdn_row(const Cp *cp, int64_t i) {
    return cp_frag_row(cp, (int)(i / cp->L.nlocal), (int)(i % cp->L.nlocal));
}
static const int32_t *cp_gdn_doc_pos(const Cp *cp, int64_t r0) {
    return cp->batch.doc_pos_dev + (int64_t)cp->L.rank * cp->batch.rows + r0;
}

/* Local fragment i's kept buffer, or NULL */
static void *cp_gdn_kept(const CpGdnCore *c, int64_t i) {
    return c->kept ? (char *)c->kept + i * (int64_t)c->kept_bytes : NULL;
}

/* Local fragment i (= s x nlocal + f) of the core: o's rows =, from S0 (NULL: 0); S_final = its exit
 * state when not NULL. Keeps what c->kept says; `in` (backend.h kept_flags): GDN_KEPT_PREP_IN, its kept
 * buffer holds its prep already (cp_gdn_fragment_prep); GDN_KEPT_STATES_IN, its state pass too (the staged
 * chain: o NULL runs that pass alone). A call that writes o counts as one forward. */
static void cp_gdn_fragment_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, int64_t i, const float *S0,
                                    float *S_final, int in, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i);
    be->gdn_chunk_forward(o ? CP_AT(o, r0 * c->ldo) : NULL, S_final, CP_AT(c->q, r0 * c->ldq),
                          CP_AT(c->k, r0 * c->ldq), CP_AT(c->v, r0 * c->ldv), c->g + r0 * d->nv, c->beta + r0 * d->nv,
                          S0, cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv, d->dk, d->dv, c->ldq, c->ldv, c->ldo,
                          cp_gdn_kept(c, i), (c->kept_states ? GDN_KEPT_STATES : 0) | in);
    if (o) cp->count.gdn_forwards[layer]++;
}

/* Its prep (the WY factors and gate cumsums) into its kept buffer, for the transition and the forward
 * after it (c->kept only) */
static void cp_gdn_fragment_prep(Cp *cp, const CpGdnCore *c, int64_t i, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i);
    be->gdn_chunk_prep(cp_gdn_kept(c, i), CP_AT(c->k, r0 * c->ldq), CP_AT(c->v, r0 * c->ldv), c->g + r0 * d->nv,
                       c->beta + r0 * d->nv, cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv, d->dk, d->dv, c->ldq,
                       c->ldv, c->kept_states);
}

/* Its backward: the gradients' rows =, with dS_final (NULL: 0) arriving at its exit; dS0 = the gradient of
 * its entry state when not NULL. */
static void cp_gdn_fragment_backward(Cp *cp, const CpGdnGrads *gr, const CpGdnCore *c, int64_t i,
                                     const float *dS_final, float *dS0, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i), hh = (int64_t)d->nv * d->dk * d->dv;
    be->gdn_chunk_backward(CP_AT(gr->dq, r0 * c->ldq), CP_AT(gr->dk, r0 * c->ldq), CP_AT(gr->dv, r0 * c->ldv),
                           gr->dg + r0 * d->nv, gr->dbeta + r0 * d->nv, dS0, CP_AT(gr->dout, r0 * c->ldo), dS_final,
                           CP_AT(c->q, r0 * c->ldq), CP_AT(c->k, r0 * c->ldq), CP_AT(c->v, r0 * c->ldv),
                           c->g + r0 * d->nv, c->beta + r0 * d->nv, c->states ? c->states + i * hh : NULL,
                           cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv, d->dk, d->dv, c->ldq, c->ldv, c->ldo,
                           cp_gdn_kept(c, i), c->kept_states);
}

/* One stage (backend.h GDN_BWD_*) of its backward, carried in its part of cp->gdn_dkept: DOUT; STATE with
 * dS_final (NULL: 0) arriving at its exit, dS0 = the gradient of its entry state when not NULL; GRADS */
static void cp_gdn_fragment_stage(Cp *cp, int stage, const CpGdnGrads *gr, const CpGdnCore *c, int64_t i,
                                  const float *dS_final, float *dS0, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i);
    be->gdn_chunk_backward_stage(stage, (char *)cp->gdn_dkept + i * (int64_t)cp->gdn_dkept_one,
                                 CP_AT(gr->dq, r0 * c->ldq), CP_AT(gr->dk, r0 * c->ldq), CP_AT(gr->dv, r0 * c->ldv),
                                 gr->dg + r0 * d->nv, gr->dbeta + r0 * d->nv, dS0, CP_AT(gr->dout, r0 * c->ldo),
                                 dS_final, CP_AT(c->q, r0 * c->ldq), CP_AT(c->k, r0 * c->ldq),
                                 CP_AT(c->v, r0 * c->ldv), c->g + r0 * d->nv, c->beta + r0 * d->nv,
                                 c->states ? c->states + i * (int64_t)d->nv * d->dk * d->dv : NULL,
                                 cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv, d->dk, d->dv, c->ldq, c->ldv,
                                 c->ldo, cp_gdn_kept(c, i));
}

/* Its transition: exit = M entry + H; with c->kept its prep first, into its kept buffer, which the
 * transition reads (and the fragment's forward after it: prep_in) */
static void cp_gdn_fragment_transition(Cp *cp, float *M, float *H, const CpGdnCore *c, int64_t i,
                                       const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i);
    if (c->kept) cp_gdn_fragment_prep(cp, c, i, d);
    be->gdn_chunk_transition(M, H, CP_AT(c->k, r0 * c->ldq), CP_AT(c->v, r0 * c->ldv), c->g + r0 * d->nv,
                             c->beta + r0 * d->nv, cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv, d->dk, d->dv,
                             c->ldq, c->ldv, cp_gdn_kept(c, i), c->kept_states);
}

/* Its own state gradient dL (gdn_chunk_dstate: through its outputs alone, from dout; the prep from its
 * kept buffer, which its forward filled) */
static void cp_gdn_fragment_dstate(Cp *cp, float *dL, const CpGdnGrads *gr, const CpGdnCore *c, int64_t i,
                                   const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const int es = be->act_size;
    const int64_t r0 = cp_gdn_row(cp, i);
    be->gdn_chunk_dstate(dL, CP_AT(gr->dout, r0 * c->ldo), CP_AT(c->q, r0 * c->ldq), CP_AT(c->k, r0 * c->ldq),
                         c->g + r0 * d->nv, c->beta + r0 * d->nv, cp_gdn_doc_pos(cp, r0), L->frag_len, d->nk, d->nv,
                         d->dk, d->dv, c->ldq, c->ldo, cp_gdn_kept(c, i), c->kept_states);
}

/* ---- the scan (P > 2) ----------------------------------------------------------------------- */

/* The gathered slot of (sample s, global fragment g): its M, and its H or dL at + mm. */
static const float *cp_scan_slot(const Cp *cp, const CpScanSizes *z, int s, int g) {
    int f, r = cp_layout_owner(&cp->L, g, &f);
    return cp->scan_recv + r * z->per_rank + ((int64_t)s * cp->L.nlocal + f) * z->slot;
}

/* out = the fold from fragment `seed` towards `target` (exclusive) in sample s: S = the seed's
 * H (or dL); then for each fragment j strictly between them, in order, S = op(M_j) S + H_j
 * (op = M^T when transpose: the backward runs towards earlier fragments). */
static void cp_scan_fold(Cp *cp, const CpScanSizes *z, float *out, int s, int seed, int target, int transpose,
                         const CpGdnDims *d) {
    const int dir = target > seed ? 1 : -1;
    const float *S = cp_scan_slot(cp, z, s, seed) + z->mm;
    int ping = 0;
    for (int j = seed + dir; j != target; j += dir) {
        const float *Mj = cp_scan_slot(cp, z, s, j);
        float *dst = j + dir == target ? out : cp->fold[ping];
        cp->be->gdn_state_affine(dst, Mj, S, Mj + z->mm, transpose, d->nv, d->dk, d->dv);
        S = dst;
        ping ^= 1;
    }
    if (S != out) cp->be->copy(out, S, (size_t)z->hh * sizeof(float));
}

/* One all-gather of every rank's slots over the CP group (`what`: for the watchdog's report). */
static void cp_scan_allgather(Cp *cp, int layer, const CpScanSizes *z, const char *what) {
    CommHandle h = {0};
    comm_set_context(cp->comm, layer, what);
    comm_iallgather(cp->comm, COMM_CP, cp->scan_send, cp->scan_recv, z->per_rank * (int64_t)sizeof(float),
                    &h);
    comm_wait(cp->comm, &h);
}

/* c->states = each local fragment's entry state, c->M = its M: each fragment's transition, one
 * all-gather, the fold in global order. */
static void cp_scan_forward(Cp *cp, int layer, const CpGdnCore *c, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const CpScanSizes z = cp_scan_sizes(cp, d);
    for (int64_t i = 0; i < (int64_t)B->samples * L->nlocal; i++) {
        float *M = cp->scan_send + i * z.slot;
        cp_gdn_fragment_transition(cp, M, M + z.mm, c, i, d);
        be->copy(c->M + i * z.mm, M, (size_t)z.mm * sizeof(float));
    }
    cp_scan_allgather(cp, layer, &z, "GDN scan all-gather forward");
    cp->count.scan_allgathers_fwd[layer]++;

    for (int s = 0; s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int gi = L->frag_global[f];
            float *E = c->states + ((int64_t)s * L->nlocal + f) * z.hh;
            const uint8_t *resets = B->frag_resets + (int64_t)s * L->nglobal;
            if (gi == 0 || B->frag_starts_doc[(int64_t)s * L->nglobal + gi]) {
                be->memset_zero(E, (size_t)z.hh * sizeof(float)); /* nothing before, or reset at once */
                continue;
            }
            int j0 = gi - 1; /* the last fragment before gi that resets (its exit is its H), else 0 */
            while (j0 > 0 && !resets[j0]) j0--;
            cp_scan_fold(cp, &z, E, s, j0, gi, 0, d);
        }
}

/* cp->dstate = the gradient arriving at each local fragment's exit: each fragment's own state
 * gradient, one all-gather of [M | dL], the reverse fold with M^T. */
static void cp_scan_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const CpScanSizes z = cp_scan_sizes(cp, d);
    for (int64_t i = 0; i < (int64_t)B->samples * L->nlocal; i++) {
        float *M = cp->scan_send + i * z.slot;
        be->copy(M, c->M + i * z.mm, (size_t)z.mm * sizeof(float));
        cp_gdn_fragment_dstate(cp, M + z.mm, gr, c, i, d);
    }
    cp_scan_allgather(cp, layer, &z, "GDN scan all-gather backward");
    cp->count.scan_allgathers_bwd[layer]++;

    for (int s = 0; s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int gi = L->frag_global[f];
            float *D = cp->dstate + ((int64_t)s * L->nlocal + f) * z.hh;
            const uint8_t *resets = B->frag_resets + (int64_t)s * L->nglobal;
            if (gi == L->nglobal - 1) { /* the sample's last fragment: nothing after it */
                be->memset_zero(D, (size_t)z.hh * sizeof(float));
                continue;
            }
            int j1 = gi + 1; /* the first fragment after gi that resets (its dE is its own dL), else the last */
            while (j1 < L->nglobal - 1 && !resets[j1]) j1++;
            cp_scan_fold(cp, &z, D, s, j1, gi, 1, d);
        }
}

/* ---- the chain (P = 2) ---------------------------------------------------------------------- */

/* One hand-off of the chain: `bytes` of send to the other rank, as many of its into recv. */
static void cp_chain_handoff(Cp *cp, int layer, const void *send, void *recv, int64_t bytes, int tag,
                             const char *what, CommHandle *h) {
    const int peer = 1 - cp->L.rank;
    comm_set_context(cp->comm, layer, what);
    comm_isendrecv(cp->comm, COMM_CP, send, peer, recv, peer, bytes, tag, h);
}

/* dst (nv, dk, dv) = src, or 0 where global fragment g of sample s starts a document (no entry state, or
 * no gradient for one) */
static void cp_chain_take(Cp *cp, float *dst, const float *src, int s, int g, int64_t hh) {
    if (cp->batch.frag_starts_doc[(int64_t)s * cp->L.nglobal + g]) cp->be->memset_zero(dst, (size_t)hh * sizeof(float));
    else if (dst != src) cp->be->copy(dst, src, (size_t)hh * sizeof(float));
}

/* The chain's buffers: out (samples, hh) what this rank hands over; own (samples, hh) rank 1's H_2 or dL_2;
 * in[2] (samples, hh) what each of the two hand-offs brings. */
typedef struct {
    float  *out, *own, *in[2];
    int64_t hh, mm, bytes;
} CpChain;

static CpChain cp_chain_buffers(const Cp *cp, const CpGdnDims *d) {
    CpChain ch;
    const int64_t S = cp->batch.samples;
    ch.hh = (int64_t)d->nv * d->dk * d->dv;
    ch.mm = (int64_t)d->nv * d->dk * d->dk;
    ch.bytes = S * ch.hh * (int64_t)sizeof(float);
    ch.out = cp->scan_send; /* scan_send holds samples x 2 slots of [M | H], scan_recv P times that */
    ch.own = cp->scan_send + S * ch.hh;
    ch.in[0] = cp->scan_recv;
    ch.in[1] = cp->scan_recv + S * ch.hh;
    return ch;
}

/* o = the core over this rank's fragments, c->states their entry states, c->M rank 1's M_2 (the header says the
 * order). Local fragment f = 0 of sample s is i = 2s, f = 1 is 2s + 1. */
static void cp_chain_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const int S = cp->batch.samples, first = cp->L.rank == 0;
    const CpChain ch = cp_chain_buffers(cp, d);
    float *E = c->states;
    CommHandle h[2];
    memset(h, 0, sizeof h);

    cp_gdn_mark(cp, 0, 0); /* head */
    for (int s = 0; s < S; s++) {
        if (first) { /* fragment 0 from nothing; its exit is fragment 1's entry */
            be->memset_zero(E + 2 * s * ch.hh, (size_t)ch.hh * sizeof(float));
            cp_gdn_fragment_forward(cp, layer, o, c, 2 * s, E + 2 * s * ch.hh, ch.out + s * ch.hh, 0, d);
        } else /* fragment 2's transition, for the relay's affine step */
            cp_gdn_fragment_transition(cp, c->M + (2 * s + 1) * ch.mm, ch.own + s * ch.hh, c, 2 * s + 1, d);
    }
    cp_chain_handoff(cp, layer, ch.out, ch.in[0], ch.bytes, CP_TAG_CHAIN_FWD0, "GDN chain forward: fragment 0's exit",
                     &h[0]);

    cp_gdn_mark(cp, 0, 1); /* relay */
    if (first) { /* fragment 3's prep while rank 1 runs fragment 1, then its side of the hand-off (posted after
                    the prep: see cp_chain_backward's relay) */
        for (int s = 0; c->kept && s < S; s++) cp_gdn_fragment_prep(cp, c, 2 * s + 1, d);
        cp_chain_handoff(cp, layer, ch.out, ch.in[1], ch.bytes, CP_TAG_CHAIN_FWD1,
                         "GDN chain forward: fragment 2's exit", &h[1]);
        comm_wait(cp->comm, &h[0]);
        comm_wait(cp->comm, &h[1]);
    } else {
        comm_wait(cp->comm, &h[0]);
        for (int s = 0; s < S; s++) { /* fragment 1 from E_1; its exit E_2; E_3 = M_2 E_2 + H_2 to rank 0 */
            float *E1 = E + 2 * s * ch.hh, *E2 = E1 + ch.hh;
            cp_chain_take(cp, E1, ch.in[0] + s * ch.hh, s, 1, ch.hh);
            cp_gdn_fragment_forward(cp, layer, o, c, 2 * s, E1, E2, 0, d);
            be->gdn_state_affine(ch.out + s * ch.hh, c->M + (2 * s + 1) * ch.mm, E2, ch.own + s * ch.hh, 0, d->nv,
                                 d->dk, d->dv);
            cp_chain_take(cp, E2, E2, s, 2, ch.hh);
        }
        cp_chain_handoff(cp, layer, ch.out, ch.in[1], ch.bytes, CP_TAG_CHAIN_FWD1,
                         "GDN chain forward: fragment 2's exit", &h[1]);
    }

    cp_gdn_mark(cp, 0, 2); /* tail */
    for (int s = 0; s < S; s++) {
        float *Ef = E + (2 * s + 1) * ch.hh; /* fragment 3's entry (rank 0) or fragment 2's (rank 1) */
        if (first) cp_chain_take(cp, Ef, ch.in[1] + s * ch.hh, s, 3, ch.hh);
        cp_gdn_fragment_forward(cp, layer, o, c, 2 * s + 1, Ef, NULL, c->kept ? GDN_KEPT_PREP_IN : 0, d);
    }
    comm_wait(cp->comm, &h[1]);
    cp->count.scan_allgathers_fwd[layer]++;
}

/* The backward of cp_chain_forward (the header says the order). */
static void cp_chain_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const int S = cp->batch.samples, first = cp->L.rank == 0;
    const CpChain ch = cp_chain_buffers(cp, d);
    float *D = cp->dstate; /* rank 1: the gradients arriving at fragments 1 and 2's exits */
    CommHandle h[2];
    memset(h, 0, sizeof h);

    cp_gdn_mark(cp, 1, 0); /* head */
    for (int s = 0; s < S; s++) /* rank 0: dE_3 = dL_3 (fragment 3 is the sample's last); rank 1: dL_2 */
        cp_gdn_fragment_dstate(cp, (first ? ch.out : ch.own) + s * ch.hh, gr, c, 2 * s + 1, d);
    cp_chain_handoff(cp, layer, ch.out, ch.in[0], ch.bytes, CP_TAG_CHAIN_BWD0,
                     "GDN chain backward: fragment 3's entry gradient", &h[0]);

    cp_gdn_mark(cp, 1, 1); /* relay */
    if (first) {
        /* Fragment 3's backward first, then this rank's side of the hand-off: posted before it, the exchange
           would wait for rank 1's side (posted when fragment 1's backward ends) on the communication stream
           for the whole pass, and on cuda NCCL waits inside a kernel that holds SMs the backward's kernels
           need. Both sides are posted about together now, when each rank's pass is done. */
        for (int s = 0; s < S; s++) cp_gdn_fragment_backward(cp, gr, c, 2 * s + 1, NULL, NULL, d);
        cp_chain_handoff(cp, layer, ch.out, ch.in[1], ch.bytes, CP_TAG_CHAIN_BWD1,
                         "GDN chain backward: fragment 1's entry gradient", &h[1]);
    } else {
        comm_wait(cp->comm, &h[0]);
        for (int s = 0; s < S; s++) { /* dE_2 = dL_2 + M_2^T dE_3; fragment 1's backward gives dE_1 */
            float *D1 = D + 2 * s * ch.hh, *D2 = D1 + ch.hh;
            cp_chain_take(cp, D2, ch.in[0] + s * ch.hh, s, 3, ch.hh);
            be->gdn_state_affine(D1, c->M + (2 * s + 1) * ch.mm, D2, ch.own + s * ch.hh, 1, d->nv, d->dk, d->dv);
            cp_chain_take(cp, D1, D1, s, 2, ch.hh);
            cp_gdn_fragment_backward(cp, gr, c, 2 * s, D1, ch.out + s * ch.hh, d);
        }
        cp_chain_handoff(cp, layer, ch.out, ch.in[1], ch.bytes, CP_TAG_CHAIN_BWD1,
                         "GDN chain backward: fragment 1's entry gradient", &h[1]);
    }

    cp_gdn_mark(cp, 1, 2); /* tail */
    if (first) {
        comm_wait(cp->comm, &h[0]);
        comm_wait(cp->comm, &h[1]);
    }
    for (int s = 0; s < S; s++) {
        float *Dx = first ? ch.in[1] + s * ch.hh : D + (2 * s + 1) * ch.hh; /* dE_1 (rank 0) or dE_3 (rank 1) */
        if (first) cp_chain_take(cp, Dx, Dx, s, 1, ch.hh);
        cp_gdn_fragment_backward(cp, gr, c, first ? 2 * s : 2 * s + 1, Dx, NULL, d);
    }
    comm_wait(cp->comm, &h[1]);
    cp->count.scan_allgathers_bwd[layer]++;
}

/* The staged chain (cp->gdn_dkept, c->kept with its states; the header says the order): cp_chain_forward's
 * results with each hand-off after state passes alone. */
static void cp_chain_forward_staged(Cp *cp, int layer, void *o, const CpGdnCore *c, const CpGdnDims *d) {
    const int S = cp->batch.samples, first = cp->L.rank == 0;
    const CpChain ch = cp_chain_buffers(cp, d);
    float *E = c->states;
    CommHandle h[2];
    memset(h, 0, sizeof h);

    cp_gdn_mark(cp, 0, 0); /* head */
    for (int s = 0; s < S; s++) {
        if (first) { /* fragment 0's state pass from nothing: its exit is fragment 1's entry */
            cp->be->memset_zero(E + 2 * s * ch.hh, (size_t)ch.hh * sizeof(float));
            cp_gdn_fragment_forward(cp, layer, NULL, c, 2 * s, E + 2 * s * ch.hh, ch.out + s * ch.hh, 0, d);
        } else { /* the preps of fragments 1 and 2 */
            cp_gdn_fragment_prep(cp, c, 2 * s, d);
            cp_gdn_fragment_prep(cp, c, 2 * s + 1, d);
        }
    }
    cp_chain_handoff(cp, layer, ch.out, ch.in[0], ch.bytes, CP_TAG_CHAIN_FWD0, "GDN chain forward: fragment 0's exit",
                     &h[0]);

    cp_gdn_mark(cp, 0, 1); /* relay */
    if (first) { /* fragment 0's outputs and fragment 3's prep while rank 1 runs its state passes */
        for (int s = 0; s < S; s++) {
            cp_gdn_fragment_forward(cp, layer, o, c, 2 * s, E + 2 * s * ch.hh, NULL, GDN_KEPT_STATES_IN, d);
            cp_gdn_fragment_prep(cp, c, 2 * s + 1, d);
        }
        cp_chain_handoff(cp, layer, ch.out, ch.in[1], ch.bytes, CP_TAG_CHAIN_FWD1,
                         "GDN chain forward: fragment 2's exit", &h[1]);
        comm_wait(cp->comm, &h[0]);
        comm_wait(cp->comm, &h[1]);
    } else {
        comm_wait(cp->comm, &h[0]);
        for (int s = 0; s < S; s++) { /* E_1 -> fragment 1's state pass -> E_2 -> fragment 2's -> E_3 to rank 0 */
            float *E1 = E + 2 * s * ch.hh, *E2 = E1 + ch.hh;
            cp_chain_take(cp, E1, ch.in[0] + s * ch.hh, s, 1, ch.hh);
            cp_gdn_fragment_forward(cp, layer, NULL, c, 2 * s, E1, E2, GDN_KEPT_PREP_IN, d);
            cp_chain_take(cp, E2, E2, s, 2, ch.hh);
            cp_gdn_fragment_forward(cp, layer, NULL, c, 2 * s + 1, E2, ch.out + s * ch.hh, GDN_KEPT_PREP_IN, d);
        }
        cp_chain_handoff(cp, layer, ch.out, ch.in[1], ch.bytes, CP_TAG_CHAIN_FWD1,
                         "GDN chain forward: fragment 2's exit", &h[1]);
    }

    cp_gdn_mark(cp, 0, 2); /* tail: rank 0 fragment 3 from E_3, whole; rank 1 the outputs of fragments 1 and 2 */
    for (int s = 0; s < S; s++) {
        float *Ef = E + (2 * s + 1) * ch.hh;
        if (first) {
            cp_chain_take(cp, Ef, ch.in[1] + s * ch.hh, s, 3, ch.hh);
            cp_gdn_fragment_forward(cp, layer, o, c, 2 * s + 1, Ef, NULL, GDN_KEPT_PREP_IN, d);
        } else {
            cp_gdn_fragment_forward(cp, layer, o, c, 2 * s, Ef - ch.hh, NULL, GDN_KEPT_STATES_IN, d);
            cp_gdn_fragment_forward(cp, layer, o, c, 2 * s + 1, Ef, NULL, GDN_KEPT_STATES_IN, d);
        }
    }
    comm_wait(cp->comm, &h[1]);
    cp->count.scan_allgathers_fwd[layer]++;
}

static void cp_chain_backward_staged(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c,
                                     const CpGdnDims *d) {
    const int S = cp->batch.samples, first = cp->L.rank == 0;
    const CpChain ch = cp_chain_buffers(cp, d);
    float *D = cp->dstate; /* rank 1: the gradients arriving at fragments 1 and 2's exits */
    CommHandle h[2];
    memset(h, 0, sizeof h);

    cp_gdn_mark(cp, 1, 0); /* head: rank 0 fragment 3's state-gradient pass (dE_3); rank 1 its dout stages */
    for (int s = 0; s < S; s++) {
        if (first) {
            cp_gdn_fragment_stage(cp, GDN_BWD_DOUT, gr, c, 2 * s + 1, NULL, NULL, d);
            cp_gdn_fragment_stage(cp, GDN_BWD_STATE, gr, c, 2 * s + 1, NULL, ch.out + s * ch.hh, d);
        } else {
            cp_gdn_fragment_stage(cp, GDN_BWD_DOUT, gr, c, 2 * s, NULL, NULL, d);
            cp_gdn_fragment_stage(cp, GDN_BWD_DOUT, gr, c, 2 * s + 1, NULL, NULL, d);
        }
    }
    cp_chain_handoff(cp, layer, ch.out, ch.in[0], ch.bytes, CP_TAG_CHAIN_BWD0,
                     "GDN chain backward: fragment 3's entry gradient", &h[0]);

    cp_gdn_mark(cp, 1, 1); /* relay */
    if (first) {
        /* This rank's side of the second hand-off before fragment 3's gradients: rank 1 (two state passes,
           then its gradients: the longer path) then finds it posted, and the NCCL kernel that waits for
           rank 1's side runs beside this rank's work, which has the slack. */
        cp_chain_handoff(cp, layer, ch.out, ch.in[1], ch.bytes, CP_TAG_CHAIN_BWD1,
                         "GDN chain backward: fragment 1's entry gradient", &h[1]);
        for (int s = 0; s < S; s++) cp_gdn_fragment_stage(cp, GDN_BWD_GRADS, gr, c, 2 * s + 1, NULL, NULL, d);
    } else {
        comm_wait(cp->comm, &h[0]);
        for (int s = 0; s < S; s++) { /* dE_3 -> fragment 2's state-gradient pass -> dE_2 -> fragment 1's -> dE_1 */
            float *D1 = D + 2 * s * ch.hh, *D2 = D1 + ch.hh;
            cp_chain_take(cp, D2, ch.in[0] + s * ch.hh, s, 3, ch.hh);
            cp_gdn_fragment_stage(cp, GDN_BWD_STATE, gr, c, 2 * s + 1, D2, D1, d);
            cp_chain_take(cp, D1, D1, s, 2, ch.hh);
            cp_gdn_fragment_stage(cp, GDN_BWD_STATE, gr, c, 2 * s, D1, ch.out + s * ch.hh, d);
        }
        cp_chain_handoff(cp, layer, ch.out, ch.in[1], ch.bytes, CP_TAG_CHAIN_BWD1,
                         "GDN chain backward: fragment 1's entry gradient", &h[1]);
    }

    cp_gdn_mark(cp, 1, 2); /* tail: rank 0 fragment 0's backward from dE_1; rank 1 the gradients of 1 and 2 */
    if (first) {
        comm_wait(cp->comm, &h[0]);
        comm_wait(cp->comm, &h[1]);
    }
    for (int s = 0; s < S; s++) {
        if (first) {
            float *D1 = ch.in[1] + s * ch.hh;
            cp_chain_take(cp, D1, D1, s, 1, ch.hh);
            cp_gdn_fragment_backward(cp, gr, c, 2 * s, D1, NULL, d);
        } else {
            float *D1 = D + 2 * s * ch.hh;
            cp_gdn_fragment_stage(cp, GDN_BWD_GRADS, gr, c, 2 * s, D1, NULL, d);
            cp_gdn_fragment_stage(cp, GDN_BWD_GRADS, gr, c, 2 * s + 1, D1 + ch.hh, NULL, d);
        }
    }
    comm_wait(cp->comm, &h[1]);
    cp->count.scan_allgathers_bwd[layer]++;
}

/* the staged chain where its buffers are (cp_init gave gdn_dkept, the forward keeps its chunk states) */
static int cp_chain_staged(const Cp *cp, const CpGdnCore *c) {
    return cp->gdn_dkept && c->kept && c->kept_states;
}

/* ---- the core ------------------------------------------------------------------------------- */

void cp_gdn_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, int communicate, const CpGdnDims *d) {
    const CpLayout *L = &cp->L;
    const int64_t hh = (int64_t)d->nv * d->dk * d->dv, n = (int64_t)cp->batch.samples * L->nlocal;
    RS_CHECK(L->P == 1 || c->states, "GDN core with cp = %d without entry states", L->P);
    if (communicate && L->P == 2) {
        if (cp_chain_staged(cp, c)) cp_chain_forward_staged(cp, layer, o, c, d);
        else cp_chain_forward(cp, layer, o, c, d);
        return;
    }
    cp_gdn_mark(cp, 0, 0); /* scan */
    if (communicate && L->P > 1) cp_scan_forward(cp, layer, c, d);
    cp_gdn_mark(cp, 0, 1); /* chunk */
    const int prep_in = communicate && L->P > 1 && c->kept; /* the scan's transitions left each prep in kept */
    for (int64_t i = 0; i < n; i++)
        cp_gdn_fragment_forward(cp, layer, o, c, i, L->P > 1 ? c->states + i * hh : NULL, NULL,
                                prep_in ? GDN_KEPT_PREP_IN : 0, d);
}

void cp_gdn_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, const CpGdnDims *d) {
    const CpLayout *L = &cp->L;
    const int64_t hh = (int64_t)d->nv * d->dk * d->dv, n = (int64_t)cp->batch.samples * L->nlocal;
    if (L->P == 2) {
        if (cp_chain_staged(cp, c)) cp_chain_backward_staged(cp, layer, gr, c, d);
        else cp_chain_backward(cp, layer, gr, c, d);
        return;
    }
    cp_gdn_mark(cp, 1, 0); /* scan */
    if (L->P > 1) cp_scan_backward(cp, layer, gr, c, d);
    cp_gdn_mark(cp, 1, 1); /* chunk */
    for (int64_t i = 0; i < n; i++)
        cp_gdn_fragment_backward(cp, gr, c, i, L->P > 1 ? cp->dstate + i * hh : NULL, NULL, d);
}

/* ---- conv halo -------------------------------------------------------------------------- */

void cp_gdn_halo_forward(Cp *cp, int layer, void *halo, const void *proj, int ldp, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const int es = be->act_size, w = d->Kc - 1;
    const int64_t tail = (int64_t)w * d->Cc, per_rank = (int64_t)B->samples * L->nlocal * tail;
    RS_CHECK(L->frag_len >= w, "fragments of %lld tokens are shorter than the conv halo (%d)", (long long)L->frag_len,
             w);
    for (int s = 0; proj && s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int64_t i = (int64_t)s * L->nlocal + f, last = cp_frag_row(cp, s, f) + L->frag_len - w;
            be->copy_2d(CP_AT(cp->halo_send, i * tail), CP_AT(proj, last * ldp), w, d->Cc, d->Cc, ldp);
        }
    CommHandle h = {0};
    comm_set_context(cp->comm, layer, "conv halo forward");
    comm_iallgather(cp->comm, COMM_CP, cp->halo_send, cp->halo_recv, per_rank * es, &h);
    comm_wait(cp->comm, &h);
    cp->count.halo_exchanges[layer]++;
    for (int s = 0; s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            int gi = L->frag_global[f];
            void *dst = CP_AT(halo, ((int64_t)s * L->nlocal + f) * tail);
            if (gi == 0) { /* the sample's first fragment: nothing before it */
                be->memset_zero(dst, (size_t)(tail * es));
                continue;
            }
            int fp, r = cp_layout_owner(L, gi - 1, &fp);
            be->copy(dst, CP_AT(cp->halo_recv, r * per_rank + ((int64_t)s * L->nlocal + fp) * tail),
                     (size_t)(tail * es));
        }
}

void cp_gdn_halo_backward(Cp *cp, int layer, void *dproj, int ldp, const void *dhalo, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpLayout *L = &cp->L;
    const CpBatch *B = &cp->batch;
    const int es = be->act_size, w = d->Kc - 1;
    const int64_t tail = (int64_t)w * d->Cc, per_rank = (int64_t)B->samples * L->nlocal * tail;
    if (dhalo != cp->halo_send) be->copy(cp->halo_send, dhalo, (size_t)(per_rank * es));
    CommHandle h = {0};
    comm_set_context(cp->comm, layer, "conv halo backward");
    comm_iallgather(cp->comm, COMM_CP, cp->halo_send, cp->halo_recv, per_rank * es, &h);
    comm_wait(cp->comm, &h);
    cp->count.halo_exchanges[layer]++;
    for (int s = 0; dproj && s < B->samples; s++)
        for (int f = 0; f < L->nlocal; f++) {
            const void *g = cp_gdn_halo_grad(cp, s, f, d);
            if (!g) continue;
            int64_t last = cp_frag_row(cp, s, f) + L->frag_len - w;
            be->add_2d(CP_AT(dproj, last * ldp), g, w, d->Cc, ldp, d->Cc);
        }
}

const void *cp_gdn_halo_grad(const Cp *cp, int s, int f, const CpGdnDims *d) {
    const CpLayout *L = &cp->L;
    const int gi = L->frag_global[f];
    if (gi == L->nglobal - 1) return NULL; /* the sample's last fragment: no successor read its tail */
    const int64_t tail = (int64_t)(d->Kc - 1) * d->Cc, per_rank = (int64_t)cp->batch.samples * L->nlocal * tail;
    int fn, r = cp_layout_owner(L, gi + 1, &fn);
    return (const char *)cp->halo_recv + (r * per_rank + ((int64_t)s * L->nlocal + fn) * tail) * cp->be->act_size;
}
