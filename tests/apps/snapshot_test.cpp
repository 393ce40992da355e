// ember-train's snapshots, as the fault-tolerance tutorial uses them: a run stopped anywhere
// (mid-epoch, killed with SIGKILL, on 2 ranks) and resumed with --resume auto ends with the
// uninterrupted run's parameters bit for bit; --keep K leaves K; a damaged newest snapshot
// is skipped with a warning; a writer killed mid-save leaves the previous snapshot loadable
// and its temporary file goes at the next save.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <ember/dist/checkpoint.h>
#include <ember/ember.h>

#include "train_cli.h"
#include "trainer.h"

namespace fs = std::filesystem;

namespace ember::apps {
namespace {

using testing::count_lines_with;
using testing::Result;
using testing::run;

// Every tensor of two checkpoint files (model, optimizer) equal bit for bit.
void expect_same_tensors(const fs::path& a, const fs::path& b) {
  const dist::CheckpointFile fa = dist::read_checkpoint(a.string());
  const dist::CheckpointFile fb = dist::read_checkpoint(b.string());
  ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
  ASSERT_GT(fa.tensors.size(), 10u);
  for (const auto& [name, ta] : fa.tensors) {
    ASSERT_TRUE(fb.tensors.count(name)) << name;
    const Tensor& tb = fb.tensors.at(name);
    ASSERT_EQ(ta.sizes(), tb.sizes()) << name;
    EXPECT_EQ(std::memcmp(ta.data_ptr(), tb.data_ptr(), ta.nbytes()), 0) << name << " differs";
  }
  EXPECT_EQ(fa.metadata.at("step"), fb.metadata.at("step"));
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

bool has_temporary(const fs::path& dir) {
  for (const std::string& name : names_in(dir))
    if (name.find(".tmp.") != std::string::npos) return true;
  return false;
}

// 40 training images in two classes; 3 epochs of 5 steps (batch 8, or 4 on each of 2 ranks),
// each step in 2 micro-batches; a snapshot every 2 steps. The reference run is uninterrupted.
class Snapshots : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("ember_apps_snapshots_" + std::to_string(getpid()));
    fs::remove_all(root_);
    ASSERT_TRUE(testing::make_image_folder(root_ / "data", 20, 4));
    const Result r = run(command(root_ / "reference", ""));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string args(const fs::path& out, int64_t batch, int64_t epochs = 3,
                          int64_t save_every = 2) {
    return " --dataset folder --data " + (root_ / "data").string() +
           " --image-size 16 --mean 0.5 0.5 0.5 --std 0.25 0.25 0.25 --batch-size " +
           std::to_string(batch) + " --accum-steps 2 --epochs " + std::to_string(epochs) +
           " --workers 0 --threads 1 --device cpu --deterministic "
           "--log-every 1 --save-every-steps " +
           std::to_string(save_every) + " --out-dir " + out.string() + " ";
  }
  static std::string command(const fs::path& out, const std::string& extra) {
    return std::string(EMBER_TRAIN_BIN) + args(out, 8) + extra;
  }
  // `out` holding only the reference run's snapshot `name`.
  static fs::path with_snapshot(const std::string& out_name, const std::string& name) {
    const fs::path out = root_ / out_name;
    fs::remove_all(out);
    fs::create_directories(out);
    fs::copy_file(root_ / "reference" / name, out / name);
    return out;
  }
  static fs::path final_of(const fs::path& out) { return out / "checkpoint-epoch-3.safetensors"; }

  static fs::path root_;
};
fs::path Snapshots::root_;

TEST_F(Snapshots, ResumedMidEpochOrAtAnEpochEndEqualsTheUninterruptedRun) {
  const fs::path reference = root_ / "reference";
  EXPECT_EQ(names_in(reference).count("checkpoint-step-4.safetensors"), 1u);
  EXPECT_EQ(names_in(reference).count("checkpoint-step-10.safetensors"), 0u);  // epoch-2's
  for (const char* name : {"checkpoint-step-4.safetensors", "checkpoint-epoch-1.safetensors",
                           "checkpoint-step-8.safetensors", "checkpoint-step-14.safetensors"}) {
    SCOPED_TRACE(name);
    const fs::path out = with_snapshot("resumed", name);
    const Result r = run(command(out, "--resume auto"));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed from " + (out / name).string()), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("done: 15 steps"), std::string::npos) << r.output;
    expect_same_tensors(final_of(reference), final_of(out));
  }
  // The comparison can fail: the snapshot of step 8 is not the end.
  const dist::CheckpointFile mid =
      dist::read_checkpoint((reference / "checkpoint-step-8.safetensors").string());
  const dist::CheckpointFile end = dist::read_checkpoint(final_of(reference).string());
  const Tensor& w = mid.tensors.at("model.fc.weight");
  EXPECT_NE(std::memcmp(w.data_ptr(), end.tensors.at("model.fc.weight").data_ptr(), w.nbytes()), 0);
}

TEST_F(Snapshots, ResumeAutoWithoutSnapshotsStartsAfresh) {
  const fs::path out = root_ / "fresh";
  fs::remove_all(out);
  const Result r = run(command(out, "--resume"));  // a bare --resume is --resume auto
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("no snapshot in " + out.string() + ": starting from scratch"),
            std::string::npos)
      << r.output;
  expect_same_tensors(final_of(root_ / "reference"), final_of(out));
}

struct Interrupted {
  std::string output;
  int status = -1;  // as waitpid gives it
};
// Runs `command` (sh -c) in a process group of its own; as soon as `file` exists (polled
// every millisecond: output may come late through a launcher), calls interrupt(pid), then
// reads on until every writer of its output has ended.
Interrupted run_interrupted(const std::string& command, const fs::path& file,
                            const std::function<void(pid_t)>& interrupt) {
  Interrupted r;
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(pipe_fds[1], 1);
    ::dup2(pipe_fds[1], 2);
    ::close(pipe_fds[0]);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  if (pid < 0) return r;
  ::setpgid(pid, pid);  // as the child does, whichever runs first
  bool interrupted = false;
  char buffer[4096];
  for (;;) {
    if (!interrupted && fs::exists(file)) {
      interrupted = true;
      interrupt(pid);
    }
    pollfd p{pipe_fds[0], POLLIN, 0};
    if (::poll(&p, 1, interrupted ? -1 : 1) == 0) continue;
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
    if (n <= 0) break;
    r.output.append(buffer, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  ::waitpid(pid, &r.status, 0);
  if (!interrupted) r.output += "\n(" + file.string() + " never appeared)";
  return r;
}

// Kills a whole job (its process group) with SIGKILL, as when its node is lost.
void kill_group(pid_t pid) { ::kill(-pid, SIGKILL); }

bool killed_by_sigkill(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }

// The descendants of `ancestor` running `name` (the workers under a launcher), from /proc.
std::vector<pid_t> descendants_named(pid_t ancestor, const std::string& name) {
  std::map<pid_t, std::pair<pid_t, std::string>> parent_and_name;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t open = line.find('('), close = line.rfind(')');  // "pid (comm) state ppid"
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    char state = 0;
    pid_t ppid = 0;
    if (rest >> state >> ppid)
      parent_and_name[std::stoi(pid)] = {ppid, line.substr(open + 1, close - open - 1)};
  }
  std::vector<pid_t> out;
  for (const auto& [pid, info] : parent_and_name) {
    if (info.second != name) continue;
    for (pid_t up = info.first; up > 1;
         up = parent_and_name.count(up) ? parent_and_name[up].first : 0) {
      if (up == ancestor) {
        out.push_back(pid);
        break;
      }
    }
  }
  return out;
}

// Kills one of the job's ember-train processes with SIGKILL (a worker lost); -1 when none.
pid_t kill_one_worker(pid_t job) {
  const std::vector<pid_t> workers = descendants_named(job, "ember-train");
  if (workers.empty()) return -1;
  ::kill(workers.back(), SIGKILL);
  return workers.back();
}

TEST_F(Snapshots, KilledWithSigkillAndResumedEqualsTheUninterruptedRun) {
  const fs::path out = root_ / "killed";
  fs::remove_all(out);
  // Killed as soon as its first snapshot is written: mid-epoch, 13 steps before the end.
  const Interrupted job = run_interrupted("exec " + command(out, ""),
                                          out / "checkpoint-step-2.safetensors", kill_group);
  ASSERT_TRUE(killed_by_sigkill(job.status)) << job.output;
  ASSERT_FALSE(fs::exists(final_of(out)));
  const Result r = run(command(out, "--resume auto"));
  ASSERT_EQ(r.code, 0) << job.output << r.output;
  EXPECT_NE(r.output.find("resumed from " + out.string() + "/checkpoint-"), std::string::npos)
      << r.output;
  expect_same_tensors(final_of(root_ / "reference"), final_of(out));
  // The metrics hold each step once: what the killed run logged after its snapshot is gone.
  EXPECT_EQ(count_lines_with(out / "metrics.jsonl", "\"kind\": \"step\""), 15);
  EXPECT_EQ(count_lines_with(out / "metrics.jsonl", "\"kind\": \"epoch\""), 3);
  EXPECT_FALSE(has_temporary(out));
}

// Two ranks started by `launch` (ending in the program's path): the reference run, and a run
// resumed from its snapshot of step 8 (mid-epoch 2), equal at the end.
void expect_two_ranks_resume_exactly(const std::string& launch, const fs::path& reference,
                                     const fs::path& out, const std::string& backend) {
  fs::remove_all(reference);
  fs::remove_all(out);
  const Result full = run(launch + Snapshots::args(reference, 4));
  ASSERT_EQ(full.code, 0) << full.output;
  ASSERT_NE(full.output.find(" 2 rank(s) on cpu (" + backend + ")"), std::string::npos)
      << full.output;
  fs::create_directories(out);
  fs::copy_file(reference / "checkpoint-step-8.safetensors", out / "checkpoint-step-8.safetensors");
  const Result resumed = run(launch + Snapshots::args(out, 4) + "--resume auto");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + out.string() + "/checkpoint-step-8"),
            std::string::npos)
      << resumed.output;
  expect_same_tensors(Snapshots::final_of(reference), Snapshots::final_of(out));
}

