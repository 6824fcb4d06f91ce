/*
 * bench_cp.h — `ringscan bench cp` (bench_cp.c): context parallelism over the
 * P ranks of mpirun, ring attention and the GDN layer beside their one-GPU
 * time and the CP peers.
 *
 * Callers: bench.c (bench_main, after parsing the options).
 */
#ifndef RS_BENCH_CP_H
#define RS_BENCH_CP_H

#include <stdio.h>

#include "bench_common.h"

/* `bench cp` with the parsed options (MPI starts there); the exit status */
int bench_cp_main(const BenchOptions *o);

/* rank 0's table of one part (0 ring attention, 1 the GDN layer, 2 the KDA layer) over the request's cases: our
 * rows `ours`, the peer's response `peer` (or NULL), P ranks, the layers' conv width; rows appended to `table`
 * (bench_cp_table.c) */
void bench_cp_print(FILE *f, int part, const json_t *req, const json_t *ours, const json_t *peer, int P, int conv,
                    json_t *table);

#endif
