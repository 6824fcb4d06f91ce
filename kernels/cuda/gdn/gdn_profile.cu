/*
 * gdn_profile.cu — the per-kernel profile of the GDN entries (cuda_gdn_profile, `ringscan bench gdn
 * --profile`): level 1 records a CUDA event on the compute stream after each kernel of an entry and
 * prints the times between them when the entry ends; level 2 also prints the state passes' cycles per
 * chunk by phase, which the kernels count on the device (GDN_TP_N). Off in training. Host code only.
 *
 * Callers: gdn.cu (gdn_prof_start / mark / end around every entry's launches), bench/bench.c.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h" /* GDN_PIECE_ROWS */
#include "cuda_ptx.h"
#include "cuda_common.h"
#include "cuda_gdn_mma.h"
#include "cuda_gdn_tune.h"
#include "cuda_kernels.h"

/* the kernels' constants only (GDN_C, GDN_META_N, GDN_TP_N, GdnCarve): no kernel is instantiated here */
#include "common.cuh"
#include "state_pass.cuh"

#include "gdn_host.h"

int gdn_prof_level; /* cuda_gdn_profile */

extern "C" void cuda_gdn_profile(int level) {
    RS_CHECK(level >= 0 && level <= 2, "cuda_gdn_profile: level %d (want 0, 1 or 2)", level);
    gdn_prof_level = level;
}

/* per-kernel times of one entry (cuda_gdn_profile): events on the compute stream between the launches */
#define GDN_PROF_MAX 40
static struct {
    cudaEvent_t ev[GDN_PROF_MAX];
    const char *name[GDN_PROF_MAX];
    int n, on;
} gdn_prof;

void gdn_prof_mark(const char *name) {
    if (!gdn_prof.on || gdn_prof.n == GDN_PROF_MAX) return;
    cudaEvent_t *e = &gdn_prof.ev[gdn_prof.n];
    if (!*e) CUDA_CHECK(cudaEventCreate(e));
    gdn_prof.name[gdn_prof.n++] = name;
    CUDA_CHECK(cudaEventRecord(*e, cuda_stream()));
}

void gdn_prof_start(int on) {
    gdn_prof.on = on;
    gdn_prof.n = 0;
    gdn_prof_mark("start");
}

void gdn_prof_end(const char *who, int64_t T, int nv) {
    if (!gdn_prof.on) return;
    gdn_prof.on = 0;
    const int n = gdn_prof.n;
    CUDA_CHECK(cudaEventSynchronize(gdn_prof.ev[n - 1]));
    float tot = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&tot, gdn_prof.ev[0], gdn_prof.ev[n - 1]));
    printf("gdn prof %s T=%lld nv=%d:", who, (long long)T, nv);
    for (int i = 1; i < n; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, gdn_prof.ev[i - 1], gdn_prof.ev[i]));
        printf(" %s %.3f", gdn_prof.name[i], ms);
    }
    printf(" | %.3f ms\n", tot);
    fflush(stdout);
}

/* prof == 2: the per-phase cycles of the state passes (block 0, warp 0, over the chunks it walked, as it counted
 * them: with a dual launch the device picks the configuration, and so the span of block 0) */
void gdn_tp_print(const GdnPlan &pl, int bwd) {
    if (pl.prof != 2 || !pl.tp) return;
    long long h[2 * GDN_TP_SLOTS];
    CUDA_CHECK(cudaMemcpy(h, pl.tp, sizeof h, cudaMemcpyDeviceToHost));
    static const char *names[GDN_TP_N] = {"wait+sync", "issue", "split+store+sync", "mma1", "epilogue+sync", "mma2"};
    for (int d = 0; d <= bwd; d++) {
        const long long *c = h + d * GDN_TP_SLOTS, nch = c[GDN_TP_N];
        if (nch <= 0) {
            printf("gdn cycles per chunk, %s pass: block 0 walked no chunk in this call\n", d ? "reverse" : "forward");
            continue;
        }
        printf("gdn cycles per chunk, %s pass (block 0, %lld chunks):", d ? "reverse" : "forward", nch);
        for (int i = 0; i < GDN_TP_N; i++) printf(" %s %.0f", names[i], (double)c[i] / (double)nch);
        printf("\n");
    }
    CUDA_CHECK(cudaMemset(pl.tp, 0, sizeof h));
}
