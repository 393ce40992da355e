// The fingerprint check and the goodbyes of a group whose collectives cannot carry them (the
// NCCL group), made over a side channel: the TcpStore its ranks met at. The issuing thread
// hands each collective's fingerprint to post(), which only queues it; a thread of this check
// publishes it to the store, waits for every peer's fingerprint of the same collective, and
// compares them with check_fingerprints (engine's one check). A mismatch, a peer's goodbye or
// a peer that publishes nothing within the timeout calls `on_failure` once with the message
// check_fingerprints (or the timeout) gives; the check then stops.
//
// Keys (under `prefix`, per rank r): "<prefix>/n/<r>" is the number of the last collective r
// published (plus kLeft once r said goodbye), "<prefix>/fp/<r>/<b % 2>" holds its fingerprints
// of block b (kBlock collectives) and "<prefix>/bye/<r>" its goodbye: a group uses 4 keys per
// rank however long it runs. Two slots suffice because a rank publishes into block b + 1 only
// after it checked all of block b, which needed every peer's fingerprints of it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace ember::dist {
class TcpStore;
}

namespace ember::dist::detail {

class StoreFingerprintCheck {
 public:
  using OnFailure = std::function<void(const std::string& message)>;
  // What a rank adds to its counter when it leaves: counts at or above it mean "left".
  static constexpr int64_t kLeft = int64_t{1} << 50;
  // Collectives #1..#kBlock form block 0, and so on: a rank publishes what it has queued of a
  // block in one request, so a check that lags behind a burst of launches catches up.
  static constexpr int64_t kBlock = 64;

  // Rank `rank` of `size`; every rank of the group passes the same `prefix`. `on_failure` runs
  // on the check's thread.
  StoreFingerprintCheck(std::shared_ptr<TcpStore> store, std::string prefix, int rank, int size,
                        std::chrono::milliseconds timeout, OnFailure on_failure);
  // Stops the thread without a goodbye (see leave()).
  ~StoreFingerprintCheck();
  StoreFingerprintCheck(const StoreFingerprintCheck&) = delete;
  StoreFingerprintCheck& operator=(const StoreFingerprintCheck&) = delete;

  // Queues this rank's fingerprint of its next collective (numbered 1, 2, ... in order).
  void post(const Fingerprint& mine);
  // Stops checking and tells the peers this rank left (`bye`, Fingerprint::goodbye): a peer
  // waiting for a collective this rank never published fails at once, naming it. A store
  // that cannot be reached any more is not reported (the process is leaving).
  void leave(const Fingerprint& bye);
  // Until every posted fingerprint was checked, the check failed, or `limit` passed; true in
  // the first case.
  bool wait_checked(std::chrono::milliseconds limit);
  // The collectives checked so far, in step with every peer.
  int64_t checked() const;

 private:
  // What this rank knows of a peer: the last collective it published (and whether it left),
  // and its block of fingerprints as last read.
  struct Peer {
    int64_t last = 0;
    bool left = false;
    int64_t block = -1;
    std::string bytes;
  };
  static int64_t block_of(int64_t seq);
  void run();
  // Publishes `batch` (queued fingerprints of one block, in order) and checks each of them.
  void check_batch(const std::vector<Fingerprint>& batch);
  // Peer `peer`'s fingerprint of `mine.seq`, waiting for it (or its goodbye) at most the timeout.
  Fingerprint peer_fingerprint(int peer, const Fingerprint& mine);
  std::string key(const char* kind, int rank) const;
  std::string slot_key(int rank, int64_t block) const;

  std::shared_ptr<TcpStore> store_;
  std::string prefix_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  OnFailure on_failure_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Fingerprint> queue_;
  bool busy_ = false, stopping_ = false, failed_ = false;
  int64_t checked_ = 0;
  // The check's thread alone: this rank's current block, what it published, its peers.
  int64_t block_ = -1, published_ = 0;
  std::string block_bytes_;
  std::vector<Peer> peers_;
  std::thread thread_;
};

}  // namespace ember::dist::detail
