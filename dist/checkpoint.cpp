#include "checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include <nlohmann/json.hpp>

#include <ember/dist/flight_recorder.h>

#include "detail/default_group.h"
#include "init.h"

namespace ember::dist {

static_assert(std::endian::native == std::endian::little,
              "checkpoints store raw little-endian data");

namespace {

constexpr const char* kFormat = "ember.checkpoint.v1";

const char* safetensors_dtype(DType t) {
  switch (t) {
    case kF32:
      return "F32";
    case kF64:
      return "F64";
    case kF16:
      return "F16";
    case kBF16:
      return "BF16";
    case kI64:
      return "I64";
    case kI32:
      return "I32";
    case kU8:
      return "U8";
    case kBool:
      return "BOOL";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType& out) {
  for (DType t : {kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kBool}) {
    if (s == safetensors_dtype(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

uint64_t checksum(const char* data, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(data[i])) * 1099511628211ull;
  return h;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string system_error(const std::string& what, const std::string& path) {
  return ember::detail::str_cat("save_checkpoint: ", what, " ", path, ": ", std::strerror(errno));
}

void write_all(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const std::string message = system_error("cannot write", path);
      ::close(fd);
      ::unlink(path.c_str());
      throw Error(message);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

using FileStatus = struct stat;

bool same_file(const FileStatus& a, const FileStatus& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// NAME.tmp.DIGITS: what write_atomically writes before the rename.
bool is_temporary_name(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0 || at + 5 == name.size()) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(at + 5), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

// Creates `tmp` and takes its lock (held until the descriptor closes, by exit or death
// included), so that no other save removes it as stale while it is written.
int create_locked(const std::string& tmp) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error(system_error("cannot create", tmp));
    if (::flock(fd, LOCK_EX) != 0) {
      // A file system without locks: written unlocked, and no save takes a temporary file
      // there for stale (their lock cannot be taken either).
      if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) return fd;
      const std::string message = system_error("cannot lock", tmp);
      ::close(fd);
      throw Error(message);
    }
    FileStatus by_fd{}, by_path{};
    if (::fstat(fd, &by_fd) == 0 && ::stat(tmp.c_str(), &by_path) == 0 && same_file(by_fd, by_path))
      return fd;
    ::close(fd);  // another save took it for stale between the open and the lock: again
  }
  throw Error(ember::detail::str_cat("save_checkpoint: cannot keep the temporary file ", tmp,
                                     " (removed again and again while it was being created)"));
}

// Removes the temporary files in `dir` that no writer holds (their writer died mid-save).
void remove_stale_temporaries(const std::filesystem::path& dir, const std::string& own) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const fs::path path = it->path();
    const std::string name = path.filename().string();
    if (!is_temporary_name(name) || path.string() == own) continue;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    FileStatus by_fd{}, by_path{};
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &by_fd) == 0 && S_ISREG(by_fd.st_mode) &&
        ::lstat(path.c_str(), &by_path) == 0 && same_file(by_fd, by_path))
      ::unlink(path.c_str());
    ::close(fd);
  }
}

// Writes `bytes` to `path` so that readers see either the old file or the whole new one.
void write_atomically(const std::string& path, const std::vector<char>& bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp =
      (dir / (target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  const int fd = create_locked(tmp);
  remove_stale_temporaries(dir, tmp);  // before writing: their space may be needed
  write_all(fd, bytes.data(), bytes.size(), tmp);
  if (::fsync(fd) != 0) {
    const std::string message = system_error("cannot fsync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(message);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string message = system_error("cannot rename " + tmp + " to", path);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(message);
  }
  ::close(fd);  // the lock is held until the rename: the file is never taken for stale
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // makes the rename durable; best effort where directories cannot sync
    ::close(dfd);
  }
}

std::vector<char> serialize(const std::map<std::string, Tensor>& tensors,
                            std::map<std::string, std::string> metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<char> data;
  for (const auto& [name, t] : tensors) {
    const Tensor host = t.detach().to(kCPU).contiguous();
    const size_t begin = data.size();
    const auto* p = static_cast<const char*>(host.data_ptr());
    data.insert(data.end(), p, p + host.nbytes());
    header[name] = {{"dtype", safetensors_dtype(host.dtype())},
                    {"shape", host.sizes()},
                    {"data_offsets", {begin, data.size()}}};
  }
  metadata["format"] = kFormat;
  metadata["checksum"] = std::to_string(checksum(data.data(), data.size()));
  header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const uint64_t length = text.size();
  std::vector<char> out(8 + text.size() + data.size());
  std::memcpy(out.data(), &length, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + text.size(), data.data(), data.size());
  return out;
}

template <typename... Parts>
Error load_error(const std::string& path, const Parts&... parts) {
  return Error(ember::detail::str_cat("load_checkpoint: ", path, ": ", parts...));
}

// The header's length from the file's first 8 bytes, checked against the file's size.
uint64_t header_length(const std::string& path, const char* first8, uint64_t file_size) {
  if (file_size < 8)
    throw load_error(path, "the file is ", file_size, " bytes, too short for a safetensors header");
  uint64_t length = 0;
  std::memcpy(&length, first8, 8);
  if (length > file_size - 8)
    throw load_error(path, "the header claims ", length, " bytes but the file holds only ",
                     file_size - 8, " after the length (truncated or not a checkpoint)");
  return length;
}

nlohmann::json parse_header(const std::string& path, const char* text, uint64_t length) {
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + length);
  } catch (const nlohmann::json::exception& e) {
    throw load_error(path, "the header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) throw load_error(path, "the header is not a JSON object");
  return header;
}

std::map<std::string, std::string> metadata_of(const std::string& path,
                                               const nlohmann::json& header) {
  std::map<std::string, std::string> out;
  if (!header.contains("__metadata__")) return out;
  const auto& meta = header["__metadata__"];
  if (!meta.is_object()) throw load_error(path, "__metadata__ is not an object");
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) throw load_error(path, "metadata \"", key, "\" is not a string");
    out[key] = value.get<std::string>();
  }
  return out;
}

// The random states' metadata keys: rank 0's where ember always kept them (so files from
// before per-rank states load as rank 0's), the other ranks' under keys of their own, and how
// many ranks' states the file holds (absent: 1).
constexpr const char* kRngRanks = "rng_ranks";
std::string rng_key(const std::string& name, int64_t rank, const char* field) {
  return rank == 0 ? "rng." + name + "." + field
                   : "rng_rank." + std::to_string(rank) + "." + name + "." + field;
}

// This process's generator states: seed, offset of each generator, in name order.
std::vector<int64_t> own_rng_states(const Checkpoint& c) {
  std::vector<int64_t> out;
  for (const auto& [name, gen] : c.generators) {
    EMBER_CHECK(gen != nullptr, "save_checkpoint", "generator \"", name, "\" is null");
    out.push_back(std::bit_cast<int64_t>(gen->seed()));
    out.push_back(std::bit_cast<int64_t>(gen->offset()));
  }
  return out;
}

// Every rank's own_rng_states, by rank: two all-gathers over `group`, the first checking that
// every rank names the same generators.
std::vector<std::vector<int64_t>> gather_rng_states(const Checkpoint& c, ProcessGroup& group) {
  const std::vector<int64_t> mine = own_rng_states(c);
  auto all_gather = [&group](const std::vector<int64_t>& values) {
    const auto n = static_cast<int64_t>(values.size());
    const Tensor input = from_vector<int64_t>(values, {n}).to(group.tensor_device());
    std::vector<Tensor> outputs;
    for (int r = 0; r < group.size(); ++r) outputs.push_back(empty({n}, input.options()));
    group.allgather(outputs, input)->wait();
    std::vector<std::vector<int64_t>> out;
    for (const Tensor& t : outputs) out.push_back(t.to_vector<int64_t>());
    return out;
  };
  uint64_t names = 14695981039346656037ull;
  for (const auto& [name, gen] : c.generators) {
    names = checksum(name.data(), name.size()) ^ (names * 1099511628211ull);
  }
  const auto described =
      all_gather({static_cast<int64_t>(mine.size()), std::bit_cast<int64_t>(names)});
  for (size_t r = 1; r < described.size(); ++r) {
    EMBER_CHECK(described[r] == described[0], "save_checkpoint", "rank ", r, " saves ",
                described[r][0] / 2, " generator(s) and rank 0 saves ", described[0][0] / 2,
                described[r][0] == described[0][0] ? " named differently" : "",
                "; every rank must save the same generators");
  }
  if (mine.empty()) return std::vector<std::vector<int64_t>>(described.size());
  return all_gather(mine);
}

// Builds the file of `c`, with the random states `rng` (by rank), and writes it to `path`.
void write_checkpoint(const std::string& path, const Checkpoint& c,
                      const std::vector<std::vector<int64_t>>& rng) {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta;
  if (c.model != nullptr) {
    for (const auto& [name, t] : c.model->state_dict()) tensors["model." + name] = t;
  }
  if (c.optimizer != nullptr) {
    const optim::StateDict sd = c.optimizer->state_dict();
    for (const auto& [key, t] : sd.tensors) tensors["optimizer." + key] = t;
    for (const auto& [key, v] : sd.scalars) meta["optimizer." + key] = number(v);
  }
  if (c.scheduler != nullptr) {
    for (const auto& [key, v] : c.scheduler->state_dict().scalars)
      meta["scheduler." + key] = number(v);
  }
  if (c.grad_scaler != nullptr) {
    for (const auto& [key, v] : c.grad_scaler->state_dict().scalars)
      meta["grad_scaler." + key] = number(v);
  }
  if (!c.generators.empty()) {
    meta[kRngRanks] = std::to_string(rng.size());
    for (size_t r = 0; r < rng.size(); ++r) {
      size_t i = 0;
      for (const auto& [name, gen] : c.generators) {
        const auto rank = static_cast<int64_t>(r);
        meta[rng_key(name, rank, "seed")] = std::to_string(std::bit_cast<uint64_t>(rng[r][i]));
        meta[rng_key(name, rank, "offset")] =
            std::to_string(std::bit_cast<uint64_t>(rng[r][i + 1]));
        i += 2;
      }
    }
  }
  if (c.sampler != nullptr) {
    EMBER_CHECK(c.sampler_consumed >= 0 && c.sampler_consumed <= c.sampler->size(),
                "save_checkpoint", "sampler_consumed ", c.sampler_consumed, " is outside [0, ",
                c.sampler->size(), "] (the sampler's remaining indices)");
    for (const auto& [key, text] : c.sampler->state(c.sampler_consumed).to_strings())
      meta["sampler." + key] = text;  // in global terms: it loads on any number of ranks
  }
  for (const auto& [key, v] : c.values) meta["values." + key] = number(v);
  for (const auto& [key, text] : c.texts) {
    bool utf8 = true;  // the header is JSON, whose strings are UTF-8
    try {
      (void)nlohmann::json(text).dump();
    } catch (const nlohmann::json::exception&) {
      utf8 = false;
    }
    EMBER_CHECK(utf8, "save_checkpoint", "text \"", key, "\" is not valid UTF-8");
    meta["texts." + key] = text;
  }
  meta["epoch"] = std::to_string(c.epoch);
  meta["step"] = std::to_string(c.step);
  write_atomically(path, serialize(tensors, std::move(meta)));
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& c, ProcessGroup* group) {
  if (group == nullptr && is_initialized() &&
      detail::default_group_for("save_checkpoint")->rank() != 0)
    return;  // not collective: rank 0 of the default group writes
  EMBER_CHECK(group == nullptr || group->is_member(), "save_checkpoint",
              "this rank is not a member of the group");
  if (group == nullptr || group->size() == 1) return write_checkpoint(path, c, {own_rng_states(c)});
  const CollectiveTag tag("save_checkpoint");  // what the flight recorder calls its collectives
  const std::vector<std::vector<int64_t>> rng = gather_rng_states(c, *group);
  std::string failure;  // rank 0's, told to the others
  if (group->rank() == 0) {
    try {
      write_checkpoint(path, c, rng);
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  // Every rank returns once rank 0 has written, or fails with it.
  Tensor written = from_vector<int64_t>({failure.empty() ? 1 : 0}, {1}).to(group->tensor_device());
  group->broadcast(written, 0)->wait();
  if (!failure.empty()) throw Error(failure);
  EMBER_CHECK(written.item<int64_t>() == 1, "save_checkpoint", "rank 0 failed to write ", path,
              " (its error says why)");
}

CheckpointFile read_checkpoint(const std::string& path, Device device) {
  auto fail = [&path](const auto&... parts) { return load_error(path, parts...); };
  std::ifstream in(path, std::ios::binary);
  if (!in) throw fail("cannot open the file (", std::strerror(errno), ")");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  const uint64_t length = header_length(path, bytes.data(), bytes.size());
  const nlohmann::json header = parse_header(path, bytes.data() + 8, length);
  const char* data = bytes.data() + 8 + length;
  const uint64_t data_size = bytes.size() - 8 - length;
  CheckpointFile out;
  out.metadata = metadata_of(path, header);
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets"))
      throw fail("tensor \"", name, "\" lacks dtype, shape or data_offsets");
    Entry e{name, kF32, {}, 0, 0};
    if (!info["dtype"].is_string() || !parse_dtype(info["dtype"].get<std::string>(), e.dtype))
      throw fail("tensor \"", name, "\" has unknown dtype ", info["dtype"].dump());
    if (!info["shape"].is_array())
      throw fail("tensor \"", name, "\" has a shape that is not a list");
    uint64_t numel = 1;
    for (const auto& s : info["shape"]) {
      if (!s.is_number_unsigned())
        throw fail("tensor \"", name, "\" has shape ", info["shape"].dump());
      e.shape.push_back(s.get<int64_t>());
      numel *= s.get<uint64_t>();
    }
    const auto& offsets = info["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      throw fail("tensor \"", name, "\" has data_offsets ", offsets.dump());
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      throw fail("tensor \"", name, "\" has data_offsets [", e.begin, ", ", e.end,
                 "] outside the data region of ", data_size, " bytes (truncated file?)");
    if (e.end - e.begin != numel * element_size(e.dtype))
      throw fail("tensor \"", name, "\" of shape ", shape_str(e.shape), " and dtype ",
                 info["dtype"].get<std::string>(), " needs ", numel * element_size(e.dtype),
                 " bytes but data_offsets span ", e.end - e.begin);
    entries.push_back(std::move(e));
  }
  std::vector<const Entry*> sorted;
  for (const auto& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  uint64_t cursor = 0;
  for (const Entry* e : sorted) {
    if (e->begin != cursor)
      throw fail("tensor \"", e->name, "\" starts at byte ", e->begin,
                 " but the previous one ends at ", cursor,
                 " (data must be contiguous, without gaps or overlaps)");
    cursor = e->end;
  }
  if (cursor != data_size)
    throw fail("the tensors cover ", cursor, " bytes of a data region of ", data_size, " bytes");
  const auto sum = out.metadata.find("checksum");
  if (sum != out.metadata.end() && sum->second != std::to_string(checksum(data, data_size)))
    throw fail("the data checksum does not match the header (the file is corrupted)");

  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    std::memcpy(t.data_ptr(), data + e.begin, e.end - e.begin);
    out.tensors[e.name] = device == kCPU ? t : t.to(device);
  }
  return out;
}

std::map<std::string, std::string> read_checkpoint_metadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw load_error(path, "cannot open the file (", std::strerror(errno), ")");
  const auto file_size = static_cast<uint64_t>(in.tellg());
  char first8[8] = {};
  in.seekg(0);
  in.read(first8, file_size < 8 ? static_cast<std::streamsize>(file_size) : 8);
  const uint64_t length = header_length(path, first8, file_size);
  std::string text(length, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(length)))
    throw load_error(path, "cannot read the header (", std::strerror(errno), ")");
  return metadata_of(path, parse_header(path, text.data(), length));
}

void load_checkpoint(const std::string& path, Checkpoint& c, Device device,
                     const ProcessGroup* group) {
  // This rank of the loading group and its size.
  std::shared_ptr<ProcessGroup> default_group;
  if (group == nullptr && is_initialized())
    default_group = detail::default_group_for("load_checkpoint");
  const ProcessGroup* loading = group != nullptr ? group : default_group.get();
  EMBER_CHECK(loading == nullptr || loading->is_member(), "load_checkpoint",
              "this rank is not a member of the group");
  const int64_t rank = loading != nullptr ? loading->rank() : 0;
  const int64_t size = loading != nullptr ? loading->size() : 1;

  CheckpointFile file = read_checkpoint(path, device);
  auto fail = [&path](const auto&... parts) { return load_error(path, parts...); };
  auto meta = [&](const std::string& key) -> const std::string& {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) throw fail("the checkpoint has no \"", key, "\"");
    return it->second;
  };
  auto integer = [&](const std::string& key) -> uint64_t {
    const std::string& s = meta(key);
    try {
      size_t used = 0;
      const uint64_t v = std::stoull(s, &used);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    throw fail("metadata \"", key, "\" = \"", s, "\" is not an unsigned integer");
  };
  auto real = [&](const std::string& key, const std::string& s) -> double {
    try {
      size_t used = 0;
      const double v = std::stod(s, &used);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    throw fail("metadata \"", key, "\" = \"", s, "\" is not a number");
  };
  auto with_prefix = [&](const std::string& prefix) {
    optim::StateDict sd;
    for (const auto& [key, t] : file.tensors) {
      if (key.rfind(prefix, 0) == 0) sd.tensors[key.substr(prefix.size())] = t;
    }
    for (const auto& [key, s] : file.metadata) {
      if (key.rfind(prefix, 0) == 0) sd.scalars[key.substr(prefix.size())] = real(key, s);
    }
    return sd;
  };
  auto it = file.metadata.find("format");
  if (it == file.metadata.end() || it->second != kFormat)
    throw fail("not an ember checkpoint (metadata \"format\" is ",
               it == file.metadata.end() ? std::string("missing") : "\"" + it->second + "\"",
               ", expected \"", kFormat, "\")");

  // Everything is read and checked before anything changes.
  const int64_t epoch = static_cast<int64_t>(integer("epoch"));
  const int64_t step = static_cast<int64_t>(integer("step"));
  std::map<std::string, std::pair<uint64_t, uint64_t>> rng;
  const bool per_rank = file.metadata.count(kRngRanks) != 0;
  const auto saved_ranks =
      static_cast<int64_t>(per_rank ? std::max<uint64_t>(integer(kRngRanks), 1) : 1);
  for (const auto& [name, gen] : c.generators) {
    const uint64_t seed0 = integer(rng_key(name, 0, "seed"));
    if (rank < saved_ranks)
      rng[name] = {integer(rng_key(name, rank, "seed")), integer(rng_key(name, rank, "offset"))};
    else  // a rank the run did not have: a fresh state derived from rank 0's seed
      rng[name] = per_rank ? std::pair{seed0 + static_cast<uint64_t>(rank), uint64_t{0}}
                           : std::pair{seed0, integer(rng_key(name, 0, "offset"))};
  }
  if (!c.generators.empty() && per_rank && saved_ranks != size && rank == 0) {
    auto ranks = [](int64_t first, int64_t last) {
      return first == last ? "rank " + std::to_string(first)
                           : ember::detail::str_cat("ranks ", first, " to ", last);
    };
    const std::string what = size > saved_ranks
                                 ? ranks(saved_ranks, size - 1) +
                                       (size - saved_ranks == 1 ? " starts" : " start") +
                                       " afresh (rank 0's seed + the rank, offset 0)"
                                 : "the states of " + ranks(size, saved_ranks - 1) + " go unused";
    std::fprintf(stderr,
                 "ember: warning: load_checkpoint: %s holds the random states of %lld rank%s and "
                 "is loaded on %lld: %s\n",
                 path.c_str(), static_cast<long long>(saved_ranks), saved_ranks == 1 ? "" : "s",
                 static_cast<long long>(size), what.c_str());
  }
  SamplerState sampler_state;
  if (c.sampler != nullptr) {
    try {
      sampler_state = c.sampler->state_from_strings(file.metadata, "sampler.");
    } catch (const Error& e) {
      throw fail(e.what());
    }
    const std::string why = c.sampler->refusal(sampler_state);
    if (!why.empty()) throw fail("the sampler cannot continue: ", why);
  }
  nn::NamedTensors model_state;
  if (c.model != nullptr) {
    const optim::StateDict sd = with_prefix("model.");
    for (const auto& [key, t] : sd.tensors) model_state.emplace_back(key, t);
  }
  const optim::StateDict optimizer_state = with_prefix("optimizer.");
  const optim::StateDict scheduler_state = with_prefix("scheduler.");
  const optim::StateDict values = with_prefix("values.");
  const optim::StateDict scaler_state = with_prefix("grad_scaler.");
  if (c.optimizer != nullptr && optimizer_state.scalars.empty())
    throw fail("the checkpoint holds no optimizer state");
  if (c.scheduler != nullptr && scheduler_state.scalars.empty())
    throw fail("the checkpoint holds no scheduler state");

  try {
    if (c.model != nullptr) c.model->load_state_dict(model_state, /*strict=*/true);
    if (c.optimizer != nullptr) c.optimizer->load_state_dict(optimizer_state);
    if (c.scheduler != nullptr) c.scheduler->load_state_dict(scheduler_state);
    if (c.grad_scaler != nullptr && !scaler_state.scalars.empty())
      c.grad_scaler->load_state_dict(scaler_state);
  } catch (const Error& e) {
    throw fail(e.what());
  }
  for (const auto& [name, gen] : c.generators) gen->set_state(rng[name].first, rng[name].second);
  if (c.sampler != nullptr) {
    c.sampler->load_state(sampler_state);
    c.sampler_consumed = 0;
  }
  c.values = values.scalars;
  c.texts.clear();
  for (const auto& [key, text] : file.metadata) {
    if (key.rfind("texts.", 0) == 0) c.texts[key.substr(6)] = text;
  }
  c.epoch = epoch;
  c.step = step;
}

}  // namespace ember::dist
