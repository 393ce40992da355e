#include "single_process_group.h"

#include <ember/tensor/grad_mode.h>

#include "detail/common.h"

namespace ember::dist {

namespace {

class DoneWork final : public Work {
 public:
  bool is_completed() override { return true; }
  void wait(std::chrono::milliseconds /*timeout*/) override {}
};

WorkHandle done() { return std::make_shared<DoneWork>(); }

void copy_into(const Tensor& dst, const Tensor& src) {
  if (dst.data_ptr() == src.data_ptr()) return;
  NoGradGuard no_grad;
  dst.detach().copy_(src);
}

}  // namespace

WorkHandle SingleProcessGroup::allreduce(const Tensor& tensor, ReduceOp op) {
  detail::check_tensor("allreduce", tensor);
  detail::check_reduce_op("allreduce", tensor, op);
  return done();  // sum, avg, max and min of one value are that value
}

WorkHandle SingleProcessGroup::broadcast(const Tensor& tensor, int root) {
  detail::check_tensor("broadcast", tensor);
  detail::check_root("broadcast", root, 1);
  return done();
}

WorkHandle SingleProcessGroup::allgather(const std::vector<Tensor>& outputs, const Tensor& input) {
  detail::check_tensor("allgather", input);
  detail::check_list("allgather", "outputs", outputs, input, 1);
  copy_into(outputs[0], input);
  return done();
}

WorkHandle SingleProcessGroup::reduce(const Tensor& tensor, int root, ReduceOp op) {
  detail::check_tensor("reduce", tensor);
  detail::check_root("reduce", root, 1);
  detail::check_reduce_op("reduce", tensor, op);
  return done();
}

WorkHandle SingleProcessGroup::reduce_scatter(const Tensor& output,
                                              const std::vector<Tensor>& inputs, ReduceOp op) {
  detail::check_tensor("reduce_scatter", output);
  detail::check_list("reduce_scatter", "inputs", inputs, output, 1);
  detail::check_reduce_op("reduce_scatter", output, op);
  copy_into(output, inputs[0]);
  return done();
}

WorkHandle SingleProcessGroup::barrier() { return done(); }

WorkHandle SingleProcessGroup::send(const Tensor& /*tensor*/, int dst, int /*tag*/) {
  throw Error("send: the single-process group has no rank " + std::to_string(dst) +
              " to send to (world size 1)");
}

WorkHandle SingleProcessGroup::recv(const Tensor& /*tensor*/, int src, int /*tag*/) {
  throw Error("recv: the single-process group has no rank " + std::to_string(src) +
              " to receive from (world size 1)");
}

}  // namespace ember::dist
