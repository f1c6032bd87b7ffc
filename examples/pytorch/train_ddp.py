#!/usr/bin/env python3
# Trains a small MLP on scikit-learn's load_digits with PyTorch DDP across regions x ranks, with
# plain DDP (--hook none: the process group's all-reduce over every rank) or with Strait's
# hierarchical hook (--hook strait: the region's gloo group inside the region, each rank's shard
# across regions through its own straitd). One process per rank, configured like torchrun:
# RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (ranks per region), MASTER_ADDR, MASTER_PORT.
# Region r holds ranks r*LOCAL_WORLD_SIZE ... (torchrun --nnodes=REGIONS --nproc-per-node=RANKS).
#
#   STRAIT_GATEWAY=/run/strait/straitd{local_rank}.sock STRAIT_JOB_ID=digits \
#     torchrun --nnodes 2 --nproc-per-node 2 ... train_ddp.py --hook strait --compression int8
#   train_ddp.py --plot loss.png run_none.json run_int8.json     # loss against step
#
# Rank 0 prints per-step loss and step time, then the test accuracy, and with --log FILE writes
# the run as JSON. Every rank checks at the end that all ranks hold bit-identical parameters
# (a SHA-256 per rank, gathered). Any failure (a Strait error, a dead peer, a timeout) prints
# one line "train_ddp: error: ..." and exits 1 within --timeout; a usage problem (a bad option,
# no launcher's variables, run logs without --plot, an unreadable run log for --plot) prints one
# such line and exits 2.
import argparse
import datetime
import hashlib
import json
import os
import sys
import time


class Parser(argparse.ArgumentParser):
    """A bad option is one line and exit status 2, like the script's other usage errors, not
    argparse's usage block above the message (--help still prints it)."""

    def error(self, message):
        self.exit(2, f"train_ddp: error: {message}; see train_ddp.py --help\n")


def parse():
    p = Parser(description="Trains an MLP on load_digits with DDP across regions, with or "
                           "without the Strait hook.")
    p.add_argument("--hook", choices=["none", "strait"], default="strait")
    p.add_argument("--compression", default=os.environ.get("STRAIT_COMPRESSION", "int8,ef"),
                   help='the job\'s policy: "none", "zstd", "int8[,ef|,noef]", ... (--hook strait)')
    p.add_argument("--gateway", default=os.environ.get("STRAIT_GATEWAY"),
                   help="this rank's straitd socket; {region} and {local_rank} are substituted")
    p.add_argument("--job-id", default=os.environ.get("STRAIT_JOB_ID", "train-ddp"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    p.add_argument("--hidden", type=int, default=128, help="hidden width (2 hidden layers)")
    p.add_argument("--input-dim", type=int, default=0,
                   help="pad the 64 pixels with fixed random features to this many inputs "
                        "(a bigger first layer, for the WAN benchmark)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds: Strait's deadline and the process groups' timeout")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--coalesce-mb", type=float, default=64.0,
                   help="--hook strait: reduce a step's consecutive buckets as one up to this "
                        "many MiB (HierarchicalState's coalesce_bytes; 0: each on its own)")
    p.add_argument("--wan-dev", metavar="IFACE",
                   help="count the bytes this region sends on IFACE (e.g. strait-wanem's wan0) "
                        "over the timed steps after the first 5, read by each region's local "
                        "rank 0 from /proc/net/dev; reported as WAN bytes per step")
    p.add_argument("--log", help="rank 0 writes the run (per-step loss, times, accuracy) here")
    p.add_argument("--quiet", action="store_true", help="print only every 50th step")
    p.add_argument("--plot", metavar="OUT_PNG",
                   help="do not train: plot loss against step for the runs (JSON) given")
    p.add_argument("runs", nargs="*", help="with --plot: run logs written by --log")
    args = p.parse_args()
    if not args.coalesce_mb >= 0:  # nan too
        p.error(f"--coalesce-mb {args.coalesce_mb}: give MiB >= 0 (0: each bucket on its own)")
    if args.steps < 1:
        p.error(f"--steps {args.steps}: give a number of steps >= 1")
    return args


class UsageError(Exception):
    """A problem the user fixes (a missing variable, an unreadable run log): one line, exit 2."""


def read_run(path):
    try:
        with open(path) as f:
            run = json.load(f)
    except OSError as e:
        raise UsageError(f"cannot read run log {path}: {e.strerror or e}; give run logs "
                         "written by --log")
    except ValueError as e:  # bad JSON or bad UTF-8
        raise UsageError(f"{path} is not valid JSON ({e}): give run logs written by --log")
    try:
        label = (f'{run["label"]} (acc {100 * run["accuracy"]:.1f}%, '
                 f'{1000 * run["step_time_s"]:.1f} ms/step)')
        steps = [s["step"] for s in run["steps"]], [s["loss"] for s in run["steps"]]
    except KeyError as e:
        raise UsageError(f"{path} is not a run log written by --log: it has no {e}")
    except (TypeError, ValueError):  # a value of the wrong type, or not a JSON object at all
        raise UsageError(f"{path} is not a run log written by --log: it needs label, accuracy, "
                         "step_time_s and steps")
    return label, steps


def plot(out, paths):
    if not paths:
        raise UsageError("--plot: no runs given; name the run logs written by --log after it")
    # Every log is read before plotting: a bad one fails fast and writes no partial figure.
    runs = [read_run(path) for path in paths]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    # Lossless and int8 runs often overlap: distinct line styles keep each visible.
    styles = ["-", "--", ":", "-."]
    for k, (label, (x, y)) in enumerate(runs):
        ax.plot(x, y, label=label, linestyle=styles[k % len(styles)],
                linewidth=2.5 - 0.5 * (k % 3))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=120)
    except OSError as e:
        raise UsageError(f"cannot write {out}: {e.strerror or e}; give a writable path")
    print(f"train_ddp: wrote {out}")


