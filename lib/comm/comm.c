/*
 * comm.c — the MPI implementation of comm.h, and the dispatch of the
 * non-blocking operations to the device's table (CommDeviceOps: NCCL) once the device runtime has opened.
 *
 * Every MPI call is checked (MPI_CHECK below): on failure the message names
 * the call, file:line, rank and host, and every rank is aborted, since a
 * collective that failed on one rank would hang the others. A failed transfer
 * (MPI_XFER_CHECK: a rank gone, a connection broken) goes through the
 * watchdog's report and exit 76, as a hang would.
 *
 * Every host wait for other ranks (the blocking collectives, comm_wait over
 * MPI) is bracketed by comm_watch_begin/end, so the watchdog
 * (comm_watchdog.c) sees how long this rank has been waiting, in which
 * operation and group.
 */
#include "comm.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

#define MPI_CHECK(call)                                                                      \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != MPI_SUCCESS) {                                                            \
            char msg_[MPI_MAX_ERROR_STRING];                                                 \
            int len_ = 0;                                                                    \
            MPI_Error_string(rc_, msg_, &len_);                                              \
            error_warn(__FILE__, __LINE__, "%s failed: %s", #call, msg_);                    \
            MPI_Abort(MPI_COMM_WORLD, RS_EXIT_FAIL);                                         \
        }                                                                                    \
    } while (0)

/* A transfer between ranks: its failure is a peer lost (dead, its connection broken; a transport such as
 * UCX fails the call where ob1's tcp waits), so it ends every rank with RS_EXIT_HANG like a hang, through
 * the watchdog's report where one runs (the job script requeues it) */
#define MPI_XFER_CHECK(c, call)                                                          \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != MPI_SUCCESS) comm_xfer_failed((c), rc_, #call, __FILE__, __LINE__);   \
    } while (0)

static noreturn void comm_xfer_failed(Comm *c, int rc, const char *call, const char *file, int line) {
    char msg[MPI_MAX_ERROR_STRING], what[MPI_MAX_ERROR_STRING + 160];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    snprintf(what, sizeof what, "%.*s failed: %s", (int)strcspn(call, "("), call, msg); /* the function's name */
    comm_watch_fail(c, what); /* returns only without a watchdog */
    error_exit(RS_EXIT_HANG, file, line,
               "a rank is gone or its connection broke (its launcher's output names the one that died); the job "
               "script requeues, and the next run resumes from the last checkpoint",
               "%s; every rank ends with exit %d", what, RS_EXIT_HANG);
}

/* MPI counts are int: large buffers go in pieces of at most 2^30 elements */
#define COMM_PIECE (1 << 30)

/* error.h's abort hook with several ranks: one rank's fatal error ends them all */
static void comm_abort_world(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

void comm_init(Comm *c, int *argc, char ***argv) {
    memset(c, 0, sizeof *c);
    int inited = 0;
    MPI_CHECK(MPI_Initialized(&inited));
    if (!inited) MPI_CHECK(MPI_Init(argc, argv));
    comm_startup_guard_mpi_up();
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c->world_size));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
    MPI_Comm local;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local));
    MPI_CHECK(MPI_Comm_rank(local, &c->local_rank));
    MPI_CHECK(MPI_Comm_size(local, &c->local_size));
    MPI_CHECK(MPI_Comm_free(&local));
    if (gethostname(c->host, sizeof c->host) != 0) snprintf(c->host, sizeof c->host, "?");
    c->host[sizeof c->host - 1] = 0;
    c->world = MPI_COMM_WORLD;
    c->cp_comm = c->dp_comm = MPI_COMM_NULL;
    error_set_rank(c->rank);
    if (c->world_size > 1) {
        error_set_abort(comm_abort_world);
        /* a peer that died closes its sockets: a rank writing to one gets EPIPE (Open MPI's TCP transport then
         * waits, and the watchdog names the dead rank and ends the run with 76) instead of dying of SIGPIPE
         * (exit 141, which no job script requeues: test_slurm's killed rank, seen under load) */
        signal(SIGPIPE, SIG_IGN);
    }
}

