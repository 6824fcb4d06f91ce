/*
 * build_info.h — what this binary was built with and what it finds at run
 * time: compiler, libyaml, jansson, MPI, and (when the cuda backend is
 * compiled in) CUDA runtime/driver, cuBLASLt, NCCL and the visible GPUs.
 * Printed by `ringscan version`; the first thing a bug report needs.
 */
#ifndef RS_BUILD_INFO_H
#define RS_BUILD_INFO_H

#include <stdio.h>

void build_info_print(FILE *f);

/* The git commit this binary was built from (12 hex digits, "unknown" outside a checkout); the
 * Makefile rebuilds build_info.o whenever HEAD moves, so this never names an older commit. */
const char *build_info_git_sha(void);

#endif
