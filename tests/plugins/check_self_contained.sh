#!/usr/bin/env bash
# The NCCL plugin loads into a training image that has only glibc, given libuv.so.1 beside it:
# its dynamic section needs glibc's libraries and libuv.so.1 only, finds the latter through
# RUNPATH $ORIGIN, and uses no glibc symbol newer than MAX_GLIBC (2.34: Ubuntu 22.04, RHEL 9,
# Debian 12 and later, the bases of current PyTorch and NGC images) and no libstdc++ symbol.
# Then the two files, copied into an empty directory, are dlopen()ed by python3 with
# LD_LIBRARY_PATH cleared: the plugin's v11 table is found and the libuv mapped is the copy.
# Usage: check_self_contained.sh PLUGIN [MAX_GLIBC]. Exit 77 when the build links the plugin
# against shared libstdc++ on purpose (STRAIT_PLUGIN_SELF_CONTAINED=OFF: sanitizer builds; CI
# checks the cuda preset's plugin instead).
set -euo pipefail
plugin=$1 max=${2:-2.34}
needed=$(readelf -d "$plugin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "NEEDED: $(tr '\n' ' ' <<<"$needed")"
if [[ ${STRAIT_PLUGIN_SELF_CONTAINED:-ON} == OFF ]]; then
  echo "SKIP: this build links the plugin against shared libraries (STRAIT_PLUGIN_SELF_CONTAINED=OFF)"
  exit 77
fi
failed=0
while read -r lib; do
  [[ -z $lib ]] && continue
  case $lib in
    libc.so.6 | libm.so.6 | ld-linux-x86-64.so.2 | libpthread.so.0 | libdl.so.2 | librt.so.1) ;;
    libuv.so.1) ;;  # copied beside the plugin (deploy/kubernetes/job-example.yaml)
    libgcc_s.so.1) ;;  # the unwinder, in every image (Debian's and Ubuntu's libgcc-s1 are essential)
    # Sanitizer builds (CI) carry their runtime; a training image never loads those.
    libclang_rt.* | libasan.so* | libubsan.so*) ;;
    *) echo "FAIL: the plugin needs $lib, which a training image may not have"; failed=1 ;;
  esac
done <<<"$needed"
runpath=$(readelf -d "$plugin" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
[[ $runpath == '$ORIGIN' ]] || { echo "FAIL: RUNPATH is '$runpath', not \$ORIGIN"; failed=1; }
newest=$(objdump -T "$plugin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)
echo "newest glibc symbol version: ${newest:-none} (allowed: <= $max)"
if [[ -n $newest && $(printf '%s\n%s\n' "$newest" "$max" | sort -V | tail -n 1) != "$max" ]]; then
  echo "FAIL: the plugin needs glibc $newest, newer than $max"
  objdump -T "$plugin" | grep "GLIBC_$newest" | head -n 5
  failed=1
fi
if objdump -T "$plugin" | grep -q 'GLIBCXX_\|CXXABI_'; then
  echo "FAIL: the plugin still needs libstdc++ symbols:"
  objdump -T "$plugin" | grep 'GLIBCXX_\|CXXABI_' | head -n 5
  failed=1
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$plugin" "$dir/libnccl-net-strait.so"
libuv=$(ldd "$plugin" | awk '$1 == "libuv.so.1" { print $3 }')
[[ -f $libuv ]] || { echo "FAIL: the loader finds no libuv.so.1 for the plugin (Debian's libuv1)"; exit 1; }
cp -L "$libuv" "$dir/libuv.so.1"
env -u LD_LIBRARY_PATH /usr/bin/python3 - "$dir/libnccl-net-strait.so" <<'PY' || failed=1
import ctypes, sys
import os
lib = ctypes.CDLL(sys.argv[1])
ctypes.c_void_p.in_dll(lib, "ncclNetPlugin_v11")
want = os.path.join(os.path.dirname(sys.argv[1]), "libuv.so.1")
maps = open("/proc/self/maps").read()
uv = sorted({l.split()[-1] for l in maps.splitlines() if "libuv" in l})
if uv != [want]:
    sys.exit(f"FAIL: libuv mapped from {uv}, not the copy beside the plugin ({want})")
print("dlopen: loaded, ncclNetPlugin_v11 found, libuv from beside the plugin")
PY
if ((failed)); then exit 1; fi
echo "check_self_contained: the plugin needs glibc <= $max and the libuv.so.1 beside it"
