# One rank of test_ddp.py's end-to-end run (started by strait.launch: torchrun-style variables,
# STRAIT_REGION, STRAIT_GATEWAY). For each policy it trains two copies of the same model side by
# side on the same batches, plain gloo DDP and DDP with strait.torch.hierarchical_hook, and saves
# both gradients of every step to OUT/rank<R>_<policy>.pt for the test to compare:
#   exact: a 2-layer linear model with integer weights and inputs, sum-of-squares loss: every
#          gradient is an integer, every sum exact in fp32 in any order, so "none" must give
#          gloo's gradients bit for bit (several buckets, shards of unequal size), each bucket
#          its own cross-region step (coalesce_bytes=0);
#   exact-coalesced: the same with the buckets of a step reduced as one (the default);
#   int8:  an MLP on load_digits: int8 with error feedback must stay close to gloo's, not equal.
# Each record also counts DDP's hook calls and the hook's cross-region steps.
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import strait.torch as st


def integer_model(gen):
    m = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randint(-2, 3, p.shape, generator=gen).float())
    return m


def run(policy, out, ranks_per_region):
    rank, world = dist.get_rank(), dist.get_world_size()
    group, region, local = st.region_groups(ranks_per_region,
                                            timeout=datetime.timedelta(seconds=30))
    state = st.HierarchicalState(group, gateway=os.environ["STRAIT_GATEWAY"],
                                 job_id=f"ddp-test-{policy}-{os.environ['MASTER_PORT']}",
                                 compression="int8,ef" if policy == "int8" else "none",
                                 timeout=30, **({"coalesce_bytes": 0} if policy == "exact" else {}))
    gen = torch.Generator().manual_seed(7)
    exact = policy.startswith("exact")
    if exact:
        base = integer_model(gen)
    else:
        from sklearn.datasets import load_digits
        x, y = load_digits(return_X_y=True)
        xs, ys = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
        torch.manual_seed(7)
        base = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(),
                                   torch.nn.Linear(96, 10))
    models = [copy_of(base), copy_of(base)]
    # Small buckets: several per step, so bucket order, keys and padding all matter.
    # DDP caps only its first bucket at dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB, which would
    # hold these whole models; torch's DDP says users may set it): tiny here too.
    first, dist._DEFAULT_FIRST_BUCKET_BYTES = dist._DEFAULT_FIRST_BUCKET_BYTES, 64
    try:
        ddps = [DDP(m, bucket_cap_mb=0.0001 if exact else 0.01) for m in models]
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first
    calls = [0]

    def counting_hook(state, bucket):
        calls[0] += 1
        return st.hierarchical_hook(state, bucket)

    ddps[1].register_comm_hook(state, counting_hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    record = {"gloo": [], "strait": [], "params": None}
    for step in range(6):
        if exact:
            xb = torch.randint(-2, 3, (4, 7), generator=gen).float()
            tb = torch.randint(-2, 3, (4, 3), generator=gen).float()
            # Each rank its own batch: integer gradients that differ per rank.
            xb, tb = xb + rank, tb - rank
        else:
            idx = torch.randint(0, len(xs), (world * 16,), generator=gen)[rank * 16:(rank + 1) * 16]
        for name, ddp, m, opt in zip(("gloo", "strait"), ddps, models, opts):
            if exact:
                with torch.no_grad():  # fresh integer weights: exact gradients at every step
                    for p, q in zip(m.parameters(), integer_model(
                            torch.Generator().manual_seed(100 + step)).parameters()):
                        p.copy_(q)
                loss = ((ddp(xb) - tb) ** 2).sum()
            else:
                loss = torch.nn.functional.cross_entropy(ddp(xs[idx]), ys[idx])
            opt.zero_grad()
            loss.backward()
            record[name].append([p.grad.detach().clone() for p in m.parameters()])
            opt.step()
    record["params"] = [p.detach().clone() for p in models[1].parameters()]
    record["wan_elements"] = state.wan_elements
    record["hook_calls"], record["cross_region_steps"] = calls[0], state.steps
    state.close()
    torch.save(record, os.path.join(out, f"rank{rank}_{policy}.pt"))


def copy_of(m):
    import copy
    return copy.deepcopy(m)


def main():
    out, policies = sys.argv[1], sys.argv[2].split(",")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    for policy in policies:
        run(policy, out, int(os.environ["LOCAL_WORLD_SIZE"]))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
