// The job secret and the handshake that proves it, shared by every connection a
// TCP-bootstrapped job accepts: the TcpStore (rendezvous, NCCL unique id) and the TCP
// backend's mesh. Without a secret, connections are taken on trust, as before.
//
// Handshake, when a secret is set (both sides know it; neither ever sends it):
//   acceptor  -> connector : "EMBA" + nonce_a (32 random bytes)
//   connector -> acceptor  : nonce_c (32 bytes) + HMAC-SHA256(secret, "c" + context + a + c)
//   acceptor  -> connector : HMAC-SHA256(secret, "a" + context + nonce_a + nonce_c)
// so each side proves the secret over a nonce the other just drew, and a reply cannot be
// replayed or reflected. `context` keeps store and mesh handshakes apart. Only the start of a
// connection is authenticated: what follows travels in clear and unsigned.
#pragma once

#include <array>
#include <chrono>
#include <optional>
#include <string>

namespace ember::dist::detail {

// EMBER_JOB_SECRET, or the contents of the file EMBER_JOB_SECRET_FILE names (one trailing
// newline dropped); "" when neither is set. Read once per process. Throws ember::Error when
// the file cannot be read or the secret is empty, or when both variables are set.
const std::string& job_secret();
// The same, read from the environment now, uncached.
std::string read_job_secret();

// `explicit_secret` when it holds a value (tests, several jobs in one process), else
// job_secret().
inline const std::string& secret_or_env(const std::optional<std::string>& explicit_secret) {
  return explicit_secret ? *explicit_secret : job_secret();
}

// One side of the handshake on a blocking socket, done by `deadline`. Returns "" on success,
// else why it failed ("sent a wrong proof of the job secret", "closed the connection", "no
// answer in time"). With an empty secret both succeed at once without a byte sent.
std::string accept_handshake(int fd, const std::string& secret, const std::string& context,
                             std::chrono::steady_clock::time_point deadline);
// The acceptor's side in two steps, for a listener that watches many connections from one
// thread: send_challenge() writes the challenge without blocking (false: the connection is
// gone); finish_accept() reads the proof once it arrives and answers it.
using Challenge = std::array<unsigned char, 32>;
bool send_challenge(int fd, const std::string& secret, Challenge& challenge);
std::string finish_accept(int fd, const std::string& secret, const std::string& context,
                          const Challenge& challenge,
                          std::chrono::steady_clock::time_point deadline);
// The connecting side may pass its first message (`first`, e.g. a greeting): it goes out with
// the proof, before the answer is read, which saves the acceptor a round trip per connection
// (without a secret it is simply sent).
std::string connect_handshake(int fd, const std::string& secret, const std::string& context,
                              std::chrono::steady_clock::time_point deadline,
                              const std::string& first = {});

// "10.0.0.7:51234" (or "[::1]:51234") for the peer of a connected socket; "?" if unknown.
std::string peer_address(int fd);

// One line on stderr, flushed: "ember::dist: <who>: <message>". For connections a listener
// drops (strangers, broken requests). After 200 lines per process further ones are counted
// but not written, so a flood of strangers cannot flood the log.
void log_dropped(const std::string& who, const std::string& message);

// Reads exactly `n` bytes by `deadline`; false on a closed connection, an error or the
// deadline (errno is ETIMEDOUT then).
bool read_by(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline);

}  // namespace ember::dist::detail
