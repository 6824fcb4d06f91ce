/*
 * bench_cp.h — `ringscan bench cp` (bench_cp.c): context parallelism over the
 * P ranks of mpirun, ring attention and the GDN layer beside their one-GPU
 * time and the CP peers.
 *
 * Callers: bench.c (bench_main, after parsing the options).
 */
#ifndef RS_BENCH_CP_H
#define RS_BENCH_CP_H

#include "bench_common.h"

/* `bench cp` with the parsed options (MPI starts there); the exit status */
int bench_cp_main(const BenchOptions *o);

#endif
