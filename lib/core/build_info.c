/*
 * build_info.c — see build_info.h. The CUDA half is kernels/cuda/cuda_info.cu,
 * linked only when nvcc was found and printed after this one by `ringscan
 * version` (cmd/ringscan.c); whether the cuda backend is in this binary is
 * whether it registered its device runtime (lib/backend/runtime.h); without it
 * we say so rather than pretend.
 */
#include "build_info.h"

#include <jansson.h>
#include <mpi.h>
#include <yaml.h>

#include "backend/runtime.h"

#ifndef RS_GIT_SHA
#define RS_GIT_SHA "unknown"
#endif

const char *build_info_git_sha(void) { return RS_GIT_SHA; }

void build_info_print(FILE *f) {
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    MPI_Get_library_version(mpi, &n); /* allowed before MPI_Init */
    for (int i = 0; i < n; i++)
        if (mpi[i] == '\n') { mpi[i] = 0; break; }
    fprintf(f, "  git        %s\n", RS_GIT_SHA);
#if defined(__clang__)
    fprintf(f, "  compiler   clang %s\n", __clang_version__);
#elif defined(__GNUC__)
    fprintf(f, "  compiler   gcc %s\n", __VERSION__);
#endif
    fprintf(f, "  libyaml    %s (static)\n", yaml_get_version_string());
    fprintf(f, "  jansson    %s (static)\n", JANSSON_VERSION);
    fprintf(f, "  MPI        %s (MPI %d.%d)\n", mpi, MPI_VERSION, MPI_SUBVERSION);
    fprintf(f, "  backends   cpu (fp32 oracle)%s\n",
            runtime_device() ? ", cuda (sm_90a)" : "; cuda not built (nvcc was not found at build time)");
}
