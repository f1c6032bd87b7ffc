#!/usr/bin/env bash
# Installs, from Debian 12's packages, everything Strait needs to build, test and benchmark: the
# toolchain, the libraries it links, the test tools and python3-torch & co. (PACKAGES in this
# script). Idempotent: packages already present are left alone and nothing is downloaded for them,
# so a second run takes about 2 s; a first one minutes, most of them downloading. Builds nothing.
# Needs root (or sudo without a password) and a reachable Debian mirror only when something is
# missing. Reads no environment variables. scripts/demo.sh, test.sh and tsan.sh run it first.
#
#   scripts/setup.sh             # install what is missing
#   scripts/setup.sh --help      # print this and exit (-h too); it takes no other argument
set -euo pipefail

# shellcheck source=scripts/args.sh
source "$(dirname "$0")/args.sh"
takes_no_arguments "$0" "$@"

PACKAGES=(
  # Toolchain.
  build-essential cmake ninja-build pkg-config git clang libclang-rt-14-dev
  # Libraries the code links.
  libuv1-dev libasio-dev libssl-dev libzstd-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev
  # Tools the tests and benchmarks run.
  iproute2 iperf3 openssl procps
  # Deploy and packaging tests: systemd-analyze, yamllint (and PyYAML for the manifest check),
  # dpkg-shlibdeps for the .deb's dependencies.
  systemd yamllint python3-yaml dpkg-dev
  # groff: the man pages rendered with every warning on (tests/deploy/check_man.py); lintian on
  # the .deb (tests/deploy/check_lintian.sh).
  groff-base lintian
  # promtool (checks straitd's /metrics output in the metrics integration test, and the alert
  # rules and the Grafana dashboard's queries in tests/deploy).
  prometheus
  # The Python package's tests, the PyTorch example and its benchmark (python/, examples/pytorch).
  python3-torch python3-numpy python3-sklearn python3-matplotlib python3-pytest
  # Debian's torch does its matrix products through the libblas.so.3 alternative, which is the
  # reference BLAS unless an optimised one is installed: OpenBLAS makes the example's training
  # steps about 10x faster (120 -> 12 ms for the bench's model on one core).
  libopenblas0-pthread
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "setup: error: these packages are missing and installing them needs root:" >&2
    echo "  ${missing[*]}" >&2
    echo "setup: run this script as root, or install them with: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq; then
  echo "setup: error: 'apt-get update' failed: no Debian mirror is reachable." >&2
  echo "setup: check the network or /etc/apt/sources.list, then run this script again." >&2
  exit 1
fi
if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
  echo "setup: error: 'apt-get install ${missing[*]}' failed (see apt's message above)." >&2
  exit 1
fi
echo "setup: done"
