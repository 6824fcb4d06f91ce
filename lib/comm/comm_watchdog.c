/*
 * comm_watchdog.c — finds a wait for other ranks that never ends (a rank stuck or dead) and ends every rank
 * with one report saying where. Callers: comm.c (the waits; comm_finalize stops it), lib/run/train.c (start,
 * step, the step-end read), lib/model/model_step.c and lib/cp/ (where they are).
 *
 * The main thread marks where it is (comm_set_step, comm_set_context: relaxed atomic stores) and brackets
 * each wait (comm_watch_begin/end: comm.c around every blocking MPI call; on cuda the trainer's step-end
 * loss read, where a stuck NCCL operation shows, since NCCL runs on streams). A thread per rank wakes every
 * min(1 s, timeout / 3); when this rank's wait passes the timeout, or the device's communicators report an error
 * (CommDeviceOps), or an MPI transfer failed on the main thread (comm_watch_fail: UCX, for one, fails a transfer to
 * a rank that died instead of waiting for it), the rank trips: it writes its record to
 * <dir>/.watchdog/<attempt>/rank-<r> and tries to create TRIP there (O_EXCL; the creator reports); every other rank
 * finds TRIP within grace / 3 and writes its record (waiting where, or busy since when); after grace =
 * clamp(timeout / 4, 2 ticks, 30 s) the reporter names the ranks of its collective's group that had not arrived,
 * prints the report once (and to report.txt), aborts the device communicators and calls MPI_Abort with RS_EXIT_HANG
 * (76). A rank that tripped or saw TRIP aborts by itself 2 grace + 10 s later, in case the reporter died.
 *
 * The attempt (rank 0's start time and pid) keeps a resumed run from reading an earlier attempt's records.
 * Several nodes need the run directory on a shared file system; without one each node's first tripped rank
 * reports its own node. MPI_Abort from the watchdog thread while the main thread is inside MPI is not
 * promised by MPI_THREAD_SINGLE; Open MPI 4.1 ends the job with the code (tests/test_watchdog.py).
 * debug.stall_* (tests only) stops the chosen rank forever at a chosen layer and step.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "core/error.h"
#include "io/fsio.h"

#define WATCH_REPORT_MAX 3500 /* of the report on stderr (error.h's message buffer); report.txt has it all */
#define WATCH_LIST_MAX   16   /* ranks listed one per line */

typedef struct CommWatch {
    Comm *c;
    /* written by the main thread, read by the watchdog thread */
    _Atomic int64_t     step;
    _Atomic int         layer;
    _Atomic(const char *) what;
    _Atomic int64_t     what_ns;  /* when the context was set */
    _Atomic int64_t     wait_ns;  /* when the current wait began; 0: not waiting */
    _Atomic(const char *) wait_op;
    _Atomic int         wait_group;
    _Atomic uint64_t    marks;    /* bumped by every begin and end: a view is whole when it did not move */
    /* options */
    double   timeout, tick, grace;
    char     dir[PATH_MAX];        /* <dir>/.watchdog/<attempt>; "" none */
    int      stall;                /* this rank stalls at (stall_step, stall_layer) */
    int64_t  stall_step;
    int      stall_layer;
    /* the thread */
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             stop;
    /* the thread's own state */
    double   looked_at; /* when this rank last looked for TRIP (every grace / 3, at least every tick) */
    double   alarm_at;  /* when this rank tripped or saw TRIP; 0: not yet */
    int      reporter;
    char     reason[480]; /* why this rank tripped ("": it only saw TRIP) */
    /* an MPI call that failed on the main thread (comm_watch_fail), which then waits for the end */
    char        failed[400];
    _Atomic int failed_set;
} CommWatch;

/* One rank's record, as written and read back. */
typedef struct {
    int       have;
    char      host[64];
    char      state[16]; /* "timeout", "waiting", "busy", "nccl", "mpi" (the library that reported an error) */
    double    wait_s, ctx_s;
    char      op[24];
    int       group, gid;
    long long step;
    int       layer;
    char      what[64];
    char      detail[512];
} WatchRecord;

static const char *const watch_group_names[COMM_GROUPS + 1] = {"world", "cp", "dp", "other"};

static int64_t watch_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double watch_now(void) { return 1e-9 * (double)watch_now_ns(); }

/* ---- the main thread's marks ------------------------------------------------------------ */

