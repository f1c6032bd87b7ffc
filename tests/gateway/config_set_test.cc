// The configs of a deployment checked together (config_check.h, CheckConfigSet; `straitd
// --check-config a.toml b.toml ...`), and the shard set of one config (`shards`): each problem is
// one error naming the file, the key and the fix; a consistent set passes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gateway/config.h"
#include "gateway/config_check.h"

namespace strait::gateway {
namespace {

// A plain-TCP config of `region` serving `shards` (a TOML value line), with `extra` lines at the
// top level and the peer regions' tables in `peers`.
GatewayConfig Config(const std::string& file, const std::string& region,
                     const std::string& shards, const std::string& peers,
                     const std::string& wan_extra = "", const std::string& tail = "") {
  const std::string text = "region = \"" + region + "\"\n" + shards +
                           "\n[local]\nsocket = \"/run/strait/s.sock\"\nallowed_uids = [1000]\n"
                           "[wan]\nlisten = \"0.0.0.0:7400\"\ntransport = \"plain\"\n" +
                           wan_extra + peers + tail;
  auto c = ParseConfig(text, file);
  EXPECT_TRUE(c.ok()) << c.status() << "\n" << text;
  return c.ok() ? *c : GatewayConfig{};
}

const char* kPeersOfA = "[peers.b]\nshard_0 = \"10.2.0.1:7400\"\nshard_1 = \"10.2.0.1:7400\"\n"
                        "shard_2 = \"10.2.0.2:7400\"\nshard_3 = \"10.2.0.2:7400\"\n";
const char* kPeersOfB = "[peers.a]\nshard_0 = \"10.1.0.1:7400\"\nshard_1 = \"10.1.0.1:7400\"\n"
                        "shard_2 = \"10.1.0.2:7400\"\nshard_3 = \"10.1.0.2:7400\"\n";

TEST(ConfigSet, AConsistentDeploymentPasses) {
  const std::vector<GatewayConfig> set = {
      Config("a0.toml", "a", "shards = \"0-1\"", kPeersOfA),
      Config("a1.toml", "a", "shards = [2, 3]", kPeersOfA),
      Config("b0.toml", "b", "shard_index = 0", kPeersOfB),
      Config("b1.toml", "b", "shard_index = 1", kPeersOfB),
      Config("b2.toml", "b", "shards = \"2-3\"", kPeersOfB)};
  EXPECT_TRUE(CheckConfigSet(set).ok()) << CheckConfigSet(set);
  EXPECT_EQ(set[0].shards, (std::vector<int>{0, 1}));
  EXPECT_EQ(set[0].shard_index, 0);
  EXPECT_EQ(set[1].shards, (std::vector<int>{2, 3}));
  EXPECT_EQ(ShardListText({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(ShardListText({0, 2, 5}), "0, 2, 5");
  EXPECT_EQ(set[1].ForShard(3).shards, (std::vector<int>{3}));
  EXPECT_EQ(set[1].ForShard(3).shard_index, 3);
}

TEST(ConfigSet, AShardServedTwiceInARegionIsRefused) {
  const Status s = CheckConfigSet({Config("a0.toml", "a", "shards = \"0-2\"", kPeersOfA),
                                   Config("a1.toml", "a", "shards = [2, 3]", kPeersOfA)});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a1.toml: shards: shard 2 of region a is also served by a0.toml; "
                             "fix: give each shard of a region to exactly one straitd"),
            std::string::npos)
      << s;
  // The same index in two regions is the pairing, not a conflict.
  EXPECT_TRUE(CheckConfigSet({Config("a0.toml", "a", "shard_index = 0", kPeersOfA),
                              Config("b0.toml", "b", "shard_index = 0", kPeersOfB)})
                  .ok());
}

TEST(ConfigSet, DialOnlyPairsMustAgreeAndNotBothBeDialOnly) {
  const std::string nat = "dial = \"outbound-only\"\n";
  const std::string a_marks_b = "[peers.b]\ndial = \"outbound-only\"\n";
  const std::string b_marks_a = "[peers.a]\ndial = \"outbound-only\"\n";
  // b behind NAT, marked by a: fine.
  EXPECT_TRUE(CheckConfigSet({Config("a.toml", "a", "shard_index = 0", a_marks_b),
                              Config("b.toml", "b", "shard_index = 0",
                                     "[peers.a]\nshard_0 = \"10.1.0.1:7400\"\n", nat)})
                  .ok());
  // Both dial-only (each marking nothing: each file alone passes).
  Status s = CheckConfigSet(
      {Config("a.toml", "a", "shard_index = 0", "[peers.b]\nshard_0 = \"10.2.0.1:7400\"\n", nat),
       Config("b.toml", "b", "shard_index = 0", "[peers.a]\nshard_0 = \"10.1.0.1:7400\"\n",
              nat)});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("regions a and b are both dial-only"), std::string::npos) << s;
  // b dials (dial-only) but a does not mark it.
  s = CheckConfigSet({Config("a.toml", "a", "shard_index = 0",
                             "[peers.b]\nshard_0 = \"10.2.0.1:7400\"\n"),
                      Config("b.toml", "b", "shard_index = 0",
                             "[peers.a]\nshard_0 = \"10.1.0.1:7400\"\n", nat)});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("a.toml: peers.b.dial: region b is dial-only (b.toml) but this "
                             "config does not mark it"),
            std::string::npos)
      << s;
  // a marks b, but b does not dial.
  s = CheckConfigSet({Config("a.toml", "a", "shard_index = 0", a_marks_b),
                      Config("b.toml", "b", "shard_index = 0",
                             "[peers.a]\nshard_0 = \"10.1.0.1:7400\"\n")});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("marks region b dial-only, but its config b.toml does not dial"),
            std::string::npos)
      << s;
  (void)b_marks_a;
}

