#include "store_check.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include <ember/dist/tcp_store.h>

namespace ember::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;

// The longest pause between two looks at a peer's count while waiting for it: the store serves
// every waiting rank's looks, so they must stay few.
constexpr auto kLongestPause = std::chrono::microseconds(5000);

// How many fingerprints post() queues before it waits for the check to catch up.
constexpr size_t kMaxQueued = size_t{1} << 16;

std::string bytes_of(const Fingerprint& f) {
  return std::string(reinterpret_cast<const char*>(&f), sizeof(Fingerprint));
}

// "allreduce #3".
std::string op_name(const Fingerprint& mine) {
  return std::string(op_kind_name(static_cast<OpKind>(mine.kind))) + " #" +
         std::to_string(mine.seq);
}

// Runs `call` (requests to the store); its failure as an ember::Error naming the collective.
template <typename F>
auto via_store(const Fingerprint& mine, int rank, F&& call) -> decltype(call()) {
  try {
    return call();
  } catch (const std::exception& e) {
    throw Error(op_name(mine) + " on rank " + std::to_string(rank) +
                ": the fingerprint check over the store the ranks met at failed (rank 0's "
                "process serves it; it may have ended): " +
                e.what());
  }
}

// Thrown inside the check's thread when leave() stops it mid-wait.
struct Stopped {};

}  // namespace

StoreFingerprintCheck::StoreFingerprintCheck(std::shared_ptr<TcpStore> store, std::string prefix,
                                             int rank, int size, std::chrono::milliseconds timeout,
                                             OnFailure on_failure)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      on_failure_(std::move(on_failure)) {
  EMBER_CHECK(store_ != nullptr, "StoreFingerprintCheck", "no store given");
  EMBER_CHECK(size >= 1 && rank >= 0 && rank < size, "StoreFingerprintCheck", "rank ", rank,
              " is not in a group of ", size);
  peers_.resize(static_cast<size_t>(size));
  thread_ = std::thread([this] { run(); });
}

StoreFingerprintCheck::~StoreFingerprintCheck() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string StoreFingerprintCheck::key(const char* kind, int rank) const {
  return prefix_ + "/" + kind + "/" + std::to_string(rank);
}

void StoreFingerprintCheck::post(const Fingerprint& mine) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failed_ || stopping_) return;  // the group is broken or leaving: nothing more to compare
  cv_.wait(lock, [&] { return queue_.size() < kMaxQueued || failed_ || stopping_; });
  queue_.push_back(mine);
  lock.unlock();
  cv_.notify_all();
}

void StoreFingerprintCheck::leave(const Fingerprint& bye) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  try {
    // The goodbye first: a peer that sees the count marked left reads it at once.
    store_->set(key("bye", rank_), bytes_of(bye));
    store_->add(key("n", rank_), kLeft);
  } catch (const std::exception&) {
  }
}

bool StoreFingerprintCheck::wait_checked(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, limit, [&] { return failed_ || (queue_.empty() && !busy_); }) &&
         !failed_;
}

int64_t StoreFingerprintCheck::checked() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return checked_;
}

void StoreFingerprintCheck::run() {
  for (;;) {
    std::vector<Fingerprint> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      // Everything queued in the front one's block goes out in one request.
      const int64_t block = block_of(queue_.front().seq);
      while (!queue_.empty() && block_of(queue_.front().seq) == block) {
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
      busy_ = true;
    }
    cv_.notify_all();  // post() may wait for room
    std::string failure;
    try {
      check_batch(batch);
    } catch (const Stopped&) {
      return;
    } catch (const std::exception& e) {
      failure = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
      if (!failure.empty()) {
        failed_ = true;
        queue_.clear();
      }
    }
    cv_.notify_all();
    if (!failure.empty()) {
      on_failure_(failure);
      return;
    }
  }
}

int64_t StoreFingerprintCheck::block_of(int64_t seq) { return (seq - 1) / kBlock; }

std::string StoreFingerprintCheck::slot_key(int rank, int64_t block) const {
  return key("fp", rank) + "/" + std::to_string(block % 2);
}

