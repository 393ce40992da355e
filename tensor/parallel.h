// How many CPU threads ember's kernels use (torch.set_num_threads): OpenMP loops, OpenBLAS
// and oneDNN all follow it. At start it is OMP_NUM_THREADS when set (as in PyTorch; ember-run
// sets it to each worker's share), else every CPU of the process's affinity mask.
#pragma once

namespace ember {

void set_num_threads(int threads);
int get_num_threads();

// The CPUs this process may run on: its affinity mask (os.sched_getaffinity, nproc).
int available_cpus();
// One process's share of available_cpus() when `processes` processes share them: the count
// divided by `processes`, at least 1 (what ember-run gives each worker of a node).
int cpu_share(int processes);

}  // namespace ember