void comm_setup_groups(Comm *c, int64_t dp, int64_t cp) {
    RS_CHECK((int64_t)c->world_size == dp * cp, "world %d != dp %lld x cp %lld", c->world_size, (long long)dp,
             (long long)cp);
    c->dp = (int)dp;
    c->cp = (int)cp;
    c->serial = 0;
    c->dp_rank = c->rank / c->cp;
    c->cp_rank = c->rank % c->cp;
    /* same dp_rank -> one CP group, ordered by cp_rank; same cp_rank -> one DP group */
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, c->dp_rank, c->cp_rank, &c->cp_comm));
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, c->cp_rank, c->dp_rank, &c->dp_comm));
    MPI_CHECK(MPI_Comm_set_errhandler(c->cp_comm, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_set_errhandler(c->dp_comm, MPI_ERRORS_RETURN));
}

void comm_finalize(Comm *c) {
    comm_startup_guard_disarm();
    comm_watchdog_stop(c);
    if (c->dev) c->dev->free(c);
    error_set_abort(NULL); /* past MPI_Finalize a fatal error is this process's alone */
    if (c->cp_comm != MPI_COMM_NULL) MPI_Comm_free(&c->cp_comm);
    if (c->dp_comm != MPI_COMM_NULL) MPI_Comm_free(&c->dp_comm);
    MPI_Finalize();
}

void comm_abort(Comm *c, int code) {
    (void)c;
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
}

/* The CommGroup of an MPI communicator, for the watchdog's report (COMM_GROUPS: another one). */
static CommGroup comm_group_of(const Comm *c, MPI_Comm comm) {
    return comm == c->world ? COMM_WORLD : comm == c->cp_comm ? COMM_CP : comm == c->dp_comm ? COMM_DP : COMM_GROUPS;
}

static void comm_allreduce_sum(Comm *c, MPI_Comm comm, void *buf, int64_t n, MPI_Datatype type, size_t es) {
    comm_watch_begin(c, "allreduce", comm_group_of(c, comm));
    for (int64_t off = 0; off < n; off += COMM_PIECE) {
        int k = (int)(n - off < COMM_PIECE ? n - off : COMM_PIECE);
        MPI_XFER_CHECK(c, MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * (int64_t)es, k, type, MPI_SUM, comm));
    }
    comm_watch_end(c);
}

void comm_allreduce_sum_f32(Comm *c, MPI_Comm comm, float *buf, int64_t n) {
    comm_allreduce_sum(c, comm, buf, n, MPI_FLOAT, sizeof *buf);
}

void comm_allreduce_sum_f64(Comm *c, MPI_Comm comm, double *buf, int64_t n) {
    comm_allreduce_sum(c, comm, buf, n, MPI_DOUBLE, sizeof *buf);
}

double comm_allreduce_sum_scalar(Comm *c, MPI_Comm comm, double v) {
    comm_allreduce_sum_f64(c, comm, &v, 1);
    return v;
}

int comm_allreduce_max_int(Comm *c, MPI_Comm comm, int v) {
    comm_watch_begin(c, "allreduce", comm_group_of(c, comm));
    MPI_XFER_CHECK(c, MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, comm));
    comm_watch_end(c);
    return v;
}

void comm_barrier(Comm *c, MPI_Comm comm) {
    comm_watch_begin(c, "barrier", comm_group_of(c, comm));
    MPI_XFER_CHECK(c, MPI_Barrier(comm));
    comm_watch_end(c);
}

void comm_bcast(Comm *c, MPI_Comm comm, void *buf, int64_t bytes, int root) {
    RS_CHECK(bytes >= 0 && bytes <= INT_MAX, "broadcast of %lld bytes", (long long)bytes);
    comm_watch_begin(c, "broadcast", comm_group_of(c, comm));
    MPI_XFER_CHECK(c, MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, comm));
    comm_watch_end(c);
}

