// DistributedDataParallel at whatever world size mpirun made (1, 2 or 3 ranks): every
// distributed result is compared with a single-process reference that each rank computes
// locally on the full global batch.
#include <map>

#include <ember/dist/ddp.h>
#include <ember/dist/nccl_process_group.h>
#include <ember/dist/sync_batch_norm.h>
#include <ember/tensor/precision.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using ::ember::testing::expect_close;
using testing::expect_same_state;
using testing::shard_rows;
using testing::world;

std::shared_ptr<nn::Module> conv_bn_net(uint64_t seed) {
  manual_seed(seed);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(2, 4, 3, nn::Conv2dOptions{.padding = {1, 1}}));
  net->push_back(std::make_shared<nn::BatchNorm2d>(4));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(4 * 4 * 4, 3));
  return net;
}

std::shared_ptr<nn::Module> mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(8, 3)});
}

std::pair<Tensor, Tensor> batch(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor x = randn(shape, kF32, &gen);
  Tensor y = randint(0, 3, {shape[0]}, kI64, &gen);
  return {x, y};
}

optim::SGDOptions sgd_options() {
  optim::SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  return o;
}

// The equivalence test: DDP + SyncBatchNorm with the global batch split across ranks
// follows one process with the whole batch, step for step.
TEST(DistributedDataParallel, MatchesOneProcessWithTheFullBatch) {
  auto pg = world();
  const int64_t global = 12;  // divisible by 1, 2 and 3 ranks
  auto reference = conv_bn_net(7);
  optim::SGD ref_sgd(reference->parameters(), sgd_options());
  auto ddp =
      std::make_shared<DistributedDataParallel>(convert_sync_batchnorm(conv_bn_net(7), pg), pg);
  optim::SGD sgd(ddp->parameters(), sgd_options());
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = batch({global, 2, 4, 4}, 100 + step);
    Tensor ref_loss = cross_entropy((*reference)(x), y);
    ref_sgd.zero_grad();
    ref_loss.backward();
    ref_sgd.step();

    Tensor loss = cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg));
    sgd.zero_grad();
    loss.backward();  // no explicit synchronize: the last bucket's hook waits
    sgd.step();
  }
  expect_same_state(ddp->module(), *reference, 1e-5, 1e-6);
}

// A gradient penalty as PyTorch users write it under DDP: the input gradient taken with
// autograd::grad (create_graph, not reduced), then one plain backward that DDP averages. It
// follows one process with the whole batch. backward(create_graph=true) itself is reduced
// without history, and says so once.
TEST(DistributedDataParallel, GradientPenaltyThroughAutogradGradMatchesOneProcess) {
  auto pg = world();
  const int64_t global = 12;
  auto reference = mlp(3);
  auto ddp = std::make_shared<DistributedDataParallel>(mlp(3), pg);
  auto penalised = [](nn::Module& model, const Tensor& x, const Tensor& y) {
    Tensor input = x.clone().requires_grad_();
    const Tensor out = model(input);
    const Tensor dx = autograd::grad({out.sum()}, {input}, {}, std::nullopt, true)[0];
    return cross_entropy(out, y) + 0.5 * (dx * dx).sum({1}).mean();
  };
  auto [x, y] = batch({global, 4}, 21);
  penalised(*reference, x, y).backward();
  ::testing::internal::CaptureStderr();
  penalised(*ddp, shard_rows(x, *pg), shard_rows(y, *pg)).backward();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  const auto mine = ddp->module().named_parameters(), theirs = reference->named_parameters();
  ASSERT_EQ(mine.size(), theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    SCOPED_TRACE(mine[i].first);
    expect_close(mine[i].second.grad(), theirs[i].second.grad(), 1e-5, 1e-6);
  }

  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 2; ++i) {
    ddp->zero_grad();
    cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg)).backward({}, false, true);
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("backward with create_graph=true averages the gradients across ranks "
                      "without their history"),
            std::string::npos)
      << said;
  const std::string head = "ember: DistributedDataParallel:";
  EXPECT_EQ(said.find(head, said.find(head) + 1), std::string::npos) << said;  // once
}

