/*
 * cuda_profile.cu — the opt-in entry timer of cuda_profile.h.
 *
 * Each profiled call takes one pair of timing events from a pool and records
 * them on the compute stream around the entry; the host clock brackets the
 * call too. When the pool is used up (or on reset/print) the stream is
 * synchronised and every pending pair's elapsed time is added to its entry:
 * a profiled run synchronises once per PROF_PAIRS calls, which a plain run
 * never does. Entries are identified by the address of their name literal
 * (cuda_backend_table.c passes one literal per entry).
 *
 * Callers: cuda_backend_table.c (the profiled table), bench/bench_step.c (reset,
 * print), the exit handler registered at the first profiled call.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_common.h"
#include "cuda_profile.h"

#define PROF_ENTRIES 64   /* more than the Backend table has */
#define PROF_PAIRS   4096 /* timing-event pairs in flight before a drain */

typedef struct {
    const char *name;
    long long   calls;
    double      gpu_ms, host_ms;
} ProfEntry;

typedef struct {
    int    entry;
    double t0; /* host clock at begin, s */
} ProfPending;

static int         prof_state; /* 0 off, 1 on (cuda_profile_enable) */
static ProfEntry   prof_entries[PROF_ENTRIES];
static int         prof_n_entries;
static cudaEvent_t prof_ev[2 * PROF_PAIRS]; /* start, stop per pair; created at first use */
static ProfPending prof_pending[PROF_PAIRS];
static int         prof_n_pending;
static int         prof_printed; /* cuda_profile_print ran since the last reset */

static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void prof_at_exit(void) {
    if (!prof_printed) cuda_profile_print(stderr, 0, 0);
}

extern "C" void cuda_profile_enable(int on) { prof_state = on != 0; }

extern "C" int cuda_profile_on(void) { return prof_state; }

static int prof_entry_of(const char *name) {
    for (int i = 0; i < prof_n_entries; i++)
        if (prof_entries[i].name == name) return i;
    RS_CHECK(prof_n_entries < PROF_ENTRIES, "cuda profile: more than %d entries", PROF_ENTRIES);
    prof_entries[prof_n_entries].name = name;
    return prof_n_entries++;
}

/* adds every pending pair's GPU time to its entry; the host waits for the compute stream */
static void prof_drain(void) {
    if (!prof_n_pending) return;
    CUDA_CHECK(cudaEventSynchronize(prof_ev[2 * prof_n_pending - 1]));
    for (int i = 0; i < prof_n_pending; i++) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, prof_ev[2 * i], prof_ev[2 * i + 1]));
        prof_entries[prof_pending[i].entry].gpu_ms += ms;
    }
    prof_n_pending = 0;
}

extern "C" int cuda_profile_begin(const char *name) {
    if (!prof_ev[0]) {
        for (int i = 0; i < 2 * PROF_PAIRS; i++) CUDA_CHECK(cudaEventCreate(&prof_ev[i]));
        atexit(prof_at_exit);
    }
    if (prof_n_pending == PROF_PAIRS) prof_drain();
    int p = prof_n_pending++;
    prof_pending[p].entry = prof_entry_of(name);
    prof_pending[p].t0 = prof_now();
    CUDA_CHECK(cudaEventRecord(prof_ev[2 * p], cuda_stream()));
    return p;
}

extern "C" void cuda_profile_end(int token) {
    CUDA_CHECK(cudaEventRecord(prof_ev[2 * token + 1], cuda_stream()));
    ProfEntry *e = &prof_entries[prof_pending[token].entry];
    e->calls++;
    e->host_ms += 1e3 * (prof_now() - prof_pending[token].t0);
}

extern "C" void cuda_profile_reset(void) {
    prof_drain();
    for (int i = 0; i < prof_n_entries; i++) prof_entries[i].calls = 0, prof_entries[i].gpu_ms = prof_entries[i].host_ms = 0;
    prof_printed = 0;
}

static int prof_cmp(const void *a, const void *b) {
    double x = ((const ProfEntry *)a)->gpu_ms, y = ((const ProfEntry *)b)->gpu_ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

extern "C" void cuda_profile_print(FILE *f, int steps, double step_ms) {
    prof_drain();
    prof_printed = 1;
    ProfEntry e[PROF_ENTRIES];
    int n = 0;
    double sum = 0, hsum = 0;
    for (int i = 0; i < prof_n_entries; i++)
        if (prof_entries[i].calls) e[n++] = prof_entries[i], sum += prof_entries[i].gpu_ms, hsum += prof_entries[i].host_ms;
    if (!n) return;
    qsort(e, (size_t)n, sizeof *e, prof_cmp);
    double d = steps > 0 ? steps : 1;
    /* shares of the measured step when there is one, else of the entries' sum */
    const double whole = step_ms > 0 ? step_ms * d : sum;
    fprintf(f, "cuda profile: Backend entries by GPU time%s\n",
            steps > 0 ? ", per step (mean over the timed steps)" : ", whole run");
    fprintf(f, "%-30s %10s %12s %12s %7s\n", "entry", "calls", "GPU ms", "host ms", step_ms > 0 ? "step %" : "GPU %");
    for (int i = 0; i < n; i++)
        fprintf(f, "%-30s %10.1f %12.3f %12.3f %6.1f%%\n", e[i].name, (double)e[i].calls / d, e[i].gpu_ms / d,
                e[i].host_ms / d, 100.0 * e[i].gpu_ms / whole);
    fprintf(f, "%-30s %10s %12.3f %12.3f %6.1f%%\n", "sum of the entries", "", sum / d, hsum / d, 100.0 * sum / whole);
    if (step_ms > 0) {
        fprintf(f, "%-30s %10s %12.3f %12s %6.1f%%\n", "unaccounted (launch gaps, host)", "", step_ms - sum / d, "",
                100.0 * (step_ms * d - sum) / whole);
        fprintf(f, "%-30s %10s %12.3f %12s %6.1f%%\n", "measured step (host clock)", "", step_ms, "", 100.0);
    }
    fflush(f);
}
