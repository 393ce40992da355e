#include "random.h"

#include <numeric>
#include <random>

#include "detail/autograd_hooks.h"
#include "detail/kernel_table.h"
#include "detail/op_utils.h"
#include "ops.h"

namespace ember {

void Generator::manual_seed(uint64_t seed) { set_state(seed, 0); }

uint64_t Generator::seed() const {
  std::lock_guard lock(mutex_);
  return seed_;
}

uint64_t Generator::offset() const {
  std::lock_guard lock(mutex_);
  return offset_;
}

void Generator::set_state(uint64_t seed, uint64_t offset) {
  std::lock_guard lock(mutex_);
  seed_ = seed;
  offset_ = offset;
}

std::pair<uint64_t, uint64_t> Generator::next_draw() {
  std::lock_guard lock(mutex_);
  return {seed_, offset_++};
}

namespace {

// 64 bits from the operating system's entropy source (getrandom or /dev/urandom), as
// PyTorch's getNonDeterministicRandom.
uint64_t nondeterministic_seed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
}

}  // namespace

Generator& default_generator() {
  static Generator generator(nondeterministic_seed());
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

uint64_t initial_seed() { return default_generator().seed(); }

namespace {

// Fills t (any layout) with one draw; non-contiguous targets receive a packed draw, so the
// numbers depend only on the seed, the offset and the element's row-major position.
Tensor& draw(Tensor& t, detail::RandomKind kind, double a, double b, Generator* gen,
             const char* op) {
  detail::check_defined(t, op);
  detail::check_inplace(op, t);
  if (kind != detail::RandomKind::kRandint) {
    EMBER_CHECK(is_floating(t.dtype()), op, "expected a floating dtype, got ", t.dtype());
  } else {
    EMBER_CHECK(t.dtype() != kBool, op, "bool tensors cannot hold random integers");
  }
  const auto [seed, offset] = (gen != nullptr ? *gen : default_generator()).next_draw();
  if (t.numel() == 0) return t;
  auto kernel = detail::require_kernel(detail::kernels_for(t.device(), op).random, t.device(), op);
  t.storage().bump_version();
  if (t.is_contiguous()) {
    kernel(kind, t, seed, offset, a, b);
  } else {
    Tensor packed = empty(t.sizes(), t.options());
    kernel(kind, packed, seed, offset, a, b);
    t.copy_(packed);
  }
  return t;
}

}  // namespace

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  EMBER_CHECK(low <= high, "uniform_", "low ", low, " must not exceed high ", high);
  return draw(t, detail::RandomKind::kUniform, low, high, gen, "uniform_");
}

Tensor& normal_(Tensor& t, double mean, double stddev, Generator* gen) {
  EMBER_CHECK(stddev >= 0, "normal_", "stddev must be non-negative, got ", stddev);
  return draw(t, detail::RandomKind::kNormal, mean, stddev, gen, "normal_");
}

Tensor uniform(const Shape& sizes, double low, double high, TensorOptions options, Generator* gen) {
  Tensor t = empty(sizes, options);
  return uniform_(t, low, high, gen);
}

Tensor rand(const Shape& sizes, TensorOptions options, Generator* gen) {
  return uniform(sizes, 0.0, 1.0, options, gen);
}

Tensor normal(const Shape& sizes, double mean, double stddev, TensorOptions options,
              Generator* gen) {
  Tensor t = empty(sizes, options);
  return normal_(t, mean, stddev, gen);
}

Tensor randn(const Shape& sizes, TensorOptions options, Generator* gen) {
  return normal(sizes, 0.0, 1.0, options, gen);
}

Tensor randint(int64_t low, int64_t high, const Shape& sizes, TensorOptions options,
               Generator* gen) {
  EMBER_CHECK(low < high, "randint", "low ", low, " must be below high ", high);
  // The kernel table carries bounds as doubles: keep them exact.
  constexpr int64_t kLimit = int64_t{1} << 62;
  EMBER_CHECK(low >= -kLimit && high <= kLimit &&
                  static_cast<int64_t>(static_cast<double>(low)) == low &&
                  static_cast<int64_t>(static_cast<double>(high)) == high,
              "randint", "bounds [", low, ", ", high,
              ") must be exactly representable as doubles within 2^62");
  Tensor t = empty(sizes, options);
  return draw(t, detail::RandomKind::kRandint, static_cast<double>(low), static_cast<double>(high),
              gen, "randint");
}

Tensor bernoulli(const Tensor& p, Generator* gen) {
  detail::check_defined(p, "bernoulli", "p");
  EMBER_CHECK(is_floating(p.dtype()), "bernoulli", "probabilities must be floating, got ",
              p.dtype());
  Tensor u = empty(p.sizes(), p.options());
  uniform_(u, 0.0, 1.0, gen);
  return lt(u, p).to(p.dtype());
}

Tensor bernoulli(const Shape& sizes, double p, TensorOptions options, Generator* gen) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, "bernoulli", "probability must be in [0, 1], got ", p);
  EMBER_CHECK(is_floating(options.dtype), "bernoulli", "expected a floating dtype, got ",
              options.dtype);
  Tensor u = empty(sizes, options);
  uniform_(u, 0.0, 1.0, gen);
  return lt(u, p).to(options.dtype);
}

Tensor randperm(int64_t n, Generator* gen) {
  EMBER_CHECK(n >= 0, "randperm", "n must be non-negative, got ", n);
  // Fisher-Yates driven by one draw of n random integers, so it is reproducible per seed.
  Tensor perm = arange(n);
  if (n < 2) return perm;
  const Tensor keys = randint(0, int64_t{1} << 62, {n}, kI64, gen);
  const int64_t* k = keys.data_ptr<int64_t>();
  int64_t* out = perm.data_ptr<int64_t>();
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j =
        static_cast<int64_t>(static_cast<uint64_t>(k[i]) % static_cast<uint64_t>(i + 1));
    std::swap(out[i], out[j]);
  }
  return perm;
}

}  // namespace ember