#if EMBER_WITH_CUDA
// The same on the GPU over NCCL, in a world of one (more ranks need a GPU each): DDP +
// SyncBatchNorm on CUDA tensors follow the CPU reference within cuDNN's rounding.
TEST(DistributedDataParallel, OnTheGpuOverNcclFollowsTheCpu) {
  EMBER_REQUIRE_CUDA();
  Float32PrecisionGuard exact_f32("highest", false);  // cuDNN allows TF32 by default
  const Device gpu = cuda_device(0);
  auto pg = std::make_shared<NcclProcessGroup>(0, 1, 0, 0, NcclProcessGroup::create_unique_id());
  auto reference = conv_bn_net(7);
  optim::SGD ref_sgd(reference->parameters(), sgd_options());
  auto net = conv_bn_net(7);
  net->to(gpu);
  auto ddp = std::make_shared<DistributedDataParallel>(convert_sync_batchnorm(net, pg), pg);
  optim::SGD sgd(ddp->parameters(), sgd_options());
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = batch({12, 2, 4, 4}, 100 + step);
    Tensor ref_loss = cross_entropy((*reference)(x), y);
    ref_sgd.zero_grad();
    ref_loss.backward();
    ref_sgd.step();

    Tensor loss = cross_entropy((*ddp)(x.to(gpu)), y.to(gpu));
    sgd.zero_grad();
    loss.backward();
    sgd.step();
  }
  ddp->module().to(kCPU);
  expect_same_state(ddp->module(), *reference, 1e-4, 1e-5);
}
#endif  // EMBER_WITH_CUDA

// Gradient accumulation: micro-batches under no_sync, then one synced backward, equal one
// large batch; and nothing is communicated inside no_sync.
TEST(DistributedDataParallel, NoSyncAccumulationEqualsOneLargeBatch) {
  auto pg = world();
  const int64_t per_rank = 4, global = per_rank * pg->size();
  auto reference = mlp(3);
  auto ddp = std::make_shared<DistributedDataParallel>(mlp(3), pg);
  auto [x, y] = batch({global, 4}, 11);
  cross_entropy((*reference)(x), y).backward();

  const Tensor mine = shard_rows(x, *pg), my_y = shard_rows(y, *pg);
  {
    auto guard = ddp->no_sync();
    (cross_entropy((*ddp)(mine.narrow(0, 0, 2)), my_y.narrow(0, 0, 2)) * 0.5).backward();
  }
  // Still purely local: the gradient of this rank's first micro-batch alone.
  auto local = mlp(3);
  (cross_entropy((*local)(mine.narrow(0, 0, 2)), my_y.narrow(0, 0, 2)) * 0.5).backward();
  const auto ddp_params = ddp->module().named_parameters();
  const auto local_params = local->named_parameters();
  for (size_t i = 0; i < ddp_params.size(); ++i)
    expect_close(ddp_params[i].second.grad(), local_params[i].second.grad(), 1e-5, 1e-7);

  (cross_entropy((*ddp)(mine.narrow(0, 2, 2)), my_y.narrow(0, 2, 2)) * 0.5).backward();
  ddp->synchronize();  // explicit wait: already done by backward, so a no-op
  const auto ref_params = reference->named_parameters();
  for (size_t i = 0; i < ddp_params.size(); ++i) {
    SCOPED_TRACE(ddp_params[i].first);
    expect_close(ddp_params[i].second.grad(), ref_params[i].second.grad(), 1e-5, 1e-7);
  }
}

// A model with a head the forward never uses.
class TwoHeads : public nn::Module {
 public:
  explicit TwoHeads(uint64_t seed) {
    manual_seed(seed);
    body = register_module("body", std::make_shared<nn::Linear>(4, 6));
    used = register_module("used", std::make_shared<nn::Linear>(6, 3));
    unused = register_module("unused", std::make_shared<nn::Linear>(6, 3));
  }
  Tensor forward(const Tensor& x) override { return used->forward(relu(body->forward(x))); }
  std::string name() const override { return "TwoHeads"; }
  std::shared_ptr<nn::Linear> body, used, unused;
};