TEST_F(Snapshots, TwoTcpRanksResumedMidEpochOrAfterAKillEqualTheUninterruptedRun) {
  const std::string launch = std::string("TORCHRUN_STYLE_TIMEOUT=120 bash ") +
                             EMBER_TORCHRUN_STYLE + " 2 " + EMBER_TRAIN_BIN;
  const fs::path reference = root_ / "reference_tcp";
  expect_two_ranks_resume_exactly(launch, reference, root_ / "resumed_tcp", "tcp");
  // One rank killed after the first snapshot (torchrun_style.sh then stops the other), the
  // job started again.
  const fs::path out = root_ / "killed_tcp";
  fs::remove_all(out);
  pid_t victim = -1;
  const Interrupted job =
      run_interrupted(launch + args(out, 4), out / "checkpoint-step-2.safetensors",
                      [&victim](pid_t pid) { victim = kill_one_worker(pid); });
  ASSERT_GT(victim, 0) << job.output;
  ASSERT_TRUE(WIFEXITED(job.status) && WEXITSTATUS(job.status) != 0) << job.output;
  ASSERT_FALSE(fs::exists(final_of(out)));
  const Result r = run(launch + args(out, 4) + "--resume auto");
  ASSERT_EQ(r.code, 0) << job.output << r.output;
  EXPECT_NE(r.output.find("resumed from " + out.string() + "/checkpoint-"), std::string::npos)
      << r.output;
  expect_same_tensors(final_of(reference), final_of(out));
}

