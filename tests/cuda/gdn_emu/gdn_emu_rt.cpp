/*
 * gdn_emu_rt.cpp (gdn_emu) — what the GDN host emulation (oracle_build.sh) adds to the KDA emulation's runtime
 * (tests/cuda/kda_emu/emu_rt.cpp): the profile entries of kernels/cuda/gdn/gdn_profile.cu as no-ops, and
 * cuda_gdn_tune_set, which keeps the wgmma / TMA passes off. The production setter (kernels/cuda/gdn/gdn_tune.cu,
 * built here as gdn_emu_tune_set_real) gets every choice as asked but state_fwd_wgmma, state_bwd_wgmma and
 * dual_wgmma, which are set to 2 (off), also for the built-in choices (NULL; set once before main), where dual_wgmma
 * would otherwise put the dual launch's second form on wgmma: every configuration of tests/cuda/test_cuda_gdn.cu
 * runs its mma.sync form (the segments, document segments, stages, column blocks and dual launch it asks for), and
 * nothing Hopper-only runs (inc/cuda_ptx.h stops the program if it did). The tags the test prints name the
 * configuration it asked for; cuda_gdn_tune_get returns the one that ran.
 */
#include "cuda_common.h"
#include "cuda_gdn_tune.h"
#include "gdn_host.h"

extern "C" void gdn_emu_tune_set_real(const CudaGdnTune *t);

extern "C" void cuda_gdn_tune_set(const CudaGdnTune *t) {
    CudaGdnTune m;
    if (t) m = *t;
    else memset(&m, 0, sizeof m);
    static bool told;
    if (!told && t && (t->sfwd == 1 || t->sfwd == 3 || t->sbwd == 1 || t->dwg == 1)) {
        printf("gdn_emu: wgmma switches asked for (state_fwd_wgmma %d, state_bwd_wgmma %d, dual_wgmma %d): the "
               "emulation runs the mma.sync passes instead (here and in every later configuration)\n",
               t->sfwd, t->sbwd, t->dwg);
        told = true;
    }
    m.sfwd = m.sbwd = m.dwg = 2;
    gdn_emu_tune_set_real(&m);
}
static const int gdn_emu_tune_init = (cuda_gdn_tune_set(NULL), 0);

extern "C" void cuda_gdn_profile(int level) {
    if (level) fprintf(stderr, "gdn_emu: cuda_gdn_profile(%d) ignored (no device timers)\n", level);
}
void gdn_tp_print(const GdnPlan &, int) {}
