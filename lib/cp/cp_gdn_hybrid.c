/*
 * cp_gdn_hybrid.c — the GDN core's hybrid schedule (cp_gdn_hybrid.h). Rank r
 * holds A = fragment r and B = fragment 2P-1-r of each sample; C fragments
 * are chained. Forward, per rank, in three steps (Cp.step_mark):
 *   head   rank 0: A's state pass from 0, its exit to rank 1. The others: the
 *          preps of A and B, and B's transition where B >= C needs one and
 *          the rank would otherwise wait (the upper half, 2r >= P).
 *   relay  A's state pass from the entry rank r-1 hands over, its exit to
 *          rank r+1 (rank P-1 keeps it: fragment P is its own B). B: chained
 *          (B < C), its state pass from rank r+1's hand-over (rank P-1's own),
 *          its exit to rank r-1; fragment C, its entry likewise and its exit
 *          M_C E_C + H_C into the all-gather slot; folded (B > C), its
 *          transition [M | H] into the slot. Then the all-gather (posted after
 *          the rank's last hand-off, so no rank's exchange waits behind it).
 *          Rank 0 computes A's outputs and B's prep here.
 *   tail   A's outputs (and a chained B's) from the kept chunk states; a
 *          folded B's entry folded from C's exit, then its whole forward.
 * Backward: head: a folded B (B >= C) its dL into the slot with its M
 * (fragment 2P-1's dL is its entry gradient), a chained B its dout stage;
 * the all-gather; A's dout stage. relay: a folded B's exit gradient from
 * the fold, dE_{B+1} = dL_{B+1} + M_{B+1}^T (... dE_{2P-1}), and its whole
 * backward (the lower half, 2r < P, here: it waits longest for the chain;
 * the upper half in the tail); a chained B's state stage from rank r-1's
 * hand-over, its dS0 on to rank r+1; A's state stage from rank r+1's
 * hand-over (rank P-1: dE_P from the fold, or from its chained B), its dS0
 * to rank r-1 (rank 0: A's whole backward). tail: the gradients stages. So
 * Cp.gdn_dkept holds A's stages alone where every B is folded (C = P).
 * Every hand-off is one comm_isendrecv on the CP group, fp32, every sample at
 * once; an entry (gradient) is 0 where its fragment starts a document.
 *
 * Callers: cp_gdn.c.
 */
#include "cp_gdn_hybrid.h"

#include "core/error.h"
#include "cp_gdn_fragment.h"

/* hand-off tags: A's exits up the ranks, B's down; the backward's B dS0 up, A's down */
enum { CP_TAG_HY_FWD_A = 41, CP_TAG_HY_FWD_B = 42, CP_TAG_HY_BWD_B = 43, CP_TAG_HY_BWD_A = 44 };

/* The schedule's shape on this rank and its buffers (floats). */
typedef struct {
    int     P, r, A, B, C, S;
    int64_t hh, mm, slot;           /* a state (nv, dk, dv), a transition (nv, dk, dk), a slot [M | H] */
    float  *inA, *outA, *inB, *outB; /* (S, hh) each: what the hand-offs bring and take */
    float  *send, *all;             /* (S, slot) this rank's all-gather slot; (P, S, slot) every rank's */
} CpHy;

static CpHy cp_hy_init(const Cp *cp, int chained, const CpGdnDims *d) {
    const CpLayout *L = &cp->L;
    CpHy h;
    h.P = L->P;
    h.r = L->rank;
    h.A = L->frag_global[0];
    h.B = L->frag_global[1];
    h.C = chained;
    h.S = cp->batch.samples;
    h.hh = (int64_t)d->nv * d->dk * d->dv;
    h.mm = (int64_t)d->nv * d->dk * d->dk;
    h.slot = h.mm + h.hh;
    RS_CHECK(L->P >= 2 && chained >= L->P && chained <= 2 * L->P - 1, "GDN hybrid: %d chained fragments at cp %d",
             chained, L->P);
    /* scan_send holds (S, 2, slot), scan_recv P times that (model_acts.c): the slot and one buffer in the first,
       every rank's slots and three buffers in the second */
    const int64_t S = h.S;
    RS_CHECK((int64_t)h.P * h.slot >= 3 * h.hh, "GDN hybrid at cp %d: linear_key_head_dim %d is too small beside "
             "linear_value_head_dim %d for its buffers", h.P, d->dk, d->dv);
    h.send = cp->scan_send;
    h.outB = cp->scan_send + S * h.slot;
    h.all = cp->scan_recv;
    h.inA = cp->scan_recv + (int64_t)h.P * S * h.slot;
    h.outA = h.inA + S * h.hh;
    h.inB = h.outA + S * h.hh;
    return h;
}

