/*
 * cp_gdn_scan.h — the GDN core's prefix scan over the CP group (P >= 5):
 * one all-gather per pass of every local fragment's [M | H] (forward) or
 * [M | dL] (backward) slots, folded in global order into each fragment's
 * entry state (c->states) or exit gradient (cp->dstate). cp_gdn.c
 * then runs every fragment from them. Derivation: docs/design/gdn-cp.md.
 *
 * Callers: cp_gdn.c.
 */
#ifndef RS_CP_GDN_SCAN_H
#define RS_CP_GDN_SCAN_H

#include "cp.h"

void cp_scan_forward(Cp *cp, int layer, const CpGdnCore *c, const CpGdnDims *d);
void cp_scan_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, const CpGdnDims *d);

#endif
