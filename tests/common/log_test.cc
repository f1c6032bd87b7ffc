// Tests for log levels, the environment variable and sinks.
#include "common/log.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

namespace strait {
namespace {

struct Captured {
  LogLevel level;
  std::string subsystem;
  std::string message;
};

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([this](LogLevel level, std::string_view subsystem, std::string_view message) {
      lines_.push_back({level, std::string(subsystem), std::string(message)});
    });
  }
  void TearDown() override {
    SetLogSink(nullptr);
    unsetenv("STRAIT_LOG_LEVEL");
    unsetenv("STRAIT_LOG_FORMAT");
    SetLogLevel(LogLevel::kInfo);
    SetLogFormat(LogFormat::kText);
  }
  std::vector<Captured> lines_;
};

TEST_F(LogTest, LevelFiltersAndStreamIsLazy) {
  SetLogLevel(LogLevel::kWarn);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  STRAIT_LOG(kInfo, "test") << "hidden " << count();
  STRAIT_LOG(kWarn, "test") << "shown " << count();
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_EQ(lines_[0].level, LogLevel::kWarn);
  EXPECT_EQ(lines_[0].subsystem, "test");
  EXPECT_EQ(lines_[0].message, "shown 1");
  EXPECT_EQ(evaluated, 1);
}

TEST_F(LogTest, ParseLevelNamesAndDigits) {
  EXPECT_EQ(*ParseLogLevel("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarn);
  EXPECT_EQ(*ParseLogLevel("4"), LogLevel::kTrace);
  StatusOr<LogLevel> bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("error, warn, info, debug, trace"), std::string::npos);
}

TEST_F(LogTest, EnvironmentSetsLevelAndBadValueIsNamed) {
  setenv("STRAIT_LOG_LEVEL", "debug", 1);
  ASSERT_TRUE(InitLogLevelFromEnv().ok());
  EXPECT_EQ(GetLogLevel(), LogLevel::kDebug);
  setenv("STRAIT_LOG_LEVEL", "verbose", 1);
  Status s = InitLogLevelFromEnv();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("STRAIT_LOG_LEVEL"), std::string::npos);
  EXPECT_NE(s.message().find("verbose"), std::string::npos);
}

TEST_F(LogTest, JsonEscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonEscape("plain text"), "plain text");
  EXPECT_EQ(JsonEscape("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(JsonEscape("C:\\dir"), "C:\\\\dir");
  EXPECT_EQ(JsonEscape("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(JsonEscape(std::string_view("\x01\x1f\0", 3)), "\\u0001\\u001f\\u0000");
  EXPECT_EQ(JsonEscape("r\xc3\xa9gion"), "r\xc3\xa9gion");  // UTF-8 passes through
}

TEST_F(LogTest, JsonLineHasTsLevelSubsystemMsg) {
  EXPECT_EQ(FormatJsonLogLine("2026-11-29T18:48:58.123Z", LogLevel::kWarn, "net",
                              "peer \"eu\" refused\n"),
            "{\"ts\":\"2026-11-29T18:48:58.123Z\",\"level\":\"warn\",\"subsystem\":\"net\","
            "\"msg\":\"peer \\\"eu\\\" refused\\n\"}");
}

TEST_F(LogTest, ParseFormatAndEnvironment) {
  EXPECT_EQ(*ParseLogFormat("JSON"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  StatusOr<LogFormat> bad = ParseLogFormat("xml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("text, json"), std::string::npos);

  setenv("STRAIT_LOG_FORMAT", "json", 1);
  ASSERT_TRUE(InitLogFormatFromEnv().ok());
  EXPECT_EQ(GetLogFormat(), LogFormat::kJson);
  setenv("STRAIT_LOG_FORMAT", "yaml", 1);
  Status s = InitLogFormatFromEnv();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("STRAIT_LOG_FORMAT"), std::string::npos);
  EXPECT_NE(s.message().find("yaml"), std::string::npos);
  EXPECT_EQ(GetLogFormat(), LogFormat::kJson);  // a bad value changes nothing
}

}  // namespace
}  // namespace strait
