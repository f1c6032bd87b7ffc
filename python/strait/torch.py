# PyTorch integration: a DDP communication hook that runs Strait's cross-region all-reduce, and a
# `strait` process-group backend whose all-reduce is that cross-region step.
#
# The hook (hierarchical_hook with a HierarchicalState) does, for each gradient bucket (or run of
# coalesced buckets, below), on one worker thread per state and in the order DDP issues them:
#   1. reduce-scatter the bucket inside the region with the region's own torch process group
#      (NCCL: reduce_scatter_tensor; gloo, which has none: each rank sends every peer its slice
#      with isend/irecv and sums its own in rank order; other backends: all_reduce and slice);
#   2. copy this rank's shard to host memory and all-reduce it across the regions through this
#      rank's straitd (a 1-rank Strait comm; the straitd must serve shard r = the rank in region,
#      so that shard k of every region meets at the straitds of index k); the gateway applies the
#      job's compression policy and error feedback (residuals kept per key: the bucket or run's
#      indices and its parameters' shapes, which DDP's rebuild of its buckets changes);
#   3. divide by the world size once, copy back and all-gather the shards inside the region
#      (NCCL: all_gather_into_tensor; gloo: isend/irecv straight into the run's slices).
# It returns a torch.futures.Future, so DDP overlaps the buckets with the rest of backward.
# Consecutive buckets of a step are coalesced (concatenated and run through 1-3 as one) up to
# coalesce_bytes (64 MiB) or the step's last bucket: each cross-region step pays the WAN's
# round trips (reduce-scatter, all-gather, commit) once, and DDP's buckets -- its first capped
# at 1 MiB -- would each pay them (bench/pytorch_ddp.sh's int8 step: about 810 -> 650 ms).
# Every rank of every region ends with bit-identical gradients, lossy codecs included (the
# gateways return one result to every region; the region's all-gather copies it).
#
#   import torch.distributed as dist, strait.torch as st
#   dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
#   region_group, region, local_rank = st.region_groups(ranks_per_region)
#   state = st.HierarchicalState(region_group, gateway=f"/run/strait/straitd{local_rank}.sock",
#                                job_id="job-42", compression="int8,ef", timeout=60)
#   model = DDP(model); model.register_comm_hook(state, st.hierarchical_hook)
#   ...; state.close()
#
# Failures (the gateway unreachable or its deadline passed, another rank dead, a region that
# disagrees) fail the bucket's future (and those coalesced with it) with a strait.StraitError
# (the region group's own errors are wrapped in one, code ERROR_ABORTED); DDP raises it from
# backward() as a RuntimeError whose message names it, and state.error holds the StraitError
# itself; the state then stays failed, and fails every later bucket.
# Give the process groups a timeout no longer than the Strait deadline so that a rank waiting for
# a dead peer inside the region fails in time too.
import collections
import contextlib
import datetime
import queue
import threading
import time
import zlib

import torch
import torch.distributed as dist

from . import ERROR_ABORTED, ERROR_INVALID_ARGUMENT, ERROR_UNSUPPORTED, Comm, StraitError

__all__ = ["HierarchicalState", "hierarchical_hook", "region_groups", "register_backend",
           "StraitProcessGroup"]


