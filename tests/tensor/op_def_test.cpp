// The op descriptors (tensor/detail/op_def.h): every op registered once with its pieces, its
// kernels present on the CPU, and README's autocast table equal to the descriptors' rules.
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <ember/tensor/detail/autocast_policy.h>
#include <ember/tensor/detail/op_def.h>

#include "test_util.h"

namespace ember {
namespace {

using detail::CastPolicy;
using detail::OpDef;

const char* policy_name(CastPolicy p) {
  switch (p) {
    case CastPolicy::kLowerPrecision:
      return "kLowerPrecision";
    case CastPolicy::kFloat32:
      return "kFloat32";
    case CastPolicy::kPromote:
      return "kPromote";
  }
  return "?";
}

// README's "Autocast policy | Ops" rows: `policy` ... | `op`, `op`, ... as op -> policy name.
std::map<std::string, std::string> readme_autocast_table(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::map<std::string, std::string> table;
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("| Autocast policy | Ops |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.rfind("|---", 0) == 0) continue;
    if (line.rfind("| `", 0) != 0) break;
    const size_t policy_end = line.find('`', 3);
    const std::string policy = line.substr(3, policy_end - 3);
    const size_t ops_start = line.find('|', policy_end);
    std::istringstream ops(line.substr(ops_start + 1));
    std::string token;
    while (std::getline(ops, token, ',')) {
      const size_t a = token.find('`'), b = token.rfind('`');
      if (a == std::string::npos || b <= a) continue;
      const std::string op = token.substr(a + 1, b - a - 1);
      EXPECT_TRUE(table.emplace(op, policy).second) << op << " is on two README rows";
    }
  }
  return table;
}

TEST(OpDef, ReadmeAutocastTableMatchesTheDescriptors) {
  std::map<std::string, std::string> from_descriptors;
  for (const OpDef* op : detail::all_ops())
    if (op->autocast) from_descriptors[std::string(op->name)] = policy_name(*op->autocast);
  ASSERT_FALSE(from_descriptors.empty());
  EXPECT_EQ(readme_autocast_table(EMBER_README), from_descriptors)
      << "README.md's autocast table and the EMBER_OP descriptors differ";
  EXPECT_EQ(detail::autocast_rules().size(), from_descriptors.size());
}

TEST(OpDef, EveryOpIsRegisteredOnceWithItsPieces) {
  const auto ops = detail::all_ops();
  std::set<std::string_view> names, node_names;
  size_t differentiable = 0;
  for (const OpDef* op : ops) {
    SCOPED_TRACE(std::string(op->name));
    EXPECT_TRUE(names.insert(op->name).second) << "two descriptors named " << op->name;
    if (op->differentiable()) {
      ++differentiable;
      EXPECT_TRUE(node_names.insert(op->node_name).second);
      EXPECT_TRUE(op->node_name.ends_with("Backward"));
    } else {
      // A composite carries an autocast rule and nothing else.
      EXPECT_TRUE(op->node_name.empty());
      EXPECT_TRUE(op->autocast.has_value());
      EXPECT_TRUE(op->kernel_slots().empty());
    }
  }
  // Spot checks that the registry holds ops of every op file.
  for (const char* name : {"add", "mm", "softmax", "sum", "cat", "conv2d", "layer_norm",
                           "cross_entropy", "scaled_dot_product_attention", "reshape"})
    EXPECT_TRUE(names.contains(name)) << name;
  EXPECT_GT(differentiable, 50U);
}

// ggml's supports_op, for the CPU: every kernel an op names is in this build's CPU kernels.
TEST(OpDef, EveryOpsKernelsAreOnTheCpu) {
  size_t with_kernels = 0;
  for (const OpDef* op : detail::all_ops()) {
    EXPECT_TRUE(op->supported_on(DeviceType::kCPU)) << op->name;
    for (const detail::KernelSlot& slot : op->kernel_slots())
      EXPECT_TRUE(slot.filled(DeviceType::kCPU)) << op->name << ": " << slot.name;
    with_kernels += op->kernel_slots().empty() ? 0 : 1;
  }
  EXPECT_GT(with_kernels, 40U);
}

// With CUDA built in, every op runs there too; without it, no op with kernels claims to.
TEST(OpDef, EveryOpsKernelsAreOnCudaWhenBuilt) {
  for (const OpDef* op : detail::all_ops()) {
    if (op->kernel_slots().empty()) continue;
    EXPECT_EQ(op->supported_on(DeviceType::kCUDA), EMBER_WITH_CUDA != 0) << op->name;
  }
}

// The node a recorded op gets is named by its descriptor.
TEST(OpDef, RecordedNodesTakeTheDescriptorsName) {
  const Tensor x = ones({2, 3}).requires_grad_();
  EXPECT_EQ((x * 2.0).grad_fn()->name(), "MulBackward");
  EXPECT_EQ(softmax(x, 1).grad_fn()->name(), "SoftmaxBackward");
  EXPECT_EQ(x.reshape({3, 2}).grad_fn()->name(), "ReshapeBackward");
}

}  // namespace
}  // namespace ember
