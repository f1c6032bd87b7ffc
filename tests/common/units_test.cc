// Tests for size, rate and duration parsing and formatting.
#include "common/units.h"

#include <gtest/gtest.h>

namespace strait {
namespace {

TEST(ParseSize, BinaryDecimalAndBareUnits) {
  EXPECT_EQ(*ParseSize("64MiB"), 64ull << 20);
  EXPECT_EQ(*ParseSize("64M"), 64ull << 20);
  EXPECT_EQ(*ParseSize("64MB"), 64'000'000ull);
  EXPECT_EQ(*ParseSize("4096"), 4096ull);
  EXPECT_EQ(*ParseSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseSize(" 2 kib "), 2048ull);
  EXPECT_EQ(*ParseSize("0"), 0ull);
  EXPECT_EQ(*ParseSize("1T"), 1ull << 40);
}

TEST(ParseSize, RejectsWithClearMessage) {
  for (const char* bad : {"", "MiB", "64XB", "-1", "1.5", "1e3", "64 Mi B", "99999999999T"}) {
    StatusOr<uint64_t> r = ParseSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("invalid size"), std::string::npos) << bad;
  }
  EXPECT_NE(ParseSize("64XB").status().message().find("e.g. 64MiB"), std::string::npos);
}

TEST(ParseRate, BitsAndBytes) {
  EXPECT_EQ(*ParseRate("100mbit"), 100'000'000ull);
  EXPECT_EQ(*ParseRate("100Mbit"), 100'000'000ull);
  EXPECT_EQ(*ParseRate("2.5gbit"), 2'500'000'000ull);
  EXPECT_EQ(*ParseRate("800kbit"), 800'000ull);
  EXPECT_EQ(*ParseRate("125MB/s"), 1'000'000'000ull);
  EXPECT_EQ(*ParseRate("1MiB/s"), 8ull << 20);
  EXPECT_EQ(*ParseRate("10bit"), 10ull);
}

TEST(ParseRate, RejectsAmbiguousAndMissingUnits) {
  StatusOr<uint64_t> amb = ParseRate("100mbps");
  ASSERT_FALSE(amb.ok());
  EXPECT_NE(amb.status().message().find("ambiguous"), std::string::npos);
  EXPECT_NE(amb.status().message().find("100mbit"), std::string::npos);
  EXPECT_FALSE(ParseRate("100").ok());
  EXPECT_FALSE(ParseRate("fast").ok());
  EXPECT_FALSE(ParseRate("0mbit").ok());
  EXPECT_FALSE(ParseRate("100 furlongs").ok());
}

TEST(ParseDuration, Units) {
  EXPECT_EQ(*ParseDurationNanos("20ms"), 20'000'000);
  EXPECT_EQ(*ParseDurationNanos("1.5s"), 1'500'000'000);
  EXPECT_EQ(*ParseDurationNanos("250us"), 250'000);
  EXPECT_EQ(*ParseDurationNanos("100ns"), 100);
  EXPECT_EQ(*ParseDurationNanos("2m"), 120'000'000'000);
  EXPECT_EQ(*ParseDurationNanos("1h"), 3'600'000'000'000);
}

TEST(ParseDuration, BareNumberIsRefused) {
  StatusOr<int64_t> r = ParseDurationNanos("20");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing unit"), std::string::npos);
  EXPECT_FALSE(ParseDurationNanos("20 fortnights").ok());
  EXPECT_FALSE(ParseDurationNanos("ms").ok());
}

TEST(Format, HumanUnits) {
  EXPECT_EQ(FormatBytes(64ull << 20), "64 MiB");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatRate(100e6), "100 Mbit/s");
  EXPECT_EQ(FormatRate(1.25e9), "1.25 Gbit/s");
  EXPECT_EQ(FormatDuration(20'000'000), "20 ms");
  EXPECT_EQ(FormatDuration(1'500'000'000), "1.50 s");
}

TEST(Format, RoundTripsThroughParse) {
  EXPECT_EQ(*ParseSize("64MiB"), 64ull << 20);
  EXPECT_EQ(*ParseRate("100mbit"), 100'000'000ull);
}

}  // namespace
}  // namespace strait
