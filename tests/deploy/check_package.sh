#!/usr/bin/env bash
# Packaging: `cmake --install` lays out what the README says, and the .deb that `cpack -G DEB`
# makes from this build tree unpacks (dpkg -x, no root install) into a tree from which the
# quick-start demo runs: strait-bench codec, then strait-bench allreduce --loopback, which starts
# the unpacked straitd found next to it.
# Usage: check_package.sh BUILD_DIR WORK_DIR. Exit 77 (skipped) without dpkg-deb.
set -euo pipefail
build=$(realpath "$1") work=$2
failed=0
fail() { echo "FAIL: $*"; failed=1; }
for tool in cpack dpkg-deb dpkg-shlibdeps; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not found (Debian's dpkg-dev)"; exit 77; }
done
rm -rf "$work" && mkdir -p "$work"
work=$(realpath "$work")

# --- cmake --install into a scratch prefix -----------------------------------------------------
cmake --install "$build" --prefix "$work/prefix" >/dev/null
for f in bin/straitd bin/strait-bench bin/strait-wanem bin/strait-certs include/strait/status.h \
  lib/systemd/system/straitd.service lib/sysusers.d/straitd.conf etc/default/straitd \
  share/strait/examples/straitd.toml share/strait/kubernetes/daemonset.yaml \
  share/strait/prometheus/strait-rules.yml share/strait/grafana/strait.json \
  share/doc/strait/README.md share/doc/strait/copyright share/doc/strait/CONFIG.md \
  share/man/man8/straitd.8.gz share/man/man8/strait-wanem.8.gz share/man/man1/strait-bench.1.gz \
  share/man/man1/strait-certs.1.gz; do
  [[ -e $work/prefix/$f ]] || fail "cmake --install did not install $f"
done
# The plugin goes to the library directory (lib, or lib/<multiarch> for prefix /usr on Debian),
# the CMake package beside it.
plugin=$(find "$work/prefix/lib" -name libnccl-net-strait.so | head -n 1)
[[ -n $plugin ]] || fail "cmake --install did not install libnccl-net-strait.so under lib/"
[[ -n $(find "$work/prefix/lib" -path '*/cmake/Strait/StraitConfig.cmake') ]] ||
  fail "cmake --install did not install lib/.../cmake/Strait/StraitConfig.cmake"
# The unit names the straitd of the prefix it was installed to.
grep -qxF "ExecStart=$work/prefix/bin/straitd --config \${STRAITD_CONFIG} \$STRAITD_OPTS" \
  "$work/prefix/lib/systemd/system/straitd.service" ||
  fail "installed unit's ExecStart does not name $work/prefix/bin/straitd"
grep -qxF "EnvironmentFile=-$work/prefix/etc/default/straitd" \
  "$work/prefix/lib/systemd/system/straitd.service" ||
  fail "installed unit's EnvironmentFile does not name $work/prefix/etc/default/straitd"

# --- the .deb ----------------------------------------------------------------------------------
(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/pack" >cpack.log 2>&1) ||
  { cat "$work/cpack.log"; echo "FAIL: cpack -G DEB failed"; exit 1; }
shopt -s nullglob
debs=("$work"/pack/strait_*.deb)
((${#debs[@]} == 1)) || { echo "FAIL: expected one strait_*.deb in $work/pack, found ${#debs[@]}"; exit 1; }
deb=${debs[0]}
echo "package: $(basename "$deb") ($(du -h "$deb" | cut -f1))"
[[ $(dpkg-deb -f "$deb" Package) == strait ]] || fail "Package is not 'strait'"
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
for d in libc6 libssl3 libzstd1 openssl; do
  [[ $depends == *"$d"* ]] || fail "Depends lacks $d (dpkg-shlibdeps or the listed ones)"
done
mkdir "$work/control"
dpkg-deb -e "$deb" "$work/control"
for s in preinst postinst prerm postrm; do
  [[ -x $work/control/$s ]] || fail "the .deb has no executable $s"
done
grep -qx 'activate-noawait ldconfig' "$work/control/triggers" 2>/dev/null ||
  fail "the .deb has no ldconfig trigger (control file triggers)"
grep -q '^libstrait 0 strait' "$work/control/shlibs" 2>/dev/null ||
  fail "the .deb has no shlibs entry for libstrait.so.0"
# dpkg keeps an operator's /etc/default/straitd across upgrades only if it is a conffile.
grep -qxF /etc/default/straitd "$work/control/conffiles" 2>/dev/null ||
  fail "the .deb's conffiles do not list /etc/default/straitd"

root=$work/root
dpkg -x "$deb" "$root"
for f in usr/bin/straitd usr/bin/strait-bench usr/bin/strait-wanem usr/bin/strait-certs \
  usr/include/strait/status.h usr/lib/systemd/system/straitd.service usr/lib/sysusers.d/straitd.conf \
  etc/default/straitd usr/share/strait/examples/straitd.toml \
  usr/lib/python3/dist-packages/strait/__init__.py usr/lib/python3/dist-packages/strait/torch.py \
  usr/share/doc/strait/changelog.gz usr/share/lintian/overrides/strait \
  usr/share/man/man8/straitd.8.gz; do
  [[ -e $root/$f ]] || fail "the .deb lacks /$f"
done
# The licence travels as Debian's copyright file (check_license.sh checks its content).
grep -q '^License: Apache-2.0$' "$root/usr/share/doc/strait/copyright" 2>/dev/null ||
  fail "the .deb's /usr/share/doc/strait/copyright does not say License: Apache-2.0"
grep -qxF 'ExecStart=/usr/bin/straitd --config ${STRAITD_CONFIG} $STRAITD_OPTS' \
  "$root/usr/lib/systemd/system/straitd.service" || fail "the .deb's unit does not run /usr/bin/straitd"
grep -qxF 'EnvironmentFile=-/etc/default/straitd' "$root/usr/lib/systemd/system/straitd.service" ||
  fail "the .deb's unit does not read /etc/default/straitd"
plugin=$(find "$root/usr/lib" -name libnccl-net-strait.so | head -n 1)
if [[ -z $plugin ]]; then
  fail "the .deb lacks libnccl-net-strait.so under /usr/lib"
elif ! nm -D --defined-only "$plugin" | grep ' ncclNetPlugin_v' >/dev/null; then
  fail "the .deb's ${plugin#"$root"} exports no ncclNetPlugin_v* table"
fi
[[ -n $(find "$root/usr/lib" -path '*/cmake/Strait/StraitConfig.cmake') ]] ||
  fail "the .deb lacks /usr/lib/.../cmake/Strait/StraitConfig.cmake"
# The Python package loads the unpacked libstrait.so.0 (no torch needed for this). A sanitizer
# build's library needs the ASan runtime first in the (uninstrumented) python3 process. (grep
# without -q: under pipefail, -q's early exit can SIGPIPE nm and fail the test by chance.)
lib=$(find "$root/usr/lib" -name libstrait.so.0 | head -n 1)
preload=()
if nm -D --undefined-only "$lib" | grep ' __asan_' >/dev/null; then
  preload=(env "LD_PRELOAD=$(clang -print-file-name=libclang_rt.asan-x86_64.so)"
           ASAN_OPTIONS=detect_leaks=0)
fi
v=$("${preload[@]}" env STRAIT_LIBRARY="$lib" PYTHONPATH="$root/usr/lib/python3/dist-packages" \
      python3 -c 'import strait; print(".".join(map(str, strait.version())))' 2>&1) ||
  fail "the .deb's Python package does not load its libstrait.so.0: $v"
if ((failed)); then exit 1; fi

# --- the demo, from the unpacked files only ----------------------------------------------------
# PATH without the build tree: strait-bench must find the unpacked straitd next to itself.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
bin=$root/usr/bin
"$bin/straitd" --syntax-only --check-config "$root/usr/share/strait/examples/straitd.toml"
"$bin/strait-certs" ca --dir "$work/pki" >/dev/null
"$bin/strait-certs" gateway --dir "$work/pki" --region us-east >/dev/null
echo "== strait-bench codec (unpacked) =="
"$bin/strait-bench" codec --size 1MiB
echo "== strait-bench allreduce --loopback (unpacked straitd) =="
out=$("$bin/strait-bench" allreduce --loopback --size 256KiB --iters 1 --codec int8 \
        --baseline ring 2>&1) || { echo "$out"; echo "FAIL: allreduce"; exit 1; }
echo "$out"
grep -q '^mesh int8 .* yes$' <<<"$out" || fail "allreduce: no bit-identical mesh int8 result"
if ((failed)); then exit 1; fi
echo "check_package: install layout, .deb contents and the demo from the unpacked .deb passed"
