/*
 * cp_gdn.c — Gated DeltaNet's delta-rule core across the CP group (cp.h):
 * cp_gdn_method chooses the schedule from the world shape (the one place it
 * is chosen), and cp_gdn_forward and cp_gdn_backward run it to give each
 * local fragment its entry state (forward) or the gradient at its exit
 * (backward).
 *
 * Per value head a fragment maps the state entering it to the state leaving
 * it affinely, X_g = M_g E_g + H_g (M_g = 0 when a document starts inside),
 * with E_g = X_{g-1} and E_0 = 0; backward, dE_g = dL_g + M_g^T dE_{g+1}.
 * At P = 2 the zigzag chain hands the states between the two ranks
 * (cp_gdn_chain.c, whole or staged); at P = 3, 4 the hybrid chains the first
 * halves by state passes and folds the second halves (cp_gdn_hybrid.c); above,
 * the prefix scan all-gathers every fragment's (M, H) and folds them
 * (cp_gdn_scan.c); without communication (P = 1, or the remat recompute,
 * which keeps the entry states the forward received) each fragment runs from
 * the states as they are. The conv halo is cp_gdn_halo.c's. Derivations, the
 * schedules step by step and their costs: docs/design/gdn-cp.md.
 *
 * Callers: lib/model/model_block.c (GDN layers), bench/bench_cp.c, tests/cp; cp_layout.c and
 * lib/model/model_acts.c (cp_gdn_method, cp_gdn_method_staged), lib/plan/plan.c (the method's name).
 */
#include "cp.h"
#include "core/error.h"
#include "cp_gdn_chain.h"
#include "cp_gdn_fragment.h"
#include "cp_gdn_hybrid.h"
#include "cp_gdn_scan.h"

/* The largest CP size the hybrid is chosen at: its critical path, one chain through the P first halves, grows
 * with P while the scan's stays two transitions and two passes deep (docs/design/gdn-cp.md, the cost table) */
#define CP_GDN_HYBRID_MAX_CP 4

const char *const cp_gdn_method_names[CP_GDN_METHODS + 1] = {"local", "scan", "chain", "hybrid", NULL};

static const char *const cp_gdn_chain_steps[] = {"head", "relay", "tail"};
static const char *const cp_gdn_scan_steps[] = {"scan", "chunk"};

/* the staged passes' config: the chain's switch and the kept chunk states */
static int cp_gdn_config_staged(const Config *cfg) {
    return cfg->parallel.gdn_chain_staged && cfg->checkpoint.gdn_keep == GDN_KEEP_STATES;
}

CpGdnMethod cp_gdn_method(const Config *cfg) {
    const int64_t P = cfg->parallel.cp;
    if (P == 1) return CP_GDN_LOCAL;
    if (P == 2) return CP_GDN_CHAIN;
    return cp_gdn_config_staged(cfg) && P <= CP_GDN_HYBRID_MAX_CP ? CP_GDN_HYBRID : CP_GDN_SCAN;
}

int cp_gdn_method_staged(CpGdnMethod m, const Config *cfg) {
    if (cfg->parallel.cp == 1 || !cp_gdn_config_staged(cfg)) return 0;
    return m == CP_GDN_CHAIN ? 2 : m == CP_GDN_HYBRID ? 1 : 0;
}

/* The fragments the hybrid schedule chains under cp's method (cp_gdn_hybrid.c), or 0: it does not run */
static int cp_gdn_chained(const Cp *cp) {
    const int P = cp->L.P;
    if (cp->gdn_method == CP_GDN_HYBRID) return P;
    if (cp->gdn_method == CP_GDN_CHAIN && P >= 3) return 2 * P - 1;
    return 0;
}

const char *const *cp_gdn_steps(const Cp *cp, int *n) {
    const int chain = cp->gdn_method == CP_GDN_CHAIN || cp->gdn_method == CP_GDN_HYBRID;
    *n = chain ? 3 : 2;
    return chain ? cp_gdn_chain_steps : cp_gdn_scan_steps;
}

int cp_gdn_forward_needs_kept(const Cp *cp) { return cp_gdn_chained(cp) > 0 && cp->gdn_dkept != NULL; }