TEST(ConfigSet, ShardWeightsMustBeTheSameEverywhere) {
  const std::string w1 = "[allreduce]\nshard_weights = { a = 2, b = 1 }\n";
  const std::string w2 = "[allreduce]\nshard_weights = { a = 1, b = 1 }\n";
  const Status s =
      CheckConfigSet({Config("a.toml", "a", "shard_index = 0",
                             "[peers.b]\nshard_0 = \"10.2.0.1:7400\"\n", "", w1),
                      Config("b.toml", "b", "shard_index = 0",
                             "[peers.a]\nshard_0 = \"10.1.0.1:7400\"\n", "", w2)});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("b.toml: allreduce.shard_weights: differs from a.toml"),
            std::string::npos)
      << s;
}

TEST(ConfigSet, ChunkSizeMustBeTheSameEverywhere) {
  const std::string c1 = "[allreduce]\nchunk_elements = 65536\n";
  const GatewayConfig a =
      Config("a.toml", "a", "shard_index = 0", "[peers.b]\nshard_0 = \"10.2.0.1:7400\"\n");
  const GatewayConfig b =
      Config("b.toml", "b", "shard_index = 0", "[peers.a]\nshard_0 = \"10.1.0.1:7400\"\n", "", c1);
  EXPECT_EQ(b.chunk_elements, 65536u);
  EXPECT_NE(b.Summary().find("chunks of 65536 elements"), std::string::npos) << b.Summary();
  const Status s = CheckConfigSet({a, b});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("b.toml: allreduce.chunk_elements: 65536 differs from unset (by op "
                             "size) in a.toml"),
            std::string::npos)
      << s;
  GatewayConfig b2 = b;
  b2.chunk_elements = a.chunk_elements;
  EXPECT_TRUE(CheckConfigSet({a, b2}).ok());
}

