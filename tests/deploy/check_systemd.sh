#!/usr/bin/env bash
# deploy/systemd: the unit passes `systemd-analyze verify` (with ExecStart pointing at the built
# straitd, since /usr/bin/straitd is what the .deb installs), carries the hardening and readiness
# settings the README promises, and the example config and environment file agree with it and
# pass `straitd --check-config`.
# Usage: check_systemd.sh STRAITD SOURCE_DIR. Exit 77 (skipped) when systemd-analyze is absent.
set -euo pipefail
straitd=$(realpath "$1") src=$2
unit=$src/deploy/systemd/straitd.service
env_file=$src/deploy/systemd/straitd.env
example=$src/deploy/examples/straitd.toml
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# The example config is what the unit reads by default.
# The text only: the example's TLS files are made on the gateway host (strait-certs).
"$straitd" --syntax-only --check-config "$example" || fail "$example does not pass straitd --check-config"
grep -qx 'STRAITD_CONFIG=/etc/strait/straitd.toml' "$env_file" ||
  fail "$env_file does not set STRAITD_CONFIG=/etc/strait/straitd.toml"
grep -qx 'Environment=STRAITD_CONFIG=/etc/strait/straitd.toml' "$unit" ||
  fail "$unit has no default STRAITD_CONFIG"
# The example's local socket lives in the unit's RuntimeDirectory.
rundir=$(sed -n 's/^RuntimeDirectory=//p' "$unit")
grep -q "^socket = \"/run/$rundir/" "$example" ||
  fail "example local.socket is not under /run/$rundir (the unit's RuntimeDirectory)"

for line in 'Type=notify' 'NotifyAccess=main' 'Restart=on-failure' 'NoNewPrivileges=yes' \
  'ProtectSystem=strict' 'ProtectHome=yes' 'PrivateTmp=yes' 'CapabilityBoundingSet=' \
  'User=strait' 'EnvironmentFile=-/etc/default/straitd' \
  'ExecStartPre=/usr/bin/straitd --check-config ${STRAITD_CONFIG}' \
  'ExecStart=/usr/bin/straitd --config ${STRAITD_CONFIG} $STRAITD_OPTS' \
  'ExecReload=/bin/kill -HUP $MAINPID'; do
  grep -qxF "$line" "$unit" || fail "$unit lacks the line: $line"
done

if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze not found (install the 'systemd' package: scripts/setup.sh);" \
       "checked the config and the unit's settings only"
  ((failed == 0)) && exit 77
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The unit's name must stay straitd.service; only the binary's path changes.
sed "s|/usr/bin/straitd|$straitd|g" "$unit" >"$work/straitd.service"
if ! out=$(cd "$work" && systemd-analyze verify ./straitd.service 2>&1) || [[ -n $out ]]; then
  fail "systemd-analyze verify straitd.service: ${out:-non-zero exit}"
fi
# The check itself must catch a broken unit (a misspelt directive).
mkdir "$work/bad"
sed 's/^NoNewPrivileges=/NoNewPrivilege=/' "$work/straitd.service" >"$work/bad/straitd.service"
out=$(cd "$work/bad" && systemd-analyze verify ./straitd.service 2>&1 || true)
[[ $out == *NoNewPrivilege* ]] || fail "systemd-analyze verify did not flag a misspelt directive"

if ((failed)); then exit 1; fi
echo "check_systemd: straitd.service verified, settings and example config OK"
