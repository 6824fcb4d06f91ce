/*
 * test_comm.c — the GPU layout verdict of comm_cuda_init (lib/comm/comm.c comm_gpu_layout_check): which
 * launches give every rank a GPU of its own. The facts are made up here, as comm_cuda_init would
 * gather them, so the refusals are tested on machines without GPUs.
 */
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "test_util.h"

static CommGpuInfo gpu_rank(const char *host, int gpus, int local_rank, int local_size, int device, const char *bus) {
    CommGpuInfo a;
    memset(&a, 0, sizeof a);
    snprintf(a.host, sizeof a.host, "%s", host);
    snprintf(a.bus, sizeof a.bus, "%s", bus);
    snprintf(a.why, sizeof a.why, "%s", gpus ? "" : "no CUDA device is visible");
    a.gpus = gpus;
    a.local_rank = local_rank;
    a.local_size = local_size;
    a.device = device;
    return a;
}

/* the verdict, and that the message holds every given fragment */
static void gpu_expect(const char *what, const CommGpuInfo *all, int n, int refused, const char *const *parts) {
    char msg[1024] = "", hint[512] = "";
    int r = comm_gpu_layout_check(all, n, msg, sizeof msg, hint, sizeof hint);
    EXPECT(r == refused, "%s: verdict %d, expected %d (%s)", what, r, refused, msg);
    for (int i = 0; parts && parts[i]; i++) EXPECT(strstr(msg, parts[i]), "%s: '%s' not in: %s", what, parts[i], msg);
    if (refused) EXPECT(hint[0], "%s: no hint", what);
    printf("%s: %s%s\n", what, refused ? "refused: " : "accepted", msg);
}

TEST(comm_gpu_layout_check) {
    /* two hosts x 4 GPUs, 4 ranks each, bound to their local ranks */
    CommGpuInfo ok[8];
    char bus[32];
    for (int r = 0; r < 8; r++) {
        snprintf(bus, sizeof bus, "0000:%02x:00.0", 0x10 + r % 4);
        ok[r] = gpu_rank(r < 4 ? "n1" : "n2", 4, r % 4, 4, r % 4, bus);
    }
    gpu_expect("2 hosts x 4 ranks on 4 GPUs each", ok, 8, 0, NULL);
    /* Slurm --gpus-per-task: every rank sees one GPU, device 0, each a different one */
    CommGpuInfo one[4];
    for (int r = 0; r < 4; r++) {
        snprintf(bus, sizeof bus, "0000:%02x:00.0", 0x20 + r);
        one[r] = gpu_rank("n1", 1, r, 4, 0, bus);
    }
    gpu_expect("4 ranks, one visible GPU each", one, 4, 0, NULL);
    /* before binding (bus ""): the counts alone */
    CommGpuInfo unbound[2] = {gpu_rank("n1", 2, 0, 2, 0, ""), gpu_rank("n1", 2, 1, 2, 0, "")};
    gpu_expect("counts before binding", unbound, 2, 0, NULL);

    CommGpuInfo none[2] = {gpu_rank("n1", 2, 0, 2, 0, ""), gpu_rank("n2", 0, 0, 1, 0, "")};
    gpu_expect("a rank without a GPU", none, 2, 1, (const char *const[]){"rank 1", "n2", "sees no GPU", NULL});
    CommGpuInfo many[3] = {gpu_rank("n1", 2, 0, 3, 0, ""), gpu_rank("n1", 2, 1, 3, 1, ""),
                           gpu_rank("n1", 2, 2, 3, 0, "")};
    gpu_expect("3 ranks on a host of 2 GPUs", many, 3, 1,
               (const char *const[]){"host n1 runs 3 ranks but has 2 GPUs", "rank 2", NULL});
    /* one GPU visible to both ranks of a host (CUDA_VISIBLE_DEVICES=0 for both): the same bus id */
    CommGpuInfo shared[3] = {gpu_rank("n1", 1, 0, 2, 0, "0000:10:00.0"), gpu_rank("n1", 1, 1, 2, 0, "0000:10:00.0"),
                             gpu_rank("n2", 1, 0, 1, 0, "0000:10:00.0")};
    gpu_expect("two ranks on one GPU", shared, 3, 1,
               (const char *const[]){"ranks 0 and 1 on host n1 both drive GPU 0000:10:00.0", NULL});
    /* the same bus id on two hosts is two GPUs */
    gpu_expect("one GPU each on two hosts", shared + 1, 2, 0, NULL);
}