/* The owner of global fragment g's slot in h->all for sample s */
static float *cp_hy_slot(const Cp *cp, const CpHy *h, int s, int g) {
    return h->all + ((int64_t)cp_layout_owner(&cp->L, g, NULL) * h->S + s) * h->slot;
}

static int cp_hy_starts_doc(const Cp *cp, int s, int g) {
    return cp->batch.frag_starts_doc[(int64_t)s * cp->L.nglobal + g];
}

/* dst = src, or 0 where global fragment g of sample s starts a document (its entry, or the gradient arriving at
 * the exit of the fragment before it, is then nothing) */
static void cp_hy_take(Cp *cp, const CpHy *h, float *dst, const float *src, int s, int g) {
    if (cp_hy_starts_doc(cp, s, g)) cp->be->memset_zero(dst, (size_t)h->hh * sizeof(float));
    else if (dst != src) cp->be->copy(dst, src, (size_t)h->hh * sizeof(float));
}

/* One hand-off with the neighbour `peer`: `bytes` of send to it, as many of its into recv (one side's is junk). */
static void cp_hy_handoff(Cp *cp, int layer, int peer, const void *send, void *recv, int64_t bytes, int tag,
                          const char *what, CommHandle *hd) {
    comm_set_context(cp->comm, layer, what);
    comm_isendrecv(cp->comm, COMM_CP, send, peer, recv, peer, bytes, tag, hd);
}

/* E = the entry of global fragment g > C of sample s: C's exit (its owner's slot), then F_j(S) = M_j S + H_j for
 * j = C+1 .. g-1 (a fragment that starts a document passes only its H) */
static void cp_hy_fold_entry(Cp *cp, const CpHy *h, float *E, int s, int g, const CpGdnDims *d) {
    const float *S = cp_hy_slot(cp, h, s, h->C) + h->mm;
    int ping = 0;
    for (int j = h->C + 1; j < g; j++) {
        const float *Mj = cp_hy_slot(cp, h, s, j);
        float *dst = j + 1 == g ? E : cp->fold[ping];
        if (cp_hy_starts_doc(cp, s, j)) cp->be->copy(dst, Mj + h->mm, (size_t)h->hh * sizeof(float));
        else cp->be->gdn_state_affine(dst, Mj, S, Mj + h->mm, 0, d->nv, d->dk, d->dv);
        S = dst;
        ping ^= 1;
    }
    if (S != E) cp->be->copy(E, S, (size_t)h->hh * sizeof(float));
}

/* D = dE_t, the gradient of the entry of global fragment t > C of sample s: dE_{2P-1} (rank 0's slot), then
 * dE_j = dL_j + M_j^T dE_{j+1} for j = 2P-2 .. t (nothing arrives at j's exit where j+1 starts a document) */
static void cp_hy_fold_grad(Cp *cp, const CpHy *h, float *D, int s, int t, const CpGdnDims *d) {
    const int last = 2 * h->P - 1;
    const float *S = cp_hy_slot(cp, h, s, last) + h->mm;
    int ping = 0;
    for (int j = last - 1; j >= t; j--) {
        const float *Mj = cp_hy_slot(cp, h, s, j);
        float *dst = j == t ? D : cp->fold[ping];
        if (cp_hy_starts_doc(cp, s, j + 1)) cp->be->copy(dst, Mj + h->mm, (size_t)h->hh * sizeof(float));
        else cp->be->gdn_state_affine(dst, Mj, S, Mj + h->mm, 1, d->nv, d->dk, d->dv);
        S = dst;
        ping ^= 1;
    }
    if (S != D) cp->be->copy(D, S, (size_t)h->hh * sizeof(float));
}

/* B's transition for sample s: M into c->M (the backward folds it), H into the slot (B > C) or outB (B == C,
 * whose exit M E + H goes into the slot); the slot's M part is M (B > C). */
