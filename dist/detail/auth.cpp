#include "auth.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <ember/tensor/error.h>

#include "socket.h"

namespace ember::dist::detail {

namespace {

constexpr size_t kMac = 32;  // SHA-256
constexpr char kMagic[4] = {'E', 'M', 'B', 'A'};
using Bytes = Challenge;

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

}  // namespace

std::string read_job_secret() {
  const char* inline_secret = env("EMBER_JOB_SECRET");
  const char* file = env("EMBER_JOB_SECRET_FILE");
  EMBER_CHECK(inline_secret == nullptr || file == nullptr, "job secret",
              "EMBER_JOB_SECRET and EMBER_JOB_SECRET_FILE are both set; set one");
  if (inline_secret != nullptr) return inline_secret;
  if (file == nullptr) return {};
  // A regular file of a secret's size: a FIFO or /dev/zero would block or grow without end.
  constexpr uintmax_t kMaxSecretFileBytes = 64 * 1024;
  std::error_code ec;
  const bool regular = std::filesystem::is_regular_file(file, ec);
  const uintmax_t bytes = regular ? std::filesystem::file_size(file, ec) : 0;
  EMBER_CHECK(regular && !ec, "job secret", "cannot read EMBER_JOB_SECRET_FILE=", file,
              ": it is not a regular file (a FIFO, a device or missing)");
  EMBER_CHECK(bytes <= kMaxSecretFileBytes, "job secret", "EMBER_JOB_SECRET_FILE=", file, " holds ",
              bytes, " bytes (a secret has at most ", kMaxSecretFileBytes, ")");
  std::ifstream in(file, std::ios::binary);
  EMBER_CHECK(in.good(), "job secret", "cannot read EMBER_JOB_SECRET_FILE=", file, ": ",
              std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  std::string secret = contents.str();
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  EMBER_CHECK(!secret.empty(), "job secret", "EMBER_JOB_SECRET_FILE=", file, " is empty");
  return secret;
}

namespace {

// NOTE: libcrypto is set up without its atexit teardown. The store's and the mesh's threads
// may still answer a handshake while the process exits; with the teardown, such a late
// RAND_bytes would run on a torn-down library (and rebuild its generator, unreachable).
void init_crypto_once() {
  static const bool ready = ::OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
  EMBER_CHECK(ready, "job secret", "OpenSSL's libcrypto failed to initialise");
}

std::array<unsigned char, kMac> mac(const std::string& secret, char role,
                                    const std::string& context, const Bytes& first,
                                    const Bytes& second) {
  std::vector<unsigned char> message;
  message.reserve(1 + context.size() + 1 + first.size() + second.size());
  message.push_back(static_cast<unsigned char>(role));
  message.insert(message.end(), context.begin(), context.end());
  message.push_back(0);
  message.insert(message.end(), first.begin(), first.end());
  message.insert(message.end(), second.begin(), second.end());
  std::array<unsigned char, kMac> out{};
  unsigned int length = 0;
  init_crypto_once();
  const unsigned char* ok = ::HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
                                   reinterpret_cast<const unsigned char*>(message.data()),
                                   message.size(), out.data(), &length);
  EMBER_CHECK(ok != nullptr && length == kMac, "job secret", "HMAC-SHA256 failed");
  return out;
}

Bytes nonce() {
  init_crypto_once();
  Bytes n{};
  EMBER_CHECK(::RAND_bytes(n.data(), static_cast<int>(n.size())) == 1, "job secret",
              "RAND_bytes failed: no random nonce for the handshake");
  return n;
}

std::string read_failure(const char* what) {
  return errno == ETIMEDOUT ? std::string("sent no ") + what + " in time"
                            : std::string("closed the connection instead of sending its ") + what;
}

}  // namespace

const std::string& job_secret() {
  static const std::string secret = read_job_secret();
  return secret;
}

bool read_by(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_readable(fd, deadline)) {
      errno = ETIMEDOUT;
      return false;
    }
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool send_challenge(int fd, const std::string& secret, Challenge& challenge) {
  if (secret.empty()) return true;
  challenge = nonce();
  std::string message(kMagic, sizeof(kMagic));
  message.append(reinterpret_cast<const char*>(challenge.data()), challenge.size());
  // 36 bytes into a fresh connection's empty send buffer: never blocks.
  return ::send(fd, message.data(), message.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
         static_cast<ssize_t>(message.size());
}

std::string finish_accept(int fd, const std::string& secret, const std::string& context,
                          const Challenge& mine, std::chrono::steady_clock::time_point deadline) {
  if (secret.empty()) return {};
  Bytes theirs{};
  std::array<unsigned char, kMac> proof{};
  if (!read_by(fd, theirs.data(), theirs.size(), deadline) ||
      !read_by(fd, proof.data(), proof.size(), deadline)) {
    return read_failure("proof of the job secret");
  }
  const auto expected = mac(secret, 'c', context, mine, theirs);
  if (CRYPTO_memcmp(expected.data(), proof.data(), kMac) != 0) {
    return "failed the job-secret handshake (wrong secret, or none)";
  }
  const auto answer = mac(secret, 'a', context, mine, theirs);
  if (!write_all(fd, answer.data(), answer.size())) return "closed the connection";
  return {};
}

std::string accept_handshake(int fd, const std::string& secret, const std::string& context,
                             std::chrono::steady_clock::time_point deadline) {
  Challenge mine{};
  if (!send_challenge(fd, secret, mine)) return "closed the connection";
  return finish_accept(fd, secret, context, mine, deadline);
}

std::string connect_handshake(int fd, const std::string& secret, const std::string& context,
                              std::chrono::steady_clock::time_point deadline,
                              const std::string& first) {
  if (secret.empty()) {
    return write_all(fd, first.data(), first.size()) ? "" : "closed the connection";
  }
  char magic[sizeof(kMagic)] = {};
  Bytes theirs{};
  if (!read_by(fd, magic, sizeof(magic), deadline)) {
    return read_failure("job-secret challenge") + " (is the same EMBER_JOB_SECRET set there?)";
  }
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return "sent no job-secret challenge (is the same EMBER_JOB_SECRET set there?)";
  }
  if (!read_by(fd, theirs.data(), theirs.size(), deadline)) return read_failure("challenge");
  const Bytes mine = nonce();
  const auto proof = mac(secret, 'c', context, theirs, mine);
  std::string reply(reinterpret_cast<const char*>(mine.data()), mine.size());
  reply.append(reinterpret_cast<const char*>(proof.data()), proof.size());
  reply += first;
  if (!write_all(fd, reply.data(), reply.size())) return "closed the connection";
  std::array<unsigned char, kMac> answer{};
  if (!read_by(fd, answer.data(), answer.size(), deadline)) {
    return errno == ETIMEDOUT ? "sent no answer to the job-secret handshake in time"
                              : "refused this process's job secret (the secrets differ)";
  }
  const auto expected = mac(secret, 'a', context, theirs, mine);
  if (CRYPTO_memcmp(expected.data(), answer.data(), kMac) != 0) {
    return "answered the handshake without knowing the job secret";
  }
  return {};
}

std::string peer_address(int fd) {
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return "?";
  char text[INET6_ADDRSTRLEN] = {};
  if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    std::string out = "[";
    out += text;
    out += "]:";
    out += std::to_string(ntohs(a->sin6_port));
    return out;
  }
  if (peer.ss_family != AF_INET) return "?";
  const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
  ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(a->sin_port));
}

void log_dropped(const std::string& who, const std::string& message) {
  static std::atomic<int> lines{0};
  constexpr int kMaxLines = 200;
  const int n = lines.fetch_add(1);
  if (n > kMaxLines) return;
  if (n == kMaxLines) {
    std::fprintf(stderr, "ember::dist: %s: further dropped connections are not logged\n",
                 who.c_str());
  } else {
    std::fprintf(stderr, "ember::dist: %s: %s\n", who.c_str(), message.c_str());
  }
  std::fflush(stderr);
}

}  // namespace ember::dist::detail
