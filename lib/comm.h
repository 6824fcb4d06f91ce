/*
 * comm.h — processes and their communication: world = dp x cp.
 *
 * Ranks come from MPI (launched by `mpirun`, or `srun --mpi=pmix` in Slurm);
 * the local rank (which GPU on a node) comes from MPI_Comm_split_type(SHARED),
 * never from rank % gpus_per_node. World rank r is (dp_rank, cp_rank) with
 * r = dp_rank * cp + cp_rank, so the ranks of one CP group are adjacent (on
 * one node when they fit: the ring and the scan stay on NVLink).
 *
 * Communicators: `world` (gradient all-reduce over dp x cp: CP ranks hold
 * partial gradients of the same parameters), `cp` (ring attention, the GDN
 * scan all-gather, the conv halo) and `dp`.
 *
 * This is the MPI backend over host buffers (cpu). The cuda backend will
 * implement the same operations with NCCL on a communication stream; the
 * non-blocking handles (CommHandle) become CUDA events there: an operation is
 * "posted" when it is enqueued, and comm_wait orders what follows after it.
 *
 * Non-blocking operations (the ones the CP schedule overlaps with compute):
 * each call appends its requests to a CommHandle; comm_wait completes every
 * request of the handle and empties it. Several calls into one handle form
 * one group (the ring step's send + receive, NCCL's ncclGroupStart/End).
 * Buffers must not be touched between posting and comm_wait, except that a
 * send buffer may be read. Every rank of the communicator posts the same
 * sequence of collectives (the CP schedule is derived from data every rank
 * holds).
 *
 * Callers: lib/train.c, lib/model_step.c (bucketed gradient all-reduce),
 * lib/cp*.c (ring, scan all-gather, conv halo), tests/cp.
 */
#ifndef RS_COMM_H
#define RS_COMM_H

#include <mpi.h>
#include <stdint.h>

#include "config.h"

typedef struct {
    int      world_size, rank, local_rank, local_size;
    int      dp, cp, dp_rank, cp_rank;
    MPI_Comm world, cp_comm, dp_comm;
    char     host[64];
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

typedef struct {
    MPI_Request req[COMM_HANDLE_MAX];
    int         n;
} CommHandle;

/* recv (P x bytes, rank-major) = every rank's `send` (bytes each), over `comm`. */
void comm_iallgather(Comm *c, MPI_Comm comm, const void *send, void *recv, int64_t bytes, CommHandle *h);
/* buf = sum over `comm` of buf (fp32, in place). */
void comm_iallreduce_sum_f32(Comm *c, MPI_Comm comm, float *buf, int64_t n, CommHandle *h);
/* Send `bytes` of `send` to rank `to` and receive `bytes` into `recv` from rank `from` (ranks of
 * `comm`); `tag` tells apart messages between the same pair (the ring's KV and dKV). */
void comm_isendrecv(Comm *c, MPI_Comm comm, const void *send, int to, void *recv, int from, int64_t bytes, int tag,
                    CommHandle *h);
void comm_isend(Comm *c, MPI_Comm comm, const void *send, int to, int64_t bytes, int tag, CommHandle *h);
void comm_irecv(Comm *c, MPI_Comm comm, void *recv, int from, int64_t bytes, int tag, CommHandle *h);
/* Completes every request of h; h is empty afterwards (waiting on an empty handle is a no-op). */
void comm_wait(Comm *c, CommHandle *h);
/* Lets posted operations progress without waiting (MPI moves non-blocking collectives only
 * inside MPI calls); h stays valid for comm_wait. */
void comm_progress(Comm *c, CommHandle *h);

/* Blocking collectives over host buffers (element counts may exceed INT_MAX). */
void   comm_allreduce_sum_f32(Comm *c, MPI_Comm comm, float *buf, int64_t n);
void   comm_allreduce_sum_f64(Comm *c, MPI_Comm comm, double *buf, int64_t n);
double comm_allreduce_sum_scalar(Comm *c, MPI_Comm comm, double v);
int    comm_allreduce_max_int(Comm *c, MPI_Comm comm, int v);
void   comm_barrier(Comm *c, MPI_Comm comm);

#endif