static void cp_hy_transition(Cp *cp, const CpHy *h, const CpGdnCore *c, int s, const CpGdnDims *d) {
    const int64_t i = 2 * (int64_t)s + 1;
    float *M = c->M + i * h->mm, *slot = h->send + (int64_t)s * h->slot;
    cp_gdn_fragment_transition(cp, M, h->B == h->C ? h->outB + (int64_t)s * h->hh : slot + h->mm, c, i, 1, d);
    if (h->B > h->C) cp->be->copy(slot, M, (size_t)h->mm * sizeof(float));
}

void cp_hybrid_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, int chained, const CpGdnDims *d) {
    const Backend *be = cp->be;
    const CpHy h = cp_hy_init(cp, chained, d);
    const int S = h.S, r = h.r, P = h.P, B = h.B, C = h.C;
    const int64_t hh = h.hh, bytes = (int64_t)S * hh * (int64_t)sizeof(float);
    const int gather = C <= 2 * P - 2;             /* fragments after C fold from the all-gather */
    const int trans = B >= C && B <= 2 * P - 2;    /* B's transition: fragment C's exit, or the fold's */
    const int early = trans && 2 * r >= P;         /* in the head, where the rank waits for its entry */
    float *E = c->states;                          /* local fragment i = 2s (A), 2s + 1 (B) */
    CommHandle hA = {0}, hB = {0}, hg = {0};
    RS_CHECK(c->kept && (c->kept_kind & GDN_KEPT_STATES), "GDN hybrid forward without the kept chunk states");

    cp_gdn_mark(cp, 0, 0); /* head */
    for (int s = 0; s < S; s++) {
        if (r == 0) { /* fragment 0's state pass from nothing (its prep inside): its exit is fragment 1's entry */
            be->memset_zero(E + 2 * s * hh, (size_t)hh * sizeof(float));
            cp_gdn_fragment_forward(cp, layer, NULL, c, 2 * s, E + 2 * s * hh, h.outA + s * hh, 0, d);
            continue;
        }
        cp_gdn_fragment_prep(cp, c, 2 * s, d);
        cp_gdn_fragment_prep(cp, c, 2 * s + 1, d);
        if (early) cp_hy_transition(cp, &h, c, s, d);
    }
    if (r == 0)
        cp_hy_handoff(cp, layer, 1, h.outA, h.inA, bytes, CP_TAG_HY_FWD_A, "GDN hybrid forward: fragment 0's exit", &hA);

    cp_gdn_mark(cp, 0, 1); /* relay */
    if (r == 0) { /* fragment 0's outputs and B's prep while the chain runs up the ranks */
        for (int s = 0; s < S; s++) {
            cp_gdn_fragment_forward(cp, layer, o, c, 2 * s, E + 2 * s * hh, NULL, GDN_KEPT_STATES_IN, d);
            cp_gdn_fragment_prep(cp, c, 2 * s + 1, d);
        }
    } else { /* A from rank r-1's hand-over; its exit to rank r+1, or at r = P-1 to its own B (fragment P) */
        cp_hy_handoff(cp, layer, r - 1, h.outA, h.inA, bytes, CP_TAG_HY_FWD_A, "GDN hybrid forward: A's entry", &hA);
        comm_wait(cp->comm, &hA);
        for (int s = 0; s < S; s++) {
            float *EA = E + 2 * s * hh, *EB = EA + hh;
            cp_hy_take(cp, &h, EA, h.inA + s * hh, s, h.A);
            cp_gdn_fragment_forward(cp, layer, NULL, c, 2 * s, EA, r < P - 1 ? h.outA + s * hh : EB, GDN_KEPT_PREP_IN,
                                    d);
            if (r == P - 1) cp_hy_take(cp, &h, EB, EB, s, B);
        }
        if (r < P - 1)
            cp_hy_handoff(cp, layer, r + 1, h.outA, h.inA, bytes, CP_TAG_HY_FWD_A, "GDN hybrid forward: A's exit", &hA);
    }
    if (trans && !early)
        for (int s = 0; s < S; s++) cp_hy_transition(cp, &h, c, s, d);
    if (B <= C) { /* B's entry down the chain from rank r+1 (rank P-1: its own A's exit, taken above) */
        if (r < P - 1) {
            cp_hy_handoff(cp, layer, r + 1, h.outA, h.inB, bytes, CP_TAG_HY_FWD_B, "GDN hybrid forward: B's entry",
                          &hB);
            comm_wait(cp->comm, &hB);
            for (int s = 0; s < S; s++) cp_hy_take(cp, &h, E + (2 * s + 1) * hh, h.inB + s * hh, s, B);
        }
        for (int s = 0; s < S; s++) {
            const int64_t i = 2 * (int64_t)s + 1;
            if (B < C) /* chained: its state pass, its exit on down */
                cp_gdn_fragment_forward(cp, layer, NULL, c, i, E + i * hh, h.outB + s * hh, GDN_KEPT_PREP_IN, d);
            else if (gather) /* fragment C: its exit from its transition, for every later fragment's fold */
                be->gdn_state_affine(h.send + s * h.slot + h.mm, c->M + i * h.mm, E + i * hh, h.outB + s * hh, 0,
                                     d->nv, d->dk, d->dv);
        }
        if (B < C)
            cp_hy_handoff(cp, layer, r - 1, h.outB, h.inB, bytes, CP_TAG_HY_FWD_B, "GDN hybrid forward: B's exit", &hB);
    }
    if (gather) {
        comm_set_context(cp->comm, layer, "GDN hybrid all-gather forward");
        comm_iallgather(cp->comm, COMM_CP, h.send, h.all, (int64_t)S * h.slot * (int64_t)sizeof(float), &hg);
    }

    cp_gdn_mark(cp, 0, 2); /* tail */
    for (int s = 0; s < S; s++) {
        if (r > 0) cp_gdn_fragment_forward(cp, layer, o, c, 2 * s, E + 2 * s * hh, NULL, GDN_KEPT_STATES_IN, d);
        if (B < C) cp_gdn_fragment_forward(cp, layer, o, c, 2 * s + 1, E + (2 * s + 1) * hh, NULL, GDN_KEPT_STATES_IN, d);
    }
    if (B >= C) {
        if (B > C) comm_wait(cp->comm, &hg);
        for (int s = 0; s < S; s++) {
            float *EB = E + (2 * s + 1) * hh;
            if (B > C) {
                cp_hy_fold_entry(cp, &h, EB, s, B, d);
                cp_hy_take(cp, &h, EB, EB, s, B);
            }
            cp_gdn_fragment_forward(cp, layer, o, c, 2 * s + 1, EB, NULL, GDN_KEPT_PREP_IN, d);
        }
    }
    comm_wait(cp->comm, &hA);
    comm_wait(cp->comm, &hB);
    comm_wait(cp->comm, &hg);
    cp->count.scan_allgathers_fwd[layer]++;
}

