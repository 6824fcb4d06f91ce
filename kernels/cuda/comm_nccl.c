/*
 * comm_nccl.c — the cuda half of comm.h: which GPU each rank drives, and the non-blocking operations over
 * device memory through NCCL, as the Comm's CommDeviceOps table (so lib/ names no NCCL function).
 * Callers: lib/comm/comm.c through that table (comm_iallgather, comm_iallgather_inplace, comm_iallreduce_sum_f32,
 * comm_ireduce_scatter_sum_f32, comm_isendrecv,
 * comm_wait, comm_finalize, the watchdog); comm_cuda_init (comm_nccl.h) from kernels/cuda/runtime_cuda.c.
 *
 * comm_cuda_init, after comm_setup_groups: every rank's GPU count and local rank are gathered and the run is
 * refused (one message from rank 0, exit 2 on every rank) when a rank sees no GPU or a host runs more ranks
 * than GPUs (unless each rank sees exactly one: --gpus-per-task); each rank binds GPU local_rank and the
 * (host, PCI bus id) pairs are gathered, refusing two ranks on one GPU; with more than one rank, one NCCL
 * communicator per group (world, cp, dp) from an id the group's first rank broadcasts over MPI (the launcher
 * and bootstrap: mpirun, or srun --mpi=pmix), and one non-blocking stream of the highest priority per group.
 *
 * An operation of group g records `ready` on the compute stream, makes g's stream wait for it, enqueues the
 * NCCL call and records the handle's event (from a pool of COMM_EVENTS) on g's stream; comm_wait makes the
 * compute stream wait for that event. The host never waits here. Under the watchdog each post also records
 * an event in its group's log of the last COMM_WATCH_LOG posts, so a rank stuck at the step's end names the
 * earliest operation not complete; the watchdog's thread polls ncclCommGetAsyncError and aborts the
 * communicators before the run ends. A failed CUDA or NCCL call ends every rank naming the call, rank, host,
 * GPU and NCCL's last error; a peer gone (ncclRemoteError: over a network transport a dead rank's sockets
 * close and the next call fails at once) is the watchdog's to report, with exit 76 (comm_nccl_fail).
 */
#ifdef RS_WITH_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm_nccl.h"
#include "cuda_setup.h"
#include "cuda_stream.h"
#include "core/error.h"

#define COMM_EVENTS 64
#define COMM_WATCH_LOG 256

/* One post in a group's log, for the watchdog. */
typedef struct {
    uint64_t    seq;  /* 1 + the group's post number; 0: never used */
    int64_t     step;
    int         layer;
    const char *op, *what;
} CommNcclPost;

typedef struct CommNccl {
    ncclComm_t   nc[COMM_GROUPS];
    cudaStream_t stream[COMM_GROUPS];
    cudaEvent_t  ready;                  /* the compute stream's position at a post */
    cudaEvent_t  event[COMM_EVENTS];     /* the handles' events */
    int          free_event[COMM_EVENTS], nfree;
    int          device;
    char         bus[32];                /* PCI bus id of the GPU, for messages */
    cudaEvent_t  post_event[COMM_GROUPS][COMM_WATCH_LOG]; /* the watchdog's log: the last posts of each group */
    CommNcclPost post[COMM_GROUPS][COMM_WATCH_LOG];
    uint64_t     posts[COMM_GROUPS];
} CommNccl;

static const char *const comm_group_names[COMM_GROUPS] = {"world", "cp", "dp"};

/* This rank's NCCL state (NULL before comm_cuda_init made it). */
static CommNccl *nccl_of(const Comm *c) { return (CommNccl *)c->dev_state; }

#define COMM_CUDA_CHECK(c, call)                                                                              \
    do {                                                                                                      \
        cudaError_t e_ = (call);                                                                              \
        if (e_ != cudaSuccess)                                                                                \
            error_exit(RS_EXIT_FAIL, __FILE__, __LINE__, NULL, "%s failed on GPU %d (%s): %s (%s)", #call,     \
                       nccl_of(c) ? nccl_of(c)->device : cuda_backend_device(), nccl_of(c) ? nccl_of(c)->bus : "?", \
                       cudaGetErrorString(e_), cudaGetErrorName(e_));                                          \
    } while (0)

