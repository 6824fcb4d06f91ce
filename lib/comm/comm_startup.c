/*
 * comm_startup.c — the start-up guard: ends a rank whose start-up (MPI_Init, then the set-up up to
 * the watchdog's start) takes longer than parallel.startup_timeout_s. The watchdog (comm_watchdog.c)
 * times every wait of the run, but only once it runs; before that, a rank that died or stalls in
 * MPI_Init or the set-up (a node lost while the job starts, a crash inside MPI_Init) leaves the
 * others waiting in MPI_Init's fence or a set-up collective until the job's time limit. The guard is
 * one thread per rank, armed before MPI_Init and disarmed where the watchdog starts. When it fires
 * it prints one error (the launcher's rank until MPI says; host; where the rank
 * still is), appends it to the run's log.txt when that file exists (so a job script finds the
 * verdict even when the rank never opened its log), and ends the rank with RS_EXIT_HANG (76): after
 * MPI_Init through MPI_Abort, which ends every rank; inside MPI_Init by _exit, and the launcher
 * ends the rest. A rank that stalls on purpose (debug.stall_step = 0) is one of them.
 *
 * Callers: cmd/ringscan.c (arm, the stall, disarm on the early exits), lib/comm/comm.c (MPI is up),
 * lib/run/train.c (disarm where the watchdog starts), comm_finalize (disarm).
 */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "core/error.h"

static struct {
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             armed;   /* the thread runs; cleared by disarm */
    double          timeout; /* s */
    char            log[PATH_MAX + 16]; /* <run dir>/log.txt; "" none */
    _Atomic int     mpi_up;  /* MPI_Init returned */
    _Atomic int     stalled; /* debug.stall_step = 0 stopped this rank before MPI_Init */
} guard = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void guard_report(const char *hint, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void guard_report(const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    error_vreport("error", __FILE__, __LINE__, hint, fmt, ap);
    va_end(ap);
}

static void *guard_main(void *arg) {
    (void)arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)guard.timeout;
    until.tv_nsec += (long)((guard.timeout - (double)(time_t)guard.timeout) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&guard.mu);
    int rc = 0;
    while (guard.armed && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&guard.cv, &guard.mu, &until);
    const int fire = guard.armed;
    pthread_mutex_unlock(&guard.mu);
    if (!fire) return NULL;
    const int up = atomic_load(&guard.mpi_up);
    if (guard.log[0] && access(guard.log, F_OK) == 0) error_open_log(guard.log); /* never creates it */
    guard_report("a rank that died or stalls in its start-up leaves the others waiting where the watchdog does not "
                 "look yet; its launcher's output names it. parallel.startup_timeout_s must exceed the longest "
                 "healthy start-up (reading a checkpoint or model.init_from)",
                 "the start-up did not finish within parallel.startup_timeout_s = %g s: this rank is still %s; every "
                 "rank ends with exit %d",
                 guard.timeout,
                 atomic_load(&guard.stalled) ? "stalled before MPI_Init (debug.stall_step = 0)"
                 : up                        ? "in the set-up after MPI_Init"
                                             : "in MPI_Init",
                 RS_EXIT_HANG);
    fflush(stdout);
    fflush(stderr);
    if (up) MPI_Abort(MPI_COMM_WORLD, RS_EXIT_HANG);
    _exit(RS_EXIT_HANG); /* inside MPI_Init, exit's handlers could wait on MPI's own threads */
}

void comm_startup_guard_arm(double timeout_s, const char *run_dir, int launcher_rank) {
    if (timeout_s <= 0 || guard.armed) return;
    guard.timeout = timeout_s;
    guard.log[0] = 0;
    if (run_dir && run_dir[0]) snprintf(guard.log, sizeof guard.log, "%s/log.txt", run_dir);
    error_set_rank(launcher_rank); /* the rank in its message, before MPI says */
    guard.armed = 1;
    int rc = pthread_create(&guard.thread, NULL, guard_main, NULL);
    if (rc != 0) RS_FATAL("cannot start the start-up guard's thread: %s", strerror(rc));
    pthread_setname_np(guard.thread, "rs-startup");
}

void comm_startup_guard_mpi_up(void) { atomic_store(&guard.mpi_up, 1); }

void comm_startup_guard_disarm(void) {
    pthread_mutex_lock(&guard.mu);
    const int was = guard.armed;
    guard.armed = 0;
    pthread_cond_signal(&guard.cv);
    pthread_mutex_unlock(&guard.mu);
    if (was) pthread_join(guard.thread, NULL);
}

noreturn void comm_startup_stall(void) {
    atomic_store(&guard.stalled, 1);
    for (;;) sleep(60); /* debug.stall_step = 0: never reach MPI_Init; the guards end every rank */
}
