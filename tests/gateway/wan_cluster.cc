// straitd processes over strait-wanem for integration tests (see wan_cluster.h).
#include "tests/gateway/wan_cluster.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "bench/wanem/config.h"
#include "bench/wanem/netns.h"
#include "common/clock.h"
#include "localproto/client.h"
#include "tests/common/straitd_process.h"
#include "tests/common/stats_text.h"

namespace strait::gateway::testing {
namespace {

// Fresh namespaces: nothing else listens there, so fixed ports are free.
constexpr int kPortBase = 7600;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

StatusOr<std::unique_ptr<WanCluster>> WanCluster::Start(WanClusterOptions options) {
  std::unique_ptr<WanCluster> c(new WanCluster(std::move(options)));
  const WanClusterOptions& o = c->options_;
  STRAIT_RETURN_IF_ERROR(wanem::CheckPrivileges());
  char tmpl[] = "/tmp/strait-wan-cluster-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return UnavailableError("mkdtemp failed");
  c->dir_ = tmpl;
  // Other uids (isolation tests) must reach the sockets, which are mode 0660 themselves.
  ::chmod(c->dir_.c_str(), 0755);
  if (o.tls) {
    auto pki = net::testing::TestPki::Create();
    if (!pki.ok()) return pki.status();
    c->pki_.emplace(std::move(pki).value());
    STRAIT_RETURN_IF_ERROR(c->pki_->MakeCa("cluster-ca"));
  }
  auto table = wanem::BuildLinkTable(o.regions, o.link, o.pair_overrides);
  if (!table.ok()) return table.status().WithContext("wan cluster links");
  wanem::EmulatorOptions eo;
  eo.name = o.name;
  eo.table = std::move(table).value();
  auto emulator = wanem::Emulator::Start(std::move(eo));
  if (!emulator.ok()) return emulator.status().WithContext("strait-wanem");
  c->emulator_ = std::move(emulator).value();
  if (o.shards_per_gateway < 1 || o.ranks_per_region % o.shards_per_gateway != 0) {
    return InvalidArgumentError("shards_per_gateway must divide ranks_per_region");
  }
  const int k = o.shards_per_gateway;
  c->pids_.assign(static_cast<size_t>(o.regions * c->Gateways()), -1);
  c->starts_.assign(c->pids_.size(), 0);
  for (int r = 0; r < o.regions; ++r) {
    for (int g = 0; g < c->Gateways(); ++g) {
      STRAIT_RETURN_IF_ERROR(c->WriteConfig(r, g * k));
      STRAIT_RETURN_IF_ERROR(c->Spawn(r, g * k));
    }
  }
  for (int r = 0; r < o.regions; ++r) {
    for (int g = 0; g < c->Gateways(); ++g) STRAIT_RETURN_IF_ERROR(c->WaitReady(r, g * k));
  }
  return c;
}

WanCluster::~WanCluster() {
  test::KillProcesses(&pids_);
  if (emulator_) emulator_->Stop().IgnoreError();
  pki_.reset();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string WanCluster::Base(int region, int index) const {
  return dir_ + "/" + RegionName(region) + "_" + std::to_string(GatewayOf(index));
}

std::string WanCluster::Socket(int region, int index) const { return Base(region, index) + ".sock"; }

std::string WanCluster::ConfigFile(int region, int index) const {
  return Base(region, index) + ".toml";
}

std::string WanCluster::Logs(int region, int index) const {
  const std::string base = Base(region, index);
  return "--- stdout\n" + ReadFile(base + ".out") + "--- stderr\n" + ReadFile(base + ".err");
}

Status WanCluster::WriteConfig(int region, int index) {
  const WanClusterOptions& o = options_;
  // Gateway g listens on kPortBase + g; shard i is served by gateway GatewayOf(i).
  const auto port = [this](int i) { return std::to_string(kPortBase + GatewayOf(i)); };
  std::string t = "region = \"" + RegionName(region) + "\"\n";
  const int k = o.shards_per_gateway;
  const int first = GatewayOf(index) * k;
  if (k == 1) {
    t += "shard_index = " + std::to_string(index) + "\n";
  } else {
    t += "shards = \"" + std::to_string(first) + "-" + std::to_string(first + k - 1) + "\"\n";
  }
  t += "[local]\nsocket = \"" + Socket(region, index) + "\"\nallowed_uids = [" +
       std::to_string(::getuid());
  for (uint32_t uid : o.allowed_uids) t += ", " + std::to_string(uid);
  t += "]\n";
  t += "[wan]\nlisten = \"" + wanem::RegionAddress(region) + ":" + port(index) + "\"\n";
  t += std::string("transport = \"") + (o.tls ? "tls" : "plain") + "\"\n";
  const auto dial_only = [&o](int r) {
    return std::find(o.dial_only_regions.begin(), o.dial_only_regions.end(), r) !=
           o.dial_only_regions.end();
  };
  if (dial_only(region)) t += "dial = \"outbound-only\"\n";
  if (o.tls) {
    auto files = pki_->MakeGateway("cluster-ca", RegionName(region),
                                   RegionName(region) + "_" + std::to_string(index));
    if (!files.ok()) return files.status();
    t += "[tls]\nca = \"" + files->ca + "\"\ncert = \"" + files->cert + "\"\nkey = \"" +
         files->key + "\"\n";
  }
  for (int p = 0; p < o.regions; ++p) {
    if (p == region && !o.full_mesh) continue;
    t += "[peers." + RegionName(p) + "]\n";
    if (dial_only(p)) {
      t += "dial = \"outbound-only\"\n";
      if (p != region) continue;  // it dials us: no address
    }
    for (int i = 0; i < o.ranks_per_region; ++i) {
      if (GatewayOf(i) != GatewayOf(index) && !o.full_mesh) continue;
      t +=
          "shard_" + std::to_string(i) + " = \"" + wanem::RegionAddress(p) + ":" + port(i) + "\"\n";
    }
  }
  t += "[link]\nstreams = 2\nstream_timeout = \"" + o.stream_timeout +
       "\"\nunreachable_after = \"" + o.unreachable_after + "\"\n";
  t += "[policy]\n" + o.policy;
  t += "[allreduce]\ndeadline = \"" + o.allreduce_deadline + "\"\nshutdown_grace = \"2s\"\n";
  if (!o.shard_weights.empty()) {
    t += "shard_weights = {";
    for (int p = 0; p < o.regions; ++p) {
      t += std::string(p ? ", " : " ") + RegionName(p) + " = " +
           std::to_string(o.shard_weights[static_cast<size_t>(p)]);
    }
    t += " }\n";
  }
  std::ofstream out(ConfigFile(region, index));
  out << t;
  if (!out.good()) return UnavailableError("cannot write " + ConfigFile(region, index));
  return Status::Ok();
}

Status WanCluster::Spawn(int region, int index) {
  const std::string base = Base(region, index);
  // Appended: a restarted daemon's ready line follows the earlier ones (WaitReady counts them).
  test::SpawnOptions output;
  output.stdout_path = base + ".out";
  output.stderr_path = base + ".err";
  const pid_t pid = test::SpawnProcess({"ip", "netns", "exec", emulator_->NamespaceOf(region),
                                        options_.straitd, "--config", ConfigFile(region, index)},
                                       output);
  if (pid < 0) return UnavailableError("cannot start straitd (the test failure above says why)");
  pids_[Slot(region, index)] = pid;
  ++starts_[Slot(region, index)];
  return Status::Ok();
}

Status WanCluster::WaitReady(int region, int index) {
  const std::string out = Base(region, index) + ".out";
  // Each start appends one ready line: wait for as many as this daemon was started.
  const Deadline deadline = Deadline::AfterSeconds(30);
  pid_t& pid = pids_[Slot(region, index)];
  for (;;) {
    const std::string text = ReadFile(out);
    size_t lines = 0;
    for (size_t at = text.find("straitd ready"); at != std::string::npos;
         at = text.find("straitd ready", at + 1)) {
      ++lines;
    }
    if (lines >= starts_[Slot(region, index)]) return Status::Ok();
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      return UnavailableError("straitd " + RegionName(region) + "." + std::to_string(index) +
                              " exited:\n" + Logs(region, index));
    }
    if (deadline.Expired()) {
      return DeadlineExceededError("straitd " + RegionName(region) + "." + std::to_string(index) +
                                   " not ready in 30 s:\n" + Logs(region, index));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool WanCluster::Running(int region, int index) {
  pid_t& pid = pids_[Slot(region, index)];
  if (pid <= 0) return false;
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) == pid) {
    pid = -1;
    return false;
  }
  return true;
}

WanClusterOptions OneGatewayPerRegion(const std::string& straitd, const std::string& tag,
                                      int regions, int64_t deadline_seconds) {
  WanClusterOptions o;
  o.straitd = straitd;
  o.name = tag + std::to_string(::getpid() % 10000);
  o.regions = regions;
  o.ranks_per_region = 1;
  o.link = "rate=100mbit,delay=10ms";
  o.allreduce_deadline = std::to_string(deadline_seconds) + "s";
  return o;
}

int64_t WanCluster::WaitForStat(int region, int index, const std::string& name,
                                const std::function<bool(int64_t)>& done,
                                Deadline deadline) const {
  int64_t value = -1;
  auto client = localproto::Client::Connect(Socket(region, index), Deadline::AfterSeconds(5));
  if (!client.ok()) return value;
  for (;;) {
    auto stats = (*client)->Stats(Deadline::AfterSeconds(5));
    if (!stats.ok()) return value;
    value = test::StatValue(*stats, name);
    if (done(value) || deadline.Expired()) return value;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void WanCluster::Kill(int region, int index) {
  pid_t& pid = pids_[Slot(region, index)];
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  pid = -1;
}

Status WanCluster::Restart(int region, int index) {
  Kill(region, index);
  STRAIT_RETURN_IF_ERROR(Spawn(region, index));
  return WaitReady(region, index);
}

}  // namespace strait::gateway::testing