void cp_hybrid_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, int chained,
                        const CpGdnDims *d) {
    const CpHy h = cp_hy_init(cp, chained, d);
    const int S = h.S, r = h.r, P = h.P, B = h.B, C = h.C;
    const int64_t hh = h.hh, bytes = (int64_t)S * hh * (int64_t)sizeof(float);
    const int gather = C <= 2 * P - 2;
    const int folded = gather && B >= C; /* B's exit gradient from the fold, its dL into it, its backward whole */
    const int early = 2 * r < P;         /* B's gradients before A's: the lower half waits longest for the chain */
    float *D = cp->dstate;               /* (S, 2, hh): the gradients arriving at A's and B's exits */
    CommHandle hA = {0}, hB = {0}, hg = {0};
    RS_CHECK(cp->gdn_dkept && cp->gdn_dkept_frags >= (folded ? 1 : 2) && c->kept &&
                 (c->kept_kind & GDN_KEPT_STATES),
             "GDN hybrid backward without its stages' buffers");

    cp_gdn_mark(cp, 1, 0); /* head */
    for (int s = 0; s < S; s++) {
        const int64_t i = 2 * (int64_t)s + 1;
        float *slot = h.send + (int64_t)s * h.slot;
        if (folded) { /* [M_B | dL_B] (fragment 2P-1: dL is its entry gradient; its M is not read) */
            cp->be->copy(slot, c->M + i * h.mm, (size_t)h.mm * sizeof(float));
            cp_gdn_fragment_dstate(cp, slot + h.mm, gr, c, i, d);
        } else
            cp_gdn_fragment_stage(cp, GDN_BWD_DOUT, gr, c, i, NULL, NULL, d);
    }
    if (gather) {
        comm_set_context(cp->comm, layer, "GDN hybrid all-gather backward");
        comm_iallgather(cp->comm, COMM_CP, h.send, h.all, (int64_t)S * h.slot * (int64_t)sizeof(float), &hg);
    }
    for (int s = 0; r > 0 && s < S; s++) cp_gdn_fragment_stage(cp, GDN_BWD_DOUT, gr, c, 2 * s, NULL, NULL, d);

    cp_gdn_mark(cp, 1, 1); /* relay */
    if (!folded) { /* a chained B from rank r-1's hand-over, or the fold where fragment B+1 is folded (or, chaining
                      every fragment, rank 0's last from nothing) */
        const int from_fold = gather && B + 1 == C;
        if (from_fold) comm_wait(cp->comm, &hg);
        else if (B < 2 * P - 1) {
            cp_hy_handoff(cp, layer, r - 1, h.outA, h.inB, bytes, CP_TAG_HY_BWD_B, "GDN hybrid backward: B's exit "
                          "gradient", &hB);
            comm_wait(cp->comm, &hB);
        }
        for (int s = 0; s < S; s++) {
            float *DB = D + (2 * s + 1) * hh, *dS0 = r == P - 1 ? D + 2 * s * hh : h.outB + s * hh;
            if (from_fold) cp_hy_fold_grad(cp, &h, DB, s, C, d);
            if (B < 2 * P - 1) cp_hy_take(cp, &h, DB, from_fold ? DB : h.inB + s * hh, s, B + 1);
            cp_gdn_fragment_stage(cp, GDN_BWD_STATE, gr, c, 2 * s + 1, B < 2 * P - 1 ? DB : NULL, dS0, d);
        }
        if (r < P - 1)
            cp_hy_handoff(cp, layer, r + 1, h.outB, h.inB, bytes, CP_TAG_HY_BWD_B, "GDN hybrid backward: B's entry "
                          "gradient", &hB);
        for (int s = 0; early && s < S; s++) cp_gdn_fragment_stage(cp, GDN_BWD_GRADS, gr, c, 2 * s + 1, NULL, NULL, d);
    }
    if (folded) { /* the fold: B's exit gradient (nothing for fragment 2P-1), and at r = P-1 A's (dE_P) */
        comm_wait(cp->comm, &hg);
        for (int s = 0; s < S; s++) {
            float *DB = D + (2 * s + 1) * hh;
            if (B < 2 * P - 1) {
                cp_hy_fold_grad(cp, &h, DB, s, B + 1, d);
                cp_hy_take(cp, &h, DB, DB, s, B + 1);
            }
            if (r == P - 1) cp_hy_fold_grad(cp, &h, D + 2 * s * hh, s, P, d);
            if (early) cp_gdn_fragment_backward(cp, gr, c, 2 * s + 1, B < 2 * P - 1 ? DB : NULL, NULL, d);
        }
    }
    if (r < P - 1) { /* A's exit gradient from rank r+1 (rank P-1: its B's entry gradient, above) */
        cp_hy_handoff(cp, layer, r + 1, h.outA, h.inA, bytes, CP_TAG_HY_BWD_A, "GDN hybrid backward: A's exit "
                      "gradient", &hA);
        comm_wait(cp->comm, &hA);
    }
    for (int s = 0; s < S; s++) {
        float *DA = D + 2 * s * hh;
        cp_hy_take(cp, &h, DA, r < P - 1 ? h.inA + s * hh : DA, s, h.A + 1);
        if (r > 0) cp_gdn_fragment_stage(cp, GDN_BWD_STATE, gr, c, 2 * s, DA, h.outA + s * hh, d);
        else cp_gdn_fragment_backward(cp, gr, c, 2 * s, DA, NULL, d); /* fragment 0: the chain's end, whole */
    }
    if (r > 0)
        cp_hy_handoff(cp, layer, r - 1, h.outA, h.inA, bytes, CP_TAG_HY_BWD_A, "GDN hybrid backward: A's entry "
                      "gradient", &hA);

    cp_gdn_mark(cp, 1, 2); /* tail */
    for (int s = 0; s < S; s++) {
        float *DB = D + (2 * s + 1) * hh;
        if (r > 0) cp_gdn_fragment_stage(cp, GDN_BWD_GRADS, gr, c, 2 * s, NULL, NULL, d);
        if (early) continue;
        if (folded) cp_gdn_fragment_backward(cp, gr, c, 2 * s + 1, B < 2 * P - 1 ? DB : NULL, NULL, d);
        else cp_gdn_fragment_stage(cp, GDN_BWD_GRADS, gr, c, 2 * s + 1, NULL, NULL, d);
    }
    comm_wait(cp->comm, &hA);
    comm_wait(cp->comm, &hB);
    comm_wait(cp->comm, &hg);
    cp->count.scan_allgathers_bwd[layer]++;
}