TEST(DistributedDataParallel, UnusedParametersAreReadyWithZeroGradients) {
  auto pg = world();
  DDPOptions options;
  options.find_unused_parameters = true;
  options.first_bucket_cap_bytes = 64;  // several buckets, one of them only unused parameters
  options.bucket_cap_bytes = 64;
  auto ddp = std::make_shared<DistributedDataParallel>(std::make_shared<TwoHeads>(5), pg, options);
  auto reference = std::make_shared<TwoHeads>(5);
  auto [x, y] = batch({3 * pg->size(), 4}, 21);
  for (int step = 0; step < 2; ++step) {  // the second pass runs on the rebuilt buckets
    ddp->zero_grad();
    reference->zero_grad();
    cross_entropy((*reference)(x), y).backward();
    cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg)).backward();
    ddp->synchronize();
    std::map<std::string, Tensor> expected;
    for (const auto& [name, p] : reference->named_parameters()) expected[name] = p;
    for (const auto& [name, p] : ddp->module().named_parameters()) {
      SCOPED_TRACE(name);
      if (name.rfind("unused.", 0) == 0) {
        ASSERT_TRUE(p.grad().defined());
        EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
      } else {
        expect_close(p.grad(), expected[name].grad(), 1e-5, 1e-7);
      }
    }
  }
  EXPECT_TRUE(ddp->buckets_rebuilt());
}

// A model of two inputs and two outputs (forward_list), and a head that only the second
// output uses: DDP forwards both inputs, walks both outputs' graphs for unused parameters,
// and averages the gradients of a loss made from both outputs.
class Siamese : public nn::Module {
 public:
  explicit Siamese(uint64_t seed) {
    manual_seed(seed);
    body = register_module("body", std::make_shared<nn::Linear>(4, 6));
    head = register_module("head", std::make_shared<nn::Linear>(6, 3));
    unused = register_module("unused", std::make_shared<nn::Linear>(6, 3));
  }
  nn::TensorList forward_list(const nn::TensorList& in) override {
    return {relu(body->forward(in.at(0))), head->forward(relu(body->forward(in.at(1))))};
  }
  std::string name() const override { return "Siamese"; }
  std::shared_ptr<nn::Linear> body, head, unused;
};

TEST(DistributedDataParallel, ForwardsSeveralInputsAndOutputs) {
  auto pg = world();
  auto ddp = std::make_shared<DistributedDataParallel>(std::make_shared<Siamese>(3), pg,
                                                       DDPOptions{.find_unused_parameters = true});
  Siamese reference(3);
  optim::SGD sgd(ddp->parameters(), sgd_options());
  optim::SGD ref_sgd(reference.parameters(), sgd_options());
  for (int step = 0; step < 3; ++step) {
    auto [a, y] = batch({2 * pg->size(), 4}, 40 + step);
    auto [b, unused_target] = batch({2 * pg->size(), 4}, 50 + step);
    auto loss_of = [&](const nn::TensorList& out, const Tensor& target) {
      return (out.at(0) * out.at(0)).mean() + cross_entropy(out.at(1), target);
    };
    ref_sgd.zero_grad();
    loss_of(reference(a, b), y).backward();
    ref_sgd.step();
    sgd.zero_grad();
    loss_of((*ddp)(shard_rows(a, *pg), shard_rows(b, *pg)), shard_rows(y, *pg)).backward();
    sgd.step();
  }
  expect_same_state(ddp->module(), reference, 1e-5, 1e-6);
}

