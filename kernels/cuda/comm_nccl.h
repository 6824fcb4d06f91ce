/*
 * comm_nccl.h — binding this rank to its GPU and moving comm.h's non-blocking operations to NCCL
 * (comm_nccl.c). Called once by the cuda device runtime (runtime_cuda.c) after comm_setup_groups.
 */
#ifndef RS_COMM_NCCL_H
#define RS_COMM_NCCL_H

#include "comm/comm.h"

/* Binds this rank to its GPU (local rank, or its only visible one) and, with more than one rank, makes
 * one NCCL communicator and stream per group and sets c->dev. Refuses, with one message naming the
 * ranks, hosts and GPUs and exit 2 on every rank, more ranks on a host than GPUs and two ranks on one
 * GPU; an NCCL failure ends every rank naming the rank, host and GPU. */
void comm_cuda_init(Comm *c);

#endif
