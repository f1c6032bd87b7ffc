#!/usr/bin/env bash
# The .deb's maintainer scripts (deploy/debian) do what Debian's install, upgrade and removal
# paths need, run for real under /bin/sh with every command that would change the host replaced
# by a stub that records its arguments (PATH holds only the stubs and the few real tools the
# scripts use):
# - with DPKG_ROOT (dpkg --root): the user is made in the target (systemd-sysusers --root, or
#   useradd --root when there is no systemd-sysusers, and not again when the target has it), the
#   tls directory gets the target's gid, and the host's systemd is never called;
# - the move to a conffile: an unowned /etc/default/straitd that is still the shipped default is
#   removed, an edited one set aside by preinst and restored by postinst (or by postrm when the
#   upgrade aborts), and one dpkg already owns is left alone;
# - on the running system (DPKG_ROOT empty; /run, /etc/passwd and /etc/group replaced in a
#   private mount namespace): a fresh install reloads systemd and starts nothing, an upgrade
#   reloads and then try-restarts straitd, prerm stops it on removal only, and without
#   /run/systemd/system nothing calls systemd.
# Usage: check_maintscripts.sh SOURCE_DIR WORK_DIR. Exit 77 (skipped) unless root with unshare
# (the mount namespace); CI runs as root.
set -euo pipefail
src=$(realpath "$1") work=$2
scripts=$src/deploy/debian
if [[ $(id -u) != 0 ]] || ! command -v unshare >/dev/null; then
  echo "SKIP: needs root and unshare(1) for a private mount namespace"
  exit 77
fi
failed=0
fail() { echo "FAIL: $*"; failed=1; }
rm -rf "$work" && mkdir -p "$work"
work=$(realpath "$work")

# Two tool sets: with and without systemd-sysusers.
for set in with without; do
  bin=$work/bin-$set
  mkdir -p "$bin"
  for tool in grep awk cmp mv rm cat mkdir; do ln -s "$(command -v "$tool")" "$bin/$tool"; done
  stubs="systemctl deb-systemd-invoke useradd install dpkg-query"
  [[ $set == with ]] && stubs="$stubs systemd-sysusers"
  for cmd in $stubs; do
    cat >"$bin/$cmd" <<STUB
#!/bin/sh
echo "$cmd \$*" >>"\$STUB_LOG"
case "$cmd" in
  # What the real ones do: useradd refuses an existing user with exit code 9; both leave the
  # group in the target's (or the host's) group file.
  useradd) grep -q '^strait:' "\${DPKG_ROOT:-}/etc/passwd" && exit 9
           echo "strait:x:7400:" >>"\${DPKG_ROOT:-}/etc/group" ;;
  systemd-sysusers) echo "strait:x:7400:" >>"\${DPKG_ROOT:-}/etc/group" ;;
  # dpkg's record of this package's conffiles (STUB_CONFFILES: its lines, or none).
  dpkg-query) [ -n "\${STUB_CONFFILES:-}" ] && printf '%s\n' "\$STUB_CONFFILES" ;;
esac
exit 0
STUB
    chmod +x "$bin/$cmd"
  done
done

# A target root: passwd/group files and the old package's shipped default environment file.
new_root() {
  local root=$work/$1-root
  rm -rf "$root" && mkdir -p "$root/etc/default" "$root/usr/share/strait" "$root/var/lib/dpkg"
  echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
  echo "root:x:0:" >"$root/etc/group"
  cp "$src/deploy/systemd/straitd.env" "$root/usr/share/strait/straitd.env"
  echo "$root"
}
# in_root NAME ROOT SET SCRIPT ARGS...: runs a script with DPKG_ROOT=ROOT, in a private mount
# namespace whose /run holds /run/systemd/system (so that a script that wrongly looks at the
# host's systemd under DPKG_ROOT is caught); its log in $LOG.
in_root() {
  local name=$1 root=$2 set=$3 script=$4
  shift 4
  : >"$work/$name.log"
  DPKG_ROOT=$root STUB_LOG=$work/$name.log BIN=$work/bin-$set SCRIPT=$scripts/$script \
    unshare --mount --propagation private /bin/sh -ec '
      mount -t tmpfs strait-test /run
      mkdir -p /run/systemd/system
      PATH=$BIN exec /bin/sh -e "$SCRIPT" "$@"' sh "$@" ||
    fail "$name: $script $* exited $?"
  LOG=$(cat "$work/$name.log")
}
has() { grep -qxF "$1" <<<"$LOG"; }
none() { ! grep -qE "$1" <<<"$LOG"; }

# --- dpkg --root --------------------------------------------------------------------------------
root=$(new_root sysusers)
in_root sysusers "$root" with postinst configure ""
has "systemd-sysusers --root=$root straitd.conf" || fail "sysusers: not run for \$DPKG_ROOT: $LOG"
has "install -d -m 0750 -o 0 -g 7400 $root/etc/strait/tls" ||
  fail "sysusers: tls directory not made with the target's gid: $LOG"
none '^(systemctl|deb-systemd-invoke)' || fail "sysusers: the host's systemd was called: $LOG"
none '^install .* /etc/' || fail "sysusers: wrote outside \$DPKG_ROOT: $LOG"

root=$(new_root useradd)
in_root useradd "$root" without postinst configure 0.1.0
grep -qE "^useradd --root $root .* strait$" <<<"$LOG" || fail "useradd: not run in \$DPKG_ROOT: $LOG"
none '^(systemctl|deb-systemd-invoke)' || fail "useradd: the host's systemd was called: $LOG"

