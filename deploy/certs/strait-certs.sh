#!/usr/bin/env bash
# strait-certs.sh: the cluster's certificate authority and one certificate per region gateway,
# made with the openssl command-line tool, in the form straitd checks (lib/net/tls.cc):
#   - every gateway trusts one cluster CA (straitd's tls.ca) and refuses certificates from others;
#   - a gateway certificate names its region in exactly one SAN URI, strait://region/<region>,
#     and straitd refuses a peer whose hello claims another region than its certificate names;
#   - keys are EC P-256; gateway certificates carry digitalSignature and both serverAuth and
#     clientAuth, because every gateway both dials and accepts (mutual TLS 1.3).
#
# Idempotent: running a command again keeps what is already there and valid, so it can sit in a
# provisioning script. The CA is never replaced unless --force is given (a new CA means every
# gateway certificate must be reissued and redistributed). Private keys are written 0600.
set -euo pipefail

PROG=$(basename "$0")
# The project version, filled in by CMake when the script is installed as strait-certs
# (cmake/StraitPack.cmake); the copy in the source tree says so instead.
VERSION="@PROJECT_VERSION@"
[[ $VERSION != @* ]] || VERSION="(source tree, not installed)"
DIR=.
DAYS=""
FORCE=0
CA_NAME="strait-cluster-ca"
REGION=""
STEM=""
EXTRA_SANS=()
# A half-made CA or certificate (keys included) never stays behind when a step fails.
SCRATCH=""
trap '[[ -n $SCRATCH ]] && rm -rf "$SCRATCH"' EXIT
# Gateway certificates within this many days of expiry are reissued by a plain re-run.
RENEW_DAYS=30

usage() {
  cat <<EOF
Usage:
  $PROG ca      [--dir DIR] [--name CN] [--days N] [--force]
  $PROG gateway --region REGION [--dir DIR] [--name STEM] [--san TYPE:VALUE]... [--days N]
                [--force]
  $PROG show    [--dir DIR] [FILE.pem]...
  $PROG help
  $PROG --version

Makes the certificates straitd's [tls] section names (ca, cert, key):
  ca       the cluster CA: DIR/ca.pem (give to every gateway as tls.ca) and DIR/ca.key (keep it
           off the gateways). Kept as it is if it exists; --force replaces it, after which every
           gateway certificate must be reissued. Default CN "$CA_NAME", 3650 days.
  gateway  a gateway certificate signed by DIR/ca.pem: DIR/STEM.pem and DIR/STEM.key (STEM
           defaults to REGION; give e.g. --name us-east-1 for the second gateway of a region).
           SAN URI strait://region/REGION; extra SANs (e.g. --san DNS:gw0.example.org,
           --san IP:10.0.0.7) are added for other tools, straitd does not need them. Kept if it
           exists, was signed by this CA, names REGION and is valid for $RENEW_DAYS more days;
           reissued otherwise or with --force. Default 365 days; cut, with a warning, to the
           days the CA has left (a certificate stops verifying when its CA expires); one
           that ends with its CA is then kept, with a warning, as a reissue cannot outlive it.
  show     the subject, region, issuer and validity of FILE (default: every *.pem in DIR), and
           whether it chains to DIR/ca.pem. FILE is a path, not a name in DIR. A FILE that is
           missing or not a certificate is an error (the others are still shown).

Exit status: 0 on success, 2 on any error (one line on stderr says what to do).

REGION: 1-63 characters from a-z, 0-9, '.', '_' and '-' (the [region] straitd accepts).

Example (two regions, CA kept on an admin machine):
  $PROG ca --dir ./pki
  $PROG gateway --dir ./pki --region us-east
  $PROG gateway --dir ./pki --region eu-west
  # copy ca.pem, us-east.pem, us-east.key to the us-east gateway's /etc/strait/tls/ (and so on)
Rotation: re-run 'gateway' (it reissues what expires within $RENEW_DAYS days), copy the files, then
'systemctl reload straitd' (SIGHUP): straitd uses them for new handshakes, links stay up.
EOF
}

die() {
  echo "$PROG: error: $*" >&2
  exit 2
}
note() { echo "$PROG: $*"; }
# Something done, but not as asked (e.g. a validity cut short): on stderr, so it shows even when
# stdout goes to a provisioning log.
warn() { echo "$PROG: warning: $*" >&2; }

# mkdir -p DIR, failing with one line of ours instead of mkdir's own (which set -e would turn
# into exit 1 with the raw message). The reason is the text after the last ": " of mkdir's line
# ("mkdir: cannot create directory 'x': Permission denied").
make_dir() {
  local out
  out=$(mkdir -p "$1" 2>&1) ||
    die "cannot create directory $1: ${out##*: }; give --dir a directory you can create or write to"
}

