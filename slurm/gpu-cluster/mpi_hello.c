/*
 * mpi_hello.c — the launch check of the GPU test cluster (slurm/gpu-cluster/): every rank says its rank, the
 * world size, the Slurm node it runs on and its CUDA_VISIBLE_DEVICES, and the ranks sum 1 each with
 * MPI_Allreduce. Exit 0 when the sum is the world size. Built by bring.sh with mpicc; run under
 * `srun --mpi=pmix` and `mpirun` before the training jobs, so a launcher that cannot start Open MPI fails in
 * a second, with its own message, not inside a job.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int rank = 0, size = 0, one = 1, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    const char *node = getenv("SLURMD_NODENAME"), *gpus = getenv("CUDA_VISIBLE_DEVICES");
    printf("mpi_hello: rank %d of %d on node %s, CUDA_VISIBLE_DEVICES %s, allreduce %d\n", rank, size,
           node ? node : "?", gpus ? gpus : "unset", sum);
    MPI_Finalize();
    return sum == size ? 0 : 1;
}
