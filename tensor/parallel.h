// How many CPU threads ember's kernels use (torch.set_num_threads): OpenMP loops, OpenBLAS
// and oneDNN all follow it.
#pragma once

namespace ember {

void set_num_threads(int threads);
int get_num_threads();

}  // namespace ember
