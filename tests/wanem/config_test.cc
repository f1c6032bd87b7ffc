// Unit tests of strait-wanem's link specs, pair selectors and schedule files: accepted forms and
// one clear error naming each bad value.
#include "bench/wanem/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace strait::wanem {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMs = 1'000'000;

StatusOr<LinkParams> Parse(std::string_view spec) {
  return ParseLinkSpec(spec, LinkParams(), LinkParams());
}

TEST(LinkSpec, AcceptsBareAndKeyedSettings) {
  auto p = Parse("100mbit,25ms,loss=1% jitter=2ms reorder queue=256KiB flowrate=50mbit");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rate_bps, 100'000'000u);
  EXPECT_EQ(p->delay_ns, 25 * kMs);
  EXPECT_EQ(p->jitter_ns, 2 * kMs);
  EXPECT_TRUE(p->reorder);
  EXPECT_DOUBLE_EQ(p->loss, 0.01);
  EXPECT_EQ(p->queue_limit_bytes, 256u * 1024);
  EXPECT_EQ(p->flow_rate_bps, 50'000'000u);
  auto ge = Parse("ge=1%:30%:0.8");
  ASSERT_TRUE(ge.ok()) << ge.status();
  EXPECT_DOUBLE_EQ(ge->ge.p, 0.01);
  EXPECT_DOUBLE_EQ(ge->ge.r, 0.3);
  EXPECT_DOUBLE_EQ(ge->ge.loss_bad, 0.8);
  EXPECT_DOUBLE_EQ(ge->ge.loss_good, 0.0);
  auto firewall = Parse("100mbit syn=drop");
  ASSERT_TRUE(firewall.ok()) << firewall.status();
  EXPECT_TRUE(firewall->drop_syn);
  auto reopened = ParseLinkSpec("syn=pass", *firewall, LinkParams());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_FALSE(reopened->drop_syn);
  EXPECT_EQ(reopened->rate_bps, 100'000'000u);
  auto unlimited = Parse("rate=unlimited");
  ASSERT_TRUE(unlimited.ok());
  EXPECT_EQ(unlimited->rate_bps, 0u);
}

TEST(LinkSpec, EachBadValueGivesOneErrorNamingIt) {
  struct Case {
    const char* spec;
    const char* names;
  };
  for (const Case& c : {Case{"rate=fast", "rate='fast'"}, Case{"loss=150%", "loss='150%'"},
                        Case{"loss=abc", "loss='abc'"}, Case{"delay=5", "delay='5'"},
                        Case{"ge=1%", "ge='1%'"}, Case{"ge=1%:0", "ge='1%:0'"},
                        Case{"colour=red", "'colour'"}, Case{"sideways", "'sideways'"},
                        Case{"queue=1", "queue='1'"}, Case{"reorder=maybe", "reorder='maybe'"},
                        Case{"flowrate=lots", "flowrate='lots'"},
                        Case{"syn=block", "syn='block'"}}) {
    auto p = Parse(c.spec);
    ASSERT_FALSE(p.ok()) << c.spec;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << c.spec;
    EXPECT_THAT(p.status().message(), HasSubstr(c.names)) << c.spec;
  }
}

TEST(LinkSpec, PercentRateIsOfTheBase) {
  LinkParams base;
  base.rate_bps = 100'000'000;
  auto p = ParseLinkSpec("rate=30%", base, base);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rate_bps, 30'000'000u);
  EXPECT_FALSE(ParseLinkSpec("rate=30%", LinkParams(), LinkParams()).ok());  // Unlimited base.
}

TEST(PairSelector, ParsesBothDirectionsOneDirectionAndAll) {
  auto both = ParsePairSelector("0:2", 3);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->size(), 2u);
  auto one = ParsePairSelector("2>1", 3);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0], std::make_pair(2, 1));
  auto all = ParsePairSelector("*", 3);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 6u);
  EXPECT_THAT(ParsePairSelector("0:3", 3).status().message(), HasSubstr("'3'"));
  EXPECT_THAT(ParsePairSelector("1:1", 3).status().message(), HasSubstr("itself"));
  EXPECT_THAT(ParsePairSelector("01", 3).status().message(), HasSubstr("'01'"));
  // Every link into one region (what puts it behind NAT), and every link out of one.
  auto into = ParsePairSelector("*>1", 3);
  ASSERT_TRUE(into.ok()) << into.status();
  EXPECT_EQ(*into, (std::vector<std::pair<int, int>>{{0, 1}, {2, 1}}));
  auto out = ParsePairSelector("2>*", 3);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, (std::vector<std::pair<int, int>>{{2, 0}, {2, 1}}));
  EXPECT_THAT(ParsePairSelector("*>3", 3).status().message(), HasSubstr("'3'"));
  EXPECT_THAT(ParsePairSelector("*>*", 3).status().message(), HasSubstr("use *"));
}