/* A failed NCCL call of group g. ncclRemoteError is a peer gone (its process exited, or the network between
 * the ranks failed): over NCCL's network transport a killed rank closes its sockets, and the survivors' next
 * call fails at once instead of waiting. That is the watchdog's case, not a bug here: under the watchdog this
 * thread waits in the failed call until the watchdog (which sees the communicator's asynchronous error, or
 * the wait's timeout) reports which ranks are missing and ends every rank with RS_EXIT_HANG (76), so the job
 * script requeues and the run resumes from its last checkpoint; without it the rank ends with 76 here. Any
 * other failure ends the rank with RS_EXIT_FAIL. */
static noreturn void comm_nccl_fail(Comm *c, CommGroup g, ncclResult_t r, const char *call, const char *file,
                                    int line) {
    CommNccl *n = nccl_of(c);
    const char *hint = "NCCL_DEBUG=WARN (or INFO) prints NCCL's own account; slurm/site.env holds the network "
                       "settings a cluster may need";
    if (r == ncclRemoteError) {
        fprintf(stderr, "ringscan: [rank %d@%s] %s:%d: %s over %s failed on GPU %d (%s): %s; NCCL says: %s\n",
                c->rank, c->host, file, line, call, comm_group_names[g], n->device, n->bus, ncclGetErrorString(r),
                ncclGetLastError(NULL));
        fflush(stderr);
        if (c->watch) { /* waits here, in the call's name: the watchdog reports and ends the run */
            static char op[64];
            snprintf(op, sizeof op, "%.*s", (int)strcspn(call, "("), call);
            comm_watch_begin(c, op, g);
            for (;;) sleep(60);
        }
        error_exit(RS_EXIT_HANG, file, line,
                   "a rank of the group exited or the network failed; exit 76: the job script requeues and the "
                   "run resumes from its last checkpoint (parallel.comm_timeout_s > 0 names the missing ranks)",
                   "%s over %s failed: a peer is gone", call, comm_group_names[g]);
    }
    error_exit(RS_EXIT_FAIL, file, line, hint, "%s failed on GPU %d (%s): %s; NCCL says: %s", call, n->device,
               n->bus, ncclGetErrorString(r), ncclGetLastError(NULL));
}

#define COMM_NCCL_CHECK(c, g, call)                                                                           \
    do {                                                                                                      \
        ncclResult_t r_ = (call);                                                                             \
        if (r_ != ncclSuccess) comm_nccl_fail(c, g, r_, #call, __FILE__, __LINE__);                           \
    } while (0)

/* The gathered GPU facts, judged on every rank alike: on a refusal rank 0 prints it once and every
 * rank exits 2 (nothing has been written yet). */
static void comm_judge_gpus(Comm *c, const CommGpuInfo *all) {
    char msg[1024], hint[512];
    if (!comm_gpu_layout_check(all, c->world_size, msg, sizeof msg, hint, sizeof hint)) return;
    if (c->rank == 0) {
        fflush(stdout);
        fprintf(stderr, "ringscan: error [rank 0@%s]: %s\n  hint: %s\n", c->host, msg, hint);
        fflush(stderr);
    }
    comm_finalize(c);
    exit(RS_EXIT_USAGE);
}

/* One communicator and one stream for group g. */
static void comm_nccl_make_group(Comm *c, CommGroup g) {
    CommNccl *n = nccl_of(c);
    MPI_Comm m = g == COMM_CP ? c->cp_comm : g == COMM_DP ? c->dp_comm : c->world;
    RS_CHECK(m != MPI_COMM_NULL, "NCCL group %s before comm_setup_groups", comm_group_names[g]);
    int size = 0, rank = 0;
    MPI_Comm_size(m, &size);
    MPI_Comm_rank(m, &rank);
    ncclUniqueId id;
    if (rank == 0) COMM_NCCL_CHECK(c, g, ncclGetUniqueId(&id));
    if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, m) != MPI_SUCCESS)
        RS_FATAL("MPI_Bcast of the NCCL id of group %s failed", comm_group_names[g]);
    COMM_NCCL_CHECK(c, g, ncclCommInitRank(&n->nc[g], size, id, rank));
    int lo = 0, hi = 0;
    COMM_CUDA_CHECK(c, cudaDeviceGetStreamPriorityRange(&lo, &hi));
    COMM_CUDA_CHECK(c, cudaStreamCreateWithPriority(&n->stream[g], cudaStreamNonBlocking, hi));
}

