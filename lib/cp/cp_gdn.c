/*
 * cp_gdn.c — Gated DeltaNet's delta-rule core across the CP group (cp.h):
 * cp_gdn_forward and cp_gdn_backward pick the schedule that gives each local
 * fragment its entry state (forward) or the gradient at its exit (backward).
 *
 * Per value head a fragment maps the state entering it to the state leaving
 * it affinely, X_g = M_g E_g + H_g (M_g = 0 when a document starts inside),
 * with E_g = X_{g-1} and E_0 = 0; backward, dE_g = dL_g + M_g^T dE_{g+1}.
 * At P = 2 the zigzag chain hands the states between the two ranks
 * (cp_gdn_chain.c, whole or staged); at P > 2 the prefix scan all-gathers
 * every fragment's (M, H) and folds them (cp_gdn_scan.c); without
 * communication (P = 1, or the remat recompute, which keeps the entry states
 * the forward received) each fragment runs from the states as they are.
 * Then every fragment's forward or backward runs (cp_gdn_fragment.c). The
 * conv halo is cp_gdn_halo.c's. Derivations and the schedules step by step:
 * docs/design/gdn-cp.md.
 *
 * Callers: lib/model/model_block.c (GDN layers), bench/bench_cp.c, tests/cp.
 */
#include "cp.h"
#include "core/error.h"
#include "cp_gdn_chain.h"
#include "cp_gdn_fragment.h"
#include "cp_gdn_scan.h"

static const char *const cp_gdn_chain_steps[] = {"head", "relay", "tail"};
static const char *const cp_gdn_scan_steps[] = {"scan", "chunk"};

const char *const *cp_gdn_steps(const CpLayout *L, int *n) {
    *n = L->P == 2 ? 3 : 2;
    return L->P == 2 ? cp_gdn_chain_steps : cp_gdn_scan_steps;
}

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
