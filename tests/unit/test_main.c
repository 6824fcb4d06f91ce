/*
 * test_main.c — the driver of build/test_ops (see test_util.h):
 *   build/test_ops --list      one case name per line
 *   build/test_ops NAME...     run these cases; exit 1 if any check failed. A NAME that is no case's name runs
 *                              every case whose name starts with NAME_ (build/test_cuda cuda_kda: the cuda_kda_* cases)
 *   build/test_ops             run every case
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

#define TEST_MAX 512
static struct { const char *name; TestFn fn; } test_cases[TEST_MAX];
static int test_count, test_failed;

void test_register(const char *name, TestFn fn) {
    if (test_count == TEST_MAX) { fprintf(stderr, "test_ops: raise TEST_MAX\n"); exit(2); }
    test_cases[test_count].name = name;
    test_cases[test_count].fn = fn;
    test_count++;
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "FAIL %s:%d: ", file, line);
    vfprintf(stdout, fmt, ap);
    fprintf(stdout, "\n");
    va_end(ap);
    test_failed++;
}

/* ---- rng ---- */
static uint64_t test_rng_state = 0x9E3779B97F4A7C15ull;
void test_rng_seed(uint64_t seed) { test_rng_state = seed * 0x9E3779B97F4A7C15ull + 1; }
static uint64_t test_next(void) {
    uint64_t x = test_rng_state;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    test_rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}
double test_uniform(void) { return ((double)(test_next() >> 11) + 0.5) / 9007199254740992.0; }
double test_normal(void) {
    double u = test_uniform(), v = test_uniform();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
void test_fill_normal(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) {
        double r;
        do r = test_normal(); while (fabs(r) < 1e-3);
        x[i] = (float)(scale * r);
    }
}
void test_fill_uniform(float *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) {
        float r;
        do r = (float)(lo + (hi - lo) * test_uniform()); while (r == 0.0f);
        x[i] = r;
    }
}
void test_to_double(double *dst, const float *src, int64_t n) { for (int64_t i = 0; i < n; i++) dst[i] = src[i]; }
void test_to_float(float *dst, const double *src, int64_t n) { for (int64_t i = 0; i < n; i++) dst[i] = (float)src[i]; }

/* ---- comparisons ---- */
double test_rel_err(const float *got, const double *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    if (num != num) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
double test_rel_err_f(const float *got, const float *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    if (num != num) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
int test_check_finite(const char *what, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            test_fail(__FILE__, __LINE__, "%s: element %lld is %g", what, (long long)i, x[i]);
            return 0;
        }
    return 1;
}
static int test_report(const char *what, double e, double bound) {
    if (e <= bound) {
        printf("%s: rel err %.3e <= %.1e ok\n", what, e, bound);
        return 1;
    }
    test_fail(__FILE__, __LINE__, "%s: rel err %.3e > bound %.1e", what, e, bound);
    return 0;
}
int test_check_rel(const char *what, const float *got, const double *want, int64_t n, double bound) {
    return test_check_finite(what, got, n) && test_report(what, test_rel_err(got, want, n), bound);
}
int test_check_rel_f(const char *what, const float *got, const float *want, int64_t n, double bound) {
    return test_check_finite(what, got, n) && test_report(what, test_rel_err_f(got, want, n), bound);
}

/* ---- finite differences ---- */
void test_fd_grad(double *grad, TestScalarFn f, void *ctx, double *x, int64_t n, const int64_t *idx, int64_t n_idx,
                  double h) {
    int64_t m = idx ? n_idx : n;
    for (int64_t j = 0; j < m; j++) {
        int64_t i = idx ? idx[j] : j;
        double x0 = x[i];
        x[i] = x0 + h;
        double fp = f(ctx, x);
        x[i] = x0 - h;
        double fm = f(ctx, x);
        x[i] = x0;
        grad[j] = (fp - fm) / (2 * h);
    }
}

/* ---- scratch ---- */
static void *test_blocks[4096];
static int test_nblocks;
void *test_alloc(int64_t bytes) {
    if (test_nblocks == 4096) { fprintf(stderr, "test_alloc: too many blocks\n"); exit(2); }
    void *p = calloc(1, (size_t)(bytes > 0 ? bytes : 1));
    if (!p) { fprintf(stderr, "test_alloc: out of memory\n"); exit(2); }
    return test_blocks[test_nblocks++] = p;
}
void test_free_all(void) {
    while (test_nblocks) free(test_blocks[--test_nblocks]);
}

static int test_run(int i) {
    int before = test_failed;
    printf("== %s\n", test_cases[i].name);
    fflush(stdout);
    test_rng_seed(0x5EED);  /* every case starts from the same seed, whatever runs before it */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    test_cases[i].fn();
    test_free_all();
    clock_gettime(CLOCK_MONOTONIC, &t1);  /* printed to plan device calls by; no case judges a time */
    printf("== %s: %s (%.1f s)\n", test_cases[i].name, test_failed == before ? "ok" : "FAILED",
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return test_failed == before;
}

/* manual_* cases (a probe that may stop the process, e.g. an illegal address on the GPU) run only when named
 * exactly: not listed, not run by a run of every case or by a prefix */
static int test_manual(int i) { return !strncmp(test_cases[i].name, "manual_", 7); }

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--list")) {
        for (int i = 0; i < test_count; i++)
            if (!test_manual(i)) printf("%s\n", test_cases[i].name);
        return 0;
    }
    int ran = 0;
    for (int i = 0; i < test_count; i++) {
        int want = argc == 1 && !test_manual(i);
        for (int a = 1; a < argc; a++) {
            int exact = 0;
            for (int j = 0; j < test_count; j++) exact |= !strcmp(argv[a], test_cases[j].name);
            const size_t n = strlen(argv[a]);
            if (exact ? !strcmp(argv[a], test_cases[i].name)
                      : !test_manual(i) && !strncmp(argv[a], test_cases[i].name, n) && test_cases[i].name[n] == '_')
                want = 1;
        }
        if (want) { test_run(i); ran++; }
    }
    if (ran == 0) { fprintf(stderr, "test_ops: no case matches\n"); return 2; }
    return test_failed ? 1 : 0;
}