static const CommDeviceOps comm_nccl_ops;

void comm_cuda_init(Comm *c) {
    RS_CHECK(c->cp_comm != MPI_COMM_NULL, "comm_cuda_init before comm_setup_groups");
    CommGpuInfo mine, *all = RS_CALLOC((size_t)c->world_size, sizeof *all);
    memset(&mine, 0, sizeof mine);
    mine.gpus = cuda_backend_probe(mine.why, sizeof mine.why);
    mine.local_rank = c->local_rank;
    mine.local_size = c->local_size;
    snprintf(mine.host, sizeof mine.host, "%s", c->host);
    comm_allgather(c, c->world, &mine, all, (int64_t)sizeof mine);
    comm_judge_gpus(c, all); /* the counts: every bus id is still "" */

    cuda_backend_init(c->local_rank);
    mine.device = cuda_backend_device();
    if (cudaDeviceGetPCIBusId(mine.bus, (int)sizeof mine.bus, mine.device) != cudaSuccess)
        snprintf(mine.bus, sizeof mine.bus, "device %d", mine.device);
    comm_allgather(c, c->world, &mine, all, (int64_t)sizeof mine);
    comm_judge_gpus(c, all); /* two ranks on one GPU */
    free(all);
    if (c->world_size == 1) return; /* nothing to communicate */

    CommNccl *n = RS_CALLOC(1, sizeof *n);
    n->device = mine.device;
    snprintf(n->bus, sizeof n->bus, "%s", mine.bus);
    c->dev_state = n;
    c->dev = &comm_nccl_ops;
    for (int g = 0; g < COMM_GROUPS; g++) comm_nccl_make_group(c, (CommGroup)g);
    COMM_CUDA_CHECK(c, cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming));
    for (int i = 0; i < COMM_EVENTS; i++) {
        COMM_CUDA_CHECK(c, cudaEventCreateWithFlags(&n->event[i], cudaEventDisableTiming));
        n->free_event[n->nfree++] = COMM_EVENTS - 1 - i;
    }
    for (int g = 0; g < COMM_GROUPS; g++)
        for (int i = 0; i < COMM_WATCH_LOG; i++)
            COMM_CUDA_CHECK(c, cudaEventCreateWithFlags(&n->post_event[g][i], cudaEventDisableTiming));
}

static void comm_nccl_free(Comm *c) {
    CommNccl *n = nccl_of(c);
    for (int g = 0; g < COMM_GROUPS; g++) {
        COMM_CUDA_CHECK(c, cudaStreamSynchronize(n->stream[g]));
        COMM_NCCL_CHECK(c, g, ncclCommDestroy(n->nc[g]));
        COMM_CUDA_CHECK(c, cudaStreamDestroy(n->stream[g]));
    }
    COMM_CUDA_CHECK(c, cudaEventDestroy(n->ready));
    for (int i = 0; i < COMM_EVENTS; i++) COMM_CUDA_CHECK(c, cudaEventDestroy(n->event[i]));
    for (int g = 0; g < COMM_GROUPS; g++)
        for (int i = 0; i < COMM_WATCH_LOG; i++) COMM_CUDA_CHECK(c, cudaEventDestroy(n->post_event[g][i]));
    free(n);
    c->dev_state = NULL;
    c->dev = NULL;
}

