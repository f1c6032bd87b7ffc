// A running emulation: the region namespaces, their TUN devices, the router thread, and a reaper
// process that removes the namespaces even if this process is killed with SIGKILL.
//
// Usage: auto emu = Emulator::Start(options);   // needs root (CheckPrivileges)
//        ... run traffic in emu->NamespaceOf(i) (NetnsGuard, `strait-wanem exec`, ip netns exec)
//        emu->Stop();  // or let the destructor do it
// Start() blocks for the setup (tens of milliseconds per region); Stop() is idempotent and
// leaves no namespace or device behind. Stats() is thread-safe.
#ifndef STRAIT_BENCH_WANEM_EMULATOR_H_
#define STRAIT_BENCH_WANEM_EMULATOR_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/config.h"
#include "bench/wanem/netns.h"
#include "bench/wanem/router.h"

namespace strait::wanem {

struct EmulatorOptions {
  std::string name = "wanem";  // Namespaces are strait-<name>-r<i>.
  LinkTable table;             // Its size is the number of regions.
  std::vector<ScheduleEvent> schedule;
  int mtu = 1500;
  std::string cc = "bbr";
  bool gso = true;
  uint64_t seed = 1;
};

class Emulator {
 public:
  // Refuses when another live process runs an instance of the same name; otherwise removes
  // stale namespaces of that name first.
  static StatusOr<std::unique_ptr<Emulator>> Start(EmulatorOptions options);
  ~Emulator();

  // Stops the router, closes the devices and deletes the namespaces. Idempotent.
  Status Stop();

  int regions() const noexcept { return options_.table.regions; }
  const std::string& name() const noexcept { return options_.name; }
  std::string NamespaceOf(int region) const { return NamespaceName(options_.name, region); }
  std::vector<std::string> Namespaces() const;
  RouterStats Stats() const { return router_->Snapshot(); }
  // Changes one directed link while traffic runs (Router::SetLink).
  Status SetLink(int src, int dst, const LinkParams& params) {
    return router_->SetLink(src, dst, params);
  }
  // The error that stopped the router early, or OK while it runs.
  Status RouterStatus() const;

 private:
  explicit Emulator(EmulatorOptions options) : options_(std::move(options)) {}
  Status StartReaper();

  EmulatorOptions options_;
  std::vector<UniqueFd> tuns_;
  std::unique_ptr<Router> router_;
  std::thread thread_;
  Status router_status_;
  std::atomic<bool> router_done_{false};
  UniqueFd reaper_pipe_;  // Closing it (or dying) tells the reaper to clean up.
  pid_t reaper_pid_ = -1;
  std::string pid_file_;
  bool stopped_ = false;
};

// Path of the pid file of instance `name`.
std::string PidFilePath(std::string_view name);
// The pid recorded for `name` if that process is alive, else 0.
pid_t LiveInstancePid(std::string_view name);
// Removes the namespaces of instance `name` (a stale one: no live owner) and its pid file.
Status RemoveInstance(std::string_view name);

}  // namespace strait::wanem

#endif  // STRAIT_BENCH_WANEM_EMULATOR_H_
