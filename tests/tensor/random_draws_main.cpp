// Not a gtest: one process's draws from the default generator, for
// Random.ProcessesDrawDifferentNumbersUnlessSeeded (random_test.cpp), which starts it twice.
//   random_draws        prints "seed S draws X0 X1 X2 X3": initial_seed() and four rand()
//                       values (hex floats) of a process that never seeds
//   random_draws SEED   the same after manual_seed(SEED)
#include <cstdio>
#include <cstdlib>

#include <ember/tensor/random.h>

int main(int argc, char** argv) {
  if (argc > 2) {
    std::fprintf(stderr, "usage: random_draws [SEED]\n");
    return 2;
  }
  if (argc == 2) ember::manual_seed(std::strtoull(argv[1], nullptr, 10));
  const unsigned long long seed = ember::initial_seed();
  std::printf("seed %llu draws", seed);
  for (const float x : ember::rand({4}).to_vector<float>())
    std::printf(" %a", static_cast<double>(x));
  std::printf("\n");
  return 0;
}
