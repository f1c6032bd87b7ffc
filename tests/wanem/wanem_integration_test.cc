// Integration tests of strait-wanem with real namespaces, TUN devices and traffic: RTT and TCP
// goodput against the configuration, UDP loss, a schedule, the one-way firewall (syn=drop: a
// region behind NAT), and teardown after normal exit,
// SIGTERM, SIGKILL of the parent and SIGKILL of the tool itself. Root only; each test skips with
// the reason otherwise. Every wait is bounded.
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/wanem/emulator.h"
#include "bench/wanem/netns.h"
#include "bench/wanem/probe.h"
#include "common/clock.h"

namespace strait::wanem {
namespace {

using ::testing::HasSubstr;

#define SKIP_UNLESS_PRIVILEGED()                                                   \
  do {                                                                             \
    Status priv = CheckPrivileges();                                               \
    if (!priv.ok()) GTEST_SKIP() << "strait-wanem integration: " << priv.message(); \
  } while (false)

// Unique per process and test, so parallel ctest runs never share namespaces.
std::string InstanceName(const char* tag) {
  return std::string(tag) + std::to_string(getpid() % 1000000);
}

EmulatorOptions Options(const std::string& name, const std::string& link,
                        std::vector<std::string> pairs = {}) {
  EmulatorOptions o;
  o.name = name;
  auto t = BuildLinkTable(2, link, pairs);
  EXPECT_TRUE(t.ok()) << t.status();
  o.table = *t;
  return o;
}

// Runs a command, returns its exit code and (stdout + stderr).
std::pair<int, std::string> Shell(const std::string& cmd) {
  std::string out;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return {-1, ""};
  std::array<char, 512> buf;
  while (fgets(buf.data(), buf.size(), f) != nullptr) out += buf.data();
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

bool WaitFor(const std::function<bool()>& cond, double seconds) {
  Deadline d = Deadline::AfterSeconds(seconds);
  while (!d.Expired()) {
    if (cond()) return true;
    usleep(20'000);
  }
  return cond();
}

bool NoNamespacesLeft(const std::string& name) {
  return ListNamespaces(NamespacePrefix(name)).empty() &&
         Shell("ip netns list").second.find(NamespacePrefix(name)) == std::string::npos;
}

// Starts `strait-wanem run --name NAME ... -- sleep 30` as a child of a fresh intermediate
// process (so the test can kill "the parent"); returns {intermediate, pid file of the tool}.
pid_t SpawnRunUnderParent(const std::string& name) {
  std::vector<std::string> args = {STRAIT_WANEM_BINARY, "run", "--name", name, "--link",
                                   "100mbit,5ms", "--", "sleep", "30"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = fork();
  if (parent == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    const pid_t tool = fork();
    if (tool == 0) {
      if (devnull >= 0) dup2(devnull, 1);
      execv(argv[0], argv.data());
      _exit(127);
    }
    int st;
    waitpid(tool, &st, 0);
    _exit(0);
  }
  return parent;
}

pid_t ToolPid(const std::string& name) {
  std::ifstream f(PidFilePath(name));
  long pid = 0;
  f >> pid;
  return static_cast<pid_t>(pid);
}

// Holds a region's namespace open, so that after teardown we can look inside it for the device.
struct NamespaceHandle {
  UniqueFd fd;
  bool HasTunDevice() const {
    bool found = false;
    std::thread t([&] {
      UniqueFd self(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
      if (setns(fd.get(), CLONE_NEWNET) != 0) return;
      found = if_nametoindex(kTunName) != 0;
      [[maybe_unused]] int rc = setns(self.get(), CLONE_NEWNET);
    });
    t.join();
    return found;
  }
};

NamespaceHandle OpenNamespace(const std::string& ns) {
  return NamespaceHandle{UniqueFd(open((std::string(kNetnsDir) + "/" + ns).c_str(),
                                       O_RDONLY | O_CLOEXEC))};
}

TEST(WanemIntegration, RttAndGoodputMatchTheConfiguration) {
  SKIP_UNLESS_PRIVILEGED();
  auto emu = Emulator::Start(Options(InstanceName("rtt"), "50mbit,25ms"));
  ASSERT_TRUE(emu.ok()) << emu.status();
  const auto ns = (*emu)->Namespaces();
  auto rtt = MeasureUdpRtt(ns, 0, 1, 10, 20'000'000);
  ASSERT_TRUE(rtt.ok()) << rtt.status();
  EXPECT_EQ(rtt->lost, 0);
  EXPECT_NEAR(rtt->min_ms, 50.0, 3.0);
  auto gp = MeasureTcpGoodput(ns, {{0, 1}}, 1'000'000'000, 2'000'000'000);
  ASSERT_TRUE(gp.ok()) << gp.status();
  const double expected = 50e6 * (1500.0 - 52.0) / 1500.0;  // TCP payload at 50 Mbit/s of IP.
  EXPECT_NEAR((*gp)[0].bits_per_second, expected, expected * 0.15);
  const RouterStats st = (*emu)->Stats();
  EXPECT_LE(st.max_packet_bytes, 1500u) << "offloads must leave MTU-sized packets only";
  EXPECT_GT(st.max_packet_bytes, 1400u);
  EXPECT_EQ(st.invalid, 0u);
  ASSERT_TRUE((*emu)->Stop().ok());
  EXPECT_TRUE(NoNamespacesLeft((*emu)->name()));
}

TEST(WanemIntegration, LossyLinkDropsTheConfiguredFraction) {
  SKIP_UNLESS_PRIVILEGED();
  auto emu = Emulator::Start(Options(InstanceName("loss"), "200mbit,5ms,loss=5%"));
  ASSERT_TRUE(emu.ok()) << emu.status();
  auto r = MeasureUdpLoss((*emu)->Namespaces(), 0, 1, 4000, 200, 4000);
  ASSERT_TRUE(r.ok()) << r.status();
  // 4000 trials at 5%: sigma is 0.34%, so +-2% is about six sigma.
  EXPECT_NEAR(r->loss, 0.05, 0.02);
  const RouterStats st = (*emu)->Stats();
  EXPECT_EQ(st.links[0][1].packets[int(Verdict::kLost)], r->sent - r->received)
      << "every missing datagram is one the model dropped";
}

// A TCP socket created in namespace `ns` (a socket stays in the namespace it was made in).
UniqueFd TcpSocketIn(const std::string& ns) {
  UniqueFd fd;
  std::thread t([&] {
    auto guard = NetnsGuard::Enter(ns);
    if (guard.ok()) fd.Reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  });
  t.join();
  return fd;
}

sockaddr_in AddressOf(int region, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = RegionAddressBe(region);
  return a;
}

// A listener of region `region` on `port`.
UniqueFd ListenIn(const RegionNamespaces& ns, int region, uint16_t port) {
  UniqueFd fd = TcpSocketIn(ns[static_cast<size_t>(region)]);
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const sockaddr_in a = AddressOf(region, port);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(fd.get(), 4) != 0) {
    return UniqueFd();
  }
  return fd;
}

// Connects from region `from` to region `to`'s `port` within `seconds`: the connected socket,
// or an invalid one when the handshake did not complete in time.
UniqueFd ConnectWithin(const RegionNamespaces& ns, int from, int to, uint16_t port,
                       double seconds) {
  UniqueFd fd = TcpSocketIn(ns[static_cast<size_t>(from)]);
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  const sockaddr_in a = AddressOf(to, port);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 &&
      errno != EINPROGRESS) {
    return UniqueFd();
  }
  pollfd p{fd.get(), POLLOUT, 0};
  if (::poll(&p, 1, static_cast<int>(seconds * 1000)) != 1) return UniqueFd();
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return UniqueFd();
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// `*>1=syn=drop` puts region 1 behind NAT: a connection into it never completes (its SYNs are
// dropped, counted as kFiltered), while one it opens to region 0 carries data both ways.
TEST(WanemIntegration, SynDropAdmitsNoInboundConnectionButConnectionsOutWork) {
  SKIP_UNLESS_PRIVILEGED();
  auto emu = Emulator::Start(Options(InstanceName("syn"), "100mbit,5ms", {"*>1=syn=drop"}));
  ASSERT_TRUE(emu.ok()) << emu.status();
  const auto ns = (*emu)->Namespaces();
  constexpr uint16_t kPort = 9300;
  UniqueFd in0 = ListenIn(ns, 0, kPort);
  UniqueFd in1 = ListenIn(ns, 1, kPort);
  ASSERT_TRUE(in0.valid() && in1.valid()) << std::strerror(errno);

  // Into region 1: the listener is there, but the handshake never completes.
  UniqueFd blocked = ConnectWithin(ns, 0, 1, kPort, 1.5);
  EXPECT_FALSE(blocked.valid()) << "a TCP connection into the NAT'd region completed";
  EXPECT_GE((*emu)->Stats().links[0][1].packets[int(Verdict::kFiltered)], 1u);

  // Out of region 1: connects, and data flows both ways over it.
  UniqueFd out = ConnectWithin(ns, 1, 0, kPort, 5.0);
  ASSERT_TRUE(out.valid()) << "a TCP connection out of the NAT'd region failed";
  UniqueFd served(::accept4(in0.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(served.valid()) << std::strerror(errno);
  char buf[8] = {};
  ASSERT_EQ(::send(out.get(), "ping", 4, 0), 4);
  ASSERT_EQ(::recv(served.get(), buf, 4, MSG_WAITALL), 4);
  EXPECT_EQ(std::string(buf, 4), "ping");
  ASSERT_EQ(::send(served.get(), "pong", 4, 0), 4);
  ASSERT_EQ(::recv(out.get(), buf, 4, MSG_WAITALL), 4);
  EXPECT_EQ(std::string(buf, 4), "pong");
  // The router publishes its counters every 50 ms: wait for the ones of the exchange above.
  EXPECT_TRUE(WaitFor([&] { return (*emu)->Stats().links[0][1].delivered_packets > 0; }, 2.0))
      << "region 0's replies never reached region 1";
  EXPECT_EQ((*emu)->Stats().links[1][0].packets[int(Verdict::kFiltered)], 0u);
  ASSERT_TRUE((*emu)->Stop().ok());
}

TEST(WanemIntegration, ScheduleCutsTheRate) {
  SKIP_UNLESS_PRIVILEGED();
  EmulatorOptions o = Options(InstanceName("sched"), "50mbit,10ms");
  auto ev = ParseSchedule("500ms * rate=20%\n", o.table, "inline");
  ASSERT_TRUE(ev.ok()) << ev.status();
  o.schedule = *ev;
  auto emu = Emulator::Start(o);
  ASSERT_TRUE(emu.ok()) << emu.status();
  auto gp = MeasureTcpGoodput((*emu)->Namespaces(), {{0, 1}}, 1'500'000'000, 1'500'000'000);
  ASSERT_TRUE(gp.ok()) << gp.status();
  const double expected = 10e6 * (1500.0 - 52.0) / 1500.0;
  EXPECT_NEAR((*gp)[0].bits_per_second, expected, expected * 0.2);
  const RouterStats st = (*emu)->Stats();
  EXPECT_EQ(st.schedule_applied, 2u);
  EXPECT_EQ(st.params[0][1].rate_bps, 10'000'000u);
}

TEST(WanemIntegration, StartRefusesALiveInstanceOfTheSameName) {
  SKIP_UNLESS_PRIVILEGED();
  const std::string name = InstanceName("dup");
  const pid_t parent = SpawnRunUnderParent(name);
  ASSERT_TRUE(WaitFor([&] { return ListNamespaces(NamespacePrefix(name)).size() == 2; }, 10));
  auto second = Emulator::Start(Options(name, "1gbit"));
  EXPECT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("is running"));
  kill(ToolPid(name), SIGTERM);
  EXPECT_TRUE(WaitFor([&] { return NoNamespacesLeft(name); }, 10));
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
}

TEST(WanemIntegration, SigtermTearsEverythingDown) {
  SKIP_UNLESS_PRIVILEGED();
  const std::string name = InstanceName("term");
  const pid_t parent = SpawnRunUnderParent(name);
  ASSERT_TRUE(WaitFor([&] { return ListNamespaces(NamespacePrefix(name)).size() == 2; }, 10));
  ASSERT_TRUE(WaitFor([&] { return ToolPid(name) > 0; }, 5));
  NamespaceHandle h;
  // Reopened on each try: until `ip netns add` has bind-mounted the namespace, the name is a
  // plain file.
  ASSERT_TRUE(WaitFor(
      [&] {
        h = OpenNamespace(NamespaceName(name, 1));
        return h.HasTunDevice();
      },
      5));
  kill(ToolPid(name), SIGTERM);
  int st = 0;
  waitpid(parent, &st, 0);  // The intermediate exits once the tool has.
  EXPECT_TRUE(NoNamespacesLeft(name));
  EXPECT_FALSE(h.HasTunDevice()) << "the TUN device outlived the tool";
  EXPECT_NE(access(PidFilePath(name).c_str(), F_OK), 0);
}

TEST(WanemIntegration, SigkillOfTheParentTearsEverythingDown) {
  SKIP_UNLESS_PRIVILEGED();
  const std::string name = InstanceName("pkill");
  const pid_t parent = SpawnRunUnderParent(name);
  ASSERT_TRUE(WaitFor([&] { return ListNamespaces(NamespacePrefix(name)).size() == 2; }, 10));
  ASSERT_TRUE(WaitFor([&] { return ToolPid(name) > 0; }, 5));
  NamespaceHandle h;
  // Reopened on each try: until `ip netns add` has bind-mounted the namespace, the name is a
  // plain file.
  ASSERT_TRUE(WaitFor(
      [&] {
        h = OpenNamespace(NamespaceName(name, 0));
        return h.HasTunDevice();
      },
      5));
  const pid_t tool = ToolPid(name);
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
  EXPECT_TRUE(WaitFor([&] { return kill(tool, 0) != 0; }, 10)) << "tool outlived its parent";
  EXPECT_TRUE(WaitFor([&] { return NoNamespacesLeft(name); }, 5));
  EXPECT_TRUE(WaitFor([&] { return !h.HasTunDevice(); }, 5));
}

TEST(WanemIntegration, SigkillOfTheToolIsCleanedByItsReaper) {
  SKIP_UNLESS_PRIVILEGED();
  const std::string name = InstanceName("kill");
  const pid_t parent = SpawnRunUnderParent(name);
  ASSERT_TRUE(WaitFor([&] { return ListNamespaces(NamespacePrefix(name)).size() == 2; }, 10));
  ASSERT_TRUE(WaitFor([&] { return ToolPid(name) > 0; }, 5));
  NamespaceHandle h;
  // Reopened on each try: until `ip netns add` has bind-mounted the namespace, the name is a
  // plain file.
  ASSERT_TRUE(WaitFor(
      [&] {
        h = OpenNamespace(NamespaceName(name, 0));
        return h.HasTunDevice();
      },
      5));
  kill(ToolPid(name), SIGKILL);
  waitpid(parent, nullptr, 0);
  EXPECT_TRUE(WaitFor([&] { return NoNamespacesLeft(name); }, 5));
  EXPECT_TRUE(WaitFor([&] { return !h.HasTunDevice(); }, 5));
}

TEST(WanemIntegration, UpExecDown) {
  SKIP_UNLESS_PRIVILEGED();
  const std::string name = InstanceName("up");
  const std::string bin = STRAIT_WANEM_BINARY;
  auto [up_rc, up_out] = Shell(bin + " up --name " + name + " --link 100mbit,5ms");
  ASSERT_EQ(up_rc, 0) << up_out;
  EXPECT_THAT(up_out, HasSubstr(NamespaceName(name, 1)));
  auto [ex_rc, ex_out] = Shell(bin + " exec --name " + name + " 1 -- ip -o -4 addr show");
  EXPECT_EQ(ex_rc, 0) << ex_out;
  EXPECT_THAT(ex_out, HasSubstr("10.201.1.1/16"));
  auto [dn_rc, dn_out] = Shell(bin + " down --name " + name);
  EXPECT_EQ(dn_rc, 0) << dn_out;
  EXPECT_TRUE(NoNamespacesLeft(name));
}

TEST(WanemIntegration, BadFlagsGiveOneClearError) {
  const std::string bin = STRAIT_WANEM_BINARY;
  auto [rc, out] = Shell(bin + " run --link rate=fast -- true");
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("rate='fast'"));
  auto [rc2, out2] = Shell(bin + " run --pair 0:7=loss=1% -- true");
  EXPECT_EQ(rc2, 2);
  EXPECT_THAT(out2, HasSubstr("'7'"));
}

// Makes Emulator::Start refuse `name` for the scope, so that a flag error reported under it
// proves the flag was checked before any namespace was made: as root, a pid file naming this
// (live) test process claims the name; without root, Start refuses anyway.
class ClaimedName {
 public:
  explicit ClaimedName(std::string instance) : name_(std::move(instance)) {
    if (geteuid() != 0) return;
    mkdir(kStateDir, 0755);
    std::ofstream(PidFilePath(name_)) << getpid() << "\n";
  }
  ~ClaimedName() { unlink(PidFilePath(name_).c_str()); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

size_t Lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

TEST(WanemIntegration, BadInAndCcRefusedBeforeSetup) {
  ClaimedName claim(InstanceName("flags"));
  const std::string run = std::string(STRAIT_WANEM_BINARY) + " run --name " + claim.name();
  for (const char* in : {"2", "-2"}) {
    auto [rc, out] = Shell(run + " --in " + in + " -- true");
    EXPECT_EQ(rc, 2) << out;
    EXPECT_THAT(out, HasSubstr(std::string("bad --in ") + in + ": regions are numbered 0..1"));
    EXPECT_EQ(Lines(out), 1u) << out;
  }
  auto [rc_nocmd, out_nocmd] = Shell(run + " --in 1");
  EXPECT_EQ(rc_nocmd, 2) << out_nocmd;
  EXPECT_THAT(out_nocmd, HasSubstr("needs a command after --"));
  auto [rc, out] = Shell(run + " --cc warp9 -- true");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_THAT(out, HasSubstr("bad --cc 'warp9'"));
  // The message names what this kernel offers; reno is always built in.
  EXPECT_THAT(out, HasSubstr("reno"));
  EXPECT_EQ(Lines(out), 1u) << out;
}

TEST(WanemIntegration, SelfcheckNamesTheRangeItAccepts) {
  ClaimedName claim(InstanceName("sc"));
  const std::string sc = std::string(STRAIT_WANEM_BINARY) + " selfcheck --name " + claim.name();
  for (const char* seconds : {"0", "nan", "601"}) {
    auto [rc, out] = Shell(sc + " --seconds " + seconds);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_THAT(out, HasSubstr(std::string("bad --seconds ") + seconds +
                               ": the measured window must be more than 0 and at most 600"));
    EXPECT_EQ(Lines(out), 1u) << out;
  }
  auto [rc, out] = Shell(sc + " --streams 17");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_THAT(out, HasSubstr("bad --streams 17: must be 1 to 16"));
}

TEST(WanemIntegration, BinaryScheduleIsQuotedOnOneLine) {
  ClaimedName claim(InstanceName("bin"));
  const std::string path = "/tmp/wanem_schedule_" + claim.name() + ".bin";
  const char kBinary[] = "\x7f" "ELF\x02\x01 \x1b]0;pwned\x07 * \r\x08rate=1%\n\0\n";
  std::ofstream(path, std::ios::binary).write(kBinary, sizeof(kBinary) - 1);
  auto [rc, out] = Shell(std::string(STRAIT_WANEM_BINARY) + " run --name " + claim.name() +
                         " --schedule " + path + " -- true");
  unlink(path.c_str());
  EXPECT_EQ(rc, 2) << out;
  EXPECT_THAT(out, HasSubstr("\\x1b]0;pwned\\x07"));
  EXPECT_EQ(Lines(out), 1u) << out;
  for (char c : out) EXPECT_TRUE((c >= 0x20 && c < 0x7f) || c == '\n') << "raw byte " << int(c);
}

TEST(WanemIntegration, MissingScheduleFileIsAUsageError) {
  ClaimedName claim(InstanceName("nosched"));
  auto [rc, out] = Shell(std::string(STRAIT_WANEM_BINARY) + " run --name " + claim.name() +
                         " --schedule /nonexistent/wanem.schedule -- true");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_THAT(out, HasSubstr("cannot open schedule file '/nonexistent/wanem.schedule'"));
  EXPECT_EQ(Lines(out), 1u) << out;
}

// `down` of a name with nothing up fails, as `ip netns del` and `docker rm` do, rather than
// passing a misspelt --name off as a teardown.
TEST(WanemIntegration, DownOfUnknownNameSaysSo) {
  SKIP_UNLESS_PRIVILEGED();
  const std::string name = InstanceName("nosuch");
  auto [rc, out] = Shell(std::string(STRAIT_WANEM_BINARY) + " down --name " + name);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_THAT(out, HasSubstr("no instance '" + name + "' is up"));
  EXPECT_THAT(out, HasSubstr("strait-wanem list"));
  EXPECT_EQ(Lines(out), 1u) << out;
}

}  // namespace
}  // namespace strait::wanem
