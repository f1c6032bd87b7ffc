// Holds deploy/CONFIG.md, the operators' configuration reference and troubleshooting guide, to
// the code, so that it cannot rot silently:
// - its key table lists exactly gateway::KnownConfigKeys(), which the parser's unknown-key
//   checks are held to (and the parser's own "allowed keys here" lists agree with it);
// - every default written as one backticked TOML value is the parser's default (the config
//   parsed with the key set to it equals the config parsed without it);
// - its flag table is exactly what `straitd --help` offers;
// - its environment table is exactly the variables lib/ and tools/ read with getenv;
// - every backticked message fragment of its troubleshooting tables occurs in lib/, tools/ or
//   plugins/.
#include <gtest/gtest.h>
#include <stdio.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gateway/config.h"

namespace strait::gateway {
namespace {

namespace fs = std::filesystem;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Doc() {
  static const std::string text = ReadText(fs::path(STRAIT_SOURCE_DIR) / "deploy" / "CONFIG.md");
  return text;
}

// One row of a Markdown table: its cells, trimmed.
using Row = std::vector<std::string>;

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// The table rows (header and separator excluded) of every table under the headings that start
// with `heading` (any level), up to the next heading of the same or a higher level.
std::vector<Row> TableRows(const std::string& doc, const std::string& heading) {
  std::vector<Row> rows;
  std::istringstream in(doc);
  std::string line;
  int level = 0;  // of the heading we are under; 0 = not under it
  bool header_next = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '#') {
      const int l = static_cast<int>(line.find_first_not_of('#'));
      const std::string title = Trim(line.substr(static_cast<size_t>(l)));
      if (level != 0 && l <= level) level = 0;
      if (level == 0 && title.rfind(heading, 0) == 0) level = l;
      header_next = true;
      continue;
    }
    if (level == 0) continue;
    if (line.empty() || line[0] != '|') {
      header_next = true;
      continue;
    }
    if (header_next) {  // the header row; the separator row follows
      header_next = false;
      continue;
    }
    if (line.rfind("|---", 0) == 0 || line.rfind("| ---", 0) == 0) continue;
    Row row;
    std::string cell;
    for (size_t i = 1; i < line.size(); ++i) {
      if (line[i] == '|') {
        row.push_back(Trim(cell));
        cell.clear();
      } else {
        cell += line[i];
      }
    }
    rows.push_back(row);
  }
  return rows;
}

// The contents of the backticked spans of `cell`.
std::vector<std::string> Backticked(const std::string& cell) {
  std::vector<std::string> spans;
  size_t pos = 0;
  while (true) {
    const size_t open = cell.find('`', pos);
    if (open == std::string::npos) break;
    const size_t close = cell.find('`', open + 1);
    if (close == std::string::npos) break;
    spans.push_back(cell.substr(open + 1, close - open - 1));
    pos = close + 1;
  }
  return spans;
}

// The first cell's single backticked span (the key, flag or variable of the row).
std::string FirstKey(const Row& row) {
  if (row.empty()) return "";
  const std::vector<std::string> spans = Backticked(row[0]);
  return spans.size() == 1 ? spans[0] : "";
}

std::string Describe(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "(none)" : out;
}

