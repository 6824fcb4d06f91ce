/*
 * comm.h — processes and their communication: world = dp x cp. Callers: lib/run/train.c,
 * lib/model/model_step.c (bucketed gradient all-reduce or reduce-scatter), lib/model/model_shard.c (weight
 * all-gather), lib/cp/ (ring, scan all-gather, conv halo, batch metadata), lib/backend/runtime.c,
 * bench/bench_cp.c, tests/cp, tests/parity; cmd/ringscan.c (the start-up guard).
 *
 * Ranks come from MPI (mpirun, or srun --mpi=pmix); the local rank (which GPU on a node) from
 * MPI_Comm_split_type(SHARED), never rank % gpus_per_node. World rank r = dp_rank * cp + cp_rank, so the
 * ranks of one CP group are adjacent (on one node when they fit). Communicators: world (gradient
 * all-reduce: CP ranks hold partial gradients of the same parameters), cp (ring, scan, halo) and dp.
 *
 * Two kinds of operation: blocking collectives over host values (counts, the loss, a stop flag, batch
 * metadata), always MPI (comm.c); and non-blocking operations over the backend's memory, named by
 * CommGroup, which the CP schedule and the gradient buckets overlap with compute: MPI over host buffers
 * on cpu, and on cuda the CommDeviceOps table below that kernels/cuda/comm_nccl.c sets when the device
 * runtime opens (lib/backend/runtime.h): NCCL, each group on its own communicator and stream, ordered
 * after the compute stream's queued work by events; the host never waits. Each call appends to a
 * CommHandle that comm_wait completes and empties; buffers stay untouched until then (a send buffer may be
 * read), and every rank of a group posts the same sequence.
 *
 * Every wait for other ranks (comm_wait on MPI, the blocking collectives, and host reads a caller brackets
 * with comm_watch_begin/end) is timed by the watchdog (comm_watchdog.c) once started; the model says where
 * it is (comm_set_step, comm_set_context) for its report.
 */
#ifndef RS_COMM_H
#define RS_COMM_H

#include <mpi.h>
#include <stdint.h>

#include "config/config.h"

/* The groups of the non-blocking operations. */
typedef enum { COMM_WORLD, COMM_CP, COMM_DP, COMM_GROUPS } CommGroup;

struct CommWatch;         /* comm_watchdog.c */
struct CommDeviceOps;     /* below */

typedef struct Comm {
    int      world_size, rank, local_rank, local_size;
    int      dp, cp, dp_rank, cp_rank;
    MPI_Comm world, cp_comm, dp_comm;
    char     host[64];
    const struct CommDeviceOps *dev; /* NULL: non-blocking operations are MPI over host memory; else the device's
                                      * (NCCL over device memory), with its own state in dev_state */
    void    *dev_state;
    int      serial;       /* every non-blocking operation is waited as soon as it is posted, so nothing overlaps
                            * (parallel.overlap_comm: false, for measurement; ringscan bench) */
    struct CommWatch *watch; /* NULL: no watchdog */
} Comm;

/* MPI_Init and world/local ranks; sets the rank used in error messages. */
void comm_init(Comm *c, int *argc, char ***argv);
/* Splits the world into dp and cp groups. The caller has checked that
 * world_size == dp x cp (config_validate_world). */
void comm_setup_groups(Comm *c, int64_t dp, int64_t cp);
void comm_finalize(Comm *c);
/* Ends every rank (MPI_Abort) with `code`: for errors found on one rank only. */
void comm_abort(Comm *c, int code);

#define COMM_HANDLE_MAX 256

/* A set of posted operations. Start it as {0}; comm_wait empties it. */
typedef struct {
    MPI_Request req[COMM_HANDLE_MAX]; /* MPI */
    int         n;
    int         event;                /* NCCL: 1 + the Comm's event recorded after the last operation; 0: none */
    int         group;                /* 1 + the CommGroup of the operations; 0: none yet */
    const char *op;                   /* the last operation's name, for the watchdog ("isendrecv", ...) */
} CommHandle;