def region_groups(ranks_per_region, backend=None, timeout=None):
    """Splits the default group into regions of `ranks_per_region` consecutive ranks (torchrun
    with --nnodes=regions --nproc-per-node=ranks_per_region numbers them that way). Every rank
    must call it. Returns (this rank's region group, region index, rank in region)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if ranks_per_region < 1 or world % ranks_per_region != 0:
        raise StraitError(ERROR_INVALID_ARGUMENT, f"world size {world} is not a multiple of "
                          f"ranks_per_region={ranks_per_region}")
    mine = None
    kwargs = {}
    if backend is not None:
        kwargs["backend"] = backend
    if timeout is not None:
        kwargs["timeout"] = timeout
    for start in range(0, world, ranks_per_region):
        g = dist.new_group(list(range(start, start + ranks_per_region)), **kwargs)
        if start <= rank < start + ranks_per_region:
            mine = g
    return mine, rank // ranks_per_region, rank % ranks_per_region


class HierarchicalState:
    """The hook's state: the region group, this rank's Strait comm and the worker thread.

    region_group: the torch process group of this rank's region (every region the same size).
    gateway: the socket of this rank's straitd, which serves shard r = this rank's index in the
    region (None: $STRAIT_GATEWAY). region, job_id, compression: as strait.Comm (None: the
    STRAIT_* variables). timeout: seconds, the deadline of each cross-region step.
    world_size: the divisor of the average (None: the default group's size).
    coalesce_bytes: consecutive buckets of one step (same dtype and device) are reduced as one
    until they reach this many bytes or the step's last bucket comes: every cross-region step
    pays the WAN's round trips once, so DDP's many buckets (its first is capped at 1 MiB) cost
    one step each otherwise. 0: every bucket on its own.
    Creating it registers the job at the gateway (blocks until then). close() stops the worker
    and the comm; idempotent."""

    def __init__(self, region_group, gateway=None, job_id=None, compression=None, region=None,
                 timeout=60.0, world_size=None, coalesce_bytes=64 << 20):
        self.region_group = region_group
        if not isinstance(coalesce_bytes, int) or coalesce_bytes < 0:
            raise StraitError(ERROR_INVALID_ARGUMENT, f"coalesce_bytes={coalesce_bytes!r}: give "
                              "a byte count >= 0 (0: every bucket on its own)")
        self.coalesce_bytes = coalesce_bytes
        self.region_rank = dist.get_rank(region_group)
        self.region_size = dist.get_world_size(region_group)
        if self.region_rank < 0:
            raise StraitError(ERROR_INVALID_ARGUMENT, "this rank is not in region_group")
        self.world_size = world_size if world_size is not None else dist.get_world_size()
        self.backend = str(dist.get_backend(region_group))
        # Shard r of every region meets at the straitds serving r (one per rank, or one per node).
        self.comm = Comm(region=region, rank=0, nranks=1, gateway=gateway, job_id=job_id,
                         compression=compression, timeout=timeout, shard=self.region_rank)
        self.steps = 0          # cross-region steps (one per bucket, or per coalesced run)
        self.wan_elements = 0   # elements this rank sent across regions (before compression)
        # Seconds the worker spent in each stage, summed over steps (for benchmarks).
        self.seconds = {"region_reduce": 0.0, "cross_region": 0.0, "region_gather": 0.0}
        self._failed = None
        self._peers = None  # global ranks of the region group's members (gloo exchange)
        self._scratch_buffers = collections.OrderedDict()  # (name, numel, dtype) -> CPU tensor
        self._queue = queue.Queue()
        self._closed = False
        self._worker = threading.Thread(target=self._loop, name="strait-ddp-hook", daemon=True)
        self._worker.start()

    # DDP pickles hook states only for its own checkpointing of comm hooks; ours holds a live
    # comm and thread, which do not survive a pickle.
    def __getstate__(self):
        raise TypeError("strait.torch.HierarchicalState cannot be pickled")

    def close(self):
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._worker.join()
        self.comm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def error(self):
        """The StraitError that failed the hook (None while it works)."""
        return self._failed

    def submit(self, buf, index, last=True, layout=""):
        """Queues one bucket (a flat tensor) and returns the Future of its reduced values.
        last: whether it is the step's last bucket (GradBucket.is_last()): a bucket may wait for
        the next ones up to coalesce_bytes, never past the last. layout: a text that changes
        when the bucket's parameters change (part of the error-feedback key)."""
        if buf.is_cuda:
            fut = torch.futures.Future(devices=[buf.device])
            stream = torch.cuda.current_stream(buf.device)
        else:
            fut = torch.futures.Future()
            stream = None
        if self._closed:
            fut.set_exception(StraitError(ERROR_INVALID_ARGUMENT, "the hook's state is closed"))
        else:
            # Queued even once the state failed: the worker fails it, and with it any bucket it
            # still holds for coalescing, which nothing else would complete.
            self._queue.put(_Queued(buf, index, fut, stream, last, layout))
        return fut

    def _loop(self):
        group, size = [], 0  # buckets held for coalescing
        while True:
            item = self._queue.get()
            if item is None:
                self._fail(group, StraitError(ERROR_INVALID_ARGUMENT,
                                              "the hook's state was closed mid-step"))
                return
            buf = item.buf
            if group and (buf.dtype != group[0].buf.dtype or buf.device != group[0].buf.device):
                self._run(group)
                group, size = [], 0
            group.append(item)
            size += buf.numel() * buf.element_size()
            if item.last or size >= self.coalesce_bytes or self._failed is not None:
                self._run(group)
                group, size = [], 0

    @staticmethod
    def _fail(group, error):
        for item in group:
            item.fut.set_exception(error)

    def _run(self, group):
        """Reduces a run of consecutive buckets as one and completes their futures."""
        if self._failed is not None:
            self._fail(group, self._failed)
            return
        bufs = [item.buf for item in group]
        first, last = group[0].index, group[-1].index
        label = f"bucket {first}" if len(group) == 1 else f"buckets {first}-{last}"
        # DDP rebuilds its buckets after the first step (other members, other order) and a run
        # may keep its indices and size: the layout keeps error-feedback residuals apart.
        layout = zlib.crc32("|".join(item.layout for item in group).encode())
        key = f"ddp.bucket{first}" + ("" if len(group) == 1 else f"-{last}") + f".{layout:08x}"
        stream = group[0].stream
        try:
            # The concatenation and the copies back run on DDP's stream, ordered with the
            # gradients' writes and the region group's operations on it.
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                if len(bufs) == 1:
                    flat = bufs[0]
                else:
                    flat = torch.cat(bufs, out=self._scratch("run", sum(b.numel() for b in bufs),
                                                             bufs[0]))
                self._reduce(flat, key)
                if len(bufs) > 1:
                    for b, part in zip(bufs, flat.split([b.numel() for b in bufs])):
                        b.copy_(part)
        except BaseException as e:  # noqa: BLE001 -- handed to DDP through the futures
            if not isinstance(e, StraitError):
                # The region group's own failure (a dead peer, its timeout), or the device's (out
                # of memory for the concatenation): one exception type for every failure.
                size = sum(b.numel() for b in bufs)
                e = StraitError(ERROR_ABORTED, f"{label} ({size} {bufs[0].dtype}), inside the "
                                f"region ({self.backend}): {type(e).__name__}: {e}")
            self._failed = e
            self._fail(group, e)
            return
        for item in group:
            item.fut.set_result(item.buf)

    def _reduce(self, buf, key):
        n, m, r, g = buf.numel(), self.region_size, self.region_rank, self.region_group
        t0 = time.monotonic()
        s = (n + m - 1) // m
        if s * m == n:
            flat = buf
        else:
            flat = self._scratch("padded", s * m, buf)
            flat[:n].copy_(buf)
            flat[n:].zero_()
        # 1. Inside the region: this rank ends with the region's sum of shard r.
        if m == 1:
            shard = flat
        elif self.backend == "nccl":
            shard = flat.new_empty(s)
            rs = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
            rs(shard, flat, group=g)
        elif self.backend == "gloo":
            shard = self._exchange_reduce(flat, s)
        else:
            dist.all_reduce(flat, group=g)
            shard = flat[r * s:(r + 1) * s]
        # 2. Across the regions, through this rank's straitd.
        t1 = time.monotonic()
        host = shard if shard.device.type == "cpu" else shard.to("cpu")
        if not host.is_contiguous():
            host = host.contiguous()
        self.comm.allreduce(host, op="sum", key=f"{key}.n{n}")
        self.steps += 1
        self.wan_elements += host.numel()
        # 3. The average, back into the region.
        t2 = time.monotonic()
        host.div_(self.world_size)
        if host is not shard:
            shard.copy_(host, non_blocking=False)
        if m > 1:
            if self.backend == "nccl":
                ag = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
                out = flat.new_empty(s * m)
                ag(out, shard, group=g)
                flat = out
            elif self.backend == "gloo":
                self._exchange_gather(flat, shard, s)
            else:
                parts = list(flat.split(s))
                dist.all_gather(parts, shard.clone() if shard.data_ptr() == parts[r].data_ptr()
                                else shard, group=g)
        if flat.data_ptr() != buf.data_ptr():
            buf.copy_(flat[:n])
        t3 = time.monotonic()
        self.seconds["region_reduce"] += t1 - t0
        self.seconds["cross_region"] += t2 - t1
        self.seconds["region_gather"] += t3 - t2


    def _exchange(self, send, recv):
        """Point-to-point inside the region: send(j) goes to and recv(j) comes from every other
        member j, all in flight at once; returns when every one is done."""
        g, r, m = self.region_group, self.region_rank, self.region_size
        peers = self._peers
        if peers is None:
            c10d = dist.distributed_c10d
            global_rank = getattr(c10d, "get_global_rank", None) or c10d._get_global_rank
            peers = self._peers = [global_rank(g, j) for j in range(m)]
        works = []
        for j in range(m):
            if j != r:
                works.append(dist.isend(send(j), peers[j], group=g))
                works.append(dist.irecv(recv(j), peers[j], group=g))
        for w in works:
            w.wait()

    def _exchange_reduce(self, flat, s):
        """Reduce-scatter for gloo, which has none: every rank sends slice j to rank j and sums
        the slices it receives for its own, in region rank order (the same order on every
        rank, so the result does not depend on arrival). Half the traffic and additions of
        all_reduce-then-slice."""
        r, m = self.region_rank, self.region_size
        parts = list(flat.split(s))
        got = {j: self._scratch(f"recv{j}", s, flat) for j in range(m) if j != r}
        self._exchange(lambda j: parts[j], lambda j: got[j])
        shard = self._scratch("shard", s, flat)
        shard.copy_(got[0] if r != 0 else parts[0])
        for j in range(1, m):
            shard.add_(parts[r] if j == r else got[j])
        return shard

    def _exchange_gather(self, flat, shard, s):
        """All-gather for gloo straight into flat's slices: gloo's all_gather copies through a
        temporary of the whole run, fresh pages each step."""
        parts = list(flat.split(s))
        self._exchange(lambda j: shard, lambda j: parts[j])
        parts[self.region_rank].copy_(shard)

    _SCRATCH_KEPT = 8

    def _scratch(self, name, numel, like):
        """A tensor of numel elements of like's dtype and device for one use inside a run (its
        contents are undefined). On the CPU it is kept for the next steps: torch's CPU allocator
        gives multi-MiB blocks back to the kernel, and faulting their pages in again each step
        cost more than the copies themselves (bench/pytorch_ddp.sh: 32 MiB per rank and step;
        a fresh 32 MiB tensor filled costs 94 ms on its 2-core VM, a reused one 1 ms). The
        worker uses them one run at a time; the _SCRATCH_KEPT most recently used stay (a run
        is at most coalesce_bytes plus a bucket). CUDA's caching allocator already reuses."""
        if like.device.type != "cpu":
            return like.new_empty(numel)
        k = (name, numel, like.dtype)
        t = self._scratch_buffers.pop(k, None)
        if t is None:
            t = like.new_empty(numel)
        self._scratch_buffers[k] = t
        while len(self._scratch_buffers) > self._SCRATCH_KEPT:
            self._scratch_buffers.popitem(last=False)
        return t


# A bucket queued for the worker: its flat buffer, DDP's index, the future DDP waits on, the CUDA
# stream (None on the CPU), whether it is the step's last, and its parameters' shapes.
_Queued = collections.namedtuple("_Queued", "buf index fut stream last layout")


def hierarchical_hook(state, bucket):
    """The DDP communication hook: register with model.register_comm_hook(state, this)."""
    # Through then(): a failure then reaches DDP as a future error (which backward() raises as a
    # RuntimeError naming the StraitError and its message), not as an exception object DDP
    # would try to use as the bucket's tensor. state.error keeps the StraitError itself.
    layout = ",".join("x".join(map(str, g.shape)) for g in bucket.gradients())
    return state.submit(bucket.buffer(), bucket.index(), bucket.is_last(), layout).then(_value)


def _value(fut):
    return fut.value()


# --- The `strait` process-group backend ------------------------------------------------------

_TORCH_OPS = {}


def _op_name(op):
    if not _TORCH_OPS:
        R = dist.ReduceOp
        _TORCH_OPS.update({R.SUM: "sum", R.PRODUCT: "prod", R.MAX: "max", R.MIN: "min"})
        if hasattr(R, "AVG"):
            _TORCH_OPS[R.AVG] = "avg"
    for k, v in _TORCH_OPS.items():
        if op == k:
            return v
    raise StraitError(ERROR_UNSUPPORTED, f"the strait backend does not support {op}")


class StraitProcessGroup(dist.ProcessGroup):
    """A process group whose members are one rank per region (rank = region index) and whose
    all-reduce is Strait's cross-region all-reduce through this process's straitd
    ($STRAIT_GATEWAY, $STRAIT_REGION, $STRAIT_JOB_ID, $STRAIT_COMPRESSION): e.g. HSDP's replicate
    dimension, or the replica group of a fault-tolerant trainer. allreduce and barrier only;
    CPU tensors (the host backend). Calls block until done, then return a completed Work."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 60.0
        self._comm = Comm(rank=0, nranks=1, timeout=secs)
        self._barriers = 0

    def getBackendName(self):
        return "strait"

    def _done(self, result):
        fut = torch.futures.Future()
        fut.set_result(result)
        return torch._C._distributed_c10d._create_work_from_future(fut)

    def allreduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        for t in tensors:
            self._comm.allreduce(t, op=op)
        return self._done(tensors)

    def barrier(self, opts=None):
        t = torch.zeros(1, dtype=torch.int32)
        self._barriers += 1
        self._comm.allreduce(t, op="sum", key=f"strait.barrier.{self._barriers}")
        return self._done([t])

    def close(self):
        self._comm.close()


def register_backend():
    """Registers the `strait` backend (idempotent): dist.new_group(ranks, backend="strait")."""
    if "strait" not in dist.Backend.__dict__ and getattr(dist.Backend, "STRAIT", None) is None:
        dist.Backend.register_backend("strait", StraitProcessGroup)
