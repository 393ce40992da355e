// The dist module's umbrella header: process groups (MPI, NCCL, TCP, single process),
// init_process_group and torch.distributed-style free functions on its default group
// (all_reduce, barrier, get_rank, ...), the TCP store, and what is built on them (DDP,
// SyncBatchNorm, Join for uneven inputs, DistributedSampler, checkpoints, metrics), and
// dist::spawn.
#pragma once

#include <ember/dist/api.h>
#include <ember/dist/checkpoint.h>
#include <ember/dist/ddp.h>
#include <ember/dist/distributed_sampler.h>
#include <ember/dist/flight_recorder.h>
#include <ember/dist/init.h>
#include <ember/dist/join.h>
#include <ember/dist/metrics.h>
#include <ember/dist/mpi_process_group.h>
#include <ember/dist/nccl_process_group.h>
#include <ember/dist/process_group.h>
#include <ember/dist/sharded_checkpoint.h>
#include <ember/dist/single_process_group.h>
#include <ember/dist/spawn.h>
#include <ember/dist/sync_batch_norm.h>
#include <ember/dist/tcp_process_group.h>
#include <ember/dist/tcp_store.h>
// Random text windows sharded across ranks (GPT training).
#include <ember/dist/window_sampler.h>
#include <ember/dist/zero.h>
