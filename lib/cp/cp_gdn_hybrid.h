/*
 * cp_gdn_hybrid.h — the GDN core's hybrid schedule over a CP group of any P:
 * global fragments 0 .. C-1 of each sample (C = `chained`, P <= C <= 2P - 1)
 * hand the state on by state passes alone, rank to rank (rank r holds
 * fragments r and 2P-1-r, so the chain runs up the ranks through the first
 * halves and, for C > P, back down); fragment C takes its entry from the
 * chain too and publishes its exit from its transition, and every later
 * fragment takes its entry from one all-gather and a fold of the transitions
 * between. The backward mirrors it: the gradients of the folded fragments come
 * from one all-gather of [M | dL] and the fold with M^T, the chained ones by
 * state-gradient stages back down the chain. C = P is the hybrid
 * (CP_GDN_HYBRID); C = 2P - 1 chains every fragment (CP_GDN_CHAIN at P >= 3).
 * Needs the fragments' kept buffers with their chunk states (forward) and
 * Cp.gdn_dkept (backward). Derivation, order and costs: docs/design/gdn-cp.md.
 *
 * Callers: cp_gdn.c.
 */
#ifndef RS_CP_GDN_HYBRID_H
#define RS_CP_GDN_HYBRID_H

#include "cp.h"

/* o = the core over this rank's fragments; c->states = their entry states, c->M the transitions of the
 * fragments after C that the backward folds. */
void cp_hybrid_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, int chained, const CpGdnDims *d);
/* gr = the core's backward, c as cp_hybrid_forward (or the scan, which leaves every M) left it. */
void cp_hybrid_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, int chained,
                        const CpGdnDims *d);

#endif
