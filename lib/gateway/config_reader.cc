// The config Reader and the list of known keys (see config_reader.h).
#include "gateway/config_reader.h"

#include <algorithm>
#include <iterator>
#include <sstream>

#include "common/strings.h"
#include "common/units.h"
#include "gateway/config.h"

namespace strait::gateway {
namespace config_internal {
namespace {

// Every key the parser accepts, dotted, in the order of config.h's format comment; names the
// operator chooses are placeholders in angle brackets. KnownConfigKeys() returns this list and
// deploy/CONFIG.md documents it (tests/deploy/config_reference_test.cc holds the two together).
// Reader::CheckNoUnknownKeys refuses to run when a table's keys differ from it, so a key added
// to the parser but not here fails every parse of that table in the tests.
constexpr std::string_view kKnownKeys[] = {
    "region",
    "shard_index",
    "shards",
    "local.socket",
    "local.allowed_uids",
    "local.allowed_gids",
    "wan.listen",
    "wan.transport",
    "wan.dial",
    "tls.ca",
    "tls.cert",
    "tls.key",
    "peers.<region>.shard_<index>",
    "peers.<region>.dial",
    "peers.<region>.max_rate",
    "region_links.transport",
    "region_links.listen",
    "link.streams",
    "link.adapt_streams",
    "link.congestion_control",
    "link.max_rate",
    "link.handshake_timeout",
    "link.unreachable_after",
    "link.stream_timeout",
    "link.tcp_rto_max",
    "policy.codec",
    "policy.error_feedback",
    "policy.min_lossy_bytes",
    "policy.max_relative_error",
    "policy.allowed_codecs",
    "metrics.listen",
    "allreduce.deadline",
    "allreduce.shutdown_grace",
    "allreduce.shard_weights.<region>",
    "allreduce.chunk_elements",
};

}  // namespace

const char* TypeName(toml::node_type type) {
  switch (type) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

// The names directly inside the table at `path` ("" = the top level) that kKnownKeys holds.
std::vector<std::string> KnownKeysIn(std::string_view path) {
  std::vector<std::string> names;
  for (std::string_view key : kKnownKeys) {
    if (!path.empty()) {
      if (key.size() <= path.size() || key.substr(0, path.size()) != path ||
          key[path.size()] != '.') {
        continue;
      }
      key.remove_prefix(path.size() + 1);
    }
    std::string name(key.substr(0, key.find('.')));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

std::string Join(const std::string& prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : prefix + "." + std::string(key);
}

Status Reader::Error(const toml::source_region& where, const std::string& key_path,
                     const std::string& problem) const {
  std::ostringstream os;
  os << file_;
  // The root table has no position of its own.
  if (where.begin.line > 0) os << ":" << where.begin.line << ":" << where.begin.column;
  os << ": " << key_path << ": " << problem;
  return InvalidArgumentError(os.str());
}

const toml::node* Reader::Get(std::string_view key) {
  used_.insert(std::string(key));
  return table_.get(key);
}

Status Reader::ReadString(std::string_view key, bool required, std::string* out) {
  const toml::node* n = Get(key);
  if (n == nullptr) return Missing(key, required, "a string");
  if (!n->is_string()) return WrongType(*n, key, "a string");
  *out = n->as_string()->get();
  return Status::Ok();
}

Status Reader::ReadBool(std::string_view key, bool* out) {
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  if (!n->is_boolean()) return WrongType(*n, key, "true or false");
  *out = n->as_boolean()->get();
  return Status::Ok();
}

Status Reader::ReadInt(std::string_view key, bool required, int64_t lo, int64_t hi, int64_t* out) {
  std::ostringstream allowed;
  allowed << "an integer in [" << lo << ", " << hi << "]";
  const toml::node* n = Get(key);
  if (n == nullptr) return Missing(key, required, allowed.str());
  if (!n->is_integer()) return WrongType(*n, key, allowed.str());
  const int64_t v = n->as_integer()->get();
  if (v < lo || v > hi) {
    return Error(n->source(), PathOf(key),
                 "found " + std::to_string(v) + "; allowed: " + allowed.str());
  }
  *out = v;
  return Status::Ok();
}

Status Reader::ReadDouble(std::string_view key, double lo, double hi, double* out) {
  std::ostringstream allowed;
  allowed << "a number in (" << lo << ", " << hi << "]";
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  double v = 0;
  if (n->is_floating_point()) {
    v = n->as_floating_point()->get();
  } else if (n->is_integer()) {
    v = static_cast<double>(n->as_integer()->get());
  } else {
    return WrongType(*n, key, allowed.str());
  }
  if (!(v > lo && v <= hi)) {
    std::ostringstream found;
    found << "found " << v << "; allowed: " << allowed.str();
    return Error(n->source(), PathOf(key), found.str());
  }
  *out = v;
  return Status::Ok();
}

Status Reader::ReadDuration(std::string_view key, int64_t* out) {
  const char* allowed = "a positive duration string such as \"250ms\", \"30s\", \"2m\"";
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  if (!n->is_string()) return WrongType(*n, key, allowed);
  auto v = ParseDurationNanos(n->as_string()->get());
  if (!v.ok() || *v <= 0) {
    return Error(n->source(), PathOf(key),
                 "found \"" + n->as_string()->get() + "\"; allowed: " + allowed);
  }
  *out = *v;
  return Status::Ok();
}

Status Reader::ReadSize(std::string_view key, uint64_t* out) {
  const char* allowed = "a byte count (integer >= 0) or a size string such as \"64KiB\"";
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  if (n->is_integer()) {
    if (n->as_integer()->get() < 0) {
      return Error(n->source(), PathOf(key),
                   "found " + std::to_string(n->as_integer()->get()) + "; allowed: " + allowed);
    }
    *out = static_cast<uint64_t>(n->as_integer()->get());
    return Status::Ok();
  }
  if (!n->is_string()) return WrongType(*n, key, allowed);
  auto v = ParseSize(n->as_string()->get());
  if (!v.ok()) {
    return Error(n->source(), PathOf(key),
                 "found \"" + n->as_string()->get() + "\"; allowed: " + allowed);
  }
  *out = *v;
  return Status::Ok();
}

Status Reader::ReadRate(std::string_view key, uint64_t* out) {
  const char* allowed = "a rate string of at least 1mbit such as \"100mbit\", \"2.5gbit\" or "
                        "\"12.5MB/s\"";
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  if (!n->is_string()) return WrongType(*n, key, allowed);
  auto v = ParseRate(n->as_string()->get());
  if (!v.ok() || *v < 1'000'000) {
    return Error(n->source(), PathOf(key),
                 "found \"" + n->as_string()->get() + "\"; allowed: " + allowed);
  }
  *out = *v;
  return Status::Ok();
}

Status Reader::ReadIdList(std::string_view key, std::vector<uint32_t>* out) {
  const char* allowed = "an array of integer ids in [0, 4294967294]";
  const toml::node* n = Get(key);
  if (n == nullptr) return Status::Ok();
  if (!n->is_array()) return WrongType(*n, key, allowed);
  const toml::array& a = *n->as_array();
  for (size_t i = 0; i < a.size(); ++i) {
    const toml::node& e = a[i];
    const std::string p = PathOf(key) + "[" + std::to_string(i) + "]";
    if (!e.is_integer()) {
      return Error(e.source(), p,
                   std::string("found ") + TypeName(e.type()) + "; allowed: " + allowed);
    }
    const int64_t v = e.as_integer()->get();
    if (v < 0 || v >= int64_t{UINT32_MAX}) {
      return Error(e.source(), p, "found " + std::to_string(v) + "; allowed: " + allowed);
    }
    out->push_back(static_cast<uint32_t>(v));
  }
  return Status::Ok();
}

Status Reader::ReadTable(std::string_view key, bool required, const toml::table** out) {
  *out = nullptr;
  const toml::node* n = Get(key);
  if (n == nullptr) return Missing(key, required, "a table [" + PathOf(key) + "]");
  if (!n->is_table()) return WrongType(*n, key, "a table [" + PathOf(key) + "]");
  *out = n->as_table();
  return Status::Ok();
}

Status Reader::CheckNoUnknownKeys(const std::vector<std::string_view>& known) const {
  // A programmer error, caught by every test that parses this table: the keys read here
  // must be the documented ones (kKnownKeys), or the reference in deploy/CONFIG.md is wrong.
  const std::vector<std::string> listed = KnownKeysIn(path_);
  std::set<std::string> read(known.begin(), known.end());
  read.insert(used_.begin(), used_.end());
  if (read != std::set<std::string>(listed.begin(), listed.end())) {
    std::string names;
    for (const std::string& name : read) AppendToList(names, name);
    return InternalError("config parser reads keys [" + names + "] in " +
                         (path_.empty() ? std::string("the top level") : "[" + path_ + "]") +
                         ", which differ from kKnownKeys in lib/gateway/config_reader.cc; add the "
                         "key there and to deploy/CONFIG.md");
  }
  for (auto&& [k, v] : table_) {
    if (used_.count(std::string(k.str())) != 0) continue;
    std::string list;
    for (std::string_view name : known) {
      if (!list.empty()) list += ", ";
      list += std::string(name);
    }
    return Error(k.source(), PathOf(k.str()), "unknown key; allowed keys here: " + list);
  }
  return Status::Ok();
}

Status Reader::Missing(std::string_view key, bool required, const std::string& allowed) const {
  if (!required) return Status::Ok();
  return ErrorAtTable("missing required key `" + std::string(key) + "`; expected " + allowed);
}

Status Reader::WrongType(const toml::node& n, std::string_view key,
                         const std::string& allowed) const {
  return Error(n.source(), PathOf(key),
               std::string("found ") + TypeName(n.type()) + "; allowed: " + allowed);
}

}  // namespace config_internal

std::vector<std::string> KnownConfigKeys() {
  return std::vector<std::string>(std::begin(config_internal::kKnownKeys),
                                  std::end(config_internal::kKnownKeys));
}

}  // namespace strait::gateway