def check_env():
    """Fails in one line, before torch loads, when no launcher set the variables train() reads
    (init_process_group's env:// needs MASTER_ADDR and MASTER_PORT)."""
    needed = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    missing = [v for v in needed if not os.environ.get(v)]
    if missing:
        raise UsageError(
            f"${', $'.join(missing)} not set: run one process per rank under a launcher, e.g. "
            "python3 -m strait.launch --regions 2 --ranks 2 -- python3 "
            "examples/pytorch/train_ddp.py ..., or torchrun --nnodes REGIONS --nproc-per-node "
            "RANKS ...")
    for v, least in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1)):
        value = os.environ.get(v)
        if value is not None and not (value.isdigit() and int(value) >= least):
            raise UsageError(f"${v}={value!r} is not a whole number >= {least}: set it as "
                             "torchrun does, or start the ranks with python3 -m strait.launch")


def data(seed, input_dim):
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    if input_dim > x.shape[1]:
        # Fixed random features of the pixels: a wider first layer with the same task.
        rng = np.random.default_rng(1234)
        proj = rng.standard_normal((x.shape[1], input_dim - x.shape[1])).astype(np.float32)
        x = np.concatenate([x, np.tanh(x @ proj / 8.0)], axis=1).astype(np.float32)
    return train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)