void comm_set_step(Comm *c, int64_t step) {
    if (!c || !c->watch) return;
    atomic_store_explicit(&c->watch->step, step, memory_order_relaxed);
}

static void watch_stall(void) {
    for (;;) sleep(60); /* debug.stall_rank: never answer again; MPI_Abort from the others ends us */
}

void comm_watch_where(const Comm *c, int64_t *step, int *layer, const char **what) {
    const CommWatch *w = c->watch;
    *step = atomic_load_explicit(&w->step, memory_order_relaxed);
    *layer = atomic_load_explicit(&w->layer, memory_order_relaxed);
    *what = atomic_load_explicit(&w->what, memory_order_relaxed);
}

void comm_set_context(Comm *c, int layer, const char *what) {
    if (!c || !c->watch) return;
    CommWatch *w = c->watch;
    atomic_store_explicit(&w->layer, layer, memory_order_relaxed);
    atomic_store_explicit(&w->what, what, memory_order_relaxed);
    atomic_store_explicit(&w->what_ns, watch_now_ns(), memory_order_relaxed);
    if (w->stall && layer == w->stall_layer &&
        atomic_load_explicit(&w->step, memory_order_relaxed) == w->stall_step)
        watch_stall();
}

void comm_watch_begin(Comm *c, const char *op, CommGroup g) {
    if (!c || !c->watch) return;
    CommWatch *w = c->watch;
    atomic_fetch_add_explicit(&w->marks, 1, memory_order_relaxed);
    atomic_store_explicit(&w->wait_op, op, memory_order_relaxed);
    atomic_store_explicit(&w->wait_group, (int)g, memory_order_relaxed);
    atomic_store_explicit(&w->wait_ns, watch_now_ns(), memory_order_release);
}

void comm_watch_end(Comm *c) {
    if (!c || !c->watch) return;
    atomic_store_explicit(&c->watch->wait_ns, 0, memory_order_release);
    atomic_fetch_add_explicit(&c->watch->marks, 1, memory_order_relaxed);
}

/* ---- records ---------------------------------------------------------------------------- */

/* The group instance a rank's group g is: its dp_rank for cp, its cp_rank for dp. */
static int watch_gid(const Comm *c, int rank, int g) {
    return g == COMM_CP ? rank / c->cp : g == COMM_DP ? rank % c->cp : 0;
}

/* Copies s into d (n bytes) without tabs or newlines, which separate the record's fields. */
static void watch_clean(char *d, size_t n, const char *s) {
    snprintf(d, n, "%s", s ? s : "");
    for (char *p = d; *p; p++)
        if (*p == '\t' || *p == '\n') *p = ' ';
}

/* This rank's record, now. */
static void watch_record_now(CommWatch *w, WatchRecord *r) {
    Comm *c = w->c;
    memset(r, 0, sizeof *r);
    uint64_t m0;
    int64_t wait_ns, what_ns;
    const char *op, *what;
    do { /* a view of one wait: retried when a begin or end moved under us */
        m0 = atomic_load_explicit(&w->marks, memory_order_acquire);
        wait_ns = atomic_load_explicit(&w->wait_ns, memory_order_acquire);
        op = atomic_load_explicit(&w->wait_op, memory_order_relaxed);
        r->group = atomic_load_explicit(&w->wait_group, memory_order_relaxed);
        r->step = (long long)atomic_load_explicit(&w->step, memory_order_relaxed);
        r->layer = atomic_load_explicit(&w->layer, memory_order_relaxed);
        what = atomic_load_explicit(&w->what, memory_order_relaxed);
        what_ns = atomic_load_explicit(&w->what_ns, memory_order_relaxed);
    } while (atomic_load_explicit(&w->marks, memory_order_acquire) != m0);
    int64_t now = watch_now_ns();
    r->have = 1;
    snprintf(r->host, sizeof r->host, "%s", c->host);
    watch_clean(r->what, sizeof r->what, what ? what : "setup");
    r->ctx_s = what_ns ? 1e-9 * (double)(now - what_ns) : 0;
    if (wait_ns) {
        r->wait_s = 1e-9 * (double)(now - wait_ns);
        snprintf(r->state, sizeof r->state, "%s", r->wait_s > w->timeout ? "timeout" : "waiting");
        watch_clean(r->op, sizeof r->op, op ? op : "?");
        r->gid = watch_gid(c, c->rank, r->group);
        /* only while the main thread waits: it posts nothing meanwhile */
        if (c->dev) c->dev->watch_pending(c, r->detail, sizeof r->detail);
    } else {
        snprintf(r->state, sizeof r->state, "busy");
        snprintf(r->op, sizeof r->op, "-");
        r->group = COMM_GROUPS;
    }
    if (w->reason[0] && (!strncmp(w->reason, "NCCL", 4) || !strncmp(w->reason, "MPI", 3))) {
        snprintf(r->state, sizeof r->state, "%s", w->reason[0] == 'N' ? "nccl" : "mpi");
        watch_clean(r->detail, sizeof r->detail, w->reason);
    }
}

