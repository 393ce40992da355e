// The dist module's umbrella header: process groups, init_process_group and the TCP store.
#pragma once

#include <ember/dist/init.h>
#include <ember/dist/mpi_process_group.h>
#include <ember/dist/nccl_process_group.h>
#include <ember/dist/process_group.h>
#include <ember/dist/single_process_group.h>
#include <ember/dist/tcp_store.h>