/* Orders group g's stream after the compute stream's queued work; returns the stream. */
static cudaStream_t comm_nccl_begin(Comm *c, CommGroup g, const CommHandle *h) {
    CommNccl *n = nccl_of(c);
    RS_CHECK(g >= 0 && g < COMM_GROUPS, "communication group %d", (int)g);
    RS_CHECK(h->group == 0 || h->group == (int)g + 1,
             "one CommHandle holds operations of groups %s and %s (a handle's operations share one stream)",
             comm_group_names[h->group - 1], comm_group_names[g]);
    COMM_CUDA_CHECK(c, cudaEventRecord(n->ready, cuda_stream()));
    COMM_CUDA_CHECK(c, cudaStreamWaitEvent(n->stream[g], n->ready, 0));
    return n->stream[g];
}

/* Marks the end of the handle's operations so far on group g's stream (and, under the watchdog,
 * logs operation `op`). */
static void comm_nccl_end(Comm *c, CommGroup g, CommHandle *h, const char *op) {
    CommNccl *n = nccl_of(c);
    if (c->watch) {
        CommNcclPost *p = &n->post[g][n->posts[g] % COMM_WATCH_LOG];
        COMM_CUDA_CHECK(c, cudaEventRecord(n->post_event[g][n->posts[g] % COMM_WATCH_LOG], n->stream[g]));
        p->seq = ++n->posts[g];
        p->op = op;
        comm_watch_where(c, &p->step, &p->layer, &p->what);
    }
    if (!h->event) {
        RS_CHECK(n->nfree > 0, "more than %d CommHandles in flight (a handle posted and never waited?)", COMM_EVENTS);
        h->event = 1 + n->free_event[--n->nfree];
        h->group = (int)g + 1;
    }
    COMM_CUDA_CHECK(c, cudaEventRecord(n->event[h->event - 1], n->stream[g]));
}

static void comm_nccl_iallgather(Comm *c, CommGroup g, const void *send, void *recv, int64_t bytes, CommHandle *h) {
    cudaStream_t s = comm_nccl_begin(c, g, h);
    COMM_NCCL_CHECK(c, g, ncclAllGather(send, recv, (size_t)bytes, ncclUint8, nccl_of(c)->nc[g], s));
    comm_nccl_end(c, g, h, "all-gather");
}

static void comm_nccl_iallreduce_sum_f32(Comm *c, CommGroup g, float *buf, int64_t n, CommHandle *h) {
    cudaStream_t s = comm_nccl_begin(c, g, h);
    COMM_NCCL_CHECK(c, g, ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, nccl_of(c)->nc[g], s));
    comm_nccl_end(c, g, h, "all-reduce");
}

/* in place: NCCL reads rank r's piece where it writes it (recvbuff = sendbuff + r n) */
static int comm_nccl_rank(const Comm *c, CommGroup g) {
    return g == COMM_CP ? c->cp_rank : g == COMM_DP ? c->dp_rank : c->rank;
}

static void comm_nccl_ireduce_scatter_sum_f32(Comm *c, CommGroup g, float *buf, int64_t n, CommHandle *h) {
    cudaStream_t s = comm_nccl_begin(c, g, h);
    COMM_NCCL_CHECK(c, g, ncclReduceScatter(buf, buf + (int64_t)comm_nccl_rank(c, g) * n, (size_t)n, ncclFloat32,
                                         ncclSum, nccl_of(c)->nc[g], s));
    comm_nccl_end(c, g, h, "reduce-scatter");
}

static void comm_nccl_iallgather_inplace(Comm *c, CommGroup g, void *buf, int64_t bytes, CommHandle *h) {
    cudaStream_t s = comm_nccl_begin(c, g, h);
    COMM_NCCL_CHECK(c, g, ncclAllGather((char *)buf + (int64_t)comm_nccl_rank(c, g) * bytes, buf, (size_t)bytes,
                                     ncclUint8, nccl_of(c)->nc[g], s));
    comm_nccl_end(c, g, h, "all-gather");
}