/* recv (P x bytes, rank-major) = every rank's `send` (bytes each), over group g. */
void comm_iallgather(Comm *c, CommGroup g, const void *send, void *recv, int64_t bytes, CommHandle *h);
/* buf = sum over group g of buf (fp32, in place). */
void comm_iallreduce_sum_f32(Comm *c, CommGroup g, float *buf, int64_t n, CommHandle *h);
/* In place over group g of P ranks, this rank r of them: buf (P x n, fp32) summed over the group into piece r,
 * buf + r n (the other pieces: undefined afterwards). Sharded gradients (lib/model/model_shard.c). */
void comm_ireduce_scatter_sum_f32(Comm *c, CommGroup g, float *buf, int64_t n, CommHandle *h);
/* In place over group g: buf (P x bytes) = every rank's piece, rank r's read from buf + r bytes. The
 * sharded weights' all-gather after the optimizer step. */
void comm_iallgather_inplace(Comm *c, CommGroup g, void *buf, int64_t bytes, CommHandle *h);
/* Send `bytes` of `send` to rank `to` and receive `bytes` into `recv` from rank `from` (ranks of
 * group g), as one group; `tag` tells apart MPI messages between the same pair (the ring's KV and dKV). */
void comm_isendrecv(Comm *c, CommGroup g, const void *send, int to, void *recv, int from, int64_t bytes, int tag,
                    CommHandle *h);
/* Completes every operation of h (NCCL: the compute stream waits for them; the host does not);
 * h is empty afterwards (waiting on an empty handle is a no-op). */
void comm_wait(Comm *c, CommHandle *h);
/* Lets posted operations progress without waiting (MPI moves non-blocking collectives only
 * inside MPI calls; NCCL needs nothing); h stays valid for comm_wait. */
void comm_progress(Comm *c, CommHandle *h);

/* One rank's GPU facts, gathered over the world by comm_cuda_init and judged by comm_gpu_layout_check. */
typedef struct {
    int  gpus;                 /* GPUs this rank sees (0: none; `why` says the runtime's reason) */
    int  local_rank, local_size, device;
    char host[64], bus[32];    /* bus: PCI bus id of the bound GPU; "" before binding */
    char why[160];
} CommGpuInfo;

/* Whether n ranks with these facts can each drive a GPU of their own (one rank per GPU: rank i binds
 * GPU local_rank, or its only visible GPU). 0 when they can; else 1 with one message naming the ranks,
 * hosts and GPUs in msg and what to do in hint. Ranks with bus "" are judged by their counts only. Pure:
 * comm_cuda_init calls it on every rank with the same gathered facts, so every rank reaches the same
 * verdict. */
int comm_gpu_layout_check(const CommGpuInfo *all, int n, char *msg, size_t nmsg, char *hint, size_t nhint);

/* The non-blocking operations over device memory, as a table the device side fills (NCCL:
 * kernels/cuda/comm_nccl.c, when the device runtime opens; lib/backend/runtime.h): comm.c dispatches
 * to it whenever c->dev is set, the watchdog asks it about stuck operations. Arguments as the comm_i*
 * calls above. */
typedef struct CommDeviceOps {
    const char *name; /* "NCCL" */
    void (*iallgather)(Comm *c, CommGroup g, const void *send, void *recv, int64_t bytes, CommHandle *h);
    void (*iallreduce_sum_f32)(Comm *c, CommGroup g, float *buf, int64_t n, CommHandle *h);
    void (*ireduce_scatter_sum_f32)(Comm *c, CommGroup g, float *buf, int64_t n, CommHandle *h);
    void (*iallgather_inplace)(Comm *c, CommGroup g, void *buf, int64_t bytes, CommHandle *h);
    void (*isendrecv)(Comm *c, CommGroup g, const void *send, int to, void *recv, int from, int64_t bytes,
                      CommHandle *h);
    void (*wait)(Comm *c, CommHandle *h);
    void (*free)(Comm *c); /* comm_finalize: the communicators and streams; clears c->dev */
    /* for the watchdog thread: an asynchronous error of a communicator (1, described in msg; else 0); the
     * earliest operation not complete (1 with msg; else 0); abort every communicator, so no kernel keeps
     * spinning on a dead peer */
    int  (*watch_error)(Comm *c, char *msg, size_t n);
    int  (*watch_pending)(Comm *c, char *msg, size_t n);
    void (*watch_abort)(Comm *c);
} CommDeviceOps;

