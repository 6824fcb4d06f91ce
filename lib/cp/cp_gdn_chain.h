/*
 * cp_gdn_chain.h — the GDN core's zigzag chain between the two ranks of a
 * CP group of 2: rank 0 holds fragments 0 and 3, rank 1 fragments 1 and 2,
 * and the entry states (forward) and their gradients (backward) are handed
 * over in three steps, head, relay and tail. The whole chain runs each
 * fragment's forward and backward whole (a transition and a dL pass carry the
 * states across); the staged chain (parallel.gdn_chain_staged, with the
 * chunk states kept) runs them in stages, so each hand-off leaves after
 * state passes alone. Derivation and the step-by-step schedule: docs/design/gdn-cp.md.
 *
 * Callers: cp_gdn.c.
 */
#ifndef RS_CP_GDN_CHAIN_H
#define RS_CP_GDN_CHAIN_H

#include "cp.h"

void cp_chain_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, const CpGdnDims *d);
void cp_chain_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, const CpGdnDims *d);
void cp_chain_forward_staged(Cp *cp, int layer, void *o, const CpGdnCore *c, const CpGdnDims *d);
void cp_chain_backward_staged(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c,
                              const CpGdnDims *d);
/* Whether the staged chain runs: cp_init gave gdn_dkept and the forward keeps its chunk states. */
int cp_chain_staged(const Cp *cp, const CpGdnCore *c);

#endif
