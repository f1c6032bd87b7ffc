// Tests of lib/common/strings.h: the list builder and the quoting of bad values in errors.
#include "common/strings.h"

#include <gtest/gtest.h>

#include <string>

namespace strait {
namespace {

TEST(Strings, AppendToListSeparatesItems) {
  std::string list;
  AppendToList(list, "a");
  AppendToList(list, std::string("b"));
  AppendToList(list, "c", " | ");
  EXPECT_EQ(list, "a, b | c");
}

TEST(Strings, QuotedForErrorShowsPrintableValuesAsTheyAre) {
  EXPECT_EQ(QuotedForError("us-east"), "'us-east'");
  EXPECT_EQ(QuotedForError(""), "''");
  EXPECT_EQ(QuotedForError(std::string(80, 'x')), "'" + std::string(80, 'x') + "'");
}

TEST(Strings, QuotedForErrorEscapesWhatATerminalWouldInterpret) {
  EXPECT_EQ(QuotedForError("a\nb"), "'a\\x0ab'");
  EXPECT_EQ(QuotedForError(std::string("a\0b", 3)), "'a\\x00b'");
  EXPECT_EQ(QuotedForError("\x1b[2J"), "'\\x1b[2J'");
  EXPECT_EQ(QuotedForError("\xc3\xa9"), "'\\xc3\\xa9'");  // not printable ASCII, so escaped
  EXPECT_EQ(QuotedForError("\x7f"), "'\\x7f'");
}

TEST(Strings, QuotedForErrorCutsLongValuesAndSaysSo) {
  const std::string q = QuotedForError(std::string(5000, 'a'));
  EXPECT_EQ(q, "'" + std::string(80, 'a') + "' (5000 bytes; the first 80 shown)");
  EXPECT_EQ(QuotedForError("abcdef", 3), "'abc' (6 bytes; the first 3 shown)");
}

}  // namespace
}  // namespace strait
