// analyze_flight_dumps (flight_recorder.h): reads a folder of flight-recorder dumps, checks
// them as untrusted input, and tells per group where its ranks are.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include <ember/dist/flight_recorder.h>
#include <ember/tensor/error.h>

namespace ember::dist {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr size_t kMaxFiles = 4096;
constexpr uintmax_t kMaxFileBytes = uintmax_t{64} << 20;
constexpr size_t kMaxGroups = 4096;
constexpr size_t kMaxEntries = 1 << 16;
constexpr int64_t kMaxRank = 1 << 20;
constexpr size_t kMaxText = 4096;

// One collective as a rank recorded it.
struct Entry {
  int64_t seq = 0;
  std::string op, dtype, reduce, state, tag, call_site;
  int64_t numel = 0, bytes = 0, root = -1;
  int64_t enqueued_ns = 0, started_ns = 0, ended_ns = 0;
  // What the ranks must agree on.
  auto key() const { return std::tie(op, dtype, numel, root, reduce); }
};

// One group as one rank recorded it.
struct GroupRecord {
  std::string backend, broken;
  int64_t rank = 0, index = 0;
  std::vector<int64_t> global_ranks;
  std::vector<Entry> entries;  // by number, oldest first
  int64_t dump_now_ns = 0;     // the rank's clock when it dumped
};

// Throws ember::Error naming the file and what is wrong with it.
class Checker {
 public:
  explicit Checker(std::string file) : file_(std::move(file)) {}
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("analyze_flight_dumps: " + file_ + " is no ember flight-recorder dump: " + what);
  }
  const Json& field(const Json& object, const char* name) const {
    if (!object.is_object()) fail(std::string("expected an object holding \"") + name + "\"");
    const auto it = object.find(name);
    if (it == object.end()) fail(std::string("\"") + name + "\" is missing");
    return *it;
  }
  int64_t integer(const Json& object, const char* name, int64_t lo, int64_t hi) const {
    const Json& v = field(object, name);
    if (!v.is_number_integer()) fail(std::string("\"") + name + "\" is not an integer");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      fail(std::string("\"") + name + "\" is " + std::to_string(x) + ", outside [" +
           std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return x;
  }
  std::string text(const Json& object, const char* name, size_t limit = kMaxText) const {
    const Json& v = field(object, name);
    if (!v.is_string()) fail(std::string("\"") + name + "\" is not a string");
    std::string s = v.get<std::string>();
    if (s.size() > limit)
      fail(std::string("\"") + name + "\" is longer than " + std::to_string(limit) + " bytes");
    return s;
  }
  const Json& array(const Json& object, const char* name, size_t limit) const {
    const Json& v = field(object, name);
    if (!v.is_array()) fail(std::string("\"") + name + "\" is not an array");
    if (v.size() > limit)
      fail(std::string("\"") + name + "\" holds more than " + std::to_string(limit) + " items");
    return v;
  }

 private:
  std::string file_;
};

constexpr int64_t kMaxI64 = std::numeric_limits<int64_t>::max();

Entry read_entry(const Checker& c, const Json& j) {
  Entry e;
  e.seq = c.integer(j, "seq", 1, kMaxI64);
  e.op = c.text(j, "op", 32);
  e.dtype = c.text(j, "dtype", 32);
  e.numel = c.integer(j, "numel", 0, kMaxI64);
  e.bytes = c.integer(j, "bytes", 0, kMaxI64);
  e.root = c.integer(j, "root", -1, kMaxRank);
  e.reduce = c.text(j, "reduce", 32);
  e.state = c.text(j, "state", 32);
  if (e.state != "enqueued" && e.state != "started" && e.state != "completed" &&
      e.state != "failed") {
    c.fail("an entry's \"state\" is \"" + e.state + "\"");
  }
  e.enqueued_ns = c.integer(j, "enqueued_ns", 0, kMaxI64);
  e.started_ns = c.integer(j, "started_ns", 0, kMaxI64);
  e.ended_ns = c.integer(j, "ended_ns", 0, kMaxI64);
  e.tag = c.text(j, "tag", 256);
  e.call_site = c.text(j, "call_site", 512);
  return e;
}

// The groups one dump holds, and the job's rank of its writer.
std::vector<GroupRecord> read_dump(const fs::path& path, int64_t& rank) {
  const Checker c(path.string());
  std::error_code ec;
  const uintmax_t bytes = fs::file_size(path, ec);
  if (ec) c.fail("cannot read its size: " + ec.message());
  if (bytes > kMaxFileBytes)
    c.fail("it holds " + std::to_string(bytes) + " bytes, more than 64 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) c.fail("cannot open it");
  std::string content(static_cast<size_t>(bytes), '\0');
  in.read(content.data(), static_cast<std::streamsize>(bytes));
  content.resize(static_cast<size_t>(in.gcount()));
  Json dump;
  try {
    dump = Json::parse(content);
  } catch (const Json::exception& e) {
    c.fail(std::string("not JSON: ") + e.what());
  }
  if (c.integer(dump, "ember_flight_recorder", 1, 1) != 1) c.fail("unknown version");
  rank = c.integer(dump, "rank", 0, kMaxRank);
  const int64_t now = c.integer(dump, "steady_now_ns", 0, kMaxI64);
  std::vector<GroupRecord> groups;
  for (const Json& g : c.array(dump, "groups", kMaxGroups)) {
    GroupRecord r;
    r.backend = c.text(g, "backend", 32);
    r.rank = c.integer(g, "rank", 0, kMaxRank);
    r.index = c.integer(g, "index", 0, kMaxRank);
    r.broken = c.text(g, "broken", 1 << 16);
    for (const Json& x : c.array(g, "global_ranks", static_cast<size_t>(kMaxRank))) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > kMaxRank)
        c.fail("\"global_ranks\" holds something other than a rank");
      r.global_ranks.push_back(x.get<int64_t>());
    }
    if (r.rank >= static_cast<int64_t>(r.global_ranks.size()) ||
        r.global_ranks[static_cast<size_t>(r.rank)] != rank) {
      c.fail("its group rank " + std::to_string(r.rank) + " is not the writer's rank " +
             std::to_string(rank) + " in \"global_ranks\"");
    }
    int64_t last = 0;
    for (const Json& j : c.array(g, "entries", kMaxEntries)) {
      Entry e = read_entry(c, j);
      if (e.seq <= last) c.fail("entries are not in increasing order of \"seq\"");
      last = e.seq;
      r.entries.push_back(std::move(e));
    }
    r.dump_now_ns = now;
    groups.push_back(std::move(r));
  }
  return groups;
}

