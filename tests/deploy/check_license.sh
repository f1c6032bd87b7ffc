#!/usr/bin/env bash
# The licence: LICENSE is the Apache License 2.0 text Debian ships, the README names it, and the
# Debian copyright file (deploy/debian/copyright, installed as share/doc/strait/copyright; the
# .deb's copy is checked by check_package.sh) is machine-readable and says Apache-2.0 for every
# file, pointing at /usr/share/common-licenses/Apache-2.0 rather than repeating the text.
# Usage: check_license.sh SOURCE_DIR
set -euo pipefail
src=$1
failed=0
fail() { echo "FAIL: $*"; failed=1; }

license=$src/LICENSE
common=/usr/share/common-licenses/Apache-2.0
if [[ ! -f $license ]]; then
  fail "no LICENSE at the top of the source tree"
elif [[ -f $common ]]; then
  cmp -s "$license" "$common" || fail "LICENSE differs from Debian's $common"
else
  grep -q 'Apache License' "$license" && grep -q 'Version 2.0, January 2004' "$license" ||
    fail "LICENSE is not the Apache License 2.0"
fi
grep -q '\[LICENSE\](LICENSE)' "$src/README.md" || fail "README.md does not link LICENSE"
grep -q 'Apache License, Version 2.0' "$src/README.md" || fail "README.md does not name the licence"

copyright=$src/deploy/debian/copyright
if [[ ! -f $copyright ]]; then
  fail "no deploy/debian/copyright"
else
  head -n 1 "$copyright" |
    grep -qxF 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' ||
    fail "deploy/debian/copyright does not start with the DEP-5 Format: line"
  # The Files: * paragraph says Apache-2.0, and a stand-alone License paragraph explains it.
  awk '/^Files: \*$/ {f=1} f && /^License: Apache-2.0$/ {ok=1} /^$/ {f=0} END {exit !ok}' \
    "$copyright" || fail "deploy/debian/copyright: the Files: * paragraph is not Apache-2.0"
  [[ $(grep -c '^License: Apache-2.0$' "$copyright") -ge 2 ]] ||
    fail "deploy/debian/copyright has no stand-alone License: Apache-2.0 paragraph"
  grep -qF '/usr/share/common-licenses/Apache-2.0' "$copyright" ||
    fail "deploy/debian/copyright does not point at /usr/share/common-licenses/Apache-2.0"
  grep -q '^Copyright: [0-9]' "$copyright" || fail "deploy/debian/copyright names no copyright holder"
  # Paragraph continuation lines start with a space; a blank line inside a field breaks parsers.
  if grep -n '^[^A-Za-z #]' "$copyright"; then fail "deploy/debian/copyright: malformed lines above"; fi
fi
grep -q 'debian/copyright DESTINATION .*doc/strait' "$src/cmake/StraitPack.cmake" ||
  fail "cmake/StraitPack.cmake does not install deploy/debian/copyright"
if ((failed)); then exit 1; fi
echo "check_license: LICENSE, README and the Debian copyright file agree on Apache-2.0"
