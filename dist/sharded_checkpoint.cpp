#include "sharded_checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include <ember/dist/flight_recorder.h>
#include <ember/tensor/grad_mode.h>

#include "detail/safetensors.h"

namespace ember::dist {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSave = "save_sharded_checkpoint";
constexpr const char* kLoad = "load_sharded_checkpoint";
constexpr const char* kIndexName = "index.json";
constexpr const char* kIndexFormat = "ember.sharded.v1";
constexpr const char* kShardFormat = "ember.shard.v1";
constexpr uint64_t kMaxIndexBytes = 100'000'000;  // as a safetensors header
constexpr int64_t kMaxWorldSize = 1 << 20;
constexpr uint64_t kChunkBytes = 1 << 20;  // the buffer bytes pass through on their way

// Shard metadata keys (the caller's own keys are kept as given).
const std::string kPrefix = "ember.";
const std::string kSaveKey = "ember.save";
const std::string kRankKey = "ember.rank";
const std::string kWorldKey = "ember.world_size";
const std::string kShapeKey = "ember.shape.";
const std::string kBeginKey = "ember.begin.";
const std::string kSumKey = "ember.checksum.";

bool is_reserved(const std::string& key) {
  return key == "format" || key == "checksum" || key.rfind(kPrefix, 0) == 0;
}

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shard_file_name(int64_t rank, int64_t world, const std::string& save) {
  return ember::detail::str_cat("shard-", rank, "-of-", world, "-", save, ".safetensors");
}

// A name in the folder itself: no separator, not "." or "..".
bool is_plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string("/\0", 2)) == std::string::npos;
}

// One piece of a tensor: flat elements [begin, end) held by rank `shard`.
struct Piece {
  int64_t shard = 0, begin = 0, end = 0;
};

// Checks that `pieces` (sorted here) cover [0, numel) once; `fail` makes the error.
template <typename Fail>
void check_cover(const std::string& name, int64_t numel, std::vector<Piece>& pieces, Fail fail) {
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return std::tie(a.begin, a.shard) < std::tie(b.begin, b.shard);
  });
  int64_t cursor = 0, previous = -1;
  for (const Piece& p : pieces) {
    if (p.begin > cursor)
      throw fail("tensor \"", name, "\": elements [", cursor, ", ", p.begin,
                 ") are held by no rank");
    if (p.begin < cursor)
      throw fail("tensor \"", name, "\": elements from ", p.begin, " are held twice (ranks ",
                 previous, " and ", p.shard, ")");
    cursor = p.end;
    previous = p.shard;
  }
  if (cursor != numel)
    throw fail("tensor \"", name, "\": elements [", cursor, ", ", numel, ") are held by no rank");
}

// What a shard's header says of one piece.
struct ShardPiece {
  DType dtype = kF32;
  Shape shape;  // the full tensor's
  int64_t begin = 0, end = 0;
  uint64_t data = 0;  // byte offset in the data region
  uint64_t checksum = 0;
};

// A shard's header, read and checked (against itself; callers check it against the others).
struct ShardHeader {
  std::string save;
  int64_t rank = 0, world = 0;
  std::map<std::string, ShardPiece> pieces;
  std::map<std::string, std::string> metadata;  // the caller's
};