# A scratch directory inside DIR (so the final mv is a rename on one file system); an unwritable
# DIR is one error line, not mktemp's.
scratch_in() {
  local tmp
  tmp=$(mktemp -d "$DIR/.$1.XXXXXX" 2>/dev/null) ||
    die "cannot write in $DIR; give --dir a directory you can write to"
  printf '%s' "$tmp"
}

need_openssl() {
  command -v openssl >/dev/null ||
    die "openssl is not installed; install it (Debian: apt-get install openssl)"
}

valid_region() {
  [[ $1 =~ ^[a-z0-9._-]{1,63}$ ]]
}

# The regions a certificate names (SAN URIs strait://region/<name>), one a line.
regions_of() {
  openssl x509 -in "$1" -noout -ext subjectAltName 2>/dev/null |
    grep -o 'URI:strait://region/[^, ]*' | sed 's|^URI:strait://region/||' || true
}

# Writes a private key with mode 0600 from the start (umask), never world-readable in between.
new_key() {
  (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null) ||
    die "openssl could not generate a key into $1"
}

cmd_ca() {
  [[ -z $DAYS ]] && DAYS=3650
  local crt="$DIR/ca.pem" key="$DIR/ca.key"
  if [[ -e $crt || -e $key ]] && ((FORCE == 0)); then
    [[ -f $crt && -f $key ]] ||
      die "only one of $crt and $key exists; restore the other, or give --force to make a new CA"
    openssl x509 -in "$crt" -noout 2>/dev/null || die "$crt is not a PEM certificate; fix it or give --force"
    note "CA exists, kept: $crt ($(openssl x509 -in "$crt" -noout -subject -enddate | paste -sd ' '))"
    note "(give --force to replace it; every gateway certificate must then be reissued)"
    return 0
  fi
  if ((FORCE == 1)) && [[ -e $crt ]]; then
    note "replacing the CA in $DIR (--force): reissue every gateway certificate with --force"
  fi
  make_dir "$DIR"
  local tmp
  tmp=$(scratch_in ca)
  SCRATCH=$tmp
  new_key "$tmp/ca.key"
  openssl req -x509 -new -key "$tmp/ca.key" -sha256 -days "$DAYS" -subj "/CN=$CA_NAME" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" \
    -out "$tmp/ca.pem" 2>"$tmp/err" || die "openssl could not make the CA: $(cat "$tmp/err")"
  # Both files appear together (rename is atomic per file; key first, so a reader never sees a
  # certificate without its key).
  mv -f "$tmp/ca.key" "$key"
  mv -f "$tmp/ca.pem" "$crt"
  rm -rf "$tmp"
  note "made CA $crt (key $key, $DAYS days): give ca.pem to every gateway, keep ca.key safe"
}

# Whole days, at most $2, that the certificate at $1 stays valid from now: the largest n for which
# openssl's -checkend says it has not expired n days (and a minute, for the time signing takes)
# from now. A binary search over -checkend, so no date parsing that differs between systems.
days_left() {
  local lo=0 hi=$2 mid
  while ((lo < hi)); do
    mid=$(((lo + hi + 1) / 2))
    if openssl x509 -in "$1" -noout -checkend $((mid * 86400 + 60)) >/dev/null; then
      lo=$mid
    else
      hi=$((mid - 1))
    fi
  done
  printf '%s' "$lo"
}

# A certificate that outlives its CA stops verifying when the CA expires, whatever its own end
# date says; so the requested validity is cut to the CA's and CAPPED says so (the warning comes
# once the certificate, and so its real end date, exists), and a CA with less than a day left is
# an error: there is nothing useful to issue until it is renewed.
CAPPED=""
cap_days_to_ca() {
  local ca=$1 left ca_end
  openssl x509 -in "$ca" -noout -checkend $((DAYS * 86400 + 60)) >/dev/null && return 0
  ca_end=$(openssl x509 -in "$ca" -noout -enddate | sed 's/^notAfter=//')
  left=$(days_left "$ca" "$DAYS")
  if ((left == 0)); then
    local when="expires within a day"
    openssl x509 -in "$ca" -noout -checkend 0 >/dev/null || when="has expired"
    die "the CA $ca $when ($ca_end); renew it ($PROG ca --dir $DIR --force), then reissue" \
      "every gateway certificate"
  fi
  CAPPED="$DAYS days would outlive the CA (it ends $ca_end); capped to $left days"
  DAYS=$left
}

