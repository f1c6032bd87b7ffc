#!/usr/bin/env bash
# lintian on the .deb: `cpack -G DEB` from this build tree, then
#   lintian --fail-on error,warning
# must pass (deploy/debian/lintian-overrides lists, with reasons, the tags the one-package layout
# earns on purpose). The check is real: the same .deb without its copyright file must fail.
# Usage: check_lintian.sh BUILD_DIR WORK_DIR. Exit 77 (skipped) without lintian or dpkg-deb;
# by hand: cpack -G DEB --config BUILD_DIR/CPackConfig.cmake -B pkg && lintian --fail-on
# error,warning pkg/strait_*.deb
set -euo pipefail
build=$(realpath "$1") work=$2
for tool in lintian cpack dpkg-deb dpkg-shlibdeps; do
  command -v "$tool" >/dev/null ||
    { echo "SKIP: $tool not found (Debian's lintian and dpkg-dev; scripts/setup.sh)"; exit 77; }
done
rm -rf "$work" && mkdir -p "$work"
work=$(realpath "$work")
(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/pack" >cpack.log 2>&1) ||
  { cat "$work/cpack.log"; echo "FAIL: cpack -G DEB failed"; exit 1; }
shopt -s nullglob
debs=("$work"/pack/strait_*.deb)
((${#debs[@]} == 1)) || { echo "FAIL: expected one strait_*.deb, found ${#debs[@]}"; exit 1; }
deb=${debs[0]}
# lintian warns about running as root (tests here often do); that line is not a finding.
run_lintian() {
  lintian --fail-on error,warning --tag-display-limit 0 "$@" 2> >(grep -v 'root privileges' >&2)
}
failed=0
if ! out=$(run_lintian "$deb"); then
  echo "$out"
  echo "FAIL: lintian --fail-on error,warning $(basename "$deb")"
  failed=1
else
  [[ -z $out ]] || echo "$out"
  echo "lintian: $(basename "$deb") has no error or warning"
fi

# Self-test: without /usr/share/doc/strait/copyright lintian must fail with no-copyright-file.
# Only that check runs, on the package without its large files (the sanitizer build's binaries
# make unpacking the whole .deb take a minute; the copyright check does not look at them).
dpkg-deb -R "$deb" "$work/tree"
rm "$work/tree/usr/share/doc/strait/copyright"
find "$work/tree/usr" -type f -size +64k -delete
(cd "$work/tree" && find usr -type f -exec md5sum {} + >DEBIAN/md5sums)
dpkg-deb --root-owner-group -b "$work/tree" "$work/broken.deb" >/dev/null
if run_lintian -C debian/copyright "$work/broken.deb" >"$work/broken.txt" ||
   ! grep -q 'no-copyright-file' "$work/broken.txt"; then
  cat "$work/broken.txt"
  echo "FAIL: self-test: lintian did not report no-copyright-file for a .deb without it"
  failed=1
fi
exit "$failed"