ShardHeader describe_shard(const detail::SafetensorsFile& file) {
  auto fail = [&file](const auto&... parts) {
    return detail::file_error(file.op(), file.path(), parts...);
  };
  const auto& meta = file.metadata();
  auto field = [&](const std::string& key) -> const std::string& {
    const auto it = meta.find(key);
    if (it == meta.end()) throw fail("the shard has no metadata \"", key, "\"");
    return it->second;
  };
  auto integer = [&](const std::string& key, uint64_t most = INT64_MAX) {
    uint64_t v = 0;
    if (!detail::parse_count(field(key), v) || v > most)
      throw fail("metadata \"", key, "\" = \"", field(key), "\" is not an unsigned integer");
    return v;
  };
  if (meta.count("format") == 0 || meta.at("format") != kShardFormat)
    throw fail("not an ember shard (metadata \"format\" is ",
               meta.count("format") == 0 ? "missing" : "\"" + meta.at("format") + "\"",
               ", expected \"", kShardFormat, "\")");
  ShardHeader out;
  out.save = field(kSaveKey);
  out.rank = static_cast<int64_t>(integer(kRankKey));
  out.world = static_cast<int64_t>(integer(kWorldKey));
  for (const detail::SafetensorsEntry& e : file.entries()) {
    ShardPiece p;
    p.dtype = e.dtype;
    int64_t numel = 0;
    json shape;
    try {
      shape = json::parse(field(kShapeKey + e.name));
    } catch (const json::exception&) {
    }
    if (!detail::parse_shape(shape, p.shape, numel))
      throw fail("metadata \"", kShapeKey, e.name, "\" = \"", field(kShapeKey + e.name),
                 "\" is not a shape");
    const int64_t count = e.shape.size() == 1 ? e.shape[0] : -1;
    p.begin = static_cast<int64_t>(integer(kBeginKey + e.name));
    if (count < 0 || p.begin > numel || count > numel - p.begin)
      throw fail("tensor \"", e.name, "\" of shape ", shape_str(e.shape), " from element ", p.begin,
                 " does not fit in the full shape ", shape_str(p.shape), " (a piece is 1-D)");
    p.end = p.begin + count;
    p.data = e.begin;
    p.checksum = integer(kSumKey + e.name, UINT64_MAX);
    out.pieces[e.name] = std::move(p);
  }
  for (const auto& [key, value] : meta) {
    if (!is_reserved(key)) out.metadata[key] = value;
  }
  return out;
}

// The bytes of this rank's shard.
std::vector<char> shard_bytes(const ShardedState& state, int64_t rank, int64_t world,
                              const std::string& save) {
  std::map<std::string, Tensor> pieces;
  std::map<std::string, std::string> meta;
  for (const auto& [key, value] : state.metadata) {
    EMBER_CHECK(!is_reserved(key), kSave, "metadata key \"", key,
                "\" is reserved (\"format\", \"checksum\" and \"ember.*\")");
    meta[key] = value;
  }
  auto add = [&](const std::string& name, const Shape& shape, int64_t begin, const Tensor& flat) {
    const Tensor host = flat.detach().to(kCPU).contiguous();
    pieces[name] = host;
    meta[kShapeKey + name] = json(shape).dump();
    meta[kBeginKey + name] = std::to_string(begin);
    meta[kSumKey + name] =
        std::to_string(detail::checksum(static_cast<const char*>(host.data_ptr()), host.nbytes()));
  };
  for (const auto& [name, t] : state.replicated) {
    EMBER_CHECK(t.defined(), kSave, "replicated tensor \"", name, "\" is undefined");
    EMBER_CHECK(state.sharded.count(name) == 0, kSave, "tensor \"", name,
                "\" is both replicated and sharded");
    const auto [begin, end] = even_split(t.numel(), rank, world);
    if (end > begin || (t.numel() == 0 && rank == 0))
      add(name, t.sizes(), begin, t.detach().reshape({-1}).narrow(0, begin, end - begin));
  }
  for (const auto& [name, s] : state.sharded) {
    EMBER_CHECK(s.values.defined(), kSave, "sharded tensor \"", name, "\" is undefined");
    for (int64_t d : s.shape)
      EMBER_CHECK(d >= 0, kSave, "sharded tensor \"", name, "\" has shape ", shape_str(s.shape));
    const int64_t numel = numel_of(s.shape);
    EMBER_CHECK(s.begin >= 0 && s.begin <= numel && s.values.numel() <= numel - s.begin, kSave,
                "sharded tensor \"", name, "\": elements [", s.begin, ", ",
                s.begin + s.values.numel(), ") are outside its shape ", shape_str(s.shape), " (",
                numel, " elements)");
    add(name, s.shape, s.begin, s.values.detach().reshape({-1}));
  }
  meta[kSaveKey] = save;
  meta[kRankKey] = std::to_string(rank);
  meta[kWorldKey] = std::to_string(world);
  return detail::serialize_safetensors(pieces, std::move(meta), kShardFormat);
}

