// torch.distributed's free functions, on the default process group that init_process_group()
// made:
//
//   dist::init_process_group();
//   dist::all_reduce(grad);                      // summed over every rank, in place
//   if (dist::get_rank() == 0) ...
//   dist::destroy_process_group();
//
// Each collective is synchronous by default, as in PyTorch: it returns once Work::wait() has
// (so on the NCCL backend, once the caller's current CUDA stream is ordered after it; see
// nccl_process_group.h). With async_op = true it returns at once; wait on the Work it gives.
// Either way the Work is returned (a finished one without async_op). Tensors are handles,
// written in place. Called before init_process_group() or after destroy_process_group(),
// every function here throws ember::Error telling to call init_process_group() first.
//
// Subgroups, as torch.distributed.new_group: every rank calls new_group with the same ranks;
// the functions below take the group as PyTorch's `group=` argument, and their src/dst are
// global ranks (the job's), as PyTorch's are; the ProcessGroup methods take ranks of the
// group, as PyTorch's ProcessGroup objects do.
//
//   auto evens = dist::new_group({0, 2});             // on every rank, also rank 1
//   if (dist::get_rank() != 1) {
//     dist::all_reduce(t, ReduceOp::kSum, evens);
//     dist::broadcast(t, /*src=*/2, evens);           // the job's rank 2 (evens' rank 1)
//   }
//
// A rank outside the group gets a group whose collectives throw ember::Error ("this rank
// (global rank 1) is not a member of group [0, 2]"); get_rank(group) is -1 there.
#pragma once

#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include <ember/dist/init.h>
#include <ember/dist/process_group.h>

namespace ember::dist {

int get_rank();
int get_world_size();
// In `group`: this rank's index (-1 outside it), and its number of members.
int get_rank(const std::shared_ptr<ProcessGroup>& group);
int get_world_size(const std::shared_ptr<ProcessGroup>& group);
// The job's rank of `group`'s rank `group_rank`, and back (-1 for a rank outside the group),
// as torch.distributed.get_global_rank / get_group_rank.
int get_global_rank(const std::shared_ptr<ProcessGroup>& group, int group_rank);
int get_group_rank(const std::shared_ptr<ProcessGroup>& group, int global_rank);

// A group of the listed ranks of the job (the default group's), made by every rank together:
// see ProcessGroup::new_group, which makes one within any group. The options default to the
// default group's (its timeout, debug mode).
std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                        std::optional<ProcessGroupOptions> options = {});
// The rank among the processes on this node (LOCAL_RANK), e.g. to pick a GPU.
int get_local_rank();
// "mpi", "nccl", "tcp" or "single" (a group made with backend "gloo" reports "tcp").
std::string get_backend();

// Each collective below records where it was called from (`where`, left to its default) in
// the flight recorder, unless a CollectiveTag names it (flight_recorder.h).

// `tensor` becomes the reduction of every rank's `tensor`.
WorkHandle all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum, bool async_op = false,
                      std::source_location where = std::source_location::current());
// The reduction lands in `tensor` on rank `dst`; the others' tensors are left unspecified.
WorkHandle reduce(const Tensor& tensor, int dst, ReduceOp op = ReduceOp::kSum,
                  bool async_op = false,
                  std::source_location where = std::source_location::current());
// Every rank's `tensor` becomes rank `src`'s.
WorkHandle broadcast(const Tensor& tensor, int src, bool async_op = false,
                     std::source_location where = std::source_location::current());
// tensor_list[r] receives rank r's `tensor`; it holds get_world_size() tensors shaped like it.
WorkHandle all_gather(const std::vector<Tensor>& tensor_list, const Tensor& tensor,
                      bool async_op = false,
                      std::source_location where = std::source_location::current());
// `output` receives the reduction of every rank's input_list[get_rank()].
WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& input_list,
                          ReduceOp op = ReduceOp::kSum, bool async_op = false,
                          std::source_location where = std::source_location::current());
// Returns once every rank has called it (with async_op: a Work that completes then).
WorkHandle barrier(bool async_op = false,
                   std::source_location where = std::source_location::current());

// Point to point, as PyTorch's send/recv (blocking) and isend/irecv (returning the Work).
void send(const Tensor& tensor, int dst, int tag = 0);
void recv(const Tensor& tensor, int src, int tag = 0);
WorkHandle isend(const Tensor& tensor, int dst, int tag = 0);
WorkHandle irecv(const Tensor& tensor, int src, int tag = 0);

// The same on `group` (null: the default group), as PyTorch's group= argument; `dst` and
// `src` are global ranks, as in torch.distributed (ember::Error when not in `group`).
WorkHandle all_reduce(const Tensor& tensor, ReduceOp op, const std::shared_ptr<ProcessGroup>& group,
                      bool async_op = false,
                      std::source_location where = std::source_location::current());
WorkHandle reduce(const Tensor& tensor, int dst, ReduceOp op,
                  const std::shared_ptr<ProcessGroup>& group, bool async_op = false,
                  std::source_location where = std::source_location::current());
WorkHandle broadcast(const Tensor& tensor, int src, const std::shared_ptr<ProcessGroup>& group,
                     bool async_op = false,
                     std::source_location where = std::source_location::current());
WorkHandle all_gather(const std::vector<Tensor>& tensor_list, const Tensor& tensor,
                      const std::shared_ptr<ProcessGroup>& group, bool async_op = false,
                      std::source_location where = std::source_location::current());
WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& input_list, ReduceOp op,
                          const std::shared_ptr<ProcessGroup>& group, bool async_op = false,
                          std::source_location where = std::source_location::current());
WorkHandle barrier(const std::shared_ptr<ProcessGroup>& group, bool async_op = false,
                   std::source_location where = std::source_location::current());
void send(const Tensor& tensor, int dst, const std::shared_ptr<ProcessGroup>& group, int tag = 0);
void recv(const Tensor& tensor, int src, const std::shared_ptr<ProcessGroup>& group, int tag = 0);
WorkHandle isend(const Tensor& tensor, int dst, const std::shared_ptr<ProcessGroup>& group,
                 int tag = 0);
WorkHandle irecv(const Tensor& tensor, int src, const std::shared_ptr<ProcessGroup>& group,
                 int tag = 0);

}  // namespace ember::dist