TEST(DistributedDataParallel, MissingGradientNamesTheParameter) {
  auto pg = world();
  auto ddp = std::make_shared<DistributedDataParallel>(std::make_shared<TwoHeads>(5), pg);
  auto [x, y] = batch({2 * pg->size(), 4}, 22);
  cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg)).backward();
  EXPECT_EMBER_ERROR(ddp->synchronize(), "unused.weight, unused.bias");
  // The next iteration reports it too, instead of mixing two iterations' gradients.
  cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg)).backward();
  EXPECT_EMBER_ERROR((*ddp)(shard_rows(x, *pg)), "find_unused_parameters");
}

// Layers registered in the opposite order to their use: the first iteration's gradient
// order differs from reverse registration order, and the buckets follow it afterwards.
class Reversed : public nn::Module {
 public:
  explicit Reversed(uint64_t seed) {
    manual_seed(seed);
    second = register_module("second", std::make_shared<nn::Linear>(6, 3));
    first = register_module("first", std::make_shared<nn::Linear>(4, 6));
  }
  Tensor forward(const Tensor& x) override { return second->forward(relu(first->forward(x))); }
  std::string name() const override { return "Reversed"; }
  std::shared_ptr<nn::Linear> second, first;
};

TEST(DistributedDataParallel, BucketsAreRebuiltFromTheObservedGradientOrder) {
  auto pg = world();
  DDPOptions options;
  options.first_bucket_cap_bytes = 1;  // one parameter per bucket
  options.bucket_cap_bytes = 1;
  auto ddp = std::make_shared<DistributedDataParallel>(std::make_shared<Reversed>(9), pg, options);
  using Names = std::vector<std::vector<std::string>>;
  EXPECT_EQ(ddp->bucket_parameter_names(),
            (Names{{"first.bias"}, {"first.weight"}, {"second.bias"}, {"second.weight"}}));
  auto reference = std::make_shared<Reversed>(9);
  optim::SGD ref_sgd(reference->parameters(), sgd_options());
  optim::SGD sgd(ddp->parameters(), sgd_options());
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch({2 * pg->size(), 4}, 30 + step);
    ref_sgd.zero_grad();
    cross_entropy((*reference)(x), y).backward();
    ref_sgd.step();
    sgd.zero_grad();
    cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg)).backward();
    sgd.step();
    EXPECT_EQ(ddp->buckets_rebuilt(), step >= 1);
  }
  const Names rebuilt = ddp->bucket_parameter_names();
  ASSERT_EQ(rebuilt.size(), 4u);
  // Backward reaches the last layer first.
  EXPECT_EQ(rebuilt[0][0].substr(0, 7), "second.");
  EXPECT_EQ(rebuilt[1][0].substr(0, 7), "second.");
  EXPECT_EQ(rebuilt[2][0].substr(0, 6), "first.");
  expect_same_state(ddp->module(), *reference, 1e-5, 1e-6);
}

TEST(DistributedDataParallel, GradientsLiveInOneFlatBucket) {
  auto pg = world();
  auto ddp = std::make_shared<DistributedDataParallel>(mlp(4), pg);
  ASSERT_EQ(ddp->bucket_parameter_names().size(), 1u);
  auto [x, y] = batch({2 * pg->size(), 4}, 40);
  cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg)).backward();
  // Bucket order is reverse registration: each gradient ends where the next one starts.
  const auto params = ddp->module().parameters();
  for (size_t i = params.size() - 1; i > 0; --i) {
    const auto* end = params[i].grad().data_ptr<float>() + params[i].numel();
    EXPECT_EQ(end, params[i - 1].grad().data_ptr<float>()) << "parameter " << i;
  }
  // Once the buckets are rebuilt (at the second forward), later iterations accumulate in
  // the same memory.
  ddp->zero_grad(/*set_to_none=*/false);
  cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg)).backward();
  ASSERT_TRUE(ddp->buckets_rebuilt());
  const void* before = params[0].grad().data_ptr();
  ddp->zero_grad(/*set_to_none=*/false);
  cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg)).backward();
  EXPECT_EQ(params[0].grad().data_ptr(), before);
}

