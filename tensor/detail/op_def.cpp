#include "op_def.h"

#include <algorithm>
#include <mutex>

namespace ember::detail {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<const OpDef*> ops;
};
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

bool OpDef::supported_on(DeviceType type) const {
  return std::all_of(kernel_slots().begin(), kernel_slots().end(),
                     [&](const KernelSlot& s) { return s.filled(type); });
}

OpRegistration::OpRegistration(const OpDef& op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.ops.push_back(&op);
}

std::vector<const OpDef*> all_ops() {
  Registry& r = registry();
  std::vector<const OpDef*> ops;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    ops = r.ops;
  }
  std::sort(ops.begin(), ops.end(),
            [](const OpDef* a, const OpDef* b) { return a->name < b->name; });
  return ops;
}

}  // namespace ember::detail