int comm_gpu_layout_check(const CommGpuInfo *all, int n, char *msg, size_t nmsg, char *hint, size_t nhint) {
    for (int r = 0; r < n; r++) {
        const CommGpuInfo *a = &all[r];
        if (a->gpus == 0) {
            snprintf(msg, nmsg, "device.kind = cuda: rank %d on host %s sees no GPU (%s)", r, a->host, a->why);
            snprintf(hint, nhint, "run on GPU nodes, or set device.kind: cpu");
            return 1;
        }
        if (a->gpus > 1 && a->local_rank >= a->gpus) {
            snprintf(msg, nmsg, "host %s runs %d ranks but has %d GPUs: rank %d (local rank %d) would have no GPU of "
                     "its own", a->host, a->local_size, a->gpus, r, a->local_rank);
            snprintf(hint, nhint, "start one rank per GPU on each host (mpirun -np <GPUs> per node, srun "
                     "--ntasks-per-node = GPUs per node), or give each task one GPU (srun --gpus-per-task=1)");
            return 1;
        }
    }
    for (int r = 0; r < n; r++)
        for (int q = 0; q < r; q++)
            if (all[r].bus[0] && !strcmp(all[q].host, all[r].host) && !strcmp(all[q].bus, all[r].bus)) {
                snprintf(msg, nmsg, "ranks %d and %d on host %s both drive GPU %s (device %d of rank %d, %d of rank "
                         "%d)", q, r, all[r].host, all[r].bus, all[q].device, q, all[r].device, r);
                snprintf(hint, nhint, "one rank per GPU: each rank binds GPU <local rank>, or its only visible GPU; "
                         "check CUDA_VISIBLE_DEVICES and the launcher's GPU binding");
                return 1;
            }
    return 0;
}

/* ---- non-blocking operations ---------------------------------------------------------- */

/* MPI counts are int: a message of more than INT_MAX bytes travels as whole 4 KiB blocks. */
#define COMM_BLOCK 4096

static void comm_count_of(int64_t bytes, int *count, MPI_Datatype *type) {
    RS_CHECK(bytes >= 0, "message of %lld bytes", (long long)bytes);
    if (bytes <= INT_MAX) {
        *count = (int)bytes;
        *type = MPI_BYTE;
        return;
    }
    RS_CHECK(bytes % COMM_BLOCK == 0 && bytes / COMM_BLOCK <= INT_MAX,
             "message of %lld bytes: above 2 GiB it must be whole %d-byte blocks", (long long)bytes, COMM_BLOCK);
    static MPI_Datatype block = MPI_DATATYPE_NULL;
    if (block == MPI_DATATYPE_NULL) {
        MPI_CHECK(MPI_Type_contiguous(COMM_BLOCK, MPI_BYTE, &block));
        MPI_CHECK(MPI_Type_commit(&block));
    }
    *count = (int)(bytes / COMM_BLOCK);
    *type = block;
}

/* Names h's operations (group g, the last one's name) for comm_wait's watch; one group per handle. */
static void comm_handle_note(CommHandle *h, CommGroup g, const char *op) {
    RS_CHECK(h->group == 0 || h->group == (int)g + 1, "one CommHandle holds operations of groups %d and %d",
             h->group - 1, (int)g);
    h->group = (int)g + 1;
    h->op = op;
}

static MPI_Request *comm_slot(CommHandle *h) {
    RS_CHECK(h->n < COMM_HANDLE_MAX, "a CommHandle holds at most %d requests", COMM_HANDLE_MAX);
    return &h->req[h->n++];
}

static MPI_Comm comm_group_mpi(const Comm *c, CommGroup g) {
    MPI_Comm m = g == COMM_CP ? c->cp_comm : g == COMM_DP ? c->dp_comm : c->world;
    RS_CHECK(m != MPI_COMM_NULL, "communication group %d used before comm_setup_groups", (int)g);
    return m;
}

void comm_allgather(Comm *c, MPI_Comm comm, const void *send, void *recv, int64_t bytes) {
    int count;
    MPI_Datatype type;
    comm_count_of(bytes, &count, &type);
    comm_watch_begin(c, "allgather", comm_group_of(c, comm));
    MPI_XFER_CHECK(c, MPI_Allgather(send, count, type, recv, count, type, comm));
    comm_watch_end(c);
}

/* After posting: the handle notes the operation (the watchdog's report), and with Comm.serial
 * (parallel.overlap_comm: false) the operation is waited at once. */
static void comm_posted(Comm *c, CommHandle *h, CommGroup g, const char *op) {
    comm_handle_note(h, g, op);
    if (c->serial) comm_wait(c, h);
}