cmd_gateway() {
  [[ -n $REGION ]] || die "gateway needs --region REGION (see '$PROG help')"
  valid_region "$REGION" ||
    die "region '$REGION' is not valid; allowed: 1-63 characters from a-z, 0-9, '.', '_', '-'"
  [[ -z $STEM ]] && STEM=$REGION
  [[ $STEM =~ ^[A-Za-z0-9._-]+$ ]] || die "--name '$STEM' must be a plain file stem (letters, digits, . _ -)"
  [[ $STEM == ca ]] && die "--name ca would overwrite the CA; choose another name"
  [[ -z $DAYS ]] && DAYS=365
  local san="URI:strait://region/$REGION"
  for s in "${EXTRA_SANS[@]}"; do
    [[ $s =~ ^(DNS|IP|URI|email):.+$ ]] ||
      die "--san '$s': allowed forms are DNS:name, IP:address, URI:uri, email:addr"
    [[ $s == URI:strait://region/* ]] &&
      die "--san '$s': the region URI comes from --region; a second one would make straitd" \
        "refuse the certificate"
    san+=",$s"
  done
  local ca="$DIR/ca.pem" cakey="$DIR/ca.key" crt="$DIR/$STEM.pem" key="$DIR/$STEM.key"
  [[ -f $ca && -f $cakey ]] || die "no CA in $DIR (ca.pem and ca.key); make one first: $PROG ca --dir $DIR"
  if [[ -f $crt && -f $key ]] && ((FORCE == 0)); then
    local why=""
    if ! openssl verify -CAfile "$ca" "$crt" >/dev/null 2>&1; then
      why="it does not chain to $ca"
    elif [[ $(regions_of "$crt") != "$REGION" ]]; then
      why="it names region(s) '$(regions_of "$crt" | paste -sd ' ')' instead of '$REGION'"
    elif ! openssl x509 -in "$crt" -noout -checkend $((RENEW_DAYS * 86400)) >/dev/null &&
         (($(days_left "$crt" "$RENEW_DAYS") + 1 < $(days_left "$ca" "$RENEW_DAYS"))); then
      why="it expires within $RENEW_DAYS days"
    elif [[ $(openssl x509 -in "$crt" -noout -pubkey | openssl sha256) != \
            $(openssl pkey -in "$key" -pubout | openssl sha256) ]]; then
      why="$key does not match it"
    fi
    if [[ -z $why ]]; then
      # Ending within RENEW_DAYS and within a day of its CA: a new one would gain less than a
      # day (it is capped to the CA the same way), so it is kept; only a renewed CA helps.
      if ! openssl x509 -in "$crt" -noout -checkend $((RENEW_DAYS * 86400)) >/dev/null; then
        warn "$crt expires within $RENEW_DAYS days and less than a day before its CA" \
          "($(openssl x509 -in "$ca" -noout -enddate | sed 's/^notAfter=//')): a reissue" \
          "cannot outlive the CA; renew the CA ($PROG ca --dir $DIR --force), then reissue" \
          "every gateway certificate"
      fi
      note "gateway certificate exists, kept: $crt (region $REGION, $(openssl x509 -in "$crt" -noout -enddate))"
      return 0
    fi
    note "reissuing $crt: $why"
  fi
  cap_days_to_ca "$ca"
  local tmp
  tmp=$(scratch_in gw)
  SCRATCH=$tmp
  cat >"$tmp/ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
  new_key "$tmp/gw.key"
  openssl req -new -key "$tmp/gw.key" -subj "/CN=straitd $STEM/O=strait region $REGION" \
    -out "$tmp/gw.csr" 2>"$tmp/err" || die "openssl could not make the request: $(cat "$tmp/err")"
  # A random 159-bit serial: certificates reissued for one region never share a serial.
  openssl x509 -req -in "$tmp/gw.csr" -CA "$ca" -CAkey "$cakey" -sha256 \
    -set_serial "0x$(openssl rand -hex 19 | sed 's/^[89a-f]/7/')" -days "$DAYS" \
    -extfile "$tmp/ext" -out "$tmp/gw.pem" 2>"$tmp/err" ||
    die "openssl could not sign the certificate: $(cat "$tmp/err")"
  openssl verify -CAfile "$ca" "$tmp/gw.pem" >/dev/null 2>&1 || die "the new certificate does not verify against $ca"
  mv -f "$tmp/gw.key" "$key"
  mv -f "$tmp/gw.pem" "$crt"
  rm -rf "$tmp"
  if [[ -n $CAPPED ]]; then
    warn "$CAPPED, ending $(openssl x509 -in "$crt" -noout -enddate | sed 's/^notAfter=//');" \
      "renew the CA ($PROG ca --dir $DIR --force), then reissue every gateway certificate"
  fi
  note "made gateway certificate $crt (key $key, region $REGION, $DAYS days)"
}

# Shows one certificate; returns 1, after one error line on stderr, for a file that is missing,
# unreadable or not a certificate, so that show can go on with the others and still fail.
show_one() {
  local f=$1
  local bad=""
  if [[ ! -e $f ]]; then
    bad="no such file"
    # FILE is a path from the current directory, not a name in --dir: point at the one meant.
    if [[ $f != /* && -f $DIR/$f ]]; then
      bad+=" (did you mean $DIR/$f? FILE is not looked up in --dir)"
    else
      bad+="; give the path of a certificate, or leave FILE out to show every *.pem in $DIR"
    fi
  elif [[ -d $f ]]; then
    bad="is a directory; give '--dir $f' to show every *.pem in it"
  elif [[ ! -r $f ]]; then
    bad="cannot be read (permission denied); run as a user who can read it"
  elif ! openssl x509 -in "$f" -noout 2>/dev/null; then
    bad="not a PEM certificate"
    if grep -q -- '-----BEGIN .*PRIVATE KEY-----' "$f" 2>/dev/null; then
      bad+=" (it holds a private key; show the .pem next to it)"
    fi
  fi
  if [[ -n $bad ]]; then
    echo "$PROG: error: $f: $bad" >&2
    return 1
  fi
  local regions chain="no CA in $DIR to check against"
  regions=$(regions_of "$f" | paste -sd ' ')
  if [[ -f $DIR/ca.pem ]]; then
    if openssl verify -CAfile "$DIR/ca.pem" "$f" >/dev/null 2>&1; then chain="chains to $DIR/ca.pem"
    else chain="does NOT chain to $DIR/ca.pem"; fi
  fi
  echo "$f:"
  openssl x509 -in "$f" -noout -subject -issuer -startdate -enddate | sed 's/^/  /'
  echo "  regions: ${regions:-(none: not a gateway certificate)}"
  echo "  $chain"
}

# Every file is shown or reported, then the exit status is die's (2) if any one failed.
cmd_show() {
  local files=("$@") failed=0
  if ((${#files[@]} == 0)); then
    [[ -d $DIR ]] || die "no such directory: $DIR; give --dir the directory the certificates are in"
    shopt -s nullglob
    files=("$DIR"/*.pem)
    ((${#files[@]} > 0)) || die "no *.pem in $DIR"
  fi
  for f in "${files[@]}"; do show_one "$f" || failed=1; done
  ((failed == 0)) || exit 2
}

(($# >= 1)) || { usage >&2; exit 2; }
if [[ $1 == --version ]]; then echo "strait-certs $VERSION"; exit 0; fi
# A flag's value; a missing one is a usage error (exit 2, as on every Strait tool), where the
# shell's own "parameter null or not set" check would exit 1.
value() { (($# >= 2)) && [[ -n $2 ]] || die "$1 needs a value (see '$PROG help')"; printf '%s' "$2"; }
CMD=$1
shift
ARGS=()
while (($# > 0)); do
  case $1 in
    --dir) DIR=$(value "$@"); shift 2 ;;
    --days)
      DAYS=$(value "$@")
      [[ $DAYS =~ ^[1-9][0-9]{0,4}$ ]] || die "--days '$DAYS': allowed: a whole number of days, 1-99999"
      shift 2 ;;
    --name)
      if [[ $CMD == ca ]]; then CA_NAME=$(value "$@"); else STEM=$(value "$@"); fi
      shift 2 ;;
    --region) REGION=$(value "$@"); shift 2 ;;
    --san) EXTRA_SANS+=("$(value "$@")"); shift 2 ;;
    --force) FORCE=1; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option '$1' (see '$PROG help')" ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

case $CMD in
  ca) need_openssl; ((${#ARGS[@]} == 0)) || die "unexpected argument '${ARGS[0]}'"; cmd_ca ;;
  gateway) need_openssl; ((${#ARGS[@]} == 0)) || die "unexpected argument '${ARGS[0]}'"; cmd_gateway ;;
  show) need_openssl; cmd_show "${ARGS[@]}" ;;
  help | -h | --help) usage ;;
  *) echo "$PROG: error: unknown command '$CMD'" >&2; usage >&2; exit 2 ;;
esac
