// Parsing of the plugin's STRAIT_* environment and interface selection.
#include "plugins/nccl/config.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <vector>

namespace strait::nccl {
namespace {

EnvGetter Env(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

sockaddr_storage V4(const char* text) {
  sockaddr_storage s{};
  auto* a = reinterpret_cast<sockaddr_in*>(&s);
  a->sin_family = AF_INET;
  inet_pton(AF_INET, text, &a->sin_addr);
  return s;
}

TEST(PluginConfig, DefaultsWhenNothingIsSet) {
  StatusOr<PluginConfig> c = ParseConfig(Env({}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->region, "");
  EXPECT_TRUE(c->region_map.empty());
  EXPECT_EQ(c->compression, "auto");
  EXPECT_EQ(c->nsocks, 4);
  EXPECT_TRUE(c->local_shm);
}

TEST(PluginConfig, EveryVariableIsRead) {
  StatusOr<PluginConfig> c = ParseConfig(Env({{"STRAIT_REGION", "us-east"},
                                              {"STRAIT_REGION_MAP", "10.1.0.0/16=us-east"},
                                              {"STRAIT_GATEWAY", "/run/straitd/local.sock"},
                                              {"STRAIT_JOB_ID", "llama-70b.run3"},
                                              {"STRAIT_COMPRESSION", "int8"},
                                              {"STRAIT_SOCKET_IFNAME", "^docker,lo"},
                                              {"STRAIT_NSOCKS", "16"},
                                              {"STRAIT_CONNECT_TIMEOUT", "500ms"},
                                              {"STRAIT_LOCAL_SHM", "0"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->region, "us-east");
  EXPECT_EQ(c->region_map.size(), 1u);
  EXPECT_EQ(c->gateway, "/run/straitd/local.sock");
  EXPECT_EQ(c->job_id, "llama-70b.run3");
  EXPECT_EQ(c->compression, "int8");
  EXPECT_EQ(c->socket_ifname, "^docker,lo");
  EXPECT_EQ(c->nsocks, 16);
  EXPECT_EQ(c->connect_timeout_ns, 500 * 1000 * 1000);
  EXPECT_FALSE(c->local_shm);
  EXPECT_FALSE(c->wan_latency_us.has_value());
  EXPECT_FALSE(c->wan_speed_mbps.has_value());
  c = ParseConfig(Env({{"STRAIT_WAN_LATENCY_US", "25000.5"}, {"STRAIT_WAN_SPEED_MBPS", "100"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->wan_latency_us, 25000.5);
  EXPECT_EQ(c->wan_speed_mbps, 100);
}

TEST(PluginConfig, CompressionTakesTheGatewaysGrammarAsCanonicalText) {
  // Everything straitd accepts (localproto/policy_grammar.h), kept as its canonical text.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"auto", "auto"},     {"none", "none"},           {"zstd:3", "zstd:3"},
      {"INT8", "int8"},     {"int8,ef", "int8,ef"},     {"auto:int8", "auto:int8"},
      {"e4m3", "fp8"},      {"zstd:-5,noef", "zstd:-5,noef"}};
  for (const auto& [in, canonical] : cases) {
    StatusOr<PluginConfig> c = ParseConfig(Env({{"STRAIT_COMPRESSION", in}}));
    ASSERT_TRUE(c.ok()) << in << ": " << c.status();
    EXPECT_EQ(c->compression, canonical) << in;
  }
}

TEST(PluginConfig, BadValuesNameTheVariable) {
  // A list, not a map: several bad values per variable.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"STRAIT_REGION", ""},
      {"STRAIT_REGION", std::string(64, 'r')},
      {"STRAIT_NSOCKS", "1x"},
      {"STRAIT_NSOCKS", ""},
      {"STRAIT_COMPRESSION", "int7"},
      {"STRAIT_COMPRESSION", ""},
      {"STRAIT_COMPRESSION", "zstd:99"},
      {"STRAIT_COMPRESSION", "auto:zstd"},
      {"STRAIT_COMPRESSION", "int8,fast"},
      {"STRAIT_JOB_ID", ""},
      {"STRAIT_GATEWAY", "relative/path"},
      {"STRAIT_GATEWAY", "/" + std::string(107, 'g')},
      {"STRAIT_SOCKET_IFNAME", "^"},
      {"STRAIT_REGION_MAP", ","},
      {"STRAIT_CONNECT_TIMEOUT", "2h"},
      {"STRAIT_CONNECT_TIMEOUT", "soon"},
      {"STRAIT_WAN_LATENCY_US", "-1"},
      {"STRAIT_WAN_LATENCY_US", "20ms"},
      {"STRAIT_WAN_LATENCY_US", "nan"},
      {"STRAIT_WAN_SPEED_MBPS", "0"},
      {"STRAIT_WAN_SPEED_MBPS", "100.5"},
      {"STRAIT_LOCAL_SHM", "yes"},
      {"STRAIT_LOCAL_SHM", ""}};
  for (const auto& [var, value] : bad) {
    StatusOr<PluginConfig> c = ParseConfig(Env({{var, value}}));
    ASSERT_FALSE(c.ok()) << var << "=" << value;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(var), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find("allowed"), std::string::npos) << c.status();
  }
}

TEST(RegionMap, LongestPrefixWinsAcrossFamilies) {
  StatusOr<std::vector<RegionRule>> map =
      ParseRegionMap("10.0.0.0/8=wide, 10.2.0.0/16=eu-west,10.2.3.4=host-pin,fd00::/8=v6");
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(LookupRegion(*map, V4("10.1.9.9")), "wide");
  EXPECT_EQ(LookupRegion(*map, V4("10.2.9.9")), "eu-west");
  EXPECT_EQ(LookupRegion(*map, V4("10.2.3.4")), "host-pin");
  EXPECT_EQ(LookupRegion(*map, V4("192.168.0.1")), std::nullopt);
  sockaddr_storage v6{};
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&v6);
  a6->sin6_family = AF_INET6;
  inet_pton(AF_INET6, "fd12::1", &a6->sin6_addr);
  EXPECT_EQ(LookupRegion(*map, v6), "v6");
  StatusOr<std::vector<RegionRule>> zero = ParseRegionMap("0.0.0.0/0=everywhere");
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(LookupRegion(*zero, V4("8.8.8.8")), "everywhere");
}

TEST(RegionMap, MalformedEntriesAreRejected) {
  for (const char* text : {"10.0.0.0/8", "10.0.0.0/8=", "=us", "10.0.0.0/x=us", "10.0.0.0/-1=us",
                           "fd00::/129=us", "host=us", "10.0.0.0/8=bad name"}) {
    StatusOr<std::vector<RegionRule>> map = ParseRegionMap(text);
    EXPECT_FALSE(map.ok()) << text;
    if (!map.ok()) {
      EXPECT_NE(map.status().message().find("STRAIT_REGION_MAP"), std::string::npos);
    }
  }
}

TEST(Interfaces, LoopbackCanBeChosenAndUnknownNamesListWhatExists) {
  StatusOr<Interface> lo = SelectInterface("=lo");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(lo->name, "lo");
  EXPECT_EQ(AddressToString(lo->addr), "127.0.0.1");
  StatusOr<Interface> none = SelectInterface("nosuchif");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("STRAIT_SOCKET_IFNAME"), std::string::npos);
  EXPECT_NE(none.status().message().find("lo"), std::string::npos);
  StatusOr<Interface> any = SelectInterface("");
  EXPECT_TRUE(any.ok()) << any.status();
}

}  // namespace
}  // namespace strait::nccl