TEST(ConfigSet, ARegionsGatewaysMustAgreeOnPlainRegionLinks) {
  const std::string own = "[peers.a]\nshard_0 = \"10.1.0.1:7401\"\nshard_1 = \"10.1.0.2:7401\"\n"
                          "[peers.b]\nshard_0 = \"10.2.0.1:7400\"\nshard_1 = \"10.2.0.2:7400\"\n";
  auto plain = [](const std::string& host) {
    return "[region_links]\ntransport = \"plain\"\nlisten = \"" + host + ":7401\"\n";
  };
  // Plain region links need a TLS WAN port (a plain one admits anyone already).
  auto tls_config = [](const std::string& file, int shard, const std::string& peers,
                       const std::string& tail) {
    const std::string text = "region = \"a\"\nshard_index = " + std::to_string(shard) +
                             "\n[local]\nsocket = \"/run/strait/s.sock\"\nallowed_uids = [1000]\n"
                             "[wan]\nlisten = \"0.0.0.0:7400\"\n[tls]\nca = \"/ca.pem\"\n"
                             "cert = \"/gw.pem\"\nkey = \"/gw.key\"\n" + peers + tail;
    auto c = ParseConfig(text, file);
    EXPECT_TRUE(c.ok()) << c.status() << "\n" << text;
    return c.ok() ? *c : GatewayConfig{};
  };
  const GatewayConfig a0 = tls_config("a0.toml", 0, own, plain("10.1.0.1"));
  const GatewayConfig a1 = tls_config("a1.toml", 1, own, plain("10.1.0.2"));
  const GatewayConfig a1_tls = tls_config("a1.toml", 1, own, "");
  EXPECT_TRUE(CheckConfigSet({a0, a1}).ok()) << CheckConfigSet({a0, a1});
  // a1 still dials a0 at its WAN port.
  const std::string stale = "[peers.a]\nshard_0 = \"10.1.0.1:7400\"\nshard_1 = \"10.1.0.2:7401\"\n"
                            "[peers.b]\nshard_0 = \"10.2.0.1:7400\"\nshard_1 = \"10.2.0.2:7400\"\n";
  const GatewayConfig a1_stale = tls_config("a1.toml", 1, stale, plain("10.1.0.2"));
  const Status wrong = CheckConfigSet({a0, a1_stale});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("a1.toml: peers.a.shard_0: \"10.1.0.1:7400\", but that gateway "
                                 "(a0.toml) takes its plain region links on region_links.listen = "
                                 "\"10.1.0.1:7401\""),
            std::string::npos)
      << wrong;
  const Status s = CheckConfigSet({a0, a1_tls});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("a1.toml: region_links.transport: \"tls\" but \"plain\" in a0.toml, "
                             "of the same region a"),
            std::string::npos)
      << s;
}

// `shards` in one config: each bad form is one error with the key and what is allowed.
TEST(ConfigSet, BadShardSetsAreRefusedWithTheKey) {
  struct Bad {
    std::string shards, expect;
  };
  const std::vector<Bad> bad = {
      {"shards = [0, 1, 1]", "shards[2]: shard 1 is listed twice"},
      {"shards = \"3-1\"", "shards: found \"3-1\"; allowed: an array of distinct shard indices"},
      {"shards = \"0-x\"", "shards: found \"0-x\""},
      {"shards = []", "shards: found no shard"},
      {"shards = [4096]", "shards[0]: found 4096"},
      {"shards = [\"0\"]", "shards[0]: found a string"},
      {"shards = 3", "shards: found an integer"},
      {"shard_index = 0\nshards = [0]", "both shard_index and shards are given"},
      {"", "missing shard_index; allowed: shard_index = <0..4095>"},
  };
  for (const Bad& b : bad) {
    const std::string text = "region = \"a\"\n" + b.shards +
                             "\n[local]\nsocket = \"/s.sock\"\nallowed_uids = [1]\n[wan]\nlisten = "
                             "\"0.0.0.0:1\"\ntransport = \"plain\"\n" + std::string(kPeersOfA);
    auto c = ParseConfig(text, "f.toml");
    ASSERT_FALSE(c.ok()) << b.shards;
    EXPECT_NE(c.status().message().find(b.expect), std::string::npos)
        << b.shards << "\n  got:  " << c.status().message() << "\n  want: " << b.expect;
  }
  // A served shard without its address in a peer region, and `shards` with a table of this
  // region's own gateways (region all-reduces need one process per shard).
  auto missing = ParseConfig(
      "region = \"a\"\nshards = \"0-4\"\n[local]\nsocket = \"/s.sock\"\nallowed_uids = [1]\n"
      "[wan]\nlisten = \"0.0.0.0:1\"\ntransport = \"plain\"\n" + std::string(kPeersOfA),
      "f.toml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("peers.b.shard_4: missing: this gateway serves "
                                            "shard 4"),
            std::string::npos)
      << missing.status();
  auto own = ParseConfig(
      "region = \"a\"\nshards = \"0-1\"\n[local]\nsocket = \"/s.sock\"\nallowed_uids = [1]\n"
      "[wan]\nlisten = \"0.0.0.0:1\"\ntransport = \"plain\"\n" + std::string(kPeersOfA) +
          "[peers.a]\nshard_0 = \"10.1.0.1:7400\"\nshard_1 = \"10.1.0.9:7400\"\n",
      "f.toml");
  ASSERT_FALSE(own.ok());
  EXPECT_NE(own.status().message().find("peers.a: region all-reduces (the NCCL plugin's CollNet "
                                        "mode) need one gateway process per shard"),
            std::string::npos)
      << own.status();
}

}  // namespace
}  // namespace strait::gateway