/* Blocking collectives over host buffers (element counts may exceed INT_MAX). */
/* recv (P x bytes, rank-major) = every rank's `send` over `comm` */
void   comm_allgather(Comm *c, MPI_Comm comm, const void *send, void *recv, int64_t bytes);
void   comm_allreduce_sum_f32(Comm *c, MPI_Comm comm, float *buf, int64_t n);
void   comm_allreduce_sum_f64(Comm *c, MPI_Comm comm, double *buf, int64_t n);
double comm_allreduce_sum_scalar(Comm *c, MPI_Comm comm, double v);
int    comm_allreduce_max_int(Comm *c, MPI_Comm comm, int v);
void   comm_barrier(Comm *c, MPI_Comm comm);
/* buf (bytes, at most INT_MAX) = rank `root`'s buf over `comm` */
void   comm_bcast(Comm *c, MPI_Comm comm, void *buf, int64_t bytes, int root);

/* ---- the start-up guard (comm_startup.c) ---------------------------------------------- */

/* Arms it before MPI_Init: unless disarmed within timeout_s (<= 0: nothing is armed), this rank
 * reports where it still is (to <run_dir>/log.txt too when that exists; run_dir may be NULL) and
 * ends with RS_EXIT_HANG. launcher_rank: the rank its messages name until MPI_Init says. */
void comm_startup_guard_arm(double timeout_s, const char *run_dir, int launcher_rank);
/* MPI_Init returned (comm_init): from now on the guard ends every rank through MPI_Abort. */
void comm_startup_guard_mpi_up(void);
/* The start-up is over (the watchdog takes over) or the process leaves; a no-op when not armed. */
void comm_startup_guard_disarm(void);
/* debug.stall_step = 0 (tests only): never returns. */
void comm_startup_stall(void) __attribute__((__noreturn__));

/* ---- the watchdog (comm_watchdog.c) -------------------------------------------------- */

typedef struct {
    double      timeout_s;   /* a wait longer than this ends every rank with RS_EXIT_HANG */
    const char *dir;         /* the run directory: the ranks compare notes in <dir>/.watchdog/<attempt>/;
                              * NULL: none (a rank that times out reports its own wait alone) */
    int64_t     stall_rank;  /* tests (debug.stall_*): this world rank (-1: none) stops forever at the */
    int64_t     stall_step;  /* first comm_set_context of stall_layer in stall_step */
    int64_t     stall_layer;
} CommWatchOptions;

/* Starts this rank's watchdog thread (every rank calls it, after comm_setup_groups: with several
 * ranks, rank 0 names the attempt over the world). timeout_s <= 0: nothing is started. */
void comm_watchdog_start(Comm *c, const CommWatchOptions *o);
/* Stops and joins it (comm_finalize calls it; a no-op without one). */
void comm_watchdog_stop(Comm *c);
/* Where this rank is, for the report: the step (the trainer), and the layer (-1: none) and a static
 * label of the communication about to happen (the model: "ring attention forward", ...). A few
 * stores; no formatting, no allocation. */
void comm_set_step(Comm *c, int64_t step);
void comm_set_context(Comm *c, int layer, const char *what);
/* Brackets a wait the watchdog times (comm.c's own waits; the trainer's synchronising host reads on
 * cuda, where a stuck NCCL operation shows up): op names it, g the ranks it waits for. */
void comm_watch_begin(Comm *c, const char *op, CommGroup g);
void comm_watch_end(Comm *c);
/* An MPI transfer failed (what: the call and MPI's words): with a watchdog running, it trips on its next
 * tick, compares notes with the other ranks and ends every rank with RS_EXIT_HANG, naming the ranks that
 * no longer answer; this call never returns then. Returns 0 without a watchdog. */
int comm_watch_fail(Comm *c, const char *what);

/* The context comm_set_step/comm_set_context set last (c->watch must be set): the device side's log. */
void comm_watch_where(const Comm *c, int64_t *step, int *layer, const char **what);

#endif
