// straitd: the region gateway daemon. Parses flags, loads the config, runs the Gateway until
// SIGTERM or SIGINT, then shuts it down within the config's allreduce.shutdown_grace.
//
//   straitd --config /etc/strait/straitd.toml
//   straitd --check-config /etc/strait/straitd.toml   # "config OK: ..." and 0, or the error and 2
#include <signal.h>

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "common/log.h"
#include "gateway/config.h"
#include "gateway/gateway.h"

int main(int argc, char** argv) {
  CLI::App app{"straitd: Strait region gateway"};
  std::string config_file, check_file, log_level;
  app.add_option("--config", config_file, "gateway config file (TOML)");
  app.add_option("--check-config", check_file, "validate a config file and exit");
  app.add_option("--log-level", log_level, "error, warn, info, debug, trace");
  CLI11_PARSE(app, argc, argv);

  if (!check_file.empty()) {
    auto config = strait::gateway::LoadConfig(check_file);
    if (!config.ok()) {
      std::fprintf(stderr, "config error: %s\n", config.status().message().c_str());
      return 2;
    }
    std::printf("config OK: %s\n", config->Summary().c_str());
    return 0;
  }
  if (config_file.empty()) {
    std::fprintf(stderr, "straitd: --config FILE is required (or --check-config FILE)\n");
    return 2;
  }
  if (!log_level.empty()) {
    auto level = strait::ParseLogLevel(log_level);
    if (!level.ok()) {
      std::fprintf(stderr, "straitd: --log-level: %s\n", level.status().message().c_str());
      return 2;
    }
    strait::SetLogLevel(*level);
  } else if (strait::Status s = strait::InitLogLevelFromEnv(); !s.ok()) {
    std::fprintf(stderr, "straitd: %s\n", s.message().c_str());
    return 2;
  }
  auto config = strait::gateway::LoadConfig(config_file);
  if (!config.ok()) {
    std::fprintf(stderr, "config error: %s\n", config.status().message().c_str());
    return 2;
  }

  // Block the stop signals before any thread starts, so that only sigwait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto gateway = strait::gateway::Gateway::Start(*config);
  if (!gateway.ok()) {
    std::fprintf(stderr, "straitd: %s\n", gateway.status().ToString().c_str());
    return 1;
  }
  std::printf("straitd ready: %s wan port %u\n", config->Summary().c_str(),
              static_cast<unsigned>((*gateway)->wan_port()));
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  STRAIT_LOG(kInfo, "straitd") << "signal " << sig << ": shutting down";
  (*gateway)->Shutdown(strait::Deadline::After(config->shutdown_grace_ns));
  STRAIT_LOG(kInfo, "straitd") << "stopped";
  return 0;
}