root=$(new_root user-exists)
echo "strait:x:7400:7400::/nonexistent:/usr/sbin/nologin" >>"$root/etc/passwd"
echo "strait:x:7400:" >>"$root/etc/group"
in_root user-exists "$root" without postinst configure 0.1.0
[[ $(grep -c '^strait:' "$root/etc/group") == 1 ]] ||
  fail "user-exists: the target's group file changed although it had the user"
has "install -d -m 0750 -o 0 -g 7400 $root/etc/strait/tls" ||
  fail "user-exists: postinst stopped at useradd's 'user exists': $LOG"

# --- the move to a conffile ---------------------------------------------------------------------
root=$(new_root pristine)
cp "$root/usr/share/strait/straitd.env" "$root/etc/default/straitd"
in_root pristine "$root" with preinst upgrade 0.1.0
[[ ! -e $root/etc/default/straitd ]] || fail "pristine: the unowned default copy was not removed"

root=$(new_root edited)
echo "STRAITD_OPTS=--log-level debug" >"$root/etc/default/straitd"
in_root edited "$root" with preinst upgrade 0.1.0
[[ ! -e $root/etc/default/straitd && -f $root/etc/default/straitd.strait-preinst ]] ||
  fail "edited: preinst did not set the edited file aside"
cp "$src/deploy/systemd/straitd.env" "$root/etc/default/straitd"  # what dpkg unpacks
in_root edited-configure "$root" with postinst configure 0.1.0
grep -qx 'STRAITD_OPTS=--log-level debug' "$root/etc/default/straitd" 2>/dev/null ||
  fail "edited: postinst did not restore the operator's file"
[[ ! -e $root/etc/default/straitd.strait-preinst ]] || fail "edited: the set-aside copy remains"

root=$(new_root aborted)
echo "STRAITD_OPTS=--log-level debug" >"$root/etc/default/straitd"
in_root aborted "$root" with preinst upgrade 0.1.0
in_root aborted-postrm "$root" with postrm abort-upgrade 0.1.0
grep -qx 'STRAITD_OPTS=--log-level debug' "$root/etc/default/straitd" 2>/dev/null ||
  fail "aborted: postrm abort-upgrade did not put the operator's file back"

root=$(new_root owned)
echo "STRAITD_OPTS=--log-level debug" >"$root/etc/default/straitd"
STUB_CONFFILES=" /etc/default/straitd 0123456789abcdef0123456789abcdef" \
  in_root owned "$root" with preinst upgrade 0.1.1
grep -qx 'STRAITD_OPTS=--log-level debug' "$root/etc/default/straitd" 2>/dev/null &&
  [[ ! -e $root/etc/default/straitd.strait-preinst ]] ||
  fail "owned: preinst touched a conffile dpkg already owns"

# --- the running system (DPKG_ROOT empty) --------------------------------------------------------
# host NAME SYSTEMD(yes|no) SCRIPT ARGS...: in a private mount namespace whose /run is empty (with
# /run/systemd/system when SYSTEMD is yes) and whose /etc/passwd and /etc/group are scratch copies.
host() {
  local name=$1 systemd=$2 script=$3
  shift 3
  local etc=$work/$name-etc
  rm -rf "$etc" && mkdir -p "$etc"
  printf 'root:x:0:0:root:/root:/bin/sh\nstrait:x:7400:7400::/nonexistent:/usr/sbin/nologin\n' \
    >"$etc/passwd"
  printf 'root:x:0:\nstrait:x:7400:\n' >"$etc/group"
  : >"$work/$name.log"
  STUB_LOG=$work/$name.log SYSTEMD=$systemd ETC=$etc BIN=$work/bin-with SCRIPT=$scripts/$script \
    unshare --mount --propagation private /bin/sh -ec '
      mount -t tmpfs strait-test /run
      [ "$SYSTEMD" = yes ] && mkdir -p /run/systemd/system
      mount --bind "$ETC/passwd" /etc/passwd
      mount --bind "$ETC/group" /etc/group
      DPKG_ROOT= PATH=$BIN exec /bin/sh -e "$SCRIPT" "$@"' sh "$@" ||
    fail "$name: $script $* exited $?"
  LOG=$(cat "$work/$name.log")
}

host fresh yes postinst configure ""
has "systemctl daemon-reload" || fail "fresh: no systemctl daemon-reload: $LOG"
none '^deb-systemd-invoke' || fail "fresh: a fresh install started or restarted straitd: $LOG"
host upgrade yes postinst configure 0.1.0
[[ $(grep -E '^(systemctl|deb-systemd-invoke)' <<<"$LOG" | tr '\n' ';') == \
  "systemctl daemon-reload;deb-systemd-invoke try-restart straitd.service;" ]] ||
  fail "upgrade: expected daemon-reload then try-restart of straitd: $LOG"
host no-systemd no postinst configure 0.1.0
none '^(systemctl|deb-systemd-invoke)' || fail "no-systemd: systemd called without it: $LOG"
host prerm-upgrade yes prerm upgrade 0.2.0
none 'stop' || fail "prerm-upgrade: stopped straitd (the new postinst restarts it): $LOG"
host prerm-remove yes prerm remove
has "deb-systemd-invoke stop straitd.service" || fail "prerm-remove: straitd not stopped: $LOG"
host postrm yes postrm purge
has "systemctl daemon-reload" || fail "postrm: no daemon-reload: $LOG"

grep -qxF /etc/default/straitd "$scripts/conffiles" || fail "conffiles lacks /etc/default/straitd"
if ((failed)); then exit 1; fi
echo "check_maintscripts: dpkg --root, the conffile move, install, upgrade and removal passed"