void cp_gdn_set_method(Cp *cp, CpGdnMethod m) {
    const int P = cp->L.P;
    RS_CHECK(m >= 0 && m < CP_GDN_METHODS && (m == CP_GDN_LOCAL) == (P == 1), "GDN CP method %d at cp %d", (int)m, P);
    cp->gdn_method = m;
    const int frags = m == CP_GDN_CHAIN ? 2 : m == CP_GDN_HYBRID ? 1 : 0;
    if (frags > (cp->gdn_dkept ? cp->gdn_dkept_frags : 0) && cp->gdn_dkept_one) {
        if (cp->gdn_dkept_own) cp->be->free(cp->gdn_dkept_own);
        cp->gdn_dkept_own = cp->be->alloc((size_t)cp->batch.samples * frags * cp->gdn_dkept_one);
        cp->gdn_dkept = cp->gdn_dkept_own;
        cp->gdn_dkept_frags = frags;
    }
}

void cp_gdn_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, int communicate, const CpGdnDims *d) {
    const CpLayout *L = &cp->L;
    const int64_t hh = (int64_t)d->nv * d->dk * d->dv, n = (int64_t)cp->batch.samples * L->nlocal;
    const int chained = cp_gdn_chained(cp);
    RS_CHECK(L->P == 1 || c->states, "GDN core with cp = %d without entry states", L->P);
    if (communicate && L->P == 2 && cp->gdn_method == CP_GDN_CHAIN) {
        if (cp_chain_staged(cp, c)) cp_chain_forward_staged(cp, layer, o, c, d);
        else cp_chain_forward(cp, layer, o, c, d);
        return;
    }
    if (communicate && chained && c->kept && (c->kept_kind & GDN_KEPT_STATES)) {
        cp_hybrid_forward(cp, layer, o, c, chained, d);
        cp->gdn_fwd_hybrid[layer] = 1;
        return;
    }
    int steps;
    cp_gdn_steps(cp, &steps);
    cp_gdn_mark(cp, 0, 0); /* scan */
    if (communicate && L->P > 1) {
        cp_scan_forward(cp, layer, c, d);
        cp->gdn_fwd_hybrid[layer] = 0;
    }
    cp_gdn_mark(cp, 0, steps - 1); /* chunk */
    const int prep_in = communicate && L->P > 1 && c->kept; /* the scan's transitions left each prep in kept */
    for (int64_t i = 0; i < n; i++)
        cp_gdn_fragment_forward(cp, layer, o, c, i, L->P > 1 ? c->states + i * hh : NULL, NULL,
                                prep_in ? GDN_KEPT_PREP_IN : 0, d);
}

void cp_gdn_backward(Cp *cp, int layer, const CpGdnGrads *gr, const CpGdnCore *c, const CpGdnDims *d) {
    const CpLayout *L = &cp->L;
    const int64_t hh = (int64_t)d->nv * d->dk * d->dv, n = (int64_t)cp->batch.samples * L->nlocal;
    const int chained = cp_gdn_chained(cp);
    if (L->P == 2 && cp->gdn_method == CP_GDN_CHAIN) {
        if (cp_chain_staged(cp, c)) cp_chain_backward_staged(cp, layer, gr, c, d);
        else cp_chain_backward(cp, layer, gr, c, d);
        return;
    }
    if (chained && cp->gdn_dkept && c->kept && (c->kept_kind & GDN_KEPT_STATES)) {
        cp_hybrid_backward(cp, layer, gr, c, chained, d);
        return;
    }
    RS_CHECK(L->P == 1 || !cp->gdn_fwd_hybrid[layer], "GDN layer %d: its forward ran the %s schedule, which leaves "
             "the transitions of its folded fragments only, but its backward has no kept chunk states or gdn_dkept "
             "for that schedule's backward (the scan's would need every fragment's)", layer,
             cp_gdn_method_names[cp->gdn_method]);
    int steps;
    cp_gdn_steps(cp, &steps);
    cp_gdn_mark(cp, 1, 0); /* scan */
    if (L->P > 1) cp_scan_backward(cp, layer, gr, c, d);
    cp_gdn_mark(cp, 1, steps - 1); /* chunk */
    for (int64_t i = 0; i < n; i++)
        cp_gdn_fragment_backward(cp, gr, c, i, L->P > 1 ? cp->dstate + i * hh : NULL, NULL, d);
}
