/*
 * error.h — how ringscan reports failure.
 *
 * Every fatal message names where it came from: `file:line`, the rank and the
 * host, the failing call or condition, and (optionally) `hint:` lines telling
 * the user what to change. The checks are always on: never `assert`, never
 * compiled out by NDEBUG.
 *
 * Exit codes are part of the user interface (Slurm scripts and tests rely on
 * them) and are defined here, once:
 *   0  RS_EXIT_OK         success
 *   1  RS_EXIT_FAIL       a runtime failure, or `plan` says the run will not fit
 *   2  RS_EXIT_USAGE      bad command line, bad config, bad input file
 *   75 RS_EXIT_PREEMPTED  stopped on SIGUSR1/SIGTERM after writing a checkpoint
 *                         (EX_TEMPFAIL: "try again later"; the job script requeues)
 *   76 RS_EXIT_HANG       a wait for other ranks passed parallel.comm_timeout_s, the
 *                         start-up passed parallel.startup_timeout_s, or NCCL reported an
 *                         asynchronous error or a peer gone (comm_watchdog.c, comm_startup.c,
 *                         comm_nccl.c; the job script requeues, and the next run resumes
 *                         from the last checkpoint)
 *
 * Where messages go: stderr, always; and, once the trainer has opened its run
 * directory's log (error_open_log), log.txt too, so a dead run's log ends with
 * the error that stopped it. Messages printed before the log opened (a
 * checkpoint that failed verification while a resume loaded it) are kept in
 * memory (the first 16 KiB) and written to the log when it opens. Rank 0
 * logs errors and warnings; the other ranks log errors only (their warnings
 * repeat rank 0's, on stderr).
 *
 * Callers: everything. Library code that can fail on user input (the config
 * loader) returns errors instead of exiting, so it can be fuzzed and tested;
 * the command line decides the exit code.
 */
#ifndef RS_ERROR_H
#define RS_ERROR_H

#include <stdarg.h>
#include <stddef.h>
#ifdef __cplusplus
#define noreturn [[noreturn]]
#else
#include <stdnoreturn.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum {
    RS_EXIT_OK        = 0,
    RS_EXIT_FAIL      = 1,
    RS_EXIT_USAGE     = 2,
    RS_EXIT_PREEMPTED = 75,
    RS_EXIT_HANG      = 76,
};

/* Set once MPI (or Slurm's environment) has told us who we are; before that
 * messages say "rank ?". */
void error_set_rank(int rank);
int  error_rank(void);
/* What a fatal error does after printing, instead of exit(code): comm sets it
 * to MPI_Abort over the world when several ranks run, so an error found on one
 * rank (bad data in its sample, a failed allocation) ends every rank instead of
 * leaving the others waiting in a collective until the job's time limit. */
void error_set_abort(void (*abort_fn)(int code));

/* Appends every later message (and the ones kept since start) to `path`
 * (O_APPEND, one write per message). Returns 0, or -1 with errno set. */
int error_open_log(const char *path);

/* Prints "ringscan: <kind> [rank R@host] file:line: <message>" (kind "error"
 * or "warning") with its hint lines to stderr and the log, and returns: for
 * a caller that ends the run its own way (every rank agreeing on a
 * deterministic failure, lib/run/train.c's train_fail). */
void error_vreport(const char *kind, const char *file, int line, const char *hint, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));

/* Prints "ringscan: error [rank R@host] file:line: <message>" and exits with
 * `code`. `hint` may be NULL or hold several lines separated by '\n'. */
noreturn void error_exit(int code, const char *file, int line, const char *hint,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Same shape, but a warning: prints and returns. */
void error_warn(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fatal internal error (a bug or a broken environment): exit 1. */
#define RS_FATAL(...) error_exit(RS_EXIT_FAIL, __FILE__, __LINE__, NULL, __VA_ARGS__)
/* Bad user input: exit 2, with a hint line. */
#define RS_USAGE(hint, ...) error_exit(RS_EXIT_USAGE, __FILE__, __LINE__, hint, __VA_ARGS__)
#define RS_WARN(...) error_warn(__FILE__, __LINE__, __VA_ARGS__)

/* Always-on check: `RS_CHECK(n > 0, "n = %d", n)` prints the condition too. */
#define RS_CHECK(cond, ...)                                                             \
    do {                                                                               \
        if (!(cond)) error_exit(RS_EXIT_FAIL, __FILE__, __LINE__, "failed check: " #cond, \
                                __VA_ARGS__);                                          \
    } while (0)

/* Checked allocation: never returns NULL. */
void *error_check_malloc(size_t n, const char *file, int line);
void *error_check_calloc(size_t n, size_t size, const char *file, int line);
void *error_check_realloc(void *p, size_t n, const char *file, int line);
char *error_check_strdup(const char *s, const char *file, int line);
#define RS_MALLOC(n)     error_check_malloc((n), __FILE__, __LINE__)
#define RS_CALLOC(n, sz) error_check_calloc((n), (sz), __FILE__, __LINE__)
#define RS_REALLOC(p, n) error_check_realloc((p), (n), __FILE__, __LINE__)
#define RS_STRDUP(s)     error_check_strdup((s), __FILE__, __LINE__)

#ifdef __cplusplus
}
#endif

#endif
