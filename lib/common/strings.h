// Small string helpers shared by the modules' error messages and logs.
#ifndef STRAIT_LIB_COMMON_STRINGS_H_
#define STRAIT_LIB_COMMON_STRINGS_H_

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

}  // namespace strait

#endif  // STRAIT_LIB_COMMON_STRINGS_H_