// Run by the ctest entry apps_snapshots_mpirun_np2 (labelled mpi), which sets
// EMBER_TEST_MPIRUN_NP to mpirun's command line up to the process count.
TEST_F(Snapshots, TwoMpiRanksResumedMidEpochEqualTheUninterruptedRun) {
  const char* mpirun = std::getenv("EMBER_TEST_MPIRUN_NP");
  if (mpirun == nullptr || mpirun[0] == '\0') GTEST_SKIP() << "run by apps_snapshots_mpirun_np2";
  expect_two_ranks_resume_exactly(std::string(mpirun) + " 2 " + EMBER_TRAIN_BIN,
                                  root_ / "reference_mpi", root_ / "resumed_mpi", "mpi");
}

#ifdef EMBER_RUN_BIN
// The fault-tolerance tutorial's run: under ember-run --max-restarts 1, one of 2 workers is
// killed with SIGKILL mid-epoch; the launcher restarts both, they resume from the newest
// snapshot, and the job ends with the uninterrupted job's parameters bit for bit.
TEST_F(Snapshots, WorkerKilledUnderEmberRunIsRestartedAndEndsBitForBit) {
  const std::string launch = std::string("timeout -k 5 150 ") + EMBER_RUN_BIN +
                             " --nproc-per-node 2 --max-restarts 1 --grace 1 " + EMBER_TRAIN_BIN;
  const fs::path reference = root_ / "reference_run", out = root_ / "restarted_run";
  fs::remove_all(reference);
  fs::remove_all(out);
  const Result full = run(launch + args(reference, 4));
  ASSERT_EQ(full.code, 0) << full.output;
  ASSERT_NE(full.output.find(" 2 rank(s) on cpu (tcp)"), std::string::npos) << full.output;
  // Killed after the snapshot of step 6, in the middle of epoch 2.
  pid_t victim = -1;
  const Interrupted job = run_interrupted("exec " + launch + args(out, 4) + "--resume auto",
                                          out / "checkpoint-step-6.safetensors",
                                          [&victim](pid_t pid) { victim = kill_one_worker(pid); });
  ASSERT_GT(victim, 0) << "no worker to kill\n" << job.output;
  ASSERT_TRUE(WIFEXITED(job.status) && WEXITSTATUS(job.status) == 0) << job.output;
  EXPECT_NE(job.output.find("no snapshot in " + out.string()), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("resumed from " + out.string() + "/checkpoint-"), std::string::npos)
      << job.output;
  expect_same_tensors(final_of(reference), final_of(out));
  EXPECT_FALSE(has_temporary(out));
}
#endif