void StoreFingerprintCheck::check_batch(const std::vector<Fingerprint>& batch) {
  const Fingerprint& first = batch.front();
  const int64_t block = block_of(first.seq);
  if (block != block_) {
    block_ = block;
    block_bytes_.clear();
  }
  for (const Fingerprint& f : batch) block_bytes_ += bytes_of(f);
  const int64_t last = batch.back().seq;
  via_store(first, rank_, [&] {
    store_->set(slot_key(rank_, block), block_bytes_);
    return store_->add(key("n", rank_), last - published_);
  });
  published_ = last;
  std::vector<Fingerprint> all(static_cast<size_t>(size_));
  for (const Fingerprint& mine : batch) {
    for (int r = 0; r < size_; ++r) {
      all[static_cast<size_t>(r)] = r == rank_ ? mine : peer_fingerprint(r, mine);
    }
    check_fingerprints(op_name(mine), all, rank_, /*issued=*/true);
    std::lock_guard<std::mutex> lock(mutex_);
    ++checked_;
  }
}

Fingerprint StoreFingerprintCheck::peer_fingerprint(int peer, const Fingerprint& mine) {
  const int64_t seq = mine.seq;
  Peer& view = peers_[static_cast<size_t>(peer)];
  const auto deadline = Clock::now() + timeout_;
  auto pause = std::chrono::microseconds(20);
  while (view.last < seq && !view.left) {
    const int64_t count = via_store(mine, rank_, [&] { return store_->add(key("n", peer), 0); });
    EMBER_CHECK(count >= 0 && count < 2 * kLeft, op_name(mine), "rank ", peer,
                " published an impossible count ", count, " under ", key("n", peer));
    view.left = count >= kLeft;
    view.last = view.left ? count - kLeft : count;
    if (view.last >= seq || view.left) break;
    if (Clock::now() > deadline) {
      throw Error(ember::detail::str_cat(
          op_name(mine), " on rank ", rank_, ": rank ", peer, " issued no collective #", seq,
          " within ", timeout_.count(), " ms (its last was #", view.last,
          "): it hangs in its own code, died, or skipped this collective"));
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (cv_.wait_for(lock, pause, [&] { return stopping_; })) throw Stopped{};
    pause = std::min(pause * 2, kLongestPause);
  }
  if (view.last >= seq) {
    // Its block as last read, read again when it lacks #seq. A rank writes block b + 2 over
    // this slot only after it read this rank's whole block b + 1, so #seq is still there.
    for (int reads = 0; reads < 2; ++reads) {
      if (view.block == block_of(seq)) {
        for (size_t at = 0; at + sizeof(Fingerprint) <= view.bytes.size();
             at += sizeof(Fingerprint)) {
          Fingerprint theirs;
          std::memcpy(&theirs, view.bytes.data() + at, sizeof(Fingerprint));
          if (theirs.seq == seq) return theirs;
        }
      }
      view.bytes =
          via_store(mine, rank_, [&] { return store_->get(slot_key(peer, block_of(seq))); });
      EMBER_CHECK(view.bytes.size() % sizeof(Fingerprint) == 0 &&
                      view.bytes.size() <= kBlock * sizeof(Fingerprint),
                  op_name(mine), "rank ", peer, "'s fingerprints under ",
                  slot_key(peer, block_of(seq)), " take ", view.bytes.size(),
                  " bytes, not a whole number of fingerprints (at most ", kBlock, ")");
      view.block = block_of(seq);
    }
    throw Error(ember::detail::str_cat(op_name(mine), " on rank ", rank_, ": rank ", peer,
                                       " published collectives up to #", view.last,
                                       " but none numbered #", seq));
  }
  // It left: its goodbye says how many collectives it issued.
  const std::string bytes = via_store(mine, rank_, [&] { return store_->get(key("bye", peer)); });
  EMBER_CHECK(bytes.size() == sizeof(Fingerprint), op_name(mine), "rank ", peer,
              "'s goodbye takes ", bytes.size(), " bytes, expected ", sizeof(Fingerprint));
  Fingerprint bye;
  std::memcpy(&bye, bytes.data(), sizeof(Fingerprint));
  // It issued this collective but left before publishing it: it went into it, so it is not
  // this rank's to judge (NCCL pairs it or times out).
  return bye.is_goodbye() && bye.seq > seq ? mine : bye;
}

}  // namespace ember::dist::detail
