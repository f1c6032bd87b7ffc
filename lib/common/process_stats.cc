// ReadProcessStats (see process_stats.h).
#include "common/process_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace strait {
namespace {

// /proc/stat's `btime`: the boot time in seconds since the epoch (0 if unreadable).
double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  std::string key;
  while (in >> key) {
    if (key == "btime") {
      double t = 0;
      in >> t;
      return t;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

}  // namespace

StatusOr<ProcessStats> ReadProcessStats() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return UnavailableError("cannot read /proc/self/stat");
  // The command name (field 2) is in parentheses and may hold spaces: fields count from the
  // last ')'. Field 3 is then the first after it.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return UnavailableError("unexpected /proc/self/stat format");
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> f;  // f[0] is field 3
  for (std::string s; rest >> s;) f.push_back(s);
  if (f.size() < 22) return UnavailableError("unexpected /proc/self/stat format");
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  ProcessStats s;
  s.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / ticks;  // utime, stime (14, 15)
  s.threads = std::stoull(f[17]);                                  // num_threads (20)
  s.start_time_seconds = BootTimeSeconds() + std::stod(f[19]) / ticks;  // starttime (22)
  s.virtual_bytes = std::stoull(f[20]);                                 // vsize (23)
  s.resident_bytes = static_cast<uint64_t>(std::stod(f[21]) * page);   // rss pages (24)
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++s.open_fds;
  }
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    s.max_fds = files.rlim_cur;
  }
  return s;
}

}  // namespace strait