void comm_iallgather(Comm *c, CommGroup g, const void *send, void *recv, int64_t bytes, CommHandle *h) {
    if (c->dev) c->dev->iallgather(c, g, send, recv, bytes, h);
    else {
        int count;
        MPI_Datatype type;
        comm_count_of(bytes, &count, &type);
        MPI_XFER_CHECK(c, MPI_Iallgather(send, count, type, recv, count, type, comm_group_mpi(c, g), comm_slot(h)));
    }
    comm_posted(c, h, g, "iallgather");
}

void comm_iallreduce_sum_f32(Comm *c, CommGroup g, float *buf, int64_t n, CommHandle *h) {
    if (c->dev) c->dev->iallreduce_sum_f32(c, g, buf, n, h);
    else
        for (int64_t off = 0; off < n; off += COMM_PIECE) {
            int k = (int)(n - off < COMM_PIECE ? n - off : COMM_PIECE);
            MPI_XFER_CHECK(c, MPI_Iallreduce(MPI_IN_PLACE, buf + off, k, MPI_FLOAT, MPI_SUM, comm_group_mpi(c, g),
                                             comm_slot(h)));
        }
    comm_posted(c, h, g, "iallreduce");
}

/* this rank's place in group g */
static int comm_group_rank(const Comm *c, CommGroup g) {
    return g == COMM_CP ? c->cp_rank : g == COMM_DP ? c->dp_rank : c->rank;
}

/* MPI: blocking (MPI_Reduce_scatter_block in place leaves the sum at the buffer's start, moved to piece r
 * at once; the cpu backend is the oracle, not the fast path), under the watchdog. */
void comm_ireduce_scatter_sum_f32(Comm *c, CommGroup g, float *buf, int64_t n, CommHandle *h) {
    if (c->dev) c->dev->ireduce_scatter_sum_f32(c, g, buf, n, h);
    else {
        RS_CHECK(n <= INT_MAX, "reduce-scatter of %lld elements per rank: at most %d", (long long)n, INT_MAX);
        comm_watch_begin(c, "reduce-scatter", g);
        MPI_XFER_CHECK(c,
                       MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, comm_group_mpi(c, g)));
        comm_watch_end(c);
        int r = comm_group_rank(c, g);
        if (r > 0) memmove(buf + (int64_t)r * n, buf, (size_t)n * sizeof *buf);
    }
    comm_posted(c, h, g, "ireduce_scatter");
}

void comm_iallgather_inplace(Comm *c, CommGroup g, void *buf, int64_t bytes, CommHandle *h) {
    if (c->dev) c->dev->iallgather_inplace(c, g, buf, bytes, h);
    else {
        int count;
        MPI_Datatype type;
        comm_count_of(bytes, &count, &type);
        MPI_XFER_CHECK(c, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, count, type,
                                         comm_group_mpi(c, g), comm_slot(h)));
    }
    comm_posted(c, h, g, "iallgather");
}

void comm_isendrecv(Comm *c, CommGroup g, const void *send, int to, void *recv, int from, int64_t bytes, int tag,
                    CommHandle *h) {
    if (c->dev) c->dev->isendrecv(c, g, send, to, recv, from, bytes, h);
    else {
        int count;
        MPI_Datatype type;
        comm_count_of(bytes, &count, &type);
        MPI_Comm m = comm_group_mpi(c, g);
        MPI_XFER_CHECK(c, MPI_Irecv(recv, count, type, from, tag, m, comm_slot(h)));
        MPI_XFER_CHECK(c, MPI_Isend(send, count, type, to, tag, m, comm_slot(h)));
    }
    comm_posted(c, h, g, "isendrecv");
}

void comm_wait(Comm *c, CommHandle *h) {
    if (c->dev) {
        c->dev->wait(c, h);
        return;
    }
    if (h->n == 0) return;
    comm_watch_begin(c, h->op, (CommGroup)(h->group - 1));
    MPI_XFER_CHECK(c, MPI_Waitall(h->n, h->req, MPI_STATUSES_IGNORE));
    comm_watch_end(c);
    h->n = 0;
    h->group = 0;
    h->op = NULL;
}

void comm_progress(Comm *c, CommHandle *h) {
    if (h->n == 0) return; /* also every NCCL handle: its operations progress on their stream */
    int done = 0;
    MPI_XFER_CHECK(c, MPI_Testall(h->n, h->req, &done, MPI_STATUSES_IGNORE));
    if (done) {
        h->n = 0;
        h->group = 0;
        h->op = NULL;
    }
}