std::string size_str(int64_t bytes) {
  char text[32];
  if (bytes < 1024) {
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  } else if (bytes < (int64_t{1} << 20)) {
    std::snprintf(text, sizeof(text), "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  }
  return text;
}

std::string seconds_str(int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(std::max<int64_t>(ns, 0)) / 1e9);
  return text;
}

// "allreduce #8 (DDP bucket 0, f32, 2.1 MiB)"
std::string call_str(const Entry& e) {
  std::string s = e.op + " #" + std::to_string(e.seq) + " (";
  if (!e.tag.empty()) {
    s += e.tag + ", ";
  } else if (!e.call_site.empty()) {
    s += "at " + e.call_site + ", ";
  }
  if (!e.dtype.empty()) {
    s += e.dtype + " x " + std::to_string(e.numel) + ", " + size_str(e.bytes);
  } else {
    s += "no data";
  }
  if (e.root >= 0) s += ", root " + std::to_string(e.root);
  return s + ")";
}

std::string ranks_str(const std::vector<int64_t>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

const Entry* find_entry(const GroupRecord& g, int64_t seq) {
  const auto it = std::lower_bound(g.entries.begin(), g.entries.end(), seq,
                                   [](const Entry& e, int64_t s) { return e.seq < s; });
  return it != g.entries.end() && it->seq == seq ? &*it : nullptr;
}

int64_t last_seq(const GroupRecord& g) { return g.entries.empty() ? 0 : g.entries.back().seq; }

int64_t last_completed(const GroupRecord& g) {
  for (auto it = g.entries.rbegin(); it != g.entries.rend(); ++it)
    if (it->state == "completed") return it->seq;
  return 0;
}

// Where one rank is, as of its dump.
std::string whereabouts(int64_t rank, const GroupRecord& g) {
  const std::string who = "rank " + std::to_string(rank);
  if (g.entries.empty()) return who + " recorded no collective";
  const Entry& e = g.entries.back();
  if (e.state == "completed") {
    return who + " is outside any collective: its last, " + call_str(e) + ", completed " +
           seconds_str(g.dump_now_ns - e.ended_ns) + " before its dump";
  }
  if (e.state == "failed") return who + " failed in " + call_str(e);
  const int64_t since = e.started_ns > 0 ? e.started_ns : e.enqueued_ns;
  return who + (e.state == "started" ? " waits in " : " has issued but not started ") +
         call_str(e) + " since " + seconds_str(g.dump_now_ns - since);
}

// One paragraph for one group: `records` by the job's rank of each member that dumped.
std::string analyze_group(const GroupRecord& any, const std::map<int64_t, GroupRecord>& records) {
  std::ostringstream out;
  out << any.backend << " group of ranks [";
  for (size_t i = 0; i < any.global_ranks.size(); ++i)
    out << (i > 0 ? ", " : "") << any.global_ranks[i];
  out << "]: ";
  std::vector<int64_t> missing;
  for (const int64_t r : any.global_ranks)
    if (records.count(r) == 0) missing.push_back(r);

  // The last collective every rank that dumped completed.
  int64_t all_done = -1;
  for (const auto& [rank, g] : records) {
    all_done = all_done < 0 ? last_completed(g) : std::min(all_done, last_completed(g));
  }
  const Entry* done = nullptr;
  if (all_done > 0) done = find_entry(records.begin()->second, all_done);
  if (done != nullptr) {
    out << "every rank that dumped completed " << call_str(*done)
        << " (the last collective all completed). ";
  } else {
    out << "no collective was completed by every rank that dumped. ";
  }

  // The first number where they disagree: a rank without it, or calls that differ.
  int64_t first = 0, top = 0;
  for (const auto& [rank, g] : records) {
    if (!g.entries.empty())
      first = first == 0 ? g.entries.front().seq : std::max(first, g.entries.front().seq);
    top = std::max(top, last_seq(g));
  }
  int64_t differ = 0;
  for (int64_t s = std::max<int64_t>(first, 1); s <= top && differ == 0; ++s) {
    const Entry* seen = nullptr;
    for (const auto& [rank, g] : records) {
      const Entry* e = find_entry(g, s);
      if (e == nullptr || (seen != nullptr && e->key() != seen->key())) {
        differ = s;
        break;
      }
      seen = e;
    }
  }
  if (differ > 0) {
    out << "The ranks disagree at #" << differ << ": ";
    std::vector<int64_t> absent;
    std::map<std::string, std::vector<int64_t>> calls;
    for (const auto& [rank, g] : records) {
      const Entry* e = find_entry(g, differ);
      if (e == nullptr) {
        absent.push_back(rank);
      } else {
        calls[call_str(*e)].push_back(rank);
      }
    }
    bool first_call = true;
    for (const auto& [call, ranks] : calls) {
      out << (first_call ? "" : ", while ") << ranks_str(ranks) << " issued " << call;
      first_call = false;
    }
    if (!absent.empty()) {
      out << (first_call ? "" : "; ") << ranks_str(absent) << " never issued #" << differ
          << " (busy in its own code, hung outside any collective, or gone)";
    }
    out << ". ";
  } else if (!records.empty()) {
    out << "The ranks that dumped agree on every collective they recorded. ";
  }
  bool first_where = true;
  for (const auto& [rank, g] : records) {
    out << (first_where ? "" : "; ") << whereabouts(rank, g);
    first_where = false;
  }
  out << ".";
  if (!missing.empty()) {
    out << " " << ranks_str(missing)
        << " left no dump (died, was stopped before it could write, or recorded nothing).";
  }
  for (const auto& [rank, g] : records) {
    if (!g.broken.empty()) {
      out << " Rank " << rank << "'s group broke: " << g.broken;
      break;
    }
  }
  return out.str();
}

}  // namespace

std::string analyze_flight_dumps(const std::string& dir) {
  std::error_code ec;
  EMBER_CHECK(fs::is_directory(dir, ec), "analyze_flight_dumps", dir, " is not a folder");
  static const std::regex name("rank[0-9]{1,7}\\.json");
  std::vector<fs::path> files;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    if (!item.is_regular_file() || !std::regex_match(item.path().filename().string(), name))
      continue;
    EMBER_CHECK(files.size() < kMaxFiles, "analyze_flight_dumps", dir, " holds more than ",
                kMaxFiles, " dumps");
    files.push_back(item.path());
  }
  EMBER_CHECK(!ec, "analyze_flight_dumps", "cannot list ", dir, ": ", ec.message());
  EMBER_CHECK(!files.empty(), "analyze_flight_dumps", dir,
              " holds no flight-recorder dump (rank<R>.json)");
  // Groups by backend, members and index; per group, each rank's record.
  using Key = std::tuple<std::string, std::vector<int64_t>, int64_t>;
  std::map<Key, std::map<int64_t, GroupRecord>> groups;
  for (const fs::path& file : files) {
    int64_t rank = 0;
    for (GroupRecord& g : read_dump(file, rank)) {
      Key key{g.backend, g.global_ranks, g.index};
      groups[key][rank] = std::move(g);
    }
  }
  if (groups.empty()) return "The dumps in " + dir + " hold no process group.";
  std::string report;
  for (const auto& [key, records] : groups) {
    if (!report.empty()) report += "\n\n";
    report += analyze_group(records.begin()->second, records);
  }
  return report;
}

}  // namespace ember::dist
