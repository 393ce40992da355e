// Philox random draws: known-answer vectors, reproducibility, and the distributions' moments;
// the default generator's fresh seed per process (initial_seed) and manual_seed.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>

#include <ember/tensor/detail/philox.h>

#include "test_util.h"

namespace ember {
namespace {

double mean_of(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
double var_of(const std::vector<double>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / static_cast<double>(v.size() - 1);
}

TEST(Random, PhiloxMatchesPublishedKnownAnswers) {
  // Philox4x32-10 test vectors from the Random123 distribution (counter, key -> output).
  const auto zero = detail::philox(0, 0, 0);
  EXPECT_EQ(zero.x[0], 0x6627e8d5u);
  EXPECT_EQ(zero.x[1], 0xe169c58du);
  EXPECT_EQ(zero.x[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.x[3], 0x9b00dbd8u);
  const auto ones = detail::philox(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(ones.x[0], 0x408f276du);
  EXPECT_EQ(ones.x[1], 0x41c83b0eu);
  EXPECT_EQ(ones.x[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.x[3], 0x6d5451fdu);
  // counter {243f6a88, 85a308d3, 13198a2e, 03707344}, key {a4093822, 299f31d0}
  const auto pi =
      detail::philox(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull);
  EXPECT_EQ(pi.x[0], 0xd16cfe09u);
  EXPECT_EQ(pi.x[1], 0x94fdccebu);
  EXPECT_EQ(pi.x[2], 0x5001e420u);
  EXPECT_EQ(pi.x[3], 0x24126ea1u);
}

TEST(Random, SameSeedSameNumbers) {
  manual_seed(1234);
  const Tensor a = rand({100});
  const Tensor b = randn({3, 5}, kF64);
  manual_seed(1234);
  EXPECT_TRUE(equal(rand({100}), a));
  EXPECT_TRUE(equal(randn({3, 5}, kF64), b));
  EXPECT_FALSE(equal(rand({100}), a));  // the offset moved on

  Generator g1(7), g2(7);
  EXPECT_TRUE(equal(randint(0, 1000, {50}, kI64, &g1), randint(0, 1000, {50}, kI64, &g2)));
  // Saving and restoring the state replays the stream.
  const uint64_t seed = g1.seed(), offset = g1.offset();
  const Tensor next = randn({20}, kF32, &g1);
  g1.set_state(seed, offset);
  EXPECT_TRUE(equal(randn({20}, kF32, &g1), next));
  EXPECT_EQ(g1.offset(), offset + 1);
}

// One run of random_draws_main.cpp: its initial_seed() and its four draws.
struct ProcessDraws {
  uint64_t seed = 0;
  std::string draws;
};

ProcessDraws process_draws(const std::string& seed_argument = "") {
  const std::string command = std::string(EMBER_RANDOM_DRAWS_BIN) + " " + seed_argument;
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (pipe == nullptr) return {};
  std::string line;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) line += buffer;
  EXPECT_EQ(pclose(pipe), 0) << command;
  std::istringstream in(line);
  std::string word;
  ProcessDraws out;
  in >> word >> out.seed >> word;
  EXPECT_EQ(word, "draws") << line;
  std::getline(in, out.draws);
  EXPECT_FALSE(out.draws.empty()) << line;
  return out;
}

TEST(Random, ProcessesDrawDifferentNumbersUnlessSeeded) {
  // As torch.rand in two fresh Python processes: each starts from its own random seed.
  const ProcessDraws a = process_draws(), b = process_draws();
  EXPECT_NE(a.seed, b.seed);
  EXPECT_NE(a.draws, b.draws);
  // manual_seed makes them repeat.
  const ProcessDraws c = process_draws("5"), d = process_draws("5");
  EXPECT_EQ(c.seed, 5u);
  EXPECT_EQ(d.seed, 5u);
  EXPECT_EQ(c.draws, d.draws);
  EXPECT_NE(c.draws, a.draws);
  // initial_seed() names the seed that replays an unseeded process's draws.
  EXPECT_EQ(process_draws(std::to_string(a.seed)).draws, a.draws);
  EXPECT_EQ(process_draws(std::to_string(b.seed)).draws, b.draws);
}

TEST(Random, InitialSeedIsTheDefaultGeneratorsSeed) {
  // This binary's main seeds 0 before every test (tests/seed_each_test.h).
  EXPECT_EQ(initial_seed(), 0u);
  EXPECT_EQ(default_generator().offset(), 0u);
  manual_seed(0xfedcba9876543210ull);  // all 64 bits are kept
  EXPECT_EQ(initial_seed(), 0xfedcba9876543210ull);
  const Tensor first = rand({5});
  EXPECT_EQ(initial_seed(), 0xfedcba9876543210ull) << "draws leave the seed alone";
  manual_seed(initial_seed());
  EXPECT_TRUE(equal(rand({5}), first));
  // A Generator built without a seed is deterministic, as torch.Generator() is.
  Generator g1, g2;
  EXPECT_EQ(g1.seed(), 0u);
  EXPECT_TRUE(equal(rand({8}, kF32, &g1), rand({8}, kF32, &g2)));
}

TEST(Random, ElementValueDependsOnlyOnPosition) {
  // A 2x3 draw holds the same numbers as the first 6 of a flat draw with the same state,
  // and a non-contiguous target receives them in row-major order.
  Generator g1(99), g2(99), g3(99);
  const auto flat = rand({6}, kF32, &g1).to_vector<float>();
  EXPECT_EQ(rand({2, 3}, kF32, &g2).to_vector<float>(), flat);
  Tensor target = zeros({3, 2}).t();
  uniform_(target, 0, 1, &g3);
  EXPECT_EQ(target.to_vector<float>(), flat);
}

TEST(Random, UniformAndNormalMoments) {
  Generator g(42);
  const auto u = rand({200000}, kF64, &g).to_vector<double>();
  EXPECT_NEAR(mean_of(u), 0.5, 0.005);
  EXPECT_NEAR(var_of(u), 1.0 / 12, 0.002);
  EXPECT_GE(*std::min_element(u.begin(), u.end()), 0.0);
  EXPECT_LT(*std::max_element(u.begin(), u.end()), 1.0);
  const auto r = uniform({100000}, -3, 5, kF32, &g).to_vector<double>();
  EXPECT_NEAR(mean_of(r), 1.0, 0.05);
  EXPECT_GE(*std::min_element(r.begin(), r.end()), -3.0);
  EXPECT_LT(*std::max_element(r.begin(), r.end()), 5.0);
  for (DType dtype : {kF32, kF64, kF16, kBF16}) {
    const auto n = normal({100000}, 2.0, 3.0, dtype, &g).to_vector<double>();
    EXPECT_NEAR(mean_of(n), 2.0, 0.06) << dtype;
    EXPECT_NEAR(std::sqrt(var_of(n)), 3.0, 0.06) << dtype;
  }
}

TEST(Random, IntegersBernoulliAndPermutations) {
  Generator g(5);
  const auto ints = randint(-3, 4, {70000}, kI64, &g).to_vector<int64_t>();
  std::vector<int> counts(7, 0);
  for (int64_t v : ints) {
    ASSERT_GE(v, -3);
    ASSERT_LT(v, 4);
    ++counts[static_cast<size_t>(v + 3)];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
  EXPECT_EQ(randint(0, 10, {4}, kI32, &g).dtype(), kI32);

  const auto b = bernoulli({100000}, 0.3, kF32, &g).to_vector<double>();
  EXPECT_NEAR(mean_of(b), 0.3, 0.01);
  const Tensor p = from_vector<float>({0.0f, 1.0f, 0.0f, 1.0f});
  EXPECT_EQ(bernoulli(p, &g).to_vector<float>(), (std::vector<float>{0, 1, 0, 1}));

  const auto perm = randperm(1000, &g).to_vector<int64_t>();
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> expected(1000);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(sorted, expected);
  EXPECT_NE(perm, expected);
}

TEST(Random, BadArguments) {
  EXPECT_EMBER_ERROR(randint(5, 5, {2}), "randint: low 5 must be below high 5");
  EXPECT_EMBER_ERROR(rand({2}, kI64), "uniform_: expected a floating dtype, got i64");
  EXPECT_EMBER_ERROR(normal({2}, 0, -1), "normal_: stddev must be non-negative");
  EXPECT_EMBER_ERROR(bernoulli({2}, 1.5), "bernoulli: probability must be in [0, 1], got 1.5");
  EXPECT_EMBER_ERROR(randperm(-1), "randperm: n must be non-negative");
}

}  // namespace
}  // namespace ember
