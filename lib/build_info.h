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

#endif