TEST(DistributedDataParallel, StartsFromRankZeroAndBroadcastsBuffers) {
  auto pg = world();
  // Each rank initialises differently; all must end up with rank 0's values.
  auto net = conv_bn_net(50 + static_cast<uint64_t>(pg->rank()));
  for (auto& [name, b] : net->named_buffers()) {
    if (b.is_floating_point()) b.fill_(pg->rank() + 1);
  }
  DDPOptions options;
  options.broadcast_bucket_bytes = 64;  // many pieces through one buffer, some larger alone
  auto ddp = std::make_shared<DistributedDataParallel>(net, pg, options);
  auto rank0 = conv_bn_net(50);
  for (auto& [name, b] : rank0->named_buffers()) {
    if (b.is_floating_point()) b.fill_(1);
  }
  expect_same_state(ddp->module(), *rank0, 0, 0);

  // Buffers drift apart (each rank trains BatchNorm on its own data without SyncBatchNorm);
  // every forward starts from rank 0's.
  auto [x, y] = batch({2, 2, 4, 4}, 60 + static_cast<uint64_t>(pg->rank()));
  cross_entropy((*ddp)(x), y).backward();
  auto bn = std::dynamic_pointer_cast<nn::BatchNorm>(ddp->module().named_children()[1].second);
  ASSERT_NE(bn, nullptr);
  bn->running_mean.fill_(10 + pg->rank());
  ddp->eval();
  NoGradGuard no_grad;
  (*ddp)(x);
  expect_close(bn->running_mean, full({4}, 10.0), 0, 0);

  auto quiet_net = conv_bn_net(70);
  DDPOptions quiet;
  quiet.broadcast_buffers = false;
  auto quiet_ddp = std::make_shared<DistributedDataParallel>(quiet_net, pg, quiet);
  auto quiet_bn = std::dynamic_pointer_cast<nn::BatchNorm>(quiet_net->named_children()[1].second);
  quiet_bn->running_mean.fill_(10 + pg->rank());
  quiet_ddp->eval();
  (*quiet_ddp)(x);
  expect_close(quiet_bn->running_mean, full({4}, 10.0 + pg->rank()), 0, 0);
}

TEST(DistributedDataParallel, DifferentModelsAcrossRanksAreRejected) {
  auto pg = world();
  if (pg->size() == 1) GTEST_SKIP() << "needs more than one rank";
  auto shape_differs = std::make_shared<nn::Linear>(4, pg->rank() == 1 ? 5 : 3);
  EXPECT_EMBER_ERROR(std::make_shared<DistributedDataParallel>(shape_differs, pg),
                     "parameter 0 differs across ranks");
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(4, 3));
  if (pg->rank() == 1) net->push_back(std::make_shared<nn::Linear>(3, 3));
  EXPECT_EMBER_ERROR(std::make_shared<DistributedDataParallel>(net, pg), "parameters but rank");
}

// bf16 and f16 traffic: the averaged gradients match full precision to the wire's precision.
TEST(DistributedDataParallel, CompressedTrafficRoundTrips) {
  auto pg = world();
  for (DType wire : {kBF16, kF16}) {
    SCOPED_TRACE(dtype_name(wire));
    DDPOptions options;
    options.compression = wire;
    auto ddp = std::make_shared<DistributedDataParallel>(mlp(8), pg, options);
    auto reference = mlp(8);
    auto [x, y] = batch({3 * pg->size(), 4}, 80);
    cross_entropy((*reference)(x), y).backward();
    cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg)).backward();
    const auto params = ddp->module().named_parameters();
    const auto ref = reference->named_parameters();
    const double eps = wire == kBF16 ? 1.0 / 128 : 1.0 / 1024;
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE(params[i].first);
      EXPECT_EQ(params[i].second.grad().dtype(), kF32);
      expect_close(params[i].second.grad(), ref[i].second.grad(), 2 * eps, 1e-4);
    }
  }
  EXPECT_EMBER_ERROR(
      std::make_shared<DistributedDataParallel>(mlp(8), pg, DDPOptions{.compression = kI32}),
      "compression must be bf16 or f16");
}

}  // namespace
}  // namespace ember::dist
