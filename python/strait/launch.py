# Runs one training command as regions x ranks local processes, torchrun-style, each with its own
# straitd (shard_index = rank in region; --straitds-per-region N: N per region, each serving the
# shards of ranks / N ranks): for tests, the demo and the benchmark on one machine.
# On loopback by default; with --wanem NAME each region's ranks and straitds run in that
# strait-wanem instance's namespace (root; `strait-wanem up --name NAME` first), region r at
# 10.201.r.1, and --tls gives the straitds mutual TLS with a throwaway CA.
#
#   python3 -m strait.launch --regions 2 --ranks 2 -- python3 train_ddp.py --hook strait
#
# Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
# STRAIT_REGION (r<region>) and STRAIT_GATEWAY (its straitd's socket), and OMP_NUM_THREADS=1
# unless set (all ranks share this machine's cores, as torchrun assumes for several per node).
# Exit status: 0 when every rank exited 0; else the first failing rank's status, after the
# others were given --grace seconds and then killed (a rank never outlives the launcher); 2 with
# one line on stderr when the launch cannot begin (bad arguments, --workdir, a straitd or the
# command cannot start). --help prints the options.
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import cluster


def make_pki(workdir, regions):
    """A throwaway CA and one gateway certificate per region (SAN URI strait://region/<r>)."""
    def run(*a):
        subprocess.run(a, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca, cakey = os.path.join(workdir, "ca.pem"), os.path.join(workdir, "ca.key")
    run("openssl", "req", "-x509", *ec, "-keyout", cakey, "-out", ca, "-days", "2",
        "-subj", "/CN=strait-launch-ca")
    for r in range(regions):
        name = cluster.region_name(r)
        base = os.path.join(workdir, name)
        run("openssl", "req", *ec, "-keyout", base + ".key", "-out", base + ".csr", "-subj",
            "/CN=" + name)
        with open(base + ".ext", "w") as f:
            f.write(f"subjectAltName=URI:strait://region/{name}\nbasicConstraints=CA:FALSE\n"
                    "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n")
        run("openssl", "x509", "-req", "-in", base + ".csr", "-CA", ca, "-CAkey", cakey,
            "-set_serial", str(1000 + r), "-days", "2", "-out", base + ".pem", "-extfile",
            base + ".ext")
    return {"ca": ca, "cert": lambda r: os.path.join(workdir, cluster.region_name(r) + ".pem"),
            "key": lambda r: os.path.join(workdir, cluster.region_name(r) + ".key")}


class Parser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit status 2, like the launch's other setup
    errors, not argparse's usage block above the message (--help still prints it)."""

    def error(self, message):
        self.exit(2, f"strait.launch: {message}; see python3 -m strait.launch --help\n")


def parse(argv):
    p = Parser(prog="python3 -m strait.launch",
               description="Runs a command as regions x ranks local processes, each with its own "
                           "straitd.")
    p.add_argument("--regions", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2, help="ranks per region")
    p.add_argument("--straitd", help="straitd binary (default: $STRAITD or build/*/tools/straitd)")
    p.add_argument("--no-gateways", action="store_true", help="start no straitd (plain DDP)")
    p.add_argument("--workdir", help="configs, sockets and logs (default: a temporary directory, "
                   "removed at the end)")
    p.add_argument("--wanem", metavar="NAME", help="run region r in strait-wanem NAME's namespace")
    p.add_argument("--wanem-bin", default=os.environ.get("STRAIT_WANEM", "strait-wanem"))
    p.add_argument("--tls", action="store_true", help="mutual TLS between the straitds")
    p.add_argument("--policy", default=cluster.DEFAULT_POLICY, help="straitd's [policy] body")
    p.add_argument("--deadline", default="30s", help="straitd's all-reduce deadline")
    p.add_argument("--max-rate", metavar="RATE",
                   help="straitd's link.max_rate, e.g. 50mbit: each straitd paces its link to "
                        "every peer region at RATE (its share of the WAN path: the path's rate "
                        "/ the ranks per region); default: unpaced")
    p.add_argument("--straitds-per-region", type=int, metavar="N",
                   help="straitds per region, each serving the shards of ranks / N consecutive "
                        "ranks behind one socket (straitd's `shards`, as one gateway per node "
                        "does); default: one per rank")
    p.add_argument("--cc", metavar="ALGORITHM",
                   help="straitd's link.congestion_control for its WAN streams, e.g. reno, "
                        "cubic or bbr; default: the system's (each namespace's with --wanem)")
    p.add_argument("--wan-bytes-out", metavar="FILE",
                   help="write the bytes every straitd sent to its WAN peers "
                        "(strait_peer_sent_bytes_total, summed) to FILE when the ranks are done")
    p.add_argument("--grace", type=float, default=90.0,
                   help="seconds the other ranks get after one failed, before they are killed")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    a = p.parse_args(argv)
    if a.command and a.command[0] == "--":
        a.command = a.command[1:]
    # These say what to do themselves: one line, without argparse's pointer to --help.
    refuse = lambda message: p.exit(2, f"strait.launch: {message}\n")  # noqa: E731
    if not a.command:
        refuse("no command given: put it after --, e.g. python3 -m strait.launch --regions 2 "
               "--ranks 2 -- python3 train.py")
    if a.regions < 1 or a.ranks < 1:
        refuse(f"--regions {a.regions} --ranks {a.ranks}: both must be at least 1")
    per_region = a.ranks if a.straitds_per_region is None else a.straitds_per_region
    if per_region < 1 or a.ranks % per_region != 0:
        refuse(f"--straitds-per-region {per_region}: give a divisor of --ranks {a.ranks} (each "
               "straitd serves as many ranks' shards as the others)")
    a.per_gateway = a.ranks // per_region
    if a.regions < 2 and not a.no_gateways:
        # Each straitd needs a peer region: with one region there is nothing to reduce across,
        # and straitd would refuse its generated config (no peers) after the launch began.
        refuse(f"--regions {a.regions}: the straitds' cross-region all-reduce needs at least 2 "
               "regions; give --regions 2 or more, or --no-gateways for plain DDP")
    return a


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    own_dir = a.workdir is None
    try:
        workdir = a.workdir or tempfile.mkdtemp(prefix="strait-launch-")
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        # A --workdir that is a file or cannot be created is the user's to fix: one line, no
        # traceback, before any straitd or rank starts.
        if a.workdir is None:
            print(f"strait.launch: cannot create a temporary directory: {e}; set $TMPDIR to a "
                  "writable directory or give --workdir", file=sys.stderr)
            return 2
        why = ("it exists and is not a directory" if os.path.exists(a.workdir) else
               e.strerror or str(e))
        print(f"strait.launch: cannot use --workdir {a.workdir}: {why}; name a directory that "
              "exists or can be created", file=sys.stderr)
        return 2
    if a.wanem:
        prefix = lambda r: [a.wanem_bin, "exec", "--name", a.wanem, str(r), "--"]  # noqa: E731
        address = lambda r: f"10.201.{r}.1"  # noqa: E731
        ports = lambda r, i: 7700 + i  # noqa: E731 -- every region has its own namespace
    else:
        prefix, address, ports = (lambda r: []), (lambda r: "127.0.0.1"), None
    gateways = None
    procs = []
    try:
        if not a.no_gateways:
            try:
                tls = make_pki(workdir, a.regions) if a.tls else None
                gateways = cluster.Gateways(a.straitd or cluster.find_straitd(), a.regions,
                                            a.ranks, workdir, address=address, prefix=prefix,
                                            tls=tls, policy=a.policy, deadline=a.deadline,
                                            ports=ports, metrics=bool(a.wan_bytes_out),
                                            max_rate=a.max_rate, congestion_control=a.cc,
                                            per_gateway=a.per_gateway)
                gateways.start()
            except (OSError, RuntimeError, ValueError, subprocess.CalledProcessError) as e:
                # Setup failures are the user's to fix (a missing straitd, a config straitd
                # refuses, openssl missing for --tls): say what, no traceback, and run no rank.
                print(f"strait.launch: cannot start the straitds: {e}", file=sys.stderr)
                return 2
        master_port = cluster.free_ports(1)[0] if not a.wanem else 29500
        world = a.regions * a.ranks
        for rank in range(world):
            r, i = divmod(rank, a.ranks)
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(i),
                       LOCAL_WORLD_SIZE=str(a.ranks), MASTER_ADDR=address(0),
                       MASTER_PORT=str(master_port), STRAIT_REGION=cluster.region_name(r))
            if gateways is not None:
                env["STRAIT_GATEWAY"] = gateways.socket(r, i)
            if world > 1:
                # As torchrun does with several processes per node: every rank shares this
                # machine's cores, and per-rank thread pools (torch's, OpenBLAS's) of one thread
                # per core would oversubscribe them. The user's own setting wins.
                env.setdefault("OMP_NUM_THREADS", "1")
            cmd = prefix(r) + a.command
            try:
                procs.append(subprocess.Popen(cmd, env=env))
            except OSError as e:
                # A command that cannot start (not found, not executable) would fail the same
                # way on every rank: say which, and let `finally` stop what already runs.
                what = "--wanem-bin" if a.wanem else "the command after --"
                print(f"strait.launch: cannot run {cmd[0]}: {e.strerror or e}; check {what}",
                      file=sys.stderr)
                return 2
        first_bad = 0
        deadline = None
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            bad = [c for c in codes if c not in (None, 0)]
            if bad and not first_bad:
                first_bad = bad[0]
                deadline = time.monotonic() + a.grace
            if deadline is not None and time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                print(f"strait.launch: killed the ranks still running {a.grace} s after one "
                      f"failed", file=sys.stderr)
            time.sleep(0.05)
        codes = [p.returncode for p in procs]
        if a.wan_bytes_out and gateways is not None and not any(codes):
            with open(a.wan_bytes_out, "w") as f:
                f.write(f"{gateways.metric_sum('strait_peer_sent_bytes_total'):.0f}\n")
        bad = [c for c in codes if c != 0]
        if bad and not first_bad:
            first_bad = bad[0]
        if first_bad:
            print(f"strait.launch: exit codes by rank: {codes}", file=sys.stderr)
        return 1 if first_bad < 0 else first_bad
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if gateways is not None:
            gateways.stop()
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
