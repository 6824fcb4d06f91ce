/*
 * bench.h — `ringscan bench attn|gdn|step|all|cp [options]` (bench.c): parses
 * the options, runs the benchmarks (`cp` in bench_cp.c) and prints the
 * tables. The tool as a whole is described in bench_common.h.
 *
 * Callers: cmd/ringscan.c.
 */
#ifndef RS_BENCH_H
#define RS_BENCH_H

/* argv[0] is "bench"; returns the exit status */
int bench_main(int argc, char **argv);

#endif
