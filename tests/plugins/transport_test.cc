// What the transport tells NCCL's cost model (getProperties): the interface's figures without a
// gateway, the WAN's with one (defaults and STRAIT_WAN_* overrides); and listen() with a
// STRAIT_GATEWAY that does not answer fails with a message naming it instead of publishing a
// handle that other regions could not use.
#include "plugins/nccl/transport.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace strait::nccl {
namespace {

EnvGetter Env(std::map<std::string, std::string> vars) {
  vars.emplace("STRAIT_SOCKET_IFNAME", "lo");
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// Runs `check` on the properties of a transport initialised from `vars`, then finalizes (the
// first init fixes the configuration until the last finalize).
template <typename Check>
void WithProperties(std::map<std::string, std::string> vars, Check check) {
  Transport& t = Transport::Get();
  ASSERT_TRUE(t.Init(Env(std::move(vars)), nullptr).ok());
  StatusOr<DeviceProperties> p = t.GetProperties(0);
  ASSERT_TRUE(p.ok()) << p.status();
  check(*p);
  t.Finalize();
}

TEST(TransportProperties, WithoutAGatewayTheInterfaceFiguresAreReported) {
  WithProperties({}, [](const DeviceProperties& p) {
    EXPECT_EQ(p.latency_us, 0.0f);
    EXPECT_EQ(p.speed_mbps, 10000);  // loopback reports no speed: NCCL's own default, explicit
    EXPECT_EQ(p.max_recvs, kMaxRecvs);
  });
}

TEST(TransportProperties, WithAGatewayTheWanLatencyIsReported) {
  WithProperties({{"STRAIT_GATEWAY", "/nonexistent/straitd.sock"}, {"STRAIT_REGION", "a"}},
                 [](const DeviceProperties& p) {
                   EXPECT_EQ(p.latency_us, static_cast<float>(kDefaultWanLatencyUs));
                   EXPECT_EQ(p.speed_mbps, 10000);
                 });
}

TEST(TransportProperties, WanVariablesOverrideTheDefaults) {
  WithProperties({{"STRAIT_GATEWAY", "/nonexistent/straitd.sock"},
                  {"STRAIT_WAN_LATENCY_US", "35000"},
                  {"STRAIT_WAN_SPEED_MBPS", "100"}},
                 [](const DeviceProperties& p) {
                   EXPECT_EQ(p.latency_us, 35000.0f);
                   EXPECT_EQ(p.speed_mbps, 100);
                 });
  // Set without a gateway they apply too (an operator describing a WAN-bound job).
  WithProperties({{"STRAIT_WAN_LATENCY_US", "0.5"}},
                 [](const DeviceProperties& p) { EXPECT_EQ(p.latency_us, 0.5f); });
}

TEST(TransportListen, AGatewayThatIsNotThereFailsListenWithItsPath) {
  Transport& t = Transport::Get();
  ASSERT_TRUE(t.Init(Env({{"STRAIT_GATEWAY", "/nonexistent/straitd.sock"}, {"STRAIT_REGION", "a"}}),
                     nullptr)
                  .ok());
  unsigned char handle[128] = {};
  StatusOr<void*> listen = t.Listen(0, handle);
  ASSERT_FALSE(listen.ok());
  EXPECT_EQ(listen.status().code(), StatusCode::kUnavailable) << listen.status();
  EXPECT_NE(listen.status().message().find("/nonexistent/straitd.sock"), std::string::npos)
      << listen.status();
  EXPECT_NE(listen.status().message().find("STRAIT_GATEWAY"), std::string::npos) << listen.status();
  t.Finalize();
}

}  // namespace
}  // namespace strait::nccl
