/*
 * cp_gdn_fragment.h — one local fragment's delta rule for the CP schedules of
 * the GDN core (cp_gdn_scan.c, cp_gdn_chain.c, cp_gdn_hybrid.c, cp_gdn.c): each call runs a
 * Backend gdn_chunk_* entry on local fragment i (= sample s x nlocal + f) of
 * the core's rows, with its doc_pos and its part of the kept buffer.
 * cp_gdn.c's header says what each schedule does; docs/design/gdn-cp.md has the derivation.
 *
 * Callers: cp_gdn.c, cp_gdn_scan.c, cp_gdn_chain.c, cp_gdn_hybrid.c.
 */
#ifndef RS_CP_GDN_FRAGMENT_H
#define RS_CP_GDN_FRAGMENT_H

#include "cp.h"

/* Marks the start of step t of a pass (0 forward, 1 backward) for cp->step_mark (bench cp's timings). */
void cp_gdn_mark(Cp *cp, int pass, int t);

/* Forward from S0 (NULL: 0) into o's rows (o NULL: the state pass alone, the staged chain); S_final = its
 * exit state when not NULL; `in`: backend.h kept_flags (GDN_KEPT_PREP_IN, GDN_KEPT_STATES_IN). */
void cp_gdn_fragment_forward(Cp *cp, int layer, void *o, const CpGdnCore *c, int64_t i, const float *S0,
                             float *S_final, int in, const CpGdnDims *d);
/* The prep (WY factors, gate cumsums) into its kept buffer (c->kept only). */
void cp_gdn_fragment_prep(Cp *cp, const CpGdnCore *c, int64_t i, const CpGdnDims *d);
/* Backward with dS_final (NULL: 0) at its exit; dS0 = the gradient of its entry state when not NULL. */
void cp_gdn_fragment_backward(Cp *cp, const CpGdnGrads *gr, const CpGdnCore *c, int64_t i,
                              const float *dS_final, float *dS0, const CpGdnDims *d);
/* One stage (GDN_BWD_*) of its backward, carried in its part of cp->gdn_dkept. */
void cp_gdn_fragment_stage(Cp *cp, int stage, const CpGdnGrads *gr, const CpGdnCore *c, int64_t i,
                           const float *dS_final, float *dS0, const CpGdnDims *d);
/* Its transition: exit = M entry + H (with c->kept, its prep first, into its kept buffer, unless prep_in: the
 * buffer holds it already). */
void cp_gdn_fragment_transition(Cp *cp, float *M, float *H, const CpGdnCore *c, int64_t i, int prep_in,
                                const CpGdnDims *d);
/* Its own state gradient dL, through its outputs alone (the prep from its kept buffer). */
void cp_gdn_fragment_dstate(Cp *cp, float *dL, const CpGdnGrads *gr, const CpGdnCore *c, int64_t i,
                            const CpGdnDims *d);

#endif
