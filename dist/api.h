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
#pragma once

#include <string>
#include <vector>

#include <ember/dist/init.h>
#include <ember/dist/process_group.h>

namespace ember::dist {

int get_rank();
int get_world_size();
// The rank among the processes on this node (LOCAL_RANK), e.g. to pick a GPU.
int get_local_rank();
// "mpi", "nccl", "tcp" or "single".
std::string get_backend();

// `tensor` becomes the reduction of every rank's `tensor`.
WorkHandle all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum, bool async_op = false);
// The reduction lands in `tensor` on rank `dst`; the others' tensors are left unspecified.
WorkHandle reduce(const Tensor& tensor, int dst, ReduceOp op = ReduceOp::kSum,
                  bool async_op = false);
// Every rank's `tensor` becomes rank `src`'s.
WorkHandle broadcast(const Tensor& tensor, int src, bool async_op = false);
// tensor_list[r] receives rank r's `tensor`; it holds get_world_size() tensors shaped like it.
WorkHandle all_gather(const std::vector<Tensor>& tensor_list, const Tensor& tensor,
                      bool async_op = false);
// `output` receives the reduction of every rank's input_list[get_rank()].
WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& input_list,
                          ReduceOp op = ReduceOp::kSum, bool async_op = false);
// Returns once every rank has called it (with async_op: a Work that completes then).
WorkHandle barrier(bool async_op = false);

// Point to point, as PyTorch's send/recv (blocking) and isend/irecv (returning the Work).
void send(const Tensor& tensor, int dst, int tag = 0);
void recv(const Tensor& tensor, int src, int tag = 0);
WorkHandle isend(const Tensor& tensor, int dst, int tag = 0);
WorkHandle irecv(const Tensor& tensor, int src, int tag = 0);

}  // namespace ember::dist