// Rank 0, once every shard exists: reads their headers, checks that they fit together and
// writes the index; then removes the shards of earlier saves.
void write_index(const fs::path& dir, int64_t world, const std::string& save) {
  auto fail = [&dir](const auto&... parts) {
    return Error(ember::detail::str_cat(kSave, ": ", dir.string(), ": ", parts...));
  };
  struct Layout {
    DType dtype;
    Shape shape;
    int64_t first_rank;  // the first to hold part of it
    std::vector<Piece> pieces;
  };
  std::map<std::string, Layout> tensors;
  std::map<std::string, std::pair<std::string, int64_t>> metadata;  // value, first rank
  std::vector<std::string> shards;
  for (int64_t r = 0; r < world; ++r) {
    shards.push_back(shard_file_name(r, world, save));
    const detail::SafetensorsFile file(kSave, (dir / shards.back()).string());
    const ShardHeader header = describe_shard(file);
    if (header.save != save || header.rank != r || header.world != world)
      throw fail(shards.back(), " is not rank ", r, "'s shard of this save");
    for (const auto& [name, p] : header.pieces) {
      auto [it, first] = tensors.try_emplace(name, Layout{p.dtype, p.shape, r, {}});
      if (!first && (it->second.dtype != p.dtype || it->second.shape != p.shape))
        throw fail("tensor \"", name, "\" is ", detail::safetensors_dtype(p.dtype), " ",
                   shape_str(p.shape), " on rank ", r, " but ",
                   detail::safetensors_dtype(it->second.dtype), " ", shape_str(it->second.shape),
                   " on rank ", it->second.first_rank);
      // Empty pieces only for empty tensors, so that every tensor has one to name its shard.
      if (p.end > p.begin || numel_of(p.shape) == 0)
        it->second.pieces.push_back({r, p.begin, p.end});
    }
    for (const auto& [key, value] : header.metadata) {
      auto [it, first] = metadata.try_emplace(key, value, r);
      if (!first && it->second.first != value)
        throw fail("metadata \"", key, "\" is \"", it->second.first, "\" on rank ",
                   it->second.second, " but \"", value, "\" on rank ", r);
    }
  }
  json index = {{"format", kIndexFormat},     {"save", save},
                {"world_size", world},        {"shards", shards},
                {"metadata", json::object()}, {"tensors", json::object()}};
  for (const auto& [key, value] : metadata) index["metadata"][key] = value.first;
  for (auto& [name, t] : tensors) {
    check_cover(name, numel_of(t.shape), t.pieces, fail);
    json pieces = json::array();
    for (const Piece& p : t.pieces)
      pieces.push_back({{"shard", p.shard}, {"begin", p.begin}, {"end", p.end}});
    index["tensors"][name] = {{"dtype", detail::safetensors_dtype(t.dtype)},
                              {"shape", t.shape},
                              {"pieces", std::move(pieces)}};
  }
  const std::string text = index.dump(1) + "\n";
  detail::write_atomically(kSave, (dir / kIndexName).string(),
                           std::vector<char>(text.begin(), text.end()));
  static const std::regex shard_name("shard-[0-9]+-of-[0-9]+-[0-9a-f]{16}\\.safetensors");
  const std::set<std::string> current(shards.begin(), shards.end());
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, shard_name) && current.count(name) == 0) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

// Runs `work` on the ranks where `active` holds, then tells every rank who failed. When one
// did, `undo` runs and every rank throws: this rank's own error, else one naming the first
// rank that failed to write `what`.
template <typename Work, typename Undo>
void run_everywhere(ProcessGroup& group, bool active, const std::string& what, Work work,
                    Undo undo) {
  std::string failure;
  if (active) {
    try {
      work();
    } catch (const std::exception& e) {
      failure = e.what();
      if (failure.empty()) failure = ember::detail::str_cat(kSave, ": failed");
    }
  }
  const Tensor flag =
      from_vector<int64_t>({failure.empty() ? 0 : 1}, {1}).to(group.tensor_device());
  std::vector<Tensor> flags;
  for (int r = 0; r < group.size(); ++r) flags.push_back(empty({1}, flag.options()));
  group.allgather(flags, flag)->wait();
  for (int r = 0; r < group.size(); ++r) {
    if (flags[static_cast<size_t>(r)].item<int64_t>() == 0) continue;
    undo();
    if (!failure.empty()) throw Error(failure);
    throw Error(ember::detail::str_cat(kSave, ": rank ", r, " failed to write ", what,
                                       " (its error says why)"));
  }
}

}  // namespace

