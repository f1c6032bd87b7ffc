// Config validation: a good file parses into the expected values, and each bad file in a table
// gives one error naming the file, line, key path, what was found and what is allowed.
#include "gateway/config.h"

#include <gtest/gtest.h>

#include <cctype>
#include <map>
#include <set>
#include <string>

namespace strait::gateway {
namespace {

constexpr const char* kGood = R"(region = "us-east"
shard_index = 1
[local]
socket = "/run/strait/s.sock"
allowed_uids = [1000, 1001]
allowed_gids = [50]
[wan]
listen = "0.0.0.0:7400"
[tls]
ca = "ca.pem"
cert = "/etc/strait/gw.pem"
key = "gw.key"
[peers.eu-west]
shard_0 = "10.1.0.1:7400"
shard_1 = "10.1.0.2:7400"
[peers.ap-south]
shard_1 = "[fd00::7]:7400"
[link]
streams = 8
congestion_control = "bbr"
unreachable_after = "45s"
[policy]
codec = "int8"
error_feedback = false
min_lossy_bytes = "1MiB"
max_relative_error = 0.01
allowed_codecs = ["none", "zstd", "int8"]
[allreduce]
deadline = "90s"
)";

TEST(GatewayConfig, ParsesAGoodFile) {
  auto c = ParseConfig(kGood, "/etc/strait/straitd.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->region, "us-east");
  EXPECT_EQ(c->shard_index, 1);
  EXPECT_EQ(c->local_socket, "/run/strait/s.sock");
  EXPECT_EQ(c->allowed_uids, (std::vector<uint32_t>{1000, 1001}));
  EXPECT_EQ(c->allowed_gids, (std::vector<uint32_t>{50}));
  EXPECT_EQ(c->wan_listen.ToString(), "0.0.0.0:7400");
  EXPECT_EQ(c->transport, net::Transport::kTls);
  EXPECT_EQ(c->tls_ca, "/etc/strait/ca.pem");  // relative to the config file
  EXPECT_EQ(c->tls_cert, "/etc/strait/gw.pem");
  ASSERT_EQ(c->peers.size(), 2u);
  EXPECT_EQ(c->peers.at("eu-west").at(1).ToString(), "10.1.0.2:7400");
  EXPECT_EQ(c->peers.at("ap-south").at(1).ToString(), "[fd00::7]:7400");
  EXPECT_EQ(c->link.streams, 8);
  EXPECT_EQ(c->link.congestion_control, "bbr");
  EXPECT_EQ(c->link.unreachable_after_ns, 45'000'000'000);
  EXPECT_EQ(c->link.tcp_rto_max_ns, 1'000'000'000);  // the default
  EXPECT_EQ(c->policy.default_codec, "int8");
  EXPECT_FALSE(c->policy.default_error_feedback);
  EXPECT_EQ(c->policy.min_lossy_bytes, 1u << 20);
  EXPECT_DOUBLE_EQ(c->policy.max_relative_error, 0.01);
  EXPECT_EQ(c->policy.allowed_codecs.size(), 3u);
  EXPECT_EQ(c->allreduce_deadline_ns, 90'000'000'000);
  EXPECT_EQ(c->WorldRegions(), (std::vector<std::string>{"ap-south", "eu-west", "us-east"}));
  EXPECT_NE(c->Summary().find("world [ap-south, eu-west, us-east]"), std::string::npos);
}

// Pacing: link.max_rate for every peer, peers.<region>.max_rate for one, in bits per second
// (net::LinkOptions::max_rate_bps and peer_max_rate_bps); unset, nothing is paced.
TEST(GatewayConfig, MaxRatePacesEveryLinkOrOnePeers) {
  EXPECT_EQ(ParseConfig(kGood, "f.toml")->link.max_rate_bps, 0u);
  EXPECT_TRUE(ParseConfig(kGood, "f.toml")->link.peer_max_rate_bps.empty());
  std::string text = kGood;
  text.replace(text.find("streams = 8"), 11, "streams = 8\nmax_rate = \"400mbit\"");
  text.replace(text.find("[peers.eu-west]"), 15, "[peers.eu-west]\nmax_rate = \"12.5MB/s\"");
  auto c = ParseConfig(text, "f.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->link.max_rate_bps, 400'000'000u);
  EXPECT_EQ(c->link.peer_max_rate_bps, (std::map<std::string, uint64_t>{{"eu-west", 100'000'000}}));
  EXPECT_EQ(c->peers.at("eu-west").size(), 2u);  // max_rate is no shard
  EXPECT_NE(c->Summary().find("paced at 400 Mbit/s, eu-west 100 Mbit/s"), std::string::npos)
      << c->Summary();
  EXPECT_EQ(ParseConfig(kGood, "f.toml")->Summary().find("paced"), std::string::npos);
}

TEST(GatewayConfig, OwnRegionTableListsTheRegionsGateways) {
  EXPECT_TRUE(ParseConfig(kGood, "f.toml")->region_gateways.empty());
  EXPECT_EQ(ParseConfig(kGood, "f.toml")->RegionSize(), 1);
  // The same [peers] section for every gateway of the cluster: this one's own entry is ignored.
  std::string text = kGood;
  text.replace(text.find("[peers.ap-south]"), 16,
               "[peers.us-east]\nshard_0 = \"10.0.0.1:7400\"\nshard_1 = \"10.0.0.2:7400\"\n"
               "[peers.ap-south]");
  auto c = ParseConfig(text, "f.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->region_gateways.size(), 1u);
  EXPECT_EQ(c->region_gateways.at(0).ToString(), "10.0.0.1:7400");
  EXPECT_EQ(c->RegionSize(), 2);
  // The cross-region world is unchanged: the own region once.
  EXPECT_EQ(c->WorldRegions(), (std::vector<std::string>{"ap-south", "eu-west", "us-east"}));
  EXPECT_EQ(c->peers.count("us-east"), 0u);
  EXPECT_NE(c->Summary().find("region gateways 2"), std::string::npos) << c->Summary();
}

TEST(GatewayConfig, RegionLinksMayBePlainOnAListenerOfTheirOwn) {
  std::string own = kGood;
  own.replace(own.find("[peers.ap-south]"), 16,
              "[peers.us-east]\nshard_0 = \"10.0.0.1:7401\"\nshard_1 = \"10.0.0.2:7401\"\n"
              "[peers.ap-south]");
  auto with = [&](const std::string& region_links) {
    return ParseConfig(own + region_links, "f.toml");
  };
  auto plain = with("[region_links]\ntransport = \"plain\"\nlisten = \"10.0.0.2:7401\"\n");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->region_plain);
  ASSERT_TRUE(plain->region_listen.has_value());
  EXPECT_EQ(plain->region_listen->ToString(), "10.0.0.2:7401");
  EXPECT_EQ(plain->transport, net::Transport::kTls);  // the WAN keeps TLS
  EXPECT_NE(plain->Summary().find("plain TCP on 10.0.0.2:7401"), std::string::npos)
      << plain->Summary();
  auto tls = with("[region_links]\ntransport = \"tls\"\n");
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_FALSE(tls->region_plain);
  EXPECT_FALSE(tls->region_listen.has_value());

  const struct {
    std::string text, expect;
  } bad[] = {
      {"[region_links]\ntransport = \"plain\"\n",
       "region_links: missing region_links.listen, required by region_links.transport = "
       "\"plain\""},
      {"[region_links]\ntransport = \"tls\"\nlisten = \"10.0.0.2:7401\"\n",
       "region_links.listen: given with region_links.transport = \"tls\""},
      {"[region_links]\ntransport = \"udp\"\n",
       "region_links.transport: found \"udp\"; allowed: \"tls\""},
      {"[region_links]\ntransport = \"plain\"\nlisten = \"10.0.0.2:7400\"\n",
       "region_links.listen: found \"10.0.0.2:7400\", the port of wan.listen (0.0.0.0:7400)"},
      {"[region_links]\ntransport = \"plain\"\nlisten = \"lan0:7401\"\n",
       "region_links.listen: found \"lan0:7401\""},
      {"[region_links]\nlisten_on = \"10.0.0.2:7401\"\n",
       "region_links.listen_on: unknown key; allowed keys here: transport, listen"},
      {"[region_links]\ntransport = \"plain\"\nlisten = \"10.0.0.9:7401\"\n",
       "region_links.listen: found \"10.0.0.9:7401\", but [peers.us-east] gives this gateway "
       "(shard_1) \"10.0.0.2:7401\""},
  };
  for (const auto& b : bad) {
    auto c = with(b.text);
    ASSERT_FALSE(c.ok()) << b.text;
    EXPECT_NE(c.status().message().find(b.expect), std::string::npos)
        << b.text << "\n" << c.status().message();
  }
  // A wildcard listen on the listed port is the listed address.
  EXPECT_TRUE(with("[region_links]\ntransport = \"plain\"\nlisten = \"0.0.0.0:7401\"\n").ok());
  // With a plain WAN port a second, plain listener would protect nothing.
  std::string plain_wan = own;
  const size_t tls_at = plain_wan.find("[tls]");
  plain_wan.erase(tls_at, plain_wan.find("[peers.eu-west]") - tls_at);
  plain_wan.replace(plain_wan.find("listen = \"0.0.0.0:7400\""), 23,
                    "listen = \"0.0.0.0:7400\"\ntransport = \"plain\"");
  auto both = ParseConfig(
      plain_wan + "[region_links]\ntransport = \"plain\"\nlisten = \"10.0.0.2:7401\"\n", "f.toml");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("region_links.transport: \"plain\" with wan.transport = "
                                         "\"plain\""),
            std::string::npos)
      << both.status().message();
  // Plain region links with no region gateways to link to.
  auto lonely = ParseConfig(
      std::string(kGood) + "[region_links]\ntransport = \"plain\"\nlisten = \"10.0.0.2:7401\"\n",
      "f.toml");
  ASSERT_FALSE(lonely.ok());
  EXPECT_NE(lonely.status().message().find("[peers.us-east] lists none"), std::string::npos)
      << lonely.status().message();
}

TEST(GatewayConfig, PlainTransportNeedsNoTls) {
  std::string text = kGood;
  const size_t tls = text.find("[tls]");
  text.erase(tls, text.find("[peers.eu-west]") - tls);
  text.replace(text.find("listen = \"0.0.0.0:7400\""), 23,
               "listen = \"0.0.0.0:7400\"\ntransport = \"plain\"");
  auto c = ParseConfig(text, "x.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->transport, net::Transport::kPlainTcp);
}

struct BadCase {
  const char* name;
  const char* find;     // text in kGood to replace ("" = append `replace` at the end)
  const char* replace;
  const char* expect;   // substring the error must contain
};

const BadCase kBadCases[] = {
    {"unknown top-level key", "shard_index = 1", "shard_index = 1\nregoin = \"x\"",
     "f.toml:3:1: regoin: unknown key; allowed keys here: region, shard_index"},
    {"misspelt shard_index", "shard_index = 1", "shard_idx = 1",
     "f.toml:2:1: shard_idx: unknown key; allowed keys here: region, shard_index"},
    {"missing region", "region = \"us-east\"\n", "", "(top level): missing required key `region`"},
    {"bad region", "region = \"us-east\"", "region = \"us east\"",
     "f.toml:1:10: region: found \"us east\"; allowed: 1-63 characters"},
    {"shard index wrong type", "shard_index = 1", "shard_index = \"1\"",
     "f.toml:2:15: shard_index: found a string; allowed: an integer in [0, 4095]"},
    {"shard index out of range", "shard_index = 1", "shard_index = -3",
     "shard_index: found -3; allowed: an integer in [0, 4095]"},
    {"unknown key in local", "allowed_gids = [50]", "allowed_gids = [50]\nmode = 432",
     "f.toml:7:1: local.mode: unknown key; allowed keys here: socket, allowed_uids, allowed_gids"},
    {"uid not an integer", "[1000, 1001]", "[1000, \"bob\"]",
     "local.allowed_uids[1]: found a string; allowed: an array of integer ids"},
    {"nobody allowed", "allowed_uids = [1000, 1001]\nallowed_gids = [50]\n", "",
     "local: neither allowed_uids nor allowed_gids"},
    {"socket path too long", "/run/strait/s.sock",
     "/run/strait/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sock",
     "local.socket: found a path of 128 bytes; allowed: a path of 1-107 bytes"},
    {"bad listen address", "0.0.0.0:7400", "localhost:7400",
     "f.toml:8:10: wan.listen: found \"localhost:7400\"; allowed: \"<numeric IPv4>:<port>\""},
    {"port out of range", "0.0.0.0:7400", "0.0.0.0:70000", "wan.listen: found \"0.0.0.0:70000\""},
    {"bad transport", "listen = \"0.0.0.0:7400\"",
     "listen = \"0.0.0.0:7400\"\ntransport = \"ssl\"",
     "wan.transport: found \"ssl\"; allowed: \"tls\" or \"plain\""},
    {"tls missing", "[tls]\nca = \"ca.pem\"\ncert = \"/etc/strait/gw.pem\"\nkey = \"gw.key\"\n", "",
     "missing table [tls] (ca, cert, key) required by wan.transport = \"tls\""},
    {"tls with plain", "listen = \"0.0.0.0:7400\"",
     "listen = \"0.0.0.0:7400\"\ntransport = \"plain\"",
     "tls: a [tls] table was given but wan.transport = \"plain\""},
    {"tls key missing", "key = \"gw.key\"\n", "", "tls: missing required key `key`"},
    {"peer shard missing", "shard_1 = \"10.1.0.2:7400\"", "shard_2 = \"10.1.0.2:7400\"",
     "peers.eu-west.shard_1: missing: this gateway serves shard 1"},
    {"peer shard bad key", "shard_0 = \"10.1.0.1:7400\"", "shard0 = \"10.1.0.1:7400\"",
     "f.toml:14:1: peers.eu-west.shard0: unknown key; allowed: shard_<index>"},
    {"peer address wrong type", "shard_1 = \"[fd00::7]:7400\"", "shard_1 = 7400",
     "f.toml:17:11: peers.ap-south.shard_1: found an integer; allowed: a string \"host:port\""},
    {"peer address bad", "shard_1 = \"10.1.0.2:7400\"", "shard_1 = \"10.1.0.2\"",
     "peers.eu-west.shard_1: found \"10.1.0.2\"; allowed:"},
    {"own region lists only this gateway", "[peers.ap-south]", "[peers.us-east]",
     "f.toml:16:1: peers.us-east.shard_0: missing: the gateways of region us-east are numbered "
     "shard_0..shard_1 (this is shard_1) and a region all-reduce needs every one"},
    {"own region gateways with a gap", "[peers.ap-south]",
     "[peers.us-east]\nshard_2 = \"10.0.0.3:7400\"\n[peers.ap-south]",
     "peers.us-east.shard_0: missing: the gateways of region us-east are numbered "
     "shard_0..shard_2 (this is shard_1)"},
    {"other region runs more gateways", "[peers.ap-south]\nshard_1 = \"[fd00::7]:7400\"",
     "[peers.us-east]\nshard_0 = \"10.0.0.1:7400\"\n[peers.ap-south]\nshard_1 = "
     "\"[fd00::7]:7400\"\nshard_2 = \"[fd00::8]:7400\"",
     "peers.ap-south.shard_2: region us-east runs 2 gateways ([peers.us-east] lists "
     "shard_0..shard_1)"},
    {"streams out of range", "streams = 8", "streams = 0",
     "link.streams: found 0; allowed: an integer in [1, 64]"},
    {"bad duration", "unreachable_after = \"45s\"", "unreachable_after = \"45\"",
     "f.toml:21:21: link.unreachable_after: found \"45\"; allowed: a positive duration string"},
    {"duration wrong type", "unreachable_after = \"45s\"", "unreachable_after = 45",
     "link.unreachable_after: found an integer; allowed: a positive duration"},
    {"tcp rto max below the kernel's bound", "streams = 8", "streams = 8\ntcp_rto_max = \"200ms\"",
     "link.tcp_rto_max: found \"200ms\"; allowed: a duration from 1s to 120s"},
    {"tcp rto max above the kernel's bound", "streams = 8", "streams = 8\ntcp_rto_max = \"5m\"",
     "link.tcp_rto_max: found \"5m\"; allowed: a duration from 1s to 120s"},
    {"stream timeout not above the keepalive interval", "streams = 8",
     "streams = 8\nstream_timeout = \"100ms\"",
     "link.stream_timeout: found \"100ms\"; allowed: longer than the streams' keepalive"},
    {"max rate without a unit", "streams = 8", "streams = 8\nmax_rate = \"100\"",
     "link.max_rate: found \"100\"; allowed: a rate string of at least 1mbit"},
    {"max rate below 1 Mbit/s", "streams = 8", "streams = 8\nmax_rate = \"500kbit\"",
     "link.max_rate: found \"500kbit\"; allowed: a rate string of at least 1mbit"},
    {"max rate not a string", "streams = 8", "streams = 8\nmax_rate = 100000000",
     "link.max_rate: found an integer; allowed: a rate string"},
    {"peer max rate bad", "[peers.eu-west]", "[peers.eu-west]\nmax_rate = \"fast\"",
     "f.toml:14:12: peers.eu-west.max_rate: found \"fast\"; allowed: a rate string"},
    {"bad congestion control", "\"bbr\"", "\"bbr; rm -rf\"",
     "link.congestion_control: found \"bbr; rm -rf\"; allowed: a kernel algorithm name"},
    {"unknown policy codec", "codec = \"int8\"", "codec = \"int3\"",
     "f.toml:23:9: policy.codec: found \"int3\"; allowed: \"auto\", \"none\""},
    {"bad min lossy bytes", "\"1MiB\"", "\"1 parsec\"",
     "policy.min_lossy_bytes: found \"1 parsec\"; allowed: a byte count"},
    {"relative error out of range", "max_relative_error = 0.01", "max_relative_error = 2",
     "policy.max_relative_error: found 2; allowed: a number in (0, 1]"},
    {"error feedback wrong type", "error_feedback = false", "error_feedback = \"no\"",
     "policy.error_feedback: found a string; allowed: true or false"},
    {"allowed codec unknown", "[\"none\", \"zstd\", \"int8\"]", "[\"none\", \"lz4\"]",
     "policy.allowed_codecs[1]: found \"lz4\"; allowed: an array of codec names"},
    {"no lossless codec", "[\"none\", \"zstd\", \"int8\"]", "[\"int8\"]",
     "policy.allowed_codecs: no lossless codec listed"},
    {"unknown allreduce key", "deadline = \"90s\"", "deadlin = \"90s\"",
     "allreduce.deadlin: unknown key; allowed keys here: deadline, shutdown_grace"},
    {"chunk size too small", "deadline = \"90s\"", "chunk_elements = 100",
     "allreduce.chunk_elements: found 100; allowed: an integer in [4096, 16777216]"},
    {"chunk size not an integer", "deadline = \"90s\"", "chunk_elements = \"128K\"",
     "allreduce.chunk_elements: found a string; allowed: an integer in [4096, 16777216]"},
    {"unknown table", "[allreduce]", "[allreduc]",
     "allreduc: unknown key; allowed keys here: region, shard_index, shards, local, wan, tls, peers"},
    {"peer region not a table", "[peers.ap-south]\nshard_1 = \"[fd00::7]:7400\"",
     "[peers]\nap-south = 3",
     "f.toml:17:12: peers.ap-south: found an integer; allowed: a table of shard_<index>"},
    {"toml syntax", "streams = 8", "streams = = 8", "f.toml:19:11: TOML syntax error"},
    // Dial-only regions (config.h): the two keys' values, and pairs no side could dial.
    {"wan dial bad value", "listen = \"0.0.0.0:7400\"",
     "listen = \"0.0.0.0:7400\"\ndial = \"inbound\"",
     "f.toml:9:8: wan.dial: found \"inbound\"; allowed: \"outbound-only\" (the region is behind "
     "NAT"},
    {"wan dial wrong type", "listen = \"0.0.0.0:7400\"", "listen = \"0.0.0.0:7400\"\ndial = true",
     "wan.dial: found a boolean; allowed: \"outbound-only\""},
    {"peer dial bad value", "[peers.eu-west]", "[peers.eu-west]\ndial = \"nat\"",
     "f.toml:14:8: peers.eu-west.dial: found \"nat\"; allowed: \"outbound-only\""},
    {"own region dial differs from wan dial", "[peers.ap-south]",
     "[peers.us-east]\ndial = \"outbound-only\"\nshard_0 = \"10.0.0.1:7400\"\n[peers.ap-south]",
     "peers.us-east.dial: names this gateway's own region, whose dial mode is wan.dial (\"any\" "
     "here), and differs from it; allowed: the same value as wan.dial"},
    {"peer without address and not dial-only", "shard_1 = \"[fd00::7]:7400\"", "",
     "peers.ap-south.shard_1: missing: this gateway serves shard 1 and runs its all-reduces "
     "with that shard of every peer region; allowed: add shard_1 = \"host:port\", or dial = "
     "\"outbound-only\" if region ap-south is behind NAT and dials this gateway"},
};

// The bad cases above, in the config of a gateway that is dial-only itself.
const BadCase kBadDialOnlyCases[] = {
    {"both sides of a pair dial-only", "[peers.eu-west]",
     "[peers.eu-west]\ndial = \"outbound-only\"",
     "f.toml:15:8: peers.eu-west.dial: both sides of the pair are dial-only: region eu-west is "
     "marked \"outbound-only\" and so is this gateway (wan.dial), so neither would accept the "
     "other's link; allowed: remove one of the two"},
    // It dials every peer, so it needs every address; NAT is no way out here.
    {"dial-only gateway without a peer address", "shard_1 = \"[fd00::7]:7400\"", "",
     "peers.ap-south.shard_1: missing: this gateway serves shard 1 and runs its all-reduces "
     "with that shard of every peer region; allowed: add shard_1 = \"host:port\""},
    {"own region not dial-only in a dial-only gateway", "[peers.ap-south]",
     "[peers.us-east]\ndial = \"any\"\nshard_0 = \"10.0.0.1:7400\"\n[peers.ap-south]",
     "peers.us-east.dial: names this gateway's own region, whose dial mode is wan.dial "
     "(\"outbound-only\" here), and differs from it"},
};

class BadConfig : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadConfig, GivesOneClearError) {
  const BadCase& bad = GetParam();
  std::string text = kGood;
  if (std::string(bad.find).empty()) {
    // A top-level key after a table would belong to the table: put it before the first one.
    text.insert(text.find("[local]"), std::string(bad.replace) + "\n");
  } else {
    const size_t at = text.find(bad.find);
    ASSERT_NE(at, std::string::npos) << bad.find;
    text.replace(at, std::string(bad.find).size(), bad.replace);
  }
  auto c = ParseConfig(text, "f.toml");
  ASSERT_FALSE(c.ok()) << bad.name;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(bad.expect), std::string::npos)
      << bad.name << "\n  got:  " << c.status().message() << "\n  want: " << bad.expect;
  EXPECT_EQ(c.status().message().rfind("f.toml", 0), 0u) << c.status().message();
}

INSTANTIATE_TEST_SUITE_P(Table, BadConfig, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& param_info) {
                           std::string n = param_info.param.name;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

// kGood as the config of a gateway behind NAT (wan.dial = "outbound-only").
std::string DialOnlyGood() {
  std::string text = kGood;
  text.replace(text.find("listen = \"0.0.0.0:7400\""), 23,
               "listen = \"0.0.0.0:7400\"\ndial = \"outbound-only\"");
  return text;
}

class BadDialOnlyConfig : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadDialOnlyConfig, GivesOneClearError) {
  const BadCase& bad = GetParam();
  std::string text = DialOnlyGood();
  const size_t at = text.find(bad.find);
  ASSERT_NE(at, std::string::npos) << bad.find;
  text.replace(at, std::string(bad.find).size(), bad.replace);
  auto c = ParseConfig(text, "f.toml");
  ASSERT_FALSE(c.ok()) << bad.name;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(bad.expect), std::string::npos)
      << bad.name << "\n  got:  " << c.status().message() << "\n  want: " << bad.expect;
  // No hint that would lead to the refused both-sides pair.
  EXPECT_EQ(c.status().message().find("if region"), std::string::npos) << c.status().message();
}

INSTANTIATE_TEST_SUITE_P(Table, BadDialOnlyConfig, ::testing::ValuesIn(kBadDialOnlyCases),
                         [](const ::testing::TestParamInfo<BadCase>& param_info) {
                           std::string n = param_info.param.name;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

// Who dials each link: the rank rule (the lower region name) unless one side is dial-only.
TEST(GatewayConfig, DialOnlyRegionDialsEveryPeerAndTheOthersWaitForIt) {
  auto plain = ParseConfig(kGood, "f.toml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->dial_only);
  EXPECT_TRUE(plain->dial_only_peers.empty());
  EXPECT_FALSE(plain->Dials("ap-south"));  // us-east ranks above both peers
  EXPECT_FALSE(plain->Dials("eu-west"));
  EXPECT_TRUE(plain->Dials("zz-north"));

  // Behind NAT: it dials both peers although they rank below it.
  auto nat = ParseConfig(DialOnlyGood(), "f.toml");
  ASSERT_TRUE(nat.ok()) << nat.status();
  EXPECT_TRUE(nat->dial_only);
  EXPECT_TRUE(nat->Dials("ap-south"));
  EXPECT_TRUE(nat->Dials("eu-west"));
  EXPECT_NE(nat->Summary().find("dial-only (dials every peer region)"), std::string::npos)
      << nat->Summary();

  // A gateway of a region that ranks first, with a peer behind NAT: that peer needs no address
  // (nobody dials it) and this gateway waits for it; the rank rule holds for the other peer.
  std::string hub = kGood;
  hub.replace(hub.find("region = \"us-east\""), 18, "region = \"aa-first\"");
  hub.replace(hub.find("shard_1 = \"[fd00::7]:7400\""), 26, "dial = \"outbound-only\"");
  auto h = ParseConfig(hub, "f.toml");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->dial_only_peers, (std::set<std::string>{"ap-south"}));
  EXPECT_TRUE(h->peers.at("ap-south").empty());
  EXPECT_EQ(h->WorldRegions(), (std::vector<std::string>{"aa-first", "ap-south", "eu-west"}));
  EXPECT_FALSE(h->Dials("ap-south"));
  EXPECT_TRUE(h->Dials("eu-west"));
  EXPECT_NE(h->Summary().find("dial-only peers [ap-south]"), std::string::npos) << h->Summary();

  // "any" is the default spelled out; an address beside "outbound-only" is allowed and unused.
  std::string spelled = kGood;
  spelled.replace(spelled.find("[peers.eu-west]"), 15, "[peers.eu-west]\ndial = \"any\"");
  spelled.replace(spelled.find("[peers.ap-south]"), 16,
                  "[peers.ap-south]\ndial = \"outbound-only\"");
  auto s = ParseConfig(spelled, "f.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->dial_only_peers, (std::set<std::string>{"ap-south"}));
  EXPECT_FALSE(s->Dials("ap-south"));

  // One [peers] section shared by every config of the cluster: the NAT'd region's own table
  // says what its wan.dial says.
  std::string shared = DialOnlyGood();
  shared.replace(shared.find("[peers.ap-south]"), 16,
                 "[peers.us-east]\ndial = \"outbound-only\"\nshard_0 = \"10.0.0.1:7400\"\n"
                 "[peers.ap-south]");
  auto sh = ParseConfig(shared, "f.toml");
  ASSERT_TRUE(sh.ok()) << sh.status();
  EXPECT_TRUE(sh->dial_only);
  EXPECT_EQ(sh->RegionSize(), 2);
  // ... also when the NAT'd region runs one gateway: its table then holds `dial` alone.
  std::string alone = DialOnlyGood();
  alone.replace(alone.find("[peers.ap-south]"), 16,
                "[peers.us-east]\ndial = \"outbound-only\"\n[peers.ap-south]");
  auto al = ParseConfig(alone, "f.toml");
  ASSERT_TRUE(al.ok()) << al.status();
  EXPECT_TRUE(al->region_gateways.empty());
  EXPECT_EQ(al->RegionSize(), 1);
}

TEST(GatewayConfig, MissingFileIsNotFound) {
  auto c = LoadConfig("/nonexistent/straitd.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("/nonexistent/straitd.toml"), std::string::npos);
}

TEST(GatewayConfig, ShardWeightsNameEveryRegionInWorldOrder) {
  std::string text = kGood;
  EXPECT_TRUE(ParseConfig(text, "f.toml")->ShardWeights().empty()) << "default: equal shards";
  text += "shard_weights = { us-east = 200, eu-west = 100, ap-south = 50 }\n";
  auto c = ParseConfig(text, "f.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  // WorldRegions() is sorted: ap-south, eu-west, us-east.
  EXPECT_EQ(c->ShardWeights(), (std::vector<uint64_t>{50, 100, 200}));
  EXPECT_NE(c->Summary().find("shard weights [50, 100, 200]"), std::string::npos) << c->Summary();

  const std::pair<const char*, const char*> bad[] = {
      {"{ us-east = 200, eu-west = 100 }", "allreduce.shard_weights: no weight for region ap-south"},
      {"{ us-east = 2, eu-west = 1, ap-south = 1, mars = 1 }",
       "allreduce.shard_weights.mars: not a region of this gateway's world"},
      {"{ us-east = 2, eu-west = 0, ap-south = 1 }",
       "allreduce.shard_weights.eu-west: found an integer <= 0; allowed: a table of region"},
      {"{ us-east = 2, eu-west = \"1\", ap-south = 1 }",
       "allreduce.shard_weights.eu-west: found a string; allowed:"},
      {"[1, 2, 3]", "allreduce.shard_weights: found an array; allowed: a table"},
  };
  for (const auto& [value, expect] : bad) {
    auto b = ParseConfig(std::string(kGood) + "shard_weights = " + value + "\n", "f.toml");
    ASSERT_FALSE(b.ok()) << value;
    EXPECT_NE(b.status().message().find(expect), std::string::npos)
        << value << "\n  got:  " << b.status().message() << "\n  want: " << expect;
  }
}

TEST(HostPort, ParsesIpv4AndIpv6) {
  auto a = ParseHostPort("127.0.0.1:9");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9);
  auto b = ParseHostPort("[::1]:65535");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->ToString(), "[::1]:65535");
  EXPECT_FALSE(ParseHostPort("::1:80").ok());
  EXPECT_FALSE(ParseHostPort("1.2.3.4:0").ok());
  EXPECT_FALSE(ParseHostPort("1.2.3.4:").ok());
  EXPECT_FALSE(ParseHostPort("[::1]80").ok());
}

// Hosts come back in one spelling, so that the config's address comparisons (a wildcard, a
// gateway's own entry among its region's peers) compare addresses, not text; what is not an
// address of the bracketed (IPv6) or bare (IPv4) kind is refused.
TEST(HostPort, SpellsHostsCanonically) {
  auto any6 = ParseHostPort("[0:0:0:0:0:0:0:0]:7400");
  ASSERT_TRUE(any6.ok());
  EXPECT_EQ(any6->host, "::");
  EXPECT_TRUE(any6->IsWildcard());
  auto one = ParseHostPort("[0:0::0001]:7400");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->host, "::1");
  EXPECT_TRUE((HostPort{"::1", 7400}.Accepts(*one)));
  // IPv4-mapped and bracketed IPv4 are the IPv4 address, as the net layer treats them.
  auto mapped = ParseHostPort("[::FFFF:10.0.0.7]:7400");
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ(mapped->host, "10.0.0.7");
  EXPECT_EQ(mapped->ToString(), "10.0.0.7:7400");
  auto bracketed = ParseHostPort("[10.0.0.7]:7400");
  ASSERT_TRUE(bracketed.ok());
  EXPECT_EQ(bracketed->host, "10.0.0.7");
  EXPECT_TRUE(ParseHostPort("[::ffff:0.0.0.0]:7400")->IsWildcard());
  for (const char* bad : {"1.2.3:80", "1.2.3.4.5:80", "256.1.1.1:80", "[:::]:80", "[fffff::]:80",
                          "01.2.3.4:80", "127.1:80"}) {
    EXPECT_FALSE(ParseHostPort(bad).ok()) << bad;
  }
  EXPECT_FALSE(ParseHostPort(std::string_view("10.0.0.1\0junk:80", 16)).ok());
}

TEST(GatewayConfig, MetricsListenIsOptionalAndValidated) {
  auto off = ParseConfig(kGood, "f.toml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->metrics_listen.has_value());
  auto on = ParseConfig(std::string(kGood) + "[metrics]\nlisten = \"127.0.0.1:9464\"\n", "f.toml");
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_TRUE(on->metrics_listen.has_value());
  EXPECT_EQ(on->metrics_listen->ToString(), "127.0.0.1:9464");
  auto bad = ParseConfig(std::string(kGood) + "[metrics]\nlisten = \"localhost:9464\"\n", "f.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f.toml:31:10: metrics.listen: found \"localhost:9464\""),
            std::string::npos)
      << bad.status();
  auto missing = ParseConfig(std::string(kGood) + "[metrics]\nport = 9464\n", "f.toml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("metrics: missing required key `listen`"),
            std::string::npos)
      << missing.status();
  auto unknown =
      ParseConfig(std::string(kGood) + "[metrics]\nlisten = \"127.0.0.1:1\"\npath = \"/m\"\n",
                  "f.toml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("metrics.path: unknown key"), std::string::npos)
      << unknown.status();
}

}  // namespace
}  // namespace strait::gateway
