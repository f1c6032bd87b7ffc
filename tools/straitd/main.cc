// straitd: the region gateway daemon. Parses flags, loads the config, runs the Gateway until
// SIGTERM or SIGINT, then shuts it down within the config's allreduce.shutdown_grace. SIGHUP
// reloads the TLS certificate, key and CA for new handshakes (links up stay up).
//
//   straitd --config /etc/strait/straitd.toml
//   straitd --check-config /etc/strait/straitd.toml   # "config OK: ..." and 0, or the error and 2
//   straitd --syntax-only --check-config FILE         # the text only (where the TLS files are not)
//   straitd --version                                 # "straitd 0.1.0 (git ...)"
//
// --check-config checks what a start would: the text (gateway/config.h), then the TLS files and
// the kernel's congestion control (gateway/config_check.h); warnings (a private key others may
// read) go to stderr and do not fail it. A start runs the same checks first. Bad flags exit 2,
// as on every Strait tool (tools/cli/cli.h).
//
// Under systemd (Type=notify, deploy/systemd/straitd.service) it reports READY=1 once its
// sockets are bound and STOPPING=1 when a stop signal arrives, through $NOTIFY_SOCKET.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/heap.h"
#include "common/log.h"
#include "gateway/config.h"
#include "gateway/config_check.h"
#include "gateway/gateway.h"
#include "net/socket_options.h"
#include "tools/cli/cli.h"

namespace {

// sd_notify(3) without libsystemd: one datagram of "KEY=value" lines to the Unix socket named
// by $NOTIFY_SOCKET (a path, or "@name" for the abstract namespace). Does nothing when the
// variable is unset (not started by systemd, or Type is not notify). Failures are logged, not
// fatal: systemd then times the start out, which says more than straitd exiting would.
void NotifySystemd(const std::string& state) {
  const char* socket_path = std::getenv("NOTIFY_SOCKET");
  if (socket_path == nullptr || socket_path[0] == '\0') return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t length = std::strlen(socket_path);
  if ((socket_path[0] != '/' && socket_path[0] != '@') || length >= sizeof(addr.sun_path)) {
    STRAIT_LOG(kWarn, "straitd") << "NOTIFY_SOCKET '" << socket_path
                                 << "' is not a Unix socket path; systemd is not notified";
    return;
  }
  std::memcpy(addr.sun_path, socket_path, length);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const auto addr_length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length);
  if (fd < 0 || ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                         reinterpret_cast<const sockaddr*>(&addr), addr_length) < 0) {
    STRAIT_LOG(kWarn, "straitd") << "cannot notify systemd through NOTIFY_SOCKET '" << socket_path
                                 << "': " << std::strerror(errno);
  }
  if (fd >= 0) ::close(fd);
}

// One line of the daemon's own to `to` (stdout or stderr): plain text, or with --log-format json
// a JSON object like every log line, so that a collector reading the container's output as JSON
// meets nothing else. --check-config's report is for a person and stays plain.
void Say(std::FILE* to, strait::LogLevel level, const std::string& text) {
  if (strait::GetLogFormat() == strait::LogFormat::kJson) {
    std::fprintf(to, "%s\n",
                 strait::FormatJsonLogLine(strait::LogTimestampNow(), level, "straitd", text)
                     .c_str());
  } else {
    std::fprintf(to, "%s\n", text.c_str());
  }
}

