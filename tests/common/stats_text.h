// Test helper: reads one counter out of straitd's stats text (the local protocol's Stats reply,
// one "name value" line per counter), for the integration tests that watch a gateway's counters
// while they cut links, kill processes or feed it bad requests.
#ifndef STRAIT_TESTS_COMMON_STATS_TEXT_H_
#define STRAIT_TESTS_COMMON_STATS_TEXT_H_

#include <cstdint>
#include <cstdlib>
#include <string>

namespace strait::test {

// The value on the line `name value` of `stats`, or -1 when no line names it (a counter this
// straitd does not have yet, or an error text in place of the stats): tests compare against
// counts >= 0, so a missing counter fails them instead of reading as zero.
inline int64_t StatValue(const std::string& stats, const std::string& name) {
  // Matched at a line's start so that "tunnels_open" is not found inside "peer_tunnels_open".
  // (Built with append, not "\n" + name: GCC 12 warns falsely about the latter, bug 105329.)
  std::string line;
  line.append("\n").append(name).append(" ");
  size_t at = stats.compare(0, line.size() - 1, line, 1) == 0 ? 0 : stats.find(line);
  if (at == std::string::npos) return -1;
  if (stats[at] == '\n') ++at;
  return std::strtoll(stats.c_str() + at + name.size() + 1, nullptr, 10);
}

}  // namespace strait::test

#endif  // STRAIT_TESTS_COMMON_STATS_TEXT_H_