static void watch_path(const CommWatch *w, char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", w->dir, name);
}

static void watch_record_write(CommWatch *w) {
    WatchRecord r;
    watch_record_now(w, &r);
    char path[PATH_MAX + 32], tmp[PATH_MAX + 48], name[32];
    snprintf(name, sizeof name, "rank-%d", w->c->rank);
    watch_path(w, path, sizeof path, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return; /* the reporter will list this rank as "no report" */
    fprintf(f, "%d\t%s\t%s\t%.3f\t%s\t%d\t%d\t%lld\t%d\t%s\t%.3f\t%s\n", w->c->rank, r.host, r.state, r.wait_s, r.op,
            r.group, r.gid, r.step, r.layer, r.what, r.ctx_s, r.detail);
    int bad = ferror(f) | fflush(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) unlink(tmp); /* a failed write leaves no partial record */
}

/* Reads rank q's record; r->have = 0 when there is none (or it is not whole). */
static void watch_record_read(const CommWatch *w, int q, WatchRecord *r) {
    memset(r, 0, sizeof *r);
    char path[PATH_MAX + 32], name[32], line[1024];
    snprintf(name, sizeof name, "rank-%d", q);
    watch_path(w, path, sizeof path, name);
    FILE *f = fsio_fopen_regular(path, NULL, NULL, NULL, 0); /* a FIFO or directory there: no record */
    if (!f) return;
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    if (!ok) return;
    line[strcspn(line, "\n")] = 0;
    char *field[12];
    int nf = 0;
    for (char *p = line; nf < 12; nf++) {
        field[nf] = p;
        char *tab = strchr(p, '\t');
        if (!tab) {
            nf++;
            break;
        }
        *tab = 0;
        p = tab + 1;
    }
    if (nf != 12 || atoi(field[0]) != q) return;
    snprintf(r->host, sizeof r->host, "%s", field[1]);
    snprintf(r->state, sizeof r->state, "%s", field[2]);
    r->wait_s = atof(field[3]);
    snprintf(r->op, sizeof r->op, "%s", field[4]);
    r->group = atoi(field[5]);
    if (r->group < 0 || r->group > COMM_GROUPS) r->group = COMM_GROUPS;
    r->gid = atoi(field[6]);
    r->step = atoll(field[7]);
    r->layer = atoi(field[8]);
    snprintf(r->what, sizeof r->what, "%s", field[9]);
    r->ctx_s = atof(field[10]);
    snprintf(r->detail, sizeof r->detail, "%s", field[11]);
    r->have = 1;
}

/* ---- the report ------------------------------------------------------------------------- */

/* Waiting for other ranks when it wrote its record (a busy rank's operation is "-"). */
static int watch_is_waiting(const WatchRecord *r) { return r->have && strcmp(r->op, "-") != 0; }
/* Whether a library (NCCL, MPI) reported an error to r's rank; the report names it ("NCCL", "MPI"). */
static const char *watch_error_from(const WatchRecord *r) {
    return !strcmp(r->state, "nccl") ? "NCCL" : !strcmp(r->state, "mpi") ? "MPI" : NULL;
}

/* Whether r waits in the same collective as ref (the same group instance, step, layer, label). */
static int watch_same_collective(const WatchRecord *r, const WatchRecord *ref) {
    return watch_is_waiting(r) && r->group == ref->group && r->gid == ref->gid && r->step == ref->step &&
           r->layer == ref->layer && !strcmp(r->op, ref->op) && !strcmp(r->what, ref->what);
}

static int watch_in_group(const Comm *c, int q, const WatchRecord *ref) {
    return ref->group == COMM_CP || ref->group == COMM_DP ? watch_gid(c, q, ref->group) == ref->gid : 1;
}

/* "at step S, layer L (label)" */
static void watch_where(const WatchRecord *r, char *buf, size_t n) {
    char layer[32] = "";
    if (r->layer >= 0) snprintf(layer, sizeof layer, ", layer %d", r->layer);
    snprintf(buf, n, "at step %lld%s (%s)", r->step, layer, r->what);
}

/* "cp group 0" */
static void watch_group_name(const WatchRecord *r, char *buf, size_t n) {
    if (r->group == COMM_CP || r->group == COMM_DP)
        snprintf(buf, n, "%s group %d", watch_group_names[r->group], r->gid);
    else
        snprintf(buf, n, "%s", watch_group_names[r->group]);
}

/* What rank r is doing, with its durations or without them (to group equal states). */
static void watch_describe(const WatchRecord *r, int timed, char *buf, size_t n) {
    char where[160], dur[48] = "", group[32];
    if (!r->have) {
        snprintf(buf, n, "no report (dead, frozen, or its node does not see the records' directory)");
        return;
    }
    watch_where(r, where, sizeof where);
    if (!watch_is_waiting(r)) {
        if (timed) snprintf(dur, sizeof dur, " for %.1f s", r->ctx_s);
        snprintf(buf, n, "busy outside any wait %s%s", where, dur);
        return;
    }
    if (timed) snprintf(dur, sizeof dur, " for %.1f s", r->wait_s);
    watch_group_name(r, group, sizeof group);
    snprintf(buf, n, "waiting in %s over %s %s%s%s%s", r->op, group, where, dur, r->detail[0] ? "; " : "", r->detail);
}

/* Appends "a-b,c" for the ranks of ranks[0..n) (ascending) to buf. */
static void watch_ranges(const int *ranks, int n, char *buf, size_t cap) {
    size_t k = strlen(buf);
    for (int i = 0; i < n && k < cap; i++) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
        int m = j > i ? snprintf(buf + k, cap - k, "%s%d-%d", i ? "," : "", ranks[i], ranks[j])
                      : snprintf(buf + k, cap - k, "%s%d", i ? "," : "", ranks[i]);
        if (m < 0) break;
        k += (size_t)m;
        i = j;
    }
}