std::pair<int64_t, int64_t> even_split(int64_t numel, int64_t rank, int64_t world_size) {
  EMBER_CHECK(numel >= 0 && world_size >= 1 && rank >= 0 && rank < world_size, "even_split",
              "cannot split ", numel, " elements for rank ", rank, " of ", world_size);
  const int64_t base = numel / world_size, extra = numel % world_size;
  const int64_t begin = rank * base + std::min(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

void add_state_dict(ShardedState& state, const optim::StateDict& dict, const std::string& prefix) {
  auto check = [&state](const std::string& key) {
    EMBER_CHECK(state.replicated.count(key) == 0 && state.sharded.count(key) == 0 &&
                    state.metadata.count(key) == 0,
                "add_state_dict", "\"", key, "\" is in the state already");
  };
  for (const auto& [key, t] : dict.tensors) {
    EMBER_CHECK(t.defined(), "add_state_dict", "tensor \"", key, "\" is undefined");
    check(prefix + key);
  }
  for (const auto& [key, v] : dict.scalars) check(prefix + key);
  for (const auto& [key, t] : dict.tensors) state.sharded[prefix + key] = {t.sizes(), 0, t};
  for (const auto& [key, v] : dict.scalars) state.metadata[prefix + key] = detail::format_number(v);
}

void save_sharded_checkpoint(const std::string& dir, const ShardedState& state,
                             ProcessGroup& group) {
  EMBER_CHECK(group.is_member(), kSave, "this rank is not a member of the group");
  const CollectiveTag tag(kSave);  // what the flight recorder calls its collectives
  // The save's ID, rank 0's draw: names this save's shards apart from any earlier ones.
  std::random_device entropy;
  const uint64_t draw = (static_cast<uint64_t>(entropy()) << 32) | entropy();
  Tensor id = from_vector<int64_t>({std::bit_cast<int64_t>(draw)}, {1}).to(group.tensor_device());
  group.broadcast(id, 0)->wait();
  char save[17];
  std::snprintf(save, sizeof(save), "%016" PRIx64, static_cast<uint64_t>(id.item<int64_t>()));
  const int64_t rank = group.rank(), world = group.size();
  const fs::path folder(dir);
  const fs::path shard = folder / shard_file_name(rank, world, save);
  auto remove_shard = [&shard] {  // no index will name this save's shards
    std::error_code ignored;
    fs::remove(shard, ignored);
  };
  run_everywhere(
      group, true, "its shard of " + dir,
      [&] {
        std::error_code ec;
        fs::create_directories(folder, ec);
        if (ec && !fs::is_directory(folder))
          throw Error(ember::detail::str_cat(kSave, ": cannot create the folder ", dir, ": ",
                                             ec.message()));
        detail::write_atomically(kSave, shard.string(), shard_bytes(state, rank, world, save));
      },
      remove_shard);
  run_everywhere(
      group, rank == 0, "the index of " + dir, [&] { write_index(folder, world, save); },
      remove_shard);
}

struct ShardedCheckpoint::Impl {
  struct Shard {
    std::unique_ptr<detail::SafetensorsFile> file;
    ShardHeader header;
  };

  std::string dir, index_path, save;
  int64_t world = 0;
  std::vector<std::string> shard_paths;
  std::map<std::string, std::string> metadata;
  std::map<std::string, TensorInfo> infos;
  std::map<std::string, std::vector<Piece>> pieces;
  mutable std::mutex mutex;
  mutable std::vector<Shard> shards;  // opened when first needed

  template <typename... Parts>
  Error fail(const Parts&... parts) const {
    return detail::file_error(kLoad, index_path, parts...);
  }

  void read_index();
  const TensorInfo& info(const std::string& name) const;
  // Checks that `name` has elements [begin, end).
  void check_range(const std::string& name, int64_t begin, int64_t end) const;
  const Shard& shard(int64_t rank) const;
  // Writes elements [begin, end) of `name` to `dst`.
  void fill(const std::string& name, int64_t begin, int64_t end, char* dst) const;
};

void ShardedCheckpoint::Impl::read_index() {
  std::error_code ec;
  const uintmax_t size = fs::file_size(index_path, ec);
  if (ec) throw fail("cannot read the index (", ec.message(), ")");
  if (size > kMaxIndexBytes)
    throw fail("the index is ", size, " bytes, more than the limit of ", kMaxIndexBytes);
  std::ifstream in(index_path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw fail("cannot read the index (", std::strerror(errno), ")");
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    throw fail("the index is not valid JSON (", e.what(), ")");
  }
  if (!index.is_object() || !index.contains("format") || index["format"] != kIndexFormat)
    throw fail("not an ember sharded snapshot index (\"format\" is ",
               index.is_object() && index.contains("format") ? index["format"].dump() : "missing",
               ", expected \"", kIndexFormat, "\")");
  for (const char* key : {"save", "world_size", "shards", "metadata", "tensors"}) {
    if (!index.contains(key)) throw fail("the index has no \"", key, "\"");
  }
  if (!index["save"].is_string()) throw fail("\"save\" is ", index["save"].dump());
  save = index["save"].get<std::string>();
  const json& w = index["world_size"];
  if (!w.is_number_unsigned() || w.get<uint64_t>() < 1 || w.get<uint64_t>() > kMaxWorldSize)
    throw fail("\"world_size\" is ", w.dump(), ", not in [1, ", kMaxWorldSize, "]");
  world = w.get<int64_t>();
  const json& names = index["shards"];
  if (!names.is_array() || static_cast<int64_t>(names.size()) != world)
    throw fail("\"shards\" is not a list of ", world, " file names (one per rank)");
  for (int64_t r = 0; r < world; ++r) {
    const json& name = names[static_cast<size_t>(r)];
    if (!name.is_string() || !is_plain_name(name.get<std::string>()))
      throw fail("rank ", r, "'s shard ", name.dump(), " is not a file name in the folder");
    shard_paths.push_back((fs::path(dir) / name.get<std::string>()).string());
    struct stat st {};
    if (::stat(shard_paths.back().c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      throw detail::file_error(kLoad, shard_paths.back(), "missing: rank ", r,
                               "'s shard, named by the index, is not a file (",
                               std::strerror(errno), ")");
  }
  shards.resize(static_cast<size_t>(world));
  if (!index["metadata"].is_object()) throw fail("\"metadata\" is not an object");
  for (const auto& [key, value] : index["metadata"].items()) {
    if (!value.is_string()) throw fail("metadata \"", key, "\" is not a string");
    metadata[key] = value.get<std::string>();
  }
  if (!index["tensors"].is_object()) throw fail("\"tensors\" is not an object");
  for (const auto& [name, t] : index["tensors"].items()) {
    TensorInfo ti;
    int64_t numel = 0;
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("pieces"))
      throw fail("tensor \"", name, "\" lacks dtype, shape or pieces");
    if (!t["dtype"].is_string() ||
        !detail::parse_safetensors_dtype(t["dtype"].get<std::string>(), ti.dtype))
      throw fail("tensor \"", name, "\" has unknown dtype ", t["dtype"].dump());
    if (!detail::parse_shape(t["shape"], ti.shape, numel))
      throw fail("tensor \"", name, "\" has shape ", t["shape"].dump());
    if (!t["pieces"].is_array()) throw fail("tensor \"", name, "\" has pieces that are no list");
    std::vector<Piece> list;
    for (const json& p : t["pieces"]) {
      auto field = [&p](const char* key) {
        return p.is_object() && p.contains(key) && p[key].is_number_unsigned()
                   ? p[key].get<uint64_t>()
                   : UINT64_MAX;
      };
      const uint64_t r = field("shard"), begin = field("begin"), end = field("end");
      if (r >= static_cast<uint64_t>(world) || begin > end || end > static_cast<uint64_t>(numel))
        throw fail("tensor \"", name, "\" of ", numel, " elements has piece ", p.dump());
      list.push_back(
          {static_cast<int64_t>(r), static_cast<int64_t>(begin), static_cast<int64_t>(end)});
    }
    check_cover(name, numel, list, [this](const auto&... parts) { return fail(parts...); });
    infos[name] = std::move(ti);
    pieces[name] = std::move(list);
  }
}

const ShardedCheckpoint::TensorInfo& ShardedCheckpoint::Impl::info(const std::string& name) const {
  const auto it = infos.find(name);
  if (it == infos.end()) throw fail("the snapshot has no tensor \"", name, "\"");
  return it->second;
}

void ShardedCheckpoint::Impl::check_range(const std::string& name, int64_t begin,
                                          int64_t end) const {
  const int64_t numel = numel_of(info(name).shape);
  if (begin < 0 || begin > end || end > numel)
    throw fail("elements [", begin, ", ", end, ") of tensor \"", name, "\" are outside its ", numel,
               " elements");
  // The index alone is untrusted: open (and check) the shards holding the range before the
  // caller allocates for it, so the size is backed by bytes the shard files really hold.
  for (const Piece& p : pieces.at(name)) {
    if (p.end > begin && p.begin < end) (void)shard(p.shard);
  }
}

const ShardedCheckpoint::Impl::Shard& ShardedCheckpoint::Impl::shard(int64_t rank) const {
  const std::lock_guard<std::mutex> lock(mutex);
  Shard& s = shards[static_cast<size_t>(rank)];
  if (s.file != nullptr) return s;
  auto file =
      std::make_unique<detail::SafetensorsFile>(kLoad, shard_paths[static_cast<size_t>(rank)]);
  ShardHeader header = describe_shard(*file);
  auto mismatch = [&file](const auto&... parts) {
    return detail::file_error(kLoad, file->path(), parts...);
  };
  if (header.save != save || header.rank != rank || header.world != world)
    throw mismatch("the shard is rank ", header.rank, " of ", header.world, " of save ",
                   header.save, ", but the index wants rank ", rank, " of ", world, " of save ",
                   save, " (a shard of another snapshot)");
  for (const auto& [name, list] : pieces) {
    for (const Piece& p : list) {
      if (p.shard != rank) continue;
      const auto it = header.pieces.find(name);
      if (it == header.pieces.end())
        throw mismatch("the shard lacks tensor \"", name, "\", which the index says it holds");
      const ShardPiece& sp = it->second;
      const TensorInfo& ti = infos.at(name);
      if (sp.dtype != ti.dtype || sp.shape != ti.shape || sp.begin != p.begin || sp.end != p.end)
        throw mismatch("tensor \"", name, "\" is ", detail::safetensors_dtype(sp.dtype), " ",
                       shape_str(sp.shape), " elements [", sp.begin, ", ", sp.end,
                       ") in the shard but ", detail::safetensors_dtype(ti.dtype), " ",
                       shape_str(ti.shape), " elements [", p.begin, ", ", p.end, ") in the index");
    }
  }
  s.file = std::move(file);
  s.header = std::move(header);
  return s;
}

void ShardedCheckpoint::Impl::fill(const std::string& name, int64_t begin, int64_t end,
                                   char* dst) const {
  const uint64_t size = element_size(infos.at(name).dtype);
  std::vector<char> buffer;
  for (const Piece& p : pieces.at(name)) {
    if (p.end <= begin || p.begin >= end) continue;
    const Shard& s = shard(p.shard);
    const ShardPiece& sp = s.header.pieces.at(name);
    const int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.end);
    // The piece's bytes in order: those before the wanted ones and after them pass through the
    // buffer, the wanted ones go straight to `dst`; all of them make up the checksum.
    uint64_t sum = detail::kChecksumSeed;
    auto pass = [&](uint64_t from, uint64_t n) {
      while (n > 0) {
        const uint64_t step = std::min(n, kChunkBytes);
        buffer.resize(std::max<size_t>(buffer.size(), step));
        s.file->read(from, buffer.data(), step);
        sum = detail::checksum(buffer.data(), step, sum);
        from += step;
        n -= step;
      }
    };
    const uint64_t before = static_cast<uint64_t>(lo - p.begin) * size;
    const uint64_t wanted = static_cast<uint64_t>(hi - lo) * size;
    char* out = dst + static_cast<uint64_t>(lo - begin) * size;
    pass(sp.data, before);
    s.file->read(sp.data + before, out, wanted);
    sum = detail::checksum(out, wanted, sum);
    pass(sp.data + before + wanted, static_cast<uint64_t>(p.end - hi) * size);
    if (sum != sp.checksum)
      throw detail::file_error(kLoad, s.file->path(), "the data of tensor \"", name,
                               "\" does not match its checksum (the file is corrupted)");
  }
}

ShardedCheckpoint::ShardedCheckpoint(const std::string& dir) : impl_(std::make_unique<Impl>()) {
  impl_->dir = dir;
  impl_->index_path = (fs::path(dir) / kIndexName).string();
  impl_->read_index();
}

ShardedCheckpoint::~ShardedCheckpoint() = default;

int64_t ShardedCheckpoint::world_size() const { return impl_->world; }

const std::map<std::string, std::string>& ShardedCheckpoint::metadata() const {
  return impl_->metadata;
}

const std::map<std::string, ShardedCheckpoint::TensorInfo>& ShardedCheckpoint::tensors() const {
  return impl_->infos;
}

Tensor ShardedCheckpoint::read(const std::string& name, int64_t begin, int64_t end) const {
  impl_->check_range(name, begin, end);
  Tensor out = empty({end - begin}, impl_->info(name).dtype);
  impl_->fill(name, begin, end, static_cast<char*>(out.data_ptr()));
  return out;
}

Tensor ShardedCheckpoint::read(const std::string& name) const {
  const Shape& shape = impl_->info(name).shape;
  return read(name, 0, numel_of(shape)).view(shape);
}

void ShardedCheckpoint::read_into(const std::string& name, int64_t begin, Tensor out) const {
  const int64_t end = begin + out.numel();
  if (out.device() == kCPU && out.dtype() == impl_->info(name).dtype && out.is_contiguous()) {
    impl_->check_range(name, begin, end);
    impl_->fill(name, begin, end, static_cast<char*>(out.data_ptr()));
    return;
  }
  const Tensor values = read(name, begin, end);
  NoGradGuard no_grad;
  out.copy_(values.view(out.sizes()));
}

optim::StateDict ShardedCheckpoint::read_state_dict(
    const std::string& prefix, const std::function<bool(const std::string&)>& wanted) const {
  optim::StateDict out;
  for (const auto& [key, value] : impl_->metadata) {
    if (key.rfind(prefix, 0) != 0) continue;
    double v = 0;
    if (!detail::parse_number(value, v))
      throw impl_->fail("metadata \"", key, "\" = \"", value, "\" is not a number");
    out.scalars[key.substr(prefix.size())] = v;
  }
  for (const auto& [key, info] : impl_->infos) {
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string name = key.substr(prefix.size());
    if (!wanted || wanted(name)) out.tensors[name] = read(key);
  }
  return out;
}

void ShardedCheckpoint::load_module(nn::Module& module, const std::string& prefix) const {
  const nn::NamedTensors own = module.state_dict();
  std::string missing, mismatched, unexpected;
  auto add = [](std::string& list, const std::string& item) {
    list += (list.empty() ? "" : ", ") + item;
  };
  std::set<std::string> names;
  for (const auto& [name, t] : own) {
    names.insert(prefix + name);
    const auto it = impl_->infos.find(prefix + name);
    if (it == impl_->infos.end())
      add(missing, name);
    else if (it->second.shape != t.sizes())
      add(mismatched, ember::detail::str_cat(name, " (snapshot ", shape_str(it->second.shape),
                                             ", model ", shape_str(t.sizes()), ")"));
  }
  for (const auto& [key, info] : impl_->infos) {
    if (key.rfind(prefix, 0) == 0 && names.count(key) == 0)
      add(unexpected, key.substr(prefix.size()));
  }
  std::string what;
  for (const std::string& part : {missing.empty() ? "" : "missing keys: " + missing,
                                  unexpected.empty() ? "" : "unexpected keys: " + unexpected,
                                  mismatched.empty() ? "" : "shape mismatch for " + mismatched}) {
    if (!part.empty()) what += (what.empty() ? "" : "; ") + part;
  }
  if (!what.empty()) throw impl_->fail("load_module (prefix \"", prefix, "\"): ", what);
  for (const auto& [name, t] : own) read_into(prefix + name, 0, t);
}

}  // namespace ember::dist