// a - b
std::set<std::string> Minus(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::set<std::string> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

std::vector<Row> KeyRows() {
  return TableRows(Doc(), "Configuration keys");
}

TEST(ConfigReference, DocumentedKeysAreExactlyTheParsersKeys) {
  std::set<std::string> documented;
  for (const Row& row : KeyRows()) {
    const std::string key = FirstKey(row);
    ASSERT_FALSE(key.empty()) << "a row of the key table has no single backticked key: "
                              << (row.empty() ? "" : row[0]);
    ASSERT_EQ(row.size(), 5u) << key << ": expected 5 columns (key, type, default, allowed, "
                              << "meaning)";
    EXPECT_TRUE(documented.insert(key).second) << key << " is documented twice";
  }
  const std::vector<std::string> known_list = KnownConfigKeys();
  const std::set<std::string> known(known_list.begin(), known_list.end());
  EXPECT_EQ(known.size(), known_list.size()) << "KnownConfigKeys() lists a key twice";
  EXPECT_GE(known.size(), 20u) << "KnownConfigKeys() lost keys";
  EXPECT_TRUE(Minus(known, documented).empty())
      << "keys the parser accepts but deploy/CONFIG.md does not document: "
      << Describe(Minus(known, documented));
  EXPECT_TRUE(Minus(documented, known).empty())
      << "keys deploy/CONFIG.md documents but the parser does not accept: "
      << Describe(Minus(documented, known));
}

// A complete valid config as dotted key -> TOML value; ParseConfig reads no files, so the
// TLS paths need not exist.
std::map<std::string, std::string> BaseConfig() {
  return {
      {"region", "\"us-east\""},
      {"shard_index", "0"},
      {"local.socket", "\"/tmp/strait-ref.sock\""},
      {"local.allowed_uids", "[1000]"},
      {"local.allowed_gids", "[1000]"},
      {"wan.listen", "\"127.0.0.1:7400\""},
      {"tls.ca", "\"ca.pem\""},
      {"tls.cert", "\"us-east.pem\""},
      {"tls.key", "\"us-east.key\""},
      {"peers.eu-west.shard_0", "\"127.0.0.2:7400\""},
  };
}

// TOML text for `keys`: top-level keys first, then one table per prefix (all but the last
// component: "peers.eu-west.shard_0" goes to [peers.eu-west]).
std::string Render(const std::map<std::string, std::string>& keys) {
  std::map<std::string, std::string> tables;
  std::string top;
  for (const auto& [key, value] : keys) {
    const size_t dot = key.rfind('.');
    if (dot == std::string::npos) {
      top += key + " = " + value + "\n";
    } else {
      tables[key.substr(0, dot)] += key.substr(dot + 1) + " = " + value + "\n";
    }
  }
  for (const auto& [table, body] : tables) top += "[" + table + "]\n" + body;
  return top;
}

// Every field a documented key sets, in one comparable string.
std::string Fingerprint(const GatewayConfig& c) {
  std::ostringstream os;
  os << c.region << "|" << c.shard_index << "|" << c.local_socket << "|uids";
  for (uint32_t u : c.allowed_uids) os << " " << u;
  os << "|gids";
  for (uint32_t g : c.allowed_gids) os << " " << g;
  os << "|" << c.wan_listen.ToString() << "|" << static_cast<int>(c.transport) << "|" << c.tls_ca
     << "|" << c.tls_cert << "|" << c.tls_key << "|dial " << c.dial_only << "|peers";
  for (const auto& [region, shards] : c.peers) {
    for (const auto& [i, hp] : shards) os << " " << region << "." << i << "=" << hp.ToString();
  }
  for (const std::string& region : c.dial_only_peers) os << " " << region << ".dial-only";
  os << "|region";
  for (const auto& [i, hp] : c.region_gateways) os << " " << i << "=" << hp.ToString();
  os << " plain " << c.region_plain << " "
     << (c.region_listen ? c.region_listen->ToString() : "none");
  os << "|link " << c.link.streams << " " << c.link.min_streams << " " << c.link.max_streams << " "
     << c.link.adapt_streams << " " << c.link.congestion_control << " "
     << c.link.handshake_timeout_ns << " " << c.link.unreachable_after_ns << " "
     << c.link.stream_timeout_ns << " " << c.link.tcp_rto_max_ns << "|policy "
     << c.policy.default_codec << " " << c.policy.default_error_feedback << " " << c.policy.min_lossy_bytes << " "
     << c.policy.max_relative_error << " codecs";
  for (CodecId id : c.policy.allowed_codecs) os << " " << static_cast<int>(id);
  os << "|allreduce " << c.allreduce_deadline_ns << " " << c.shutdown_grace_ns << " chunk "
     << c.chunk_elements << " weights";
  for (const auto& [region, w] : c.shard_weights) os << " " << region << "=" << w;
  os << "|metrics " << (c.metrics_listen ? c.metrics_listen->ToString() : "off");
  return os.str();
}

// The keys whose fields Fingerprint() covers; a documented literal default of any other key
// could not be checked, so the test asks for Fingerprint() to be extended.
const std::set<std::string>& FingerprintedKeys() {
  static const std::set<std::string> keys = {"region",
                                             "shard_index",
                                             "local.socket",
                                             "local.allowed_uids",
                                             "local.allowed_gids",
                                             "wan.listen",
                                             "wan.transport",
                                             "wan.dial",
                                             "region_links.transport",
                                             "tls.ca",
                                             "tls.cert",
                                             "tls.key",
                                             "peers.<region>.shard_<index>",
                                             "link.streams",
                                             "link.adapt_streams",
                                             "link.congestion_control",
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
                                             "allreduce.chunk_elements"};
  return keys;
}

TEST(ConfigReference, DocumentedDefaultsAreTheParsersDefaults) {
  int checked = 0;
  for (const Row& row : KeyRows()) {
    ASSERT_EQ(row.size(), 5u);
    const std::string key = FirstKey(row);
    const std::string& cell = row[2];
    // Only a cell that is exactly one backticked value states a literal default.
    if (cell.size() < 2 || cell.front() != '`' || cell.back() != '`' ||
        Backticked(cell).size() != 1) {
      continue;
    }
    const std::string value = Backticked(cell)[0];
    ASSERT_EQ(key.find('<'), std::string::npos)
        << key << ": a key with placeholders cannot have a literal default";
    ASSERT_TRUE(FingerprintedKeys().count(key) != 0)
        << key << " has the documented default " << value
        << " but Fingerprint() in this test does not cover its field: extend it";
    std::map<std::string, std::string> without = BaseConfig();
    without.erase(key);
    std::map<std::string, std::string> with = without;
    with[key] = value;
    auto a = ParseConfig(Render(without), "/etc/strait/straitd.toml");
    auto b = ParseConfig(Render(with), "/etc/strait/straitd.toml");
    ASSERT_TRUE(a.ok()) << key << ": " << a.status().message();
    ASSERT_TRUE(b.ok()) << key << " = " << value
                        << " (the documented default): " << b.status().message();
    EXPECT_EQ(Fingerprint(*a), Fingerprint(*b))
        << key << ": the documented default " << value << " is not the parser's default";
    ++checked;
  }
  EXPECT_GE(checked, 10) << "too few literal defaults found: is the key table still parsed?";
}

// The check above is real: a wrong documented default would be caught.
TEST(ConfigReference, AWrongDefaultChangesTheFingerprint) {
  std::map<std::string, std::string> with = BaseConfig();
  with["link.streams"] = "5";
  auto a = ParseConfig(Render(BaseConfig()), "/etc/strait/straitd.toml");
  auto b = ParseConfig(Render(with), "/etc/strait/straitd.toml");
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_NE(Fingerprint(*a), Fingerprint(*b));
}

// The parser's own "unknown key" message for each table lists exactly the keys that
// KnownConfigKeys() puts in that table.
TEST(ConfigReference, ParserUnknownKeyListsMatchKnownConfigKeys) {
  std::map<std::string, std::set<std::string>> expected;  // table -> names directly in it
  for (const std::string& key : KnownConfigKeys()) {
    if (key.rfind("peers.", 0) == 0) {  // peers.<region>: checked below
      expected[""].insert("peers");
      continue;
    }
    const size_t dot = key.find('.');
    if (dot == std::string::npos) {
      expected[""].insert(key);
    } else {
      const std::string rest = key.substr(dot + 1);
      expected[""].insert(key.substr(0, dot));
      expected[key.substr(0, dot)].insert(rest.substr(0, rest.find('.')));
    }
  }
  for (const auto& [table, names] : expected) {
    std::map<std::string, std::string> keys = BaseConfig();
    keys[(table.empty() ? "" : table + ".") + "no_such_key"] = "1";
    // Tables of optional sections appear only through the unknown key; [metrics] also needs
    // its required key to get as far as the unknown-key check.
    if (table == "metrics") keys["metrics.listen"] = "\"127.0.0.1:9464\"";
    auto parsed = ParseConfig(Render(keys), "/etc/strait/straitd.toml");
    ASSERT_FALSE(parsed.ok()) << "[" << table << "] accepted an unknown key";
    const std::string message(parsed.status().message());
    const std::string marker = "unknown key; allowed keys here: ";
    const size_t at = message.find(marker);
    ASSERT_NE(at, std::string::npos) << "[" << table << "]: " << message;
    std::set<std::string> listed;
    std::istringstream in(message.substr(at + marker.size()));
    std::string name;
    while (std::getline(in, name, ',')) listed.insert(Trim(name));
    EXPECT_EQ(listed, names) << "[" << table << "]: the parser lists " << Describe(listed)
                             << ", KnownConfigKeys() has " << Describe(names);
  }
  // peers.<region>.shard_<index>: any other key inside a peer table is refused.
  std::map<std::string, std::string> keys = BaseConfig();
  keys["peers.eu-west.no_such_key"] = "\"127.0.0.3:7400\"";
  auto parsed = ParseConfig(Render(keys), "/etc/strait/straitd.toml");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(std::string(parsed.status().message()).find("shard_<index>"), std::string::npos)
      << parsed.status().message();
}

// Every file under lib/, tools/ and plugins/ that is C or C++ source, concatenated once.
const std::string& Sources() {
  static const std::string all = [] {
    std::string text;
    for (const char* dir : {"lib", "tools", "plugins"}) {
      for (const auto& e : fs::recursive_directory_iterator(fs::path(STRAIT_SOURCE_DIR) / dir)) {
        const std::string ext = e.path().extension().string();
        if (!e.is_regular_file() ||
            (ext != ".cc" && ext != ".h" && ext != ".c" && ext != ".cu" && ext != ".cuh")) {
          continue;
        }
        text += ReadText(e.path());
        text += '\n';
      }
    }
    return text;
  }();
  return all;
}

TEST(ConfigReference, TroubleshootingFragmentsOccurInTheSources) {
  ASSERT_GT(Sources().size(), 100000u) << "the sources were not found under " << STRAIT_SOURCE_DIR;
  int checked = 0;
  for (const Row& row : TableRows(Doc(), "Troubleshooting")) {
    ASSERT_FALSE(row.empty());
    const std::vector<std::string> fragments = Backticked(row[0]);
    EXPECT_FALSE(fragments.empty()) << "a troubleshooting row quotes no message: " << row[0];
    for (const std::string& fragment : fragments) {
      EXPECT_GE(fragment.size(), 6u) << "fragment too short to mean anything: " << fragment;
      EXPECT_NE(Sources().find(fragment), std::string::npos)
          << "deploy/CONFIG.md quotes the message fragment `" << fragment
          << "`, which no longer occurs in lib/, tools/ or plugins/: update the doc";
      ++checked;
    }
  }
  EXPECT_GE(checked, 60) << "too few troubleshooting fragments found: are the tables parsed?";
  // The search is real: text that is in no source is not found.
  EXPECT_EQ(Sources().find("this fragment occurs in no source file"), std::string::npos);
}

TEST(ConfigReference, EnvironmentTableMatchesGetenvCalls) {
  std::set<std::string> documented;
  for (const Row& row : TableRows(Doc(), "Environment variables straitd reads")) {
    const std::string name = FirstKey(row);
    ASSERT_FALSE(name.empty()) << row[0];
    documented.insert(name);
  }
  // What straitd's code reads: getenv("NAME") in lib/ and tools/ (the plugin's variables are
  // documented in plugins/README.md).
  std::set<std::string> read;
  const std::regex getenv_call(R"re(getenv\(\s*"([A-Za-z0-9_]+)"\s*\))re");
  for (const char* dir : {"lib", "tools"}) {
    for (const auto& e : fs::recursive_directory_iterator(fs::path(STRAIT_SOURCE_DIR) / dir)) {
      if (!e.is_regular_file()) continue;
      const std::string text = ReadText(e.path());
      for (auto it = std::sregex_iterator(text.begin(), text.end(), getenv_call);
           it != std::sregex_iterator(); ++it) {
        read.insert((*it)[1].str());
      }
    }
  }
  EXPECT_GE(read.size(), 3u) << "no getenv calls found: has the way straitd reads them changed?";
  EXPECT_TRUE(Minus(read, documented).empty())
      << "variables the code reads but deploy/CONFIG.md does not document: "
      << Describe(Minus(read, documented));
  EXPECT_TRUE(Minus(documented, read).empty())
      << "variables deploy/CONFIG.md documents but no getenv reads: "
      << Describe(Minus(documented, read));
}

TEST(ConfigReference, FlagTableMatchesStraitdHelp) {
  std::set<std::string> documented;
  for (const Row& row : TableRows(Doc(), "straitd flags")) {
    const std::string flag = FirstKey(row);
    ASSERT_FALSE(flag.empty()) << row[0];
    documented.insert(flag.substr(0, flag.find(' ')));
  }
  FILE* p = ::popen((std::string(STRAITD_PATH) + " --help 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string help;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) help.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << help;
  std::set<std::string> offered;
  const std::regex flag(R"(--[a-z][a-z0-9-]*)");
  for (auto it = std::sregex_iterator(help.begin(), help.end(), flag); it != std::sregex_iterator();
       ++it) {
    offered.insert(it->str());
  }
  EXPECT_GE(offered.size(), 4u) << help;
  EXPECT_TRUE(Minus(offered, documented).empty())
      << "flags straitd offers but deploy/CONFIG.md does not document: "
      << Describe(Minus(offered, documented)) << "\n"
      << help;
  EXPECT_TRUE(Minus(documented, offered).empty())
      << "flags deploy/CONFIG.md documents but straitd --help does not offer: "
      << Describe(Minus(documented, offered)) << "\n"
      << help;
}

}  // namespace
}  // namespace strait::gateway