TEST_F(Snapshots, KeepLeavesTheNewestK) {
  const fs::path out = root_ / "keep";
  fs::remove_all(out);
  const Result r = run(std::string(EMBER_TRAIN_BIN) + args(out, 8, 1, 1) + "--keep 3");
  ASSERT_EQ(r.code, 0) << r.output;
  std::set<std::string> snapshots;
  for (const SnapshotFile& s : list_snapshots(out.string()))
    snapshots.insert(fs::path(s.path).filename().string());
  EXPECT_EQ(snapshots,
            (std::set<std::string>{"checkpoint-step-3.safetensors", "checkpoint-step-4.safetensors",
                                   "checkpoint-epoch-1.safetensors"}));
  EXPECT_EQ(names_in(out).count("checkpoint-step-1.safetensors"), 0u);
  EXPECT_FALSE(has_temporary(out));
}

TEST_F(Snapshots, DamagedNewestIsSkippedWithAWarning) {
  struct Damage {
    const char* name;
    const char* reason;
    void (*apply)(const fs::path&);
  };
  const Damage damages[] = {{"truncated", "truncated",
                             [](const fs::path& p) { fs::resize_file(p, fs::file_size(p) / 2); }},
                            {"bad checksum", "checksum does not match",
                             [](const fs::path& p) {
                               std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
                               f.seekg(-5, std::ios::end);
                               char c = 0;
                               f.get(c);
                               f.seekp(-5, std::ios::end);
                               f.put(static_cast<char>(c ^ 0x40));
                             }},
                            {"bad header", "the header claims", [](const fs::path& p) {
                               std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
                               f.write("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
                             }}};
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.name);
    const fs::path out = with_snapshot("damaged", "checkpoint-step-4.safetensors");
    const fs::path newest = out / "checkpoint-step-8.safetensors";
    fs::copy_file(root_ / "reference" / "checkpoint-step-8.safetensors", newest);
    d.apply(newest);
    const Result r = run(command(out, "--resume auto"));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("warning: skipped the damaged snapshot " + newest.string()),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(d.reason), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("resumed from " + (out / "checkpoint-step-4.safetensors").string()),
              std::string::npos)
        << r.output;
    expect_same_tensors(final_of(root_ / "reference"), final_of(out));
  }
}

// A writer killed while it writes a large checkpoint: the previous file still loads, and the
// next save removes the temporary file it left.
TEST(CheckpointWriter, KilledMidSaveLeavesThePreviousOneAndNoTemporaryAfterTheNextSave) {
  const fs::path dir =
      fs::temp_directory_path() / ("ember_apps_killed_save_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "checkpoint.safetensors").string();
  auto small = std::make_shared<nn::Linear>(4, 2);
  dist::Checkpoint previous;
  previous.model = small.get();
  previous.step = 1;
  dist::save_checkpoint(path, previous);
  auto big = std::make_shared<nn::Linear>(4096, 4096);  // 64 MiB of weights
  dist::Checkpoint large;
  large.model = big.get();
  large.step = 2;
  bool left_temporary = false;
  for (int attempt = 0; attempt < 20 && !left_temporary; ++attempt) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      try {
        for (;;) dist::save_checkpoint(path, large);  // over the previous one, again and again
      } catch (...) {
        ::_exit(1);
      }
    }
    ASSERT_GT(pid, 0);
    // Killed while its temporary file is being written.
    int status = 0;
    while (!has_temporary(dir) && ::waitpid(pid, &status, WNOHANG) == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    left_temporary = has_temporary(dir);
  }
  ASSERT_TRUE(left_temporary) << "no kill landed during a save";
  // Whole and loadable: the previous one, or one the writer finished before.
  const std::string step = dist::read_checkpoint(path).metadata.at("step");
  EXPECT_TRUE(step == "1" || step == "2") << step;
  dist::save_checkpoint(path, previous);  // the next save
  EXPECT_FALSE(has_temporary(dir));
  EXPECT_EQ(dist::read_checkpoint(path).metadata.at("step"), "1");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ember::apps
