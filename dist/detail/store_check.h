// The fingerprint check and the goodbyes of a group whose collectives cannot carry them (the
// NCCL group), made over a side channel: the TcpStore its ranks met at. The issuing thread
// hands each collective's fingerprint to post(), which only queues it; a thread of this check
// publishes it to the store, waits for every peer's fingerprint of the same collective, and
// compares them with check_fingerprints (engine's one check). A mismatch, a peer's goodbye or
// a peer that publishes nothing within the timeout calls `on_failure` once with the message
// check_fingerprints (or the timeout) gives; the check then stops.
//
// Keys (under `prefix`, per rank r): "<prefix>/n/<r>" counts the fingerprints r published
// (plus kLeft once r said goodbye), "<prefix>/fp/<r>/<seq % 2>" holds its last two and
// "<prefix>/bye/<r>" its goodbye: a group uses 4 keys per rank however long it runs. Two slots
// suffice because a rank publishes #s+1 only after it read every peer's #s.
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
  void run();
  void check_one(const Fingerprint& mine);
  // Peer `peer`'s fingerprint of `mine.seq`, waiting for it (or its goodbye) at most the timeout.
  Fingerprint peer_fingerprint(int peer, const Fingerprint& mine);
  // The fingerprint at `key`, checked to be one (its bytes come from the network).
  Fingerprint read_fingerprint(const Fingerprint& mine, const std::string& key);
  std::string key(const char* kind, int rank) const;

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
  std::thread thread_;
};

}  // namespace ember::dist::detail