static void comm_nccl_isendrecv(Comm *c, CommGroup g, const void *send, int to, void *recv, int from,
                                int64_t bytes, CommHandle *h) {
    cudaStream_t s = comm_nccl_begin(c, g, h);
    ncclComm_t nc = nccl_of(c)->nc[g];
    COMM_NCCL_CHECK(c, g, ncclGroupStart());
    COMM_NCCL_CHECK(c, g, ncclSend(send, (size_t)bytes, ncclUint8, to, nc, s));
    COMM_NCCL_CHECK(c, g, ncclRecv(recv, (size_t)bytes, ncclUint8, from, nc, s));
    COMM_NCCL_CHECK(c, g, ncclGroupEnd());
    comm_nccl_end(c, g, h, "send/recv");
}

static void comm_nccl_wait(Comm *c, CommHandle *h) {
    if (!h->event) return;
    CommNccl *n = nccl_of(c);
    COMM_CUDA_CHECK(c, cudaStreamWaitEvent(cuda_stream(), n->event[h->event - 1], 0));
    n->free_event[n->nfree++] = h->event - 1;
    h->event = 0;
    h->group = 0;
}

/* ---- the watchdog thread's side --------------------------------------------------------- */

static int comm_nccl_watch_error(Comm *c, char *msg, size_t len) {
    CommNccl *n = nccl_of(c);
    for (int g = 0; g < COMM_GROUPS; g++) {
        ncclResult_t r = ncclSuccess;
        if (ncclCommGetAsyncError(n->nc[g], &r) != ncclSuccess || r == ncclSuccess || r == ncclInProgress) continue;
        snprintf(msg, len, "group %s on GPU %d (%s): %s; NCCL says: %s", comm_group_names[g], n->device, n->bus,
                 ncclGetErrorString(r), ncclGetLastError(n->nc[g]));
        return 1;
    }
    return 0;
}

static int comm_nccl_watch_pending(Comm *c, char *msg, size_t len) {
    CommNccl *n = nccl_of(c);
    size_t k = 0;
    msg[0] = 0;
    if (cudaSetDevice(n->device) != cudaSuccess) return 0; /* this thread's current device */
    for (int g = 0; g < COMM_GROUPS; g++) {
        uint64_t first = n->posts[g] > COMM_WATCH_LOG ? n->posts[g] - COMM_WATCH_LOG : 0;
        for (uint64_t i = first; i < n->posts[g]; i++) {
            if (cudaEventQuery(n->post_event[g][i % COMM_WATCH_LOG]) != cudaErrorNotReady) continue;
            const CommNcclPost *p = &n->post[g][i % COMM_WATCH_LOG];
            int m = snprintf(msg + k, len - k,
                             "%sNCCL %s over %s (post %llu%s) at step %lld, layer %d (%s) not complete", k ? "; " : "",
                             p->op, comm_group_names[g], (unsigned long long)p->seq,
                             i == first && first > 0 ? ", or an earlier one" : "", (long long)p->step, p->layer,
                             p->what ? p->what : "?");
            if (m > 0) k = k + (size_t)m < len ? k + (size_t)m : len - 1;
            break;
        }
    }
    return k > 0;
}

static void comm_nccl_watch_abort(Comm *c) {
    CommNccl *n = nccl_of(c);
    for (int g = 0; g < COMM_GROUPS; g++) ncclCommAbort(n->nc[g]); /* the run ends next: nothing to check */
}
static const CommDeviceOps comm_nccl_ops = {
    .name               = "NCCL",
    .iallgather         = comm_nccl_iallgather,
    .iallreduce_sum_f32 = comm_nccl_iallreduce_sum_f32,
    .ireduce_scatter_sum_f32 = comm_nccl_ireduce_scatter_sum_f32,
    .iallgather_inplace = comm_nccl_iallgather_inplace,
    .isendrecv          = comm_nccl_isendrecv,
    .wait               = comm_nccl_wait,
    .free               = comm_nccl_free,
    .watch_error        = comm_nccl_watch_error,
    .watch_pending      = comm_nccl_watch_pending,
    .watch_abort        = comm_nccl_watch_abort,
};
#endif