// The config at `file`, checked as --check-config and a start both need: its text, then what it
// refers to. Prints the error ("config error: ...") and returns nullopt when it cannot start.
// Warnings ("config warning: ...") go to stderr for --check-config and to the log (whose format
// the operator chose) at a start. `syntax_only` skips the second half.
std::optional<strait::gateway::GatewayConfig> LoadCheckedConfig(const std::string& file,
                                                                bool log_warnings,
                                                                bool syntax_only = false) {
  // At a start (log_warnings) the error is the daemon's last line, in the log's format.
  const auto fail = [&](const std::string& message) {
    if (log_warnings) {
      Say(stderr, strait::LogLevel::kError, "config error: " + message);
    } else {
      std::fprintf(stderr, "config error: %s\n", message.c_str());
    }
  };
  auto config = strait::gateway::LoadConfig(file);
  if (!config.ok()) {
    fail(config.status().message());
    return std::nullopt;
  }
  if (syntax_only) return std::move(config).value();
  std::vector<std::string> warnings;
  if (strait::Status s = strait::gateway::CheckConfigEnvironment(*config, &warnings); !s.ok()) {
    fail(s.message());
    return std::nullopt;
  }
  // At start Gateway::Start takes the shard locks itself; a check says who holds them.
  if (!log_warnings) {
    if (strait::Status s = strait::gateway::CheckShardLocks(*config); !s.ok()) {
      fail(s.message());
      return std::nullopt;
    }
  }
  for (const std::string& w : warnings) {
    if (log_warnings) {
      STRAIT_LOG(kWarn, "straitd") << "config warning: " << w;
    } else {
      std::fprintf(stderr, "config warning: %s\n", w.c_str());
    }
  }
  return std::move(config).value();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"straitd: Strait region gateway"};
  strait::cli::AddVersionFlag(app, "straitd");
  std::string config_file, log_level, log_format;
  std::vector<std::string> check_files;
  app.add_option("--config", config_file, "gateway config file (TOML)");
  bool syntax_only = false;
  CLI::Option* check = app.add_option(
      "--check-config", check_files,
      "validate a config file and the TLS files and kernel features it names, then exit; "
      "several files (a deployment's gateways) are also checked against each other: a shard "
      "served twice in a region, dial-only pairs, shard weights");
  app.add_flag("--syntax-only", syntax_only,
               "with --check-config: check the file's text only, not the files it names (CI, "
               "or an init container before the TLS Secret is mounted)")
      ->needs(check);
  app.add_option("--log-level", log_level, "error, warn, info, debug, trace");
  app.add_option("--log-format", log_format,
                 "text (default) or json (one object per line: ts, level, subsystem, msg; the ready "
                 "line on stdout and a failed start's error too)");
  if (std::optional<int> done = strait::cli::Parse(app, argc, argv, "straitd")) return *done;

  // The log settings first, so that --check-config refuses what would stop a start (systemd
  // runs the check with the same flags and environment before it starts the daemon).
  if (!log_level.empty()) {
    auto level = strait::ParseLogLevel(log_level);
    if (!level.ok()) {
      std::fprintf(stderr, "straitd: --log-level: %s\n", level.status().message().c_str());
      return strait::kExitUsage;
    }
    strait::SetLogLevel(*level);
  } else if (strait::Status s = strait::InitLogLevelFromEnv(); !s.ok()) {
    std::fprintf(stderr, "straitd: %s\n", s.message().c_str());
    return strait::kExitUsage;
  }
  if (!log_format.empty()) {
    auto format = strait::ParseLogFormat(log_format);
    if (!format.ok()) {
      std::fprintf(stderr, "straitd: --log-format: %s\n", format.status().message().c_str());
      return strait::kExitUsage;
    }
    strait::SetLogFormat(*format);
  } else if (strait::Status s = strait::InitLogFormatFromEnv(); !s.ok()) {
    std::fprintf(stderr, "straitd: %s\n", s.message().c_str());
    return strait::kExitUsage;
  }
  if (!check_files.empty()) {
    for (const std::string& file : check_files) {
      // --check-config takes every word after it, so `--check-config --syntax-only f` would
      // check a file named "--syntax-only" (and skip the flag): say how to write it instead.
      if (!file.empty() && file[0] == '-') {
        std::fprintf(stderr,
                     "straitd: --check-config: '%s' is not a config file; give flags before "
                     "--check-config (e.g. straitd --syntax-only --check-config FILE...)\n",
                     file.c_str());
        return strait::kExitUsage;
      }
    }
    std::vector<strait::gateway::GatewayConfig> configs;
    for (const std::string& file : check_files) {
      const std::optional<strait::gateway::GatewayConfig> config =
          LoadCheckedConfig(file, /*log_warnings=*/false, syntax_only);
      if (!config) return strait::kExitUsage;
      configs.push_back(*config);
    }
    if (strait::Status s = strait::gateway::CheckConfigSet(configs); !s.ok()) {
      std::fprintf(stderr, "config error: %s\n", s.message().c_str());
      return strait::kExitUsage;
    }
    for (const auto& config : configs) std::printf("config OK: %s\n", config.Summary().c_str());
    return 0;
  }
  if (config_file.empty()) {
    std::fprintf(stderr, "straitd: --config FILE is required (or --check-config FILE)\n");
    return strait::kExitUsage;
  }
  const std::optional<strait::gateway::GatewayConfig> config =
      LoadCheckedConfig(config_file, /*log_warnings=*/true);
  if (!config) return strait::kExitUsage;

  // Before any thread (and arena) exists: all-reduce buffers are reused, not re-faulted.
  strait::KeepLargeBuffersInHeap();
  // Block the stop signals before any thread starts, so that only sigwait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);  // certificate reload, handled in the wait loop below
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto gateway = strait::gateway::Gateway::Start(*config);
  if (!gateway.ok()) {
    Say(stderr, strait::LogLevel::kError, "straitd: " + gateway.status().ToString());
    return 1;
  }
  Say(stdout, strait::LogLevel::kInfo,
      "straitd ready: " + config->Summary() + " wan port " + std::to_string((*gateway)->wan_port()));
  std::fflush(stdout);
  NotifySystemd("READY=1\nSTATUS=serving " + config->Summary());
  if (std::string advice = strait::net::WanHostTuningAdvice(); !advice.empty()) {
    STRAIT_LOG(kWarn, "straitd") << "host tuning: " << advice;
  }
  int sig = 0;
  // SIGHUP reloads the TLS identity (certificate rotation) without dropping links; a bad new
  // file is logged and the old identity stays in use.
  while (sigwait(&stop_signals, &sig) == 0 && sig == SIGHUP) {
    if (strait::Status s = (*gateway)->ReloadIdentity(); !s.ok()) {
      STRAIT_LOG(kError, "straitd") << "SIGHUP: " << s;
    } else {
      STRAIT_LOG(kInfo, "straitd") << "SIGHUP: TLS identity reloaded for new handshakes";
    }
  }
  NotifySystemd("STOPPING=1");
  STRAIT_LOG(kInfo, "straitd") << "signal " << sig << ": shutting down";
  (*gateway)->Shutdown(strait::Deadline::After(config->shutdown_grace_ns));
  STRAIT_LOG(kInfo, "straitd") << "stopped";
  return 0;
}
