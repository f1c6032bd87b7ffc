# Starts and stops a set of straitd processes for tests, examples, the demo and the benchmark:
# `regions` regions, and in each one straitd per rank index i (shard_index = i), so that the
# daemons of one index form one cross-region mesh -- the layout the DDP hook needs (each torch
# rank talks to the straitd of its own index). Loopback by default (127.0.0.1, free ports, plain
# TCP; no root); `address` and `prefix` put each region's daemons in a strait-wanem namespace,
# and `tls` adds mutual TLS. Not for production: operators write straitd.toml themselves
# (deploy/examples/straitd.toml).
#
#   with strait.cluster.Gateways("build/release/tools/straitd/straitd", regions=2, shards=2,
#                                workdir=tmp) as gw:
#       gw.socket(region, index)    # the Unix socket of straitd <region>.<index>
import os
import signal
import socket
import subprocess
import sys
import time

from ._lib import BUILD_PRESETS

DEFAULT_POLICY = ('allowed_codecs = ["none", "zstd", "int8", "int4", "fp8"]\n'
                  'max_relative_error = 1.0\nmin_lossy_bytes = "16KiB"\n')


def region_name(r):
    return f"r{r}"


def free_ports(n):
    """n distinct TCP ports free on 127.0.0.1 right now."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def find_straitd(root=None):
    """$STRAITD; else build/{release,ci,dev,asan}/tools/straitd/straitd under root (default: the
    source tree this package sits in); else PATH (an installed straitd); else the same build
    directories under the current directory (a pip-installed package run from a source tree).
    The same order as the library's search (_lib.py), so both come from one build or one install.
    Raises FileNotFoundError naming every place it looked."""
    env = os.environ.get("STRAITD")
    if env:
        if os.access(env, os.X_OK) and os.path.isfile(env):
            return env
        raise FileNotFoundError(f"$STRAITD is {env!r}, which is not an executable file: point "
                                "it at a built straitd or unset it")
    tried = []

    def in_build_tree(base):
        for preset in BUILD_PRESETS:
            p = os.path.abspath(os.path.join(base, "build", preset, "tools", "straitd", "straitd"))
            if os.access(p, os.X_OK):
                return p
            if p not in tried:
                tried.append(p)
        return None

    found = in_build_tree(root or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                               ".."))
    if found:
        return found
    for d in os.environ.get("PATH", "").split(os.pathsep):
        p = os.path.join(d, "straitd")
        if d and os.access(p, os.X_OK):
            return p
    found = None if root else in_build_tree(os.getcwd())
    if found:
        return found
    raise FileNotFoundError("straitd not found (looked at " + ", ".join(tried) + " and on "
                            "$PATH): build it (cmake --build build/release --target straitd), "
                            "install the strait .deb, or set $STRAITD")


class Gateways:
    """regions x shards straitd processes. address(r) -> the region's WAN address (default
    127.0.0.1); prefix(r) -> argv prefix that runs a command in the region (default none);
    tls: None, or dict(ca=path, cert=lambda r: path, key=lambda r: path); policy: the [policy]
    section's body; deadline: the [allreduce] deadline; ports: the WAN port of (r, i), default
    free loopback ports. per_gateway: shards each straitd serves (config `shards`): 1 (the
    default) runs one per shard; k runs shards / k per region, straitd g serving shards
    g*k .. g*k+k-1 behind one socket. Methods taking (r, i) take a shard i and act on the straitd
    that serves it."""

    def __init__(self, straitd, regions, shards, workdir, address=None, prefix=None, tls=None,
                 policy=DEFAULT_POLICY, deadline="30s", streams=2, ports=None, env=None,
                 metrics=False, per_gateway=1, max_rate=None, congestion_control=None):
        if per_gateway < 1 or shards % per_gateway != 0:
            raise ValueError(f"per_gateway={per_gateway} must divide shards={shards}")
        self.per_gateway = per_gateway
        self.straitd, self.regions, self.shards, self.workdir = straitd, regions, shards, workdir
        self.address = address or (lambda r: "127.0.0.1")
        self.prefix = prefix or (lambda r: [])
        self.tls, self.policy, self.deadline, self.streams = tls, policy, deadline, streams
        # straitd's link.max_rate (a rate string such as "50mbit"): pacing, each straitd's share
        # of the WAN path to every peer region. None: unpaced.
        self.max_rate = max_rate
        # straitd's link.congestion_control (e.g. "reno"). None: the system's default.
        self.congestion_control = congestion_control
        if ports is None:
            free = free_ports(regions * shards)
            ports = lambda r, i: free[r * shards + i]  # noqa: E731
        self.port = ports
        self.env = env
        # The [metrics] HTTP listener's port of (r, i): loopback takes free ports; a namespace
        # per region can use the same ones everywhere.
        self.metrics_port = None
        if metrics:
            mfree = free_ports(regions * shards)
            self.metrics_port = lambda r, i: mfree[r * shards + i]  # noqa: E731
        self.procs = {}
        os.makedirs(workdir, exist_ok=True)

    def _base(self, r, i):
        return os.path.join(self.workdir, f"straitd_{region_name(r)}_{i // self.per_gateway}")

    def _first(self, i):
        """The first shard of the straitd that serves shard i (its key in procs, its port)."""
        return i - i % self.per_gateway

    def socket(self, r, i):
        return self._base(r, i) + ".sock"

    def config(self, r, i):
        i = self._first(i)
        k = self.per_gateway
        t = f'region = "{region_name(r)}"\n'
        t += f"shard_index = {i}\n" if k == 1 else f'shards = "{i}-{i + k - 1}"\n'
        t += f'[local]\nsocket = "{self.socket(r, i)}"\nallowed_uids = [{os.getuid()}]\n'
        t += f'[wan]\nlisten = "{self.address(r)}:{self.port(r, i)}"\n'
        t += f'transport = "{"tls" if self.tls else "plain"}"\n'
        if self.tls:
            t += (f'[tls]\nca = "{self.tls["ca"]}"\ncert = "{self.tls["cert"](r)}"\n'
                  f'key = "{self.tls["key"](r)}"\n')
        for p in range(self.regions):
            if p != r:
                t += f"[peers.{region_name(p)}]\n"
                for s in range(i, i + k):
                    t += f'shard_{s} = "{self.address(p)}:{self.port(p, i)}"\n'
        t += f"[link]\nstreams = {self.streams}\n"
        if self.max_rate:
            t += f'max_rate = "{self.max_rate}"\n'
        if self.congestion_control:
            t += f'congestion_control = "{self.congestion_control}"\n'
        t += "[policy]\n" + self.policy
        if self.metrics_port is not None:
            t += f'[metrics]\nlisten = "{self.address(r)}:{self.metrics_port(r, i)}"\n'
        t += f'[allreduce]\ndeadline = "{self.deadline}"\nshutdown_grace = "2s"\n'
        return t

    def logs(self, r, i):
        try:
            with open(self._base(r, i) + ".log", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def start(self, timeout=30.0):
        for r in range(self.regions):
            for i in range(0, self.shards, self.per_gateway):
                self.start_one(r, i)
        for r in range(self.regions):
            for i in range(0, self.shards, self.per_gateway):
                self.wait_ready(r, i, timeout)
        return self

    def start_one(self, r, i):
        i = self._first(i)
        base = self._base(r, i)
        with open(base + ".toml", "w") as f:
            f.write(self.config(r, i))
        log = open(base + ".log", "w")
        # Not the caller's LD_PRELOAD: scripts/test.sh preloads the ASan runtime into python3
        # for an ASan-built libstrait.so, and an ASan-built straitd has its own (static) copy.
        env = dict(self.env if self.env is not None else os.environ)
        env.pop("LD_PRELOAD", None)
        self.procs[(r, i)] = subprocess.Popen(
            self.prefix(r) + [self.straitd, "--config", base + ".toml"], stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        log.close()

    def wait_ready(self, r, i, timeout=30.0):
        i = self._first(i)
        end = time.monotonic() + timeout
        while "straitd ready" not in self.logs(r, i):
            if self.procs[(r, i)].poll() is not None:
                raise RuntimeError(f"straitd {region_name(r)}.{i} exited:\n{self.logs(r, i)}")
            if time.monotonic() > end:
                raise RuntimeError(f"straitd {region_name(r)}.{i} not ready in {timeout} s:\n"
                                   f"{self.logs(r, i)}")
            time.sleep(0.02)

    def metric_sum(self, name):
        """The sum over every straitd of the metric `name` (all its label sets), read from each
        daemon's /metrics inside its region; needs metrics=True."""
        total = 0.0
        for (r, i) in self.procs:
            url = f"http://{self.address(r)}:{self.metrics_port(r, i)}/metrics"
            text = subprocess.run(
                self.prefix(r) + [sys.executable, "-c", "import sys, urllib.request; sys.stdout."
                                  "write(urllib.request.urlopen(sys.argv[1], timeout=10).read()."
                                  "decode())", url],
                check=True, capture_output=True, text=True, timeout=30).stdout
            for line in text.splitlines():
                if line.startswith(name + "{") or line.startswith(name + " "):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self, r, i):
        p = self.procs.get((r, self._first(i)))
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 5
        for p in self.procs.values():
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
