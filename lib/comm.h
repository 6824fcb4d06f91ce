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
 * non-blocking handles (CommRequest) become CUDA events there.
 *
 * Callers: lib/train.c, lib/cp*.c.
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

/* Blocking collectives over host buffers (element counts may exceed INT_MAX). */
void   comm_allreduce_sum_f32(Comm *c, MPI_Comm comm, float *buf, int64_t n);
void   comm_allreduce_sum_f64(Comm *c, MPI_Comm comm, double *buf, int64_t n);
double comm_allreduce_sum_scalar(Comm *c, MPI_Comm comm, double v);
int    comm_allreduce_max_int(Comm *c, MPI_Comm comm, int v);
void   comm_barrier(Comm *c, MPI_Comm comm);

#endif
