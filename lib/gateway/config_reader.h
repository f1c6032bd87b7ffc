// Internal to lib/gateway's config loading (config.cc): a Reader that walks one TOML table of
// straitd's config, reads typed keys with one clear error each (file, position, key path, what
// was found, what is allowed), and remembers which keys it read, so that whatever is left over
// is an unknown key; and the list of every key the parser accepts (KnownConfigKeys).
#ifndef STRAIT_LIB_GATEWAY_CONFIG_READER_H_
#define STRAIT_LIB_GATEWAY_CONFIG_READER_H_

#include <toml++/toml.h>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strait/status.h"

namespace strait::gateway::config_internal {

// "a string", "an integer", ... for error messages.
const char* TypeName(toml::node_type type);
// The names directly inside the table at `path` ("" = the top level) that the known keys hold.
std::vector<std::string> KnownKeysIn(std::string_view path);
// `prefix`.`key` ("" prefix: `key`).
std::string Join(const std::string& prefix, std::string_view key);

// Walks one table. Every accessor returns the first error it meets, formatted with the file,
// the node's position and its key path.
class Reader {
 public:
  Reader(const toml::table& table, std::string path, const std::string& file)
      : table_(table), path_(std::move(path)), file_(file) {}

  Status Error(const toml::source_region& where, const std::string& key_path,
               const std::string& problem) const;
  Status ErrorAtTable(const std::string& problem) const {
    return Error(table_.source(), path_.empty() ? "(top level)" : path_, problem);
  }

  const toml::node* Get(std::string_view key);
  std::string PathOf(std::string_view key) const { return Join(path_, key); }

  // Each Read* leaves *out untouched when the key is absent and `required` is false.
  Status ReadString(std::string_view key, bool required, std::string* out);
  Status ReadBool(std::string_view key, bool* out);
  Status ReadInt(std::string_view key, bool required, int64_t lo, int64_t hi, int64_t* out);
  Status ReadDouble(std::string_view key, double lo, double hi, double* out);
  // A duration string ("30s", "250ms") that must be positive.
  Status ReadDuration(std::string_view key, int64_t* out);
  // A size: an integer number of bytes or a string such as "64KiB".
  Status ReadSize(std::string_view key, uint64_t* out);
  // A rate string such as "100mbit" or "12.5MB/s", in bits per second; at least 1 Mbit/s (a
  // WAN link paced slower is a typo, not a setting).
  Status ReadRate(std::string_view key, uint64_t* out);
  Status ReadIdList(std::string_view key, std::vector<uint32_t>* out);
  // A sub-table; *out is null when absent.
  Status ReadTable(std::string_view key, bool required, const toml::table** out);

  // The first key that no accessor asked for, as an error listing the known ones.
  Status CheckNoUnknownKeys(const std::vector<std::string_view>& known) const;

  const toml::table& table() const { return table_; }
  const std::string& path() const { return path_; }

 private:
  Status Missing(std::string_view key, bool required, const std::string& allowed) const;
  Status WrongType(const toml::node& n, std::string_view key, const std::string& allowed) const;

  const toml::table& table_;
  std::string path_;
  const std::string& file_;
  std::set<std::string> used_;
};

}  // namespace strait::gateway::config_internal

#endif  // STRAIT_LIB_GATEWAY_CONFIG_READER_H_
