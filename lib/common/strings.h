// Small string helpers shared by the modules' error messages and logs.
#ifndef STRAIT_LIB_COMMON_STRINGS_H_
#define STRAIT_LIB_COMMON_STRINGS_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace strait {

// Appends `item` to a `separator`-separated list ("a, b, c"). Spelled as two appends rather than
// `list += (list.empty() ? "" : ", ") + item`, which builds a temporary per item and, with a
// std::string item, makes gcc 12 at -O3 report a false -Wrestrict in libstdc++'s insert.
inline void AppendToList(std::string& list, std::string_view item,
                         std::string_view separator = ", ") {
  if (!list.empty()) list += separator;
  list += item;
}

// `value` in single quotes for an error message that names a bad argument: bytes outside
// printable ASCII as \xNN (a stray control character is then visible, and cannot garble a
// terminal or a log line), and a value longer than `max` bytes cut there, with its length (a
// 5000-byte argument is a mistake to point at, not to print).
inline std::string QuotedForError(std::string_view value, size_t max = 80) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  const size_t shown = value.size() < max ? value.size() : max;
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  out += '\'';
  if (value.size() > max) {
    out += " (";
    out += std::to_string(value.size());
    out += " bytes; the first ";
    out += std::to_string(max);
    out += " shown)";
  }
  return out;
}

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_STRINGS_H_
