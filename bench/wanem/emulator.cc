// Bring-up and teardown of an emulation (see emulator.h), including the SIGKILL-proof reaper.
#include "bench/wanem/emulator.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/clock.h"
#include "common/log.h"

namespace strait::wanem {

std::string PidFilePath(std::string_view name) {
  return std::string(kStateDir) + "/" + std::string(name) + ".pid";
}

pid_t LiveInstancePid(std::string_view name) {
  std::ifstream f(PidFilePath(name));
  long pid = 0;
  if (!(f >> pid) || pid <= 0) return 0;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return 0;
  return static_cast<pid_t>(pid);
}

Status RemoveInstance(std::string_view name) {
  Status result;
  for (const std::string& ns : ListNamespaces(NamespacePrefix(name))) {
    Status s = DeleteNamespace(ns);
    if (!s.ok() && result.ok()) result = s;
  }
  ::unlink(PidFilePath(name).c_str());
  ::unlink((std::string(kStateDir) + "/" + std::string(name) + ".log").c_str());
  return result;
}

StatusOr<std::unique_ptr<Emulator>> Emulator::Start(EmulatorOptions options) {
  STRAIT_RETURN_IF_ERROR(CheckPrivileges());
  STRAIT_RETURN_IF_ERROR(ValidateInstanceName(options.name));
  if (options.table.regions < 2 || options.table.regions > kMaxRegions) {
    return InvalidArgumentError("an emulation needs 2.." + std::to_string(kMaxRegions) +
                                " regions");
  }
  if (pid_t other = LiveInstancePid(options.name); other != 0 && other != getpid()) {
    return FailedPreconditionError("instance '" + options.name + "' is running as pid " +
                                   std::to_string(other) + "; stop it with `strait-wanem down "
                                   "--name " + options.name + "` or pick another --name");
  }
  Status stale = RemoveInstance(options.name);
  if (!stale.ok()) return stale.WithContext("removing stale namespaces of '" + options.name + "'");

  std::unique_ptr<Emulator> emu(new Emulator(std::move(options)));  // Private constructor.
  mkdir(kStateDir, 0755);
  emu->pid_file_ = PidFilePath(emu->options_.name);
  {
    std::ofstream f(emu->pid_file_);
    f << getpid() << "\n";
    if (!f) return InternalError("cannot write " + emu->pid_file_);
  }
  STRAIT_RETURN_IF_ERROR(emu->StartReaper());

  const int n = emu->options_.table.regions;
  for (int r = 0; r < n; ++r) {
    const std::string ns = emu->NamespaceOf(r);
    Status s = CreateNamespace(ns);
    if (!s.ok()) return s.WithContext("creating region " + std::to_string(r));
    RegionSetup setup;
    setup.ns = ns;
    setup.region = r;
    setup.mtu = emu->options_.mtu;
    setup.cc = emu->options_.cc;
    setup.gso = emu->options_.gso;
    auto tun = SetUpRegion(setup);
    if (!tun.ok()) return tun.status().WithContext("setting up region " + std::to_string(r));
    emu->tuns_.push_back(std::move(*tun));
  }

  RouterOptions ro;
  for (const auto& t : emu->tuns_) ro.tun_fds.push_back(t.get());
  ro.table = emu->options_.table;
  ro.schedule = emu->options_.schedule;
  ro.seed = emu->options_.seed;
  STRAIT_ASSIGN_OR_RETURN(emu->router_, Router::Create(std::move(ro)));
  Emulator* self = emu.get();
  emu->thread_ = std::thread([self] {
    Status s = self->router_->Run();
    if (!s.ok()) {
      STRAIT_LOG(kError, "wanem") << "router stopped: " << s;
    }
    self->router_status_ = s;
    self->router_done_.store(true, std::memory_order_release);
  });
  STRAIT_LOG(kInfo, "wanem") << "instance '" << emu->options_.name << "' up: " << n
                             << " regions, MTU " << emu->options_.mtu << ", cc "
                             << emu->options_.cc;
  return emu;
}

Status Emulator::StartReaper() {
  // Everything the child touches is prepared here: after fork() in a threaded process it may only
  // make system calls.
  std::vector<std::string> paths;
  for (int r = 0; r < options_.table.regions; ++r) {
    paths.push_back(std::string(kNetnsDir) + "/" + NamespaceOf(r));
  }
  std::vector<const char*> cpaths;
  for (const auto& p : paths) cpaths.push_back(p.c_str());
  const char* pid_file = pid_file_.c_str();
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return InternalError(std::string("pipe2: ") +
                                                       std::strerror(errno));
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  const pid_t pid = fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    if (devnull >= 0) ::close(devnull);
    return InternalError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // The reaper: its own session (a signal to the owner's process group spares it), no stdio
    // (a reader of the owner's output must not wait for it), nothing inherited but the pipe.
    setsid();
    struct sigaction sa {};
    sa.sa_handler = SIG_IGN;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT}) sigaction(sig, &sa, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 1);
      dup2(devnull, 2);
    }
    if (dup2(fds[0], 3) < 0) _exit(1);
    syscall(SYS_close_range, 4u, ~0u, 0u);
    char c = 0;
    ssize_t n;
    do {
      n = ::read(3, &c, 1);
    } while (n < 0 && errno == EINTR);
    if (n == 1 && c == 'D') _exit(0);  // The owner cleaned up itself.
    for (const char* p : cpaths) {
      umount2(p, MNT_DETACH);
      unlink(p);
    }
    unlink(pid_file);
    _exit(0);
  }
  ::close(fds[0]);
  if (devnull >= 0) ::close(devnull);
  reaper_pipe_.Reset(fds[1]);
  reaper_pid_ = pid;
  return Status::Ok();
}

Emulator::~Emulator() {
  Status s = Stop();
  if (!s.ok()) {
    STRAIT_LOG(kError, "wanem") << "teardown: " << s;
  }
}

Status Emulator::RouterStatus() const {
  if (!router_done_.load(std::memory_order_acquire)) return Status::Ok();
  return router_status_.ok() ? CancelledError("router stopped") : router_status_;
}

std::vector<std::string> Emulator::Namespaces() const {
  std::vector<std::string> out;
  for (int r = 0; r < regions(); ++r) out.push_back(NamespaceOf(r));
  return out;
}

Status Emulator::Stop() {
  if (stopped_) return Status::Ok();
  stopped_ = true;
  if (router_) router_->Stop();
  if (thread_.joinable()) thread_.join();
  // Devices go with their descriptors; namespaces once their mount and last user are gone.
  tuns_.clear();
  Status result = RemoveInstance(options_.name);
  if (reaper_pipe_.valid()) {
    const char done = 'D';
    [[maybe_unused]] ssize_t w = ::write(reaper_pipe_.get(), &done, 1);
    reaper_pipe_.Reset();
  }
  if (reaper_pid_ > 0) {
    // The reaper exits as soon as it reads the byte; bounded wait all the same.
    Deadline deadline = Deadline::AfterSeconds(2.0);
    while (waitpid(reaper_pid_, nullptr, WNOHANG) == 0) {
      if (deadline.Expired()) {
        ::kill(reaper_pid_, SIGKILL);
        waitpid(reaper_pid_, nullptr, 0);
        break;
      }
      usleep(1000);
    }
    reaper_pid_ = -1;
  }
  STRAIT_LOG(kInfo, "wanem") << "instance '" << options_.name << "' down";
  return result;
}

}  // namespace strait::wanem