TEST(LinkTable, AppliesPairOverridesOnTopOfTheLink) {
  auto t = BuildLinkTable(3, "100mbit,10ms", {"0:1=rate=20mbit,delay=80ms", "2>0=loss=1%"});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->at(0, 1).rate_bps, 20'000'000u);
  EXPECT_EQ(t->at(1, 0).delay_ns, 80 * kMs);
  EXPECT_EQ(t->at(0, 2).rate_bps, 100'000'000u);
  EXPECT_DOUBLE_EQ(t->at(2, 0).loss, 0.01);
  EXPECT_DOUBLE_EQ(t->at(0, 2).loss, 0.0);
  auto nat = BuildLinkTable(3, "100mbit", {"*>2=syn=drop"});
  ASSERT_TRUE(nat.ok()) << nat.status();
  EXPECT_TRUE(nat->at(0, 2).drop_syn);
  EXPECT_TRUE(nat->at(1, 2).drop_syn);
  EXPECT_FALSE(nat->at(2, 0).drop_syn);
  EXPECT_FALSE(nat->at(0, 1).drop_syn);
  EXPECT_THAT(BuildLinkTable(1, "1gbit", {}).status().message(), HasSubstr("--regions 1"));
  EXPECT_THAT(BuildLinkTable(2, "1gbit,loss=2", {}).status().message(), HasSubstr("--link"));
  EXPECT_THAT(BuildLinkTable(2, "1gbit", {"0:1"}).status().message(), HasSubstr("--pair '0:1'"));
}

TEST(Schedule, ResolvesTimedChangesInOrder) {
  auto t = BuildLinkTable(2, "100mbit,25ms", {});
  ASSERT_TRUE(t.ok());
  const char* text =
      "# rate drops to 30% at 20 s and recovers at 40 s\n"
      "40s  *    rate=100%\n"
      "20s  *    rate=30%   # both directions\n"
      "25s  0>1  loss=2% delay=80ms\n"
      "\n"
      "30s  0>1  base\n";
  auto ev = ParseSchedule(text, *t, "sched.txt");
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_EQ(ev->size(), 6u);
  EXPECT_EQ((*ev)[0].at_ns, 20'000 * kMs);
  EXPECT_EQ((*ev)[0].params.rate_bps, 30'000'000u);
  EXPECT_EQ((*ev)[2].at_ns, 25'000 * kMs);
  EXPECT_EQ((*ev)[2].params.rate_bps, 30'000'000u);  // Changes accumulate.
  EXPECT_DOUBLE_EQ((*ev)[2].params.loss, 0.02);
  EXPECT_EQ((*ev)[3].at_ns, 30'000 * kMs);
  EXPECT_DOUBLE_EQ((*ev)[3].params.loss, 0.0);  // `base` resets.
  EXPECT_EQ((*ev)[3].params.delay_ns, 25 * kMs);
  EXPECT_EQ((*ev)[5].params.rate_bps, 100'000'000u);
}

TEST(Schedule, ErrorsNameFileAndLine) {
  auto t = BuildLinkTable(2, "100mbit", {});
  ASSERT_TRUE(t.ok());
  EXPECT_THAT(ParseSchedule("1s * rate=30%\n2x * rate=1%\n", *t, "s.txt").status().message(),
              HasSubstr("s.txt:2"));
  EXPECT_THAT(ParseSchedule("1s 0>5 rate=1mbit\n", *t, "s.txt").status().message(),
              HasSubstr("s.txt:1"));
  auto bad = ParseSchedule("\n\n3s * loss=300%\n", *t, "s.txt");
  EXPECT_THAT(bad.status().message(), HasSubstr("s.txt:3"));
  EXPECT_THAT(bad.status().message(), HasSubstr("loss='300%'"));
  EXPECT_THAT(ParseSchedule("1s *\n", *t, "s.txt").status().message(), HasSubstr("s.txt:1"));
  // A path that cannot be read is a usage error (the tool exits 2), saying why and what to do.
  auto missing = LoadScheduleFile("/nonexistent/schedule", *t);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("'/nonexistent/schedule': No such file"));
  EXPECT_THAT(missing.status().message(), HasSubstr("give --schedule a readable file"));
}

// A binary file given as --schedule: its bytes are shown quoted (\xNN), never echoed raw, so the
// error stays one printable line.
TEST(Schedule, NonTextBytesAreQuoted) {
  auto t = BuildLinkTable(2, "100mbit", {});
  ASSERT_TRUE(t.ok());
  const char kBinary[] = "\x7f" "ELF\x02\x01 \x1b[2J * \r\x07rate=1%\n\0\0\n";
  const std::string binary(kBinary, sizeof(kBinary) - 1);
  auto bad = ParseSchedule(binary, *t, "a.out");
  ASSERT_FALSE(bad.ok());
  const std::string& m = bad.status().message();
  EXPECT_THAT(m, HasSubstr("a.out:1"));
  EXPECT_THAT(m, HasSubstr("\\x7fELF\\x02\\x01 \\x1b[2J"));
  for (char c : m) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "raw byte " << int(c) << " in: " << m;
}

TEST(CongestionControl, NamesWhatARegionMayUse) {
  EXPECT_TRUE(CheckCongestionControl("bbr", "reno bbr cubic", "reno bbr").ok());
  auto unknown = CheckCongestionControl("warp9", "reno bbr cubic", "reno bbr");
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("bad --cc 'warp9'"));
  EXPECT_THAT(unknown.message(), HasSubstr("a region can use 'reno bbr'"));
  EXPECT_THAT(unknown.message(), HasSubstr("loaded: 'reno bbr cubic'"));
  // Loaded, but a namespace other than the root one may not default to it.
  auto restricted = CheckCongestionControl("cubic", "reno bbr cubic", "reno bbr");
  EXPECT_EQ(restricted.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(restricted.message(), HasSubstr("tcp_allowed_congestion_control ('reno bbr')"));
  EXPECT_THAT(CheckCongestionControl("\x1b[2J", "reno", "reno").message(),
              HasSubstr("'\\x1b[2J'"));
}

}  // namespace
}  // namespace strait::wanem
