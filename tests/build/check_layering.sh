#!/usr/bin/env bash
# Builds the layering probes (EXCLUDE_FROM_ALL object libraries, tests/build/CMakeLists.txt) one
# at a time. Each case is `fail:<target>:<header>` or `ok:<target>:<header>`: a `fail` probe must
# not compile, and its compiler must say that it did not find <header> (any other error means the
# probe is broken, not that the layering holds); an `ok` probe must compile.
set -uo pipefail
build=$1; shift
failures=0
for spec in "$@"; do
  IFS=: read -r expect target header <<<"$spec"
  out=$(cmake --build "$build" --target "$target" 2>&1)
  rc=$?
  if [[ $expect == ok ]]; then
    if ((rc != 0)); then
      echo "$out"; echo "FAIL: $target: \"$header\" should compile with its module's include roots"
      failures=$((failures + 1))
    else
      echo "ok: $target compiles \"$header\""
    fi
    continue
  fi
  if ((rc == 0)); then
    echo "FAIL: $target: \"$header\" compiled, so the module can include a module above it"
    failures=$((failures + 1))
  elif ! grep -qE "$header(: No such file or directory|' file not found)" <<<"$out"; then
    echo "$out"; echo "FAIL: $target failed to build, but not because \"$header\" was not found"
    failures=$((failures + 1))
  else
    echo "ok: $target cannot include \"$header\""
  fi
done
((failures == 0)) || { echo "$failures layering probe(s) failed"; exit 1; }
echo "layering: every upward include fails to compile, every downward one compiles"
