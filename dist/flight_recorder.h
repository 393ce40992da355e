// The flight recorder: every MPI, TCP and NCCL process group keeps, on each rank, a ring of
// its last collectives (number, op, dtype, element count, root, reduce op, state: enqueued,
// started, completed or failed, times, and the caller's tag, else, for dist::all_reduce and
// the other free functions of api.h, the file and line they were called from), recorded by the
// collective engine at a cost of nanoseconds, on unless EMBER_FLIGHT_RECORDER=0. Each process
// writes all its groups' rings as JSON to <dir>/rank<R>.json when a collective times out or its
// group breaks, on SIGUSR1 (unless the program handles SIGUSR1 itself), and on request
// (dump_flight_recorder). analyze_flight_dumps() reads a folder of such dumps and says, in
// one paragraph, where the ranks disagree and who never arrived; ember-run runs it after a
// failed job, and the ember-flight command on a folder from an mpirun or srun job.
#pragma once

#include <string>
#include <string_view>

namespace ember::dist {

// Tags the collectives this thread issues while it lives ("DDP bucket 3", "save_checkpoint"),
// as the recorder and the analyzer show them; the innermost tag wins. Each distinct tag is
// kept for the process's life: use a few fixed names, not one per step.
class CollectiveTag {
 public:
  explicit CollectiveTag(std::string_view tag);
  ~CollectiveTag();
  CollectiveTag(const CollectiveTag&) = delete;
  CollectiveTag& operator=(const CollectiveTag&) = delete;

 private:
  const char* previous_;
};

// The folder dumps go to: the last set_flight_recorder_dir(), else EMBER_FLIGHT_DIR, else
// "ember-flight" in the working directory. Created when a dump is written.
void set_flight_recorder_dir(const std::string& dir);
std::string flight_recorder_dir();

// Whether groups made from now on record (default: unless EMBER_FLIGHT_RECORDER is "0").
void set_flight_recorder_enabled(bool enabled);
bool flight_recorder_enabled();

// Writes this process's records, every live group's, to <dir>/rank<R>.json (R: its rank in
// the job), replacing an earlier dump, with `reason`; returns the path. ember::Error when
// the file cannot be written.
std::string dump_flight_recorder(const std::string& reason = "requested by the program");

// Reads the dumps in `dir` (rank*.json from the ranks of one job) and says in one paragraph,
// per group: the last collective every rank completed, the first number where the ranks
// disagree, where each rank is ("rank 0 waits in barrier #8 (save_checkpoint) while rank 1
// is in allreduce #8 (DDP bucket 0, 2.1 MB)"), and which ranks never arrived or left no
// dump. Dumps are untrusted: at most 4096 files of at most 64 MiB each are read, and a file
// that is no dump is an ember::Error naming it and what is wrong.
std::string analyze_flight_dumps(const std::string& dir);

}  // namespace ember::dist
