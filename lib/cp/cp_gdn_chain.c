/*
 * cp_gdn_chain.c — the GDN core's zigzag chain at P = 2 (cp_gdn_chain.h).
 * Whole: forward head (rank 0: fragment 0; rank 1: fragment 2's prep and
 * transition), relay (E_1 to rank 1, fragment 1, E_3 = M_2 E_2 + H_2 back),
 * tail (fragments 3 and 2 without prep); backward head (dL_3 and dL_2 by
 * gdn_chunk_dstate), relay (dE_3 to rank 1, dE_2 = dL_2 + M_2^T dE_3,
 * fragment 1's backward, dE_1 back), tail (fragments 0 and 2). Staged: the
 * same hand-offs after state passes and backward stages alone
 * (GDN_KEPT_STATES_IN, gdn_chunk_backward_stage), with rank 1's two
 * fragments' stages in cp->gdn_dkept. Each hand-off is one comm_isendrecv
 * between the two ranks, fp32, every sample at once, posted when its data
 * is ready. Only the order of fp32 operations differs from the scan's.
 * Derivation and the full schedule: docs/design/gdn-cp.md.
 *
 * Callers: cp_gdn.c (cp_gdn_forward, cp_gdn_backward).
 */
#include "cp_gdn_chain.h"

#include <string.h>

#include "cp_gdn_fragment.h"

enum { CP_TAG_CHAIN_FWD0 = 31, CP_TAG_CHAIN_FWD1 = 32, CP_TAG_CHAIN_BWD0 = 33, CP_TAG_CHAIN_BWD1 = 34 };

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
void cp_chain_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, const CpGdnDims *d) {
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
            cp_gdn_fragment_transition(cp, c->M + (2 * s + 1) * ch.mm, ch.own + s * ch.hh, c, 2 * s + 1, 0, d);
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
void cp_chain_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, const CpGdnDims *d) {
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
void cp_chain_forward_staged(Cp *cp, int layer, void *o, const CpGdnCore *c, const CpGdnDims *d) {
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

void cp_chain_backward_staged(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c,
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
int cp_chain_staged(const Cp *cp, const CpGdnCore *c) {
    return cp->gdn_dkept && c->kept && (c->kept_kind & GDN_KEPT_STATES);
}
