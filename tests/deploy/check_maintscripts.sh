#!/usr/bin/env bash
# The .deb's maintainer scripts (deploy/debian) do what Debian's upgrade path needs: a fresh
# install does not start straitd; an upgrade restarts a running one (try-restart) and does not
# stop it in prerm; removal stops it; every path they touch lies under DPKG_ROOT (dpkg --root).
# They run for real under sh, with DPKG_ROOT pointing at a scratch tree and the commands that
# would change the host (systemctl, deb-systemd-invoke, systemd-sysusers, install) replaced by
# stubs on PATH that record their arguments.
# Usage: check_maintscripts.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
scripts=$src/deploy/debian
failed=0
fail() { echo "FAIL: $*"; failed=1; }
rm -rf "$work" && mkdir -p "$work/bin"
work=$(realpath "$work")
for cmd in systemctl deb-systemd-invoke systemd-sysusers install; do
  printf '#!/bin/sh\necho "%s $*" >>"$STUB_LOG"\n' "$cmd" >"$work/bin/$cmd"
  chmod +x "$work/bin/$cmd"
done

# run NAME SYSTEMD(yes|no) SCRIPT ARGS...: runs one script in a fresh root, log in $work/NAME.log.
run() {
  local name=$1 systemd=$2 script=$3
  shift 3
  local root=$work/$name-root
  mkdir -p "$root"
  [[ $systemd == yes ]] && mkdir -p "$root/run/systemd/system"
  : >"$work/$name.log"
  DPKG_ROOT=$root STUB_LOG=$work/$name.log PATH=$work/bin:/usr/bin:/bin \
    sh -e "$scripts/$script" "$@" || fail "$script $* exited $?"
  LOG=$(cat "$work/$name.log")
  ROOT=$root
}
has() { grep -qxF "$1" <<<"$LOG"; }

run fresh yes postinst configure ""
has "systemctl daemon-reload" || fail "fresh install: no systemctl daemon-reload"
grep -q '^deb-systemd-invoke' <<<"$LOG" && fail "fresh install started or restarted straitd: $LOG"
has "systemd-sysusers --root=$ROOT $ROOT/usr/lib/sysusers.d/straitd.conf" ||
  fail "fresh install: systemd-sysusers not run on \$DPKG_ROOT's sysusers.d: $LOG"
has "install -d -m 0750 -o root -g strait $ROOT/etc/strait/tls" ||
  fail "fresh install: /etc/strait/tls not made under \$DPKG_ROOT: $LOG"
grep -E '^install .* /etc/' <<<"$LOG" && fail "postinst wrote outside \$DPKG_ROOT"

run upgrade yes postinst configure 0.1.0
has "deb-systemd-invoke try-restart straitd.service" ||
  fail "upgrade: running straitd not restarted (no deb-systemd-invoke try-restart): $LOG"

run no-systemd no postinst configure 0.1.0
grep -qE '^(systemctl|deb-systemd-invoke)' <<<"$LOG" &&
  fail "without systemd (no /run/systemd/system) postinst called systemd: $LOG"

run prerm-upgrade yes prerm upgrade 0.2.0
grep -q 'stop' <<<"$LOG" && fail "prerm upgrade stopped straitd (the postinst restarts it): $LOG"
run prerm-remove yes prerm remove
has "deb-systemd-invoke stop straitd.service" || fail "prerm remove did not stop straitd: $LOG"
run postrm yes postrm purge
has "systemctl daemon-reload" || fail "postrm did not reload systemd: $LOG"

# The conffile list names the file the unit reads.
grep -qxF /etc/default/straitd "$scripts/conffiles" || fail "conffiles lacks /etc/default/straitd"
grep -qxF 'EnvironmentFile=-/etc/default/straitd' "$src/deploy/systemd/straitd.service" ||
  fail "the unit does not read /etc/default/straitd"
if ((failed)); then exit 1; fi
echo "check_maintscripts: fresh install, upgrade (try-restart), removal and DPKG_ROOT passed"