/* Appends to the report (cap bytes; the stderr copy stops at WATCH_REPORT_MAX). */
typedef struct {
    char  *s;
    size_t len, cap;
} WatchText;

static void watch_add(WatchText *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void watch_add(WatchText *t, const char *fmt, ...) {
    if (t->len >= t->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (m > 0) t->len = t->len + (size_t)m < t->cap ? t->len + (size_t)m : t->cap - 1;
}

typedef struct {
    const char *desc;
    int         rank;
} WatchSorted;

static int watch_sorted_cmp(const void *a, const void *b) {
    const WatchSorted *x = a, *y = b;
    int d = strcmp(x->desc, y->desc);
    return d ? d : x->rank - y->rank;
}

/* The collective the report is about: of those ranks wait in, the first (lowest rank) whose missing
 * ranks wait in no other collective, i.e. the one a busy, frozen or dead rank holds up (ranks that
 * wait elsewhere are held up further down the chain); `self` when there is none (a cycle). */
static int watch_pick(const Comm *c, const WatchRecord *all, int self) {
    const int n = c->world_size;
    int *reps = RS_CALLOC((size_t)n, sizeof *reps), nrep = 0, pick = self;
    for (int q = 0; q < n; q++) {
        if (!watch_is_waiting(&all[q])) continue;
        int seen = 0;
        for (int i = 0; i < nrep && !seen; i++) seen = watch_same_collective(&all[q], &all[reps[i]]);
        if (!seen) reps[nrep++] = q;
    }
    for (int i = 0; i < nrep && pick == self; i++) {
        const WatchRecord *ref = &all[reps[i]];
        int leaf = 1;
        for (int q = 0; q < n && leaf; q++)
            if (watch_in_group(c, q, ref) && watch_is_waiting(&all[q]) && !watch_same_collective(&all[q], ref))
                leaf = 0;
        if (leaf) pick = reps[i];
    }
    free(reps);
    return pick;
}

/* The report's lines about ref's collective: the ranks of its group that had not arrived (ranks[0..nmiss),
 * of nin) and those waiting in it. */
static void watch_report_group(WatchText *t, const WatchRecord *all, const int *miss, int nmiss, int nin,
                               const char *group, const Comm *c, const WatchRecord *ref) {
    char desc[1024], list[1024] = "";
    int *ranks = RS_CALLOC((size_t)c->world_size, sizeof *ranks), nw = 0;
    double most = 0;
    watch_ranges(miss, nmiss, list, sizeof list);
    watch_add(t, "  not arrived: rank%s %s (%d of the %d ranks of %s)\n", nmiss == 1 ? "" : "s", nmiss ? list : "none",
              nmiss, nin, group);
    for (int i = 0; i < nmiss && i < WATCH_LIST_MAX; i++) {
        watch_describe(&all[miss[i]], 1, desc, sizeof desc);
        watch_add(t, "    rank %d (%s): %s\n", miss[i], all[miss[i]].have ? all[miss[i]].host : "?", desc);
    }
    if (nmiss > WATCH_LIST_MAX) watch_add(t, "    ... %d more\n", nmiss - WATCH_LIST_MAX);
    for (int q = 0; q < c->world_size; q++)
        if (watch_in_group(c, q, ref) && watch_same_collective(&all[q], ref)) {
            ranks[nw++] = q;
            if (all[q].wait_s > most) most = all[q].wait_s;
        }
    list[0] = 0;
    watch_ranges(ranks, nw, list, sizeof list);
    watch_add(t, "  arrived and waiting: rank%s %s (the longest for %.1f s)\n", nw == 1 ? "" : "s", list, most);
    free(ranks);
}

/* The report from every rank's record, about the collective rank `at` waits in. */
static void watch_report(CommWatch *w, const WatchRecord *all, int at, WatchText *t) {
    const Comm *c = w->c;
    const int n = c->world_size;
    const WatchRecord *ref = &all[at];
    const int waiting = watch_is_waiting(ref);
    char where[160], group[32], list[1024] = "";
    watch_where(ref, where, sizeof where);
    watch_group_name(ref, group, sizeof group);
    int *ranks = RS_CALLOC((size_t)n, sizeof *ranks);
    int nin = 0, nmiss = 0;
    for (int q = 0; q < n; q++)
        if (watch_in_group(c, q, ref)) ranks[nin++] = q;
    watch_ranges(ranks, nin, list, sizeof list);
    const char *lib = watch_error_from(ref);
    if (!waiting) /* an error found while this rank was not waiting: every rank's state */
        watch_add(t, "%s reported an error to rank %d (%s), busy %s: %s\n  the ranks:\n", lib ? lib : "NCCL", at,
                  ref->host, where, ref->detail);
    else if (lib)
        watch_add(t, "%s reported an error to rank %d (%s), waiting in %s over %s (ranks %s) %s: %s\n", lib, at,
                  ref->host, ref->op, group, list, where, ref->detail);
    else
        watch_add(t,
                  "a wait for other ranks passed parallel.comm_timeout_s = %g s: rank %d (%s) has waited %.1f s in "
                  "%s over %s (ranks %s) %s%s%s\n",
                  w->timeout, at, ref->host, ref->wait_s, ref->op, group, list, where, ref->detail[0] ? "; " : "",
                  ref->detail);
    for (int q = 0; q < n; q++)
        if (watch_in_group(c, q, ref) && !watch_same_collective(&all[q], ref)) ranks[nmiss++] = q;
    if (waiting) watch_report_group(t, all, ranks, nmiss, nin, group, c, ref);
    /* the ranks outside the group (all of them without one), by what they do */
    WatchSorted *s = RS_CALLOC((size_t)n, sizeof *s);
    char *descs = RS_CALLOC((size_t)n, 256);
    int ns = 0;
    for (int q = 0; q < n; q++)
        if (!waiting || !watch_in_group(c, q, ref)) {
            watch_describe(&all[q], 0, descs + (size_t)q * 256, 256);
            s[ns++] = (WatchSorted){descs + (size_t)q * 256, q};
        }
    qsort(s, (size_t)ns, sizeof *s, watch_sorted_cmp);
    if (ns && waiting) watch_add(t, "  the other ranks:\n");
    for (int i = 0; i < ns;) {
        int j = i, k = 0;
        while (j < ns && !strcmp(s[j].desc, s[i].desc)) ranks[k++] = s[j++].rank;
        list[0] = 0;
        watch_ranges(ranks, k, list, sizeof list);
        watch_add(t, "    rank%s %s: %s\n", k == 1 ? "" : "s", list, s[i].desc);
        i = j;
    }
    free(s);
    free(descs);
    free(ranks);
}

/* error.h's abort hook once the watchdog ends the run: NCCL's kernels are told to give up (a thread
 * calls MPI_Abort anyway if ncclCommAbort itself hangs), then MPI_Abort ends every rank. */
static CommWatch *watch_ending;

static int watch_code;

static void *watch_deadline(void *arg) {
    sleep(10);
    MPI_Abort(MPI_COMM_WORLD, watch_code);
    return NULL;
}

static void watch_abort_hook(int code) {
    watch_code = code;
    if (watch_ending && watch_ending->c->dev) {
        pthread_t t;
        if (pthread_create(&t, NULL, watch_deadline, NULL) == 0) pthread_detach(t);
        watch_ending->c->dev->watch_abort(watch_ending->c);
    }
    MPI_Abort(MPI_COMM_WORLD, code);
}

/* Ends this rank, and through MPI_Abort every rank. A reporter prints the report first. */
static noreturn void watch_abort(CommWatch *w, int report) {
    Comm *c = w->c;
    const int n = c->world_size;
    WatchRecord now, *all = RS_CALLOC((size_t)n, sizeof *all);
    if (w->dir[0])
        for (int q = 0; q < n; q++) watch_record_read(w, q, &all[q]);
    watch_record_now(w, &now);
    /* a wait that ended meanwhile is reported as it was when this rank tripped (its record) */
    if (watch_is_waiting(&now) || !all[c->rank].have) all[c->rank] = now;
    if (!watch_is_waiting(&all[c->rank]) && !watch_error_from(&all[c->rank])) report = 0;
    WatchText t = {RS_CALLOC(1, 1 << 20), 0, 1 << 20};
    if (report) watch_report(w, all, watch_pick(c, all, c->rank), &t);
    else watch_add(&t, "rank %d: the watchdog's report (%s) did not end the run; ending it\n", c->rank,
                   w->dir[0] ? w->dir : "no run directory");
    if (w->dir[0]) {
        char path[PATH_MAX + 32];
        watch_path(w, path, sizeof path, "report.txt");
        FILE *f = report ? fopen(path, "w") : NULL;
        if (f) {
            fputs(t.s, f);
            int bad = ferror(f) | fflush(f), e = errno;
            if (fclose(f) != 0 || bad) { /* no partial report.txt: the message below carries the report */
                if (!bad) e = errno;
                unlink(path);
                watch_add(&t, "\n  (%s could not be written: %s; the report is only here)", path, strerror(e));
            }
        }
    }
    if (t.len > WATCH_REPORT_MAX) {
        t.s[WATCH_REPORT_MAX] = 0;
        t.len = WATCH_REPORT_MAX;
        watch_add(&t, "\n  ... (the whole report: %s/report.txt)", w->dir);
    }
    if (t.len && t.s[t.len - 1] == '\n') t.s[--t.len] = 0;
    char hint[1024];
    snprintf(hint, sizeof hint,
             "every rank ends with exit %d; the ranks' records: %.600s\n"
             "a rank \"not in any wait\" is stuck outside communication (a hung kernel or file system, a stopped "
             "process); a rank waiting elsewhere took another path\n"
             "raise parallel.comm_timeout_s if a wait can legitimately last longer (a checkpoint write; on cuda a "
             "whole step); 0 turns the watchdog off",
             RS_EXIT_HANG, w->dir[0] ? w->dir : "none (no run directory)");
    watch_ending = w;
    error_set_abort(watch_abort_hook);
    error_exit(RS_EXIT_HANG, __FILE__, __LINE__, hint, "%s", t.s);
}

/* ---- the thread ------------------------------------------------------------------------- */

static void watch_trip(CommWatch *w, const char *reason) {
    snprintf(w->reason, sizeof w->reason, "%s", reason);
    w->alarm_at = watch_now();
    if (!w->dir[0] || fsio_mkdirs(w->dir) != 0) { /* <run dir>/.watchdog/<attempt> */
        w->dir[0] = 0; /* nowhere to compare notes: report alone */
        watch_abort(w, 1);
    }
    watch_record_write(w);
    char path[PATH_MAX + 32];
    watch_path(w, path, sizeof path, "TRIP");
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd >= 0) {
        char who[32];
        int k = snprintf(who, sizeof who, "%d\n", w->c->rank);
        if (write(fd, who, (size_t)k) != k) { /* the file's existence is what counts */ }
        close(fd);
        w->reporter = 1;
    }
}

static void watch_tick(CommWatch *w) {
    double now = watch_now();
    if (!w->alarm_at) {
        char reason[480] = "";
        int64_t since = atomic_load_explicit(&w->wait_ns, memory_order_acquire);
        if (since && now - 1e-9 * (double)since > w->timeout) snprintf(reason, sizeof reason, "timeout");
        char msg[400];
        if (w->c->dev && w->c->dev->watch_error(w->c, msg, sizeof msg))
            snprintf(reason, sizeof reason, "%s: %s", w->c->dev->name, msg);
        if (atomic_load_explicit(&w->failed_set, memory_order_acquire))
            snprintf(reason, sizeof reason, "MPI: %s", w->failed);
        if (reason[0]) {
            watch_trip(w, reason);
            return;
        }
        if (!w->dir[0] || now - w->looked_at < w->grace / 3) return;
        w->looked_at = now;
        char path[PATH_MAX + 32];
        struct stat st;
        watch_path(w, path, sizeof path, "TRIP");
        if (stat(path, &st) != 0) return; /* the healthy case: nothing to do */
        w->alarm_at = now;
    }
    /* alarmed: keep the record current until the reporter ends the run */
    watch_record_write(w);
    if (w->reporter && now - w->alarm_at >= w->grace) watch_abort(w, 1);
    if (now - w->alarm_at >= 2 * w->grace + 10) watch_abort(w, 0);
}

static void *watch_main(void *arg) {
    CommWatch *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double t = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + w->tick;
        until.tv_sec = (time_t)t;
        until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
        pthread_cond_timedwait(&w->cv, &w->mu, &until);
        if (w->stop) break;
        pthread_mutex_unlock(&w->mu);
        watch_tick(w);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

void comm_watchdog_start(Comm *c, const CommWatchOptions *o) {
    RS_CHECK(!c->watch, "the watchdog started twice");
    if (o->timeout_s <= 0) return;
    CommWatch *w = RS_CALLOC(1, sizeof *w);
    w->c = c;
    w->timeout = o->timeout_s;
    w->tick = o->timeout_s / 3 < 1.0 ? o->timeout_s / 3 : 1.0;
    w->grace = o->timeout_s / 4;
    if (w->grace < 2 * w->tick) w->grace = 2 * w->tick;
    if (w->grace > 30) w->grace = 30;
    w->stall = o->stall_rank == c->rank;
    w->stall_step = o->stall_step;
    w->stall_layer = (int)o->stall_layer;
    atomic_store(&w->layer, -1);
    if (o->dir) { /* the attempt: rank 0's wall time and pid, the same on every rank */
        long long attempt[2] = {(long long)time(NULL), (long long)getpid()};
        if (c->world_size > 1 && MPI_Bcast(attempt, 2, MPI_LONG_LONG, 0, c->world) != MPI_SUCCESS)
            RS_FATAL("MPI_Bcast of the watchdog's attempt failed");
        int k = snprintf(w->dir, sizeof w->dir, "%s/.watchdog/%lld-%lld", o->dir, attempt[0], attempt[1]);
        RS_CHECK(k > 0 && (size_t)k < sizeof w->dir, "run directory path too long for the watchdog: %s", o->dir);
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    c->watch = w;
    int rc = pthread_create(&w->thread, NULL, watch_main, w);
    if (rc != 0) RS_FATAL("cannot start the watchdog thread: %s", strerror(rc));
    pthread_setname_np(w->thread, "rs-watchdog");
}

int comm_watch_fail(Comm *c, const char *what) {
    CommWatch *w = c->watch;
    if (!w) return 0;
    snprintf(w->failed, sizeof w->failed, "%s", what);
    atomic_store_explicit(&w->failed_set, 1, memory_order_release);
    pthread_mutex_lock(&w->mu);
    pthread_cond_signal(&w->cv); /* its next tick now */
    pthread_mutex_unlock(&w->mu);
    for (;;) pause(); /* the wait stays open in this rank's record; the watchdog ends every rank */
}

void comm_watchdog_stop(Comm *c) {
    CommWatch *w = c->watch;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    c->watch = NULL;
    free(w);
}