def tx_bytes(dev):
    """Bytes sent on network interface `dev` in this process's network namespace."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == dev:
                return int(counters.split()[8])
    raise RuntimeError(f"no network interface {dev!r} in /proc/net/dev")


STATE = None  # the hook's state, for the error report


def train(args):
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    per_region = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    region, local_rank = rank // per_region, rank % per_region
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    t_setup = time.monotonic()

    state = None
    torch.manual_seed(args.seed)
    xtr, xte, ytr, yte = data(args.seed, args.input_dim)
    d = xtr.shape[1]
    model = torch.nn.Sequential(torch.nn.Linear(d, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 10))
    nparams = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    if args.hook == "strait":
        import strait.torch as st
        group, _, _ = st.region_groups(per_region, timeout=timeout)
        if not args.gateway:
            raise SystemExit("train_ddp: error: --hook strait needs --gateway or $STRAIT_GATEWAY")
        gw = args.gateway.format(region=region, local_rank=local_rank)
        state = st.HierarchicalState(group, gateway=gw, job_id=args.job_id,
                                     region=os.environ.get("STRAIT_REGION", f"r{region}"),
                                     compression=args.compression, timeout=args.timeout,
                                     coalesce_bytes=int(args.coalesce_mb * (1 << 20)))
        ddp.register_comm_hook(state, st.hierarchical_hook)
        global STATE
        STATE = state
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    xtr_t, ytr_t = torch.from_numpy(xtr), torch.from_numpy(ytr).long()
    gen = np.random.default_rng(args.seed)  # the same on every rank: each takes its slice
    global_batch = args.batch * world
    steps, times = [], []
    warm = min(5, args.steps - 1)
    wan_start = t_warm = None
    losses = []  # (loss tensor, its pending all-reduce) per step, completed in order
    printed = 0

    def report(upto):
        # Waits for the global mean loss of the steps before `upto`; rank 0 prints them.
        nonlocal printed
        for k in range(printed, upto):
            lt, work = losses[k]
            work.wait()
            steps[k]["loss"] = lt.item() / world
            if rank == 0 and (not args.quiet or k % 50 == 0 or k == args.steps - 1):
                print(f"step {k:4d}  loss {steps[k]['loss']:.4f}  step "
                      f"{1000 * steps[k]['time_s']:7.1f} ms", flush=True)
        printed = max(printed, upto)

    for step in range(args.steps):
        if args.wan_dev and step == warm:
            dist.barrier()
            wan_start = tx_bytes(args.wan_dev) if local_rank == 0 else 0
        idx = gen.choice(len(xtr), size=global_batch, replace=False)
        mine = torch.from_numpy(idx[rank * args.batch:(rank + 1) * args.batch])
        t0 = time.monotonic()
        if step == warm:
            t_warm = t0
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(xtr_t[mine]), ytr_t[mine])
        loss.backward()
        opt.step()
        dt = time.monotonic() - t0
        # The global mean loss, for the log. Asynchronous: a synchronous all-reduce over every
        # rank would put the WAN's round trips into each step and start the ranks of the next
        # one apart (the ring's last hops reach them at different times).
        lt = loss.detach().clone()
        losses.append((lt, dist.all_reduce(lt, async_op=True)))
        steps.append({"step": step, "loss": None, "time_s": dt})
        times.append(dt)
        if rank == 0 and not args.quiet:
            report(step)  # the previous step's: by now its all-reduce is done
    report(args.steps)
    # Wall time per step after the warm-up, everything in the loop included (the throughput).
    wall_step = (time.monotonic() - t_warm) / (args.steps - warm)

    wan_per_step = None
    if args.wan_dev:
        dist.barrier()
        mine = tx_bytes(args.wan_dev) - wan_start if local_rank == 0 else 0
        sent = [None] * world
        dist.all_gather_object(sent, mine)
        wan_per_step = sum(sent) / max(1, args.steps - warm)
    with torch.no_grad():
        pred = model(torch.from_numpy(xte)).argmax(1).numpy()
    acc = float((pred == yte).mean())
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    hashes = [None] * world
    dist.all_gather_object(hashes, h.hexdigest())
    identical = len(set(hashes)) == 1
    # Skip the first steps (DDP rebuilds its buckets after step 0; the codecs warm up).
    steady = times[warm:]
    step_time = sorted(steady)[len(steady) // 2]
    wan = state.wan_elements if state is not None else 0
    stages = dict(state.seconds) if state is not None else {}
    if state is not None:
        state.close()
    if rank == 0:
        label = "gloo DDP" if args.hook == "none" else f"strait hook ({args.compression})"
        print(f"{label}: {world} ranks ({world // per_region} regions x {per_region}), "
              f"{nparams} parameters, median step {1000 * step_time:.1f} ms (wall per step "
              f"{1000 * wall_step:.1f} ms), test accuracy "
              f"{100 * acc:.2f}%, parameters identical on every rank: "
              f"{'yes' if identical else 'NO'}", flush=True)
        if stages:
            per = {k: 1000 * v / args.steps for k, v in stages.items()}
            print("  hook stages per step (rank 0, ms): " +
                  ", ".join(f"{k} {v:.1f}" for k, v in per.items()), flush=True)
        if args.log:
            with open(args.log, "w") as f:
                json.dump({"label": label, "hook": args.hook, "compression": args.compression,
                           "world": world, "regions": world // per_region, "params": nparams,
                           "step_time_s": step_time, "wall_step_s": wall_step, "accuracy": acc,
                           "hashes": hashes,
                           "identical": identical, "wan_elements_rank0": wan,
                           "wan_bytes_per_step": wan_per_step, "hook_seconds_rank0": stages,
                           "setup_s": t_setup, "steps": steps}, f)
    if not identical:
        raise RuntimeError(f"parameters differ between ranks: {hashes}")
    dist.barrier()


def main():
    args = parse()
    try:
        if args.plot:
            plot(args.plot, args.runs)
            return 0
        if args.runs:
            # Training would silently ignore them: a forgotten --plot, or a stray word.
            raise UsageError(f"run logs given without --plot ({' '.join(args.runs)}): they are "
                             "only read with --plot; plot them with train_ddp.py --plot OUT.png "
                             "RUN.json ..., or drop them to train")
        check_env()
    except UsageError as e:
        print(f"train_ddp: error: {e}", file=sys.stderr)
        return 2
    try:
        train(args)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 -- one line, then out without waiting for peers
        # DDP re-raises a hook's failure as a RuntimeError; the hook kept the StraitError.
        if STATE is not None and STATE.error is not None:
            e = STATE.error
        text = " ".join(f"{type(e).__name__}: {e}".split())
        sys.stdout.flush()
        # One write: ranks share the terminal, and their lines must not interleave.
        os.write(2, f"train_ddp: error: rank {os.environ.get('RANK')}: {text}\n".encode())
        os._exit(1)
    sys.stdout.flush()
    # Exit without tearing down the process groups: a peer may already be gone.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
