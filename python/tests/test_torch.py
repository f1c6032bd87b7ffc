# The DDP hook's worker (strait.torch.HierarchicalState) on its own, without process groups or a
# straitd: coalescing, and that every bucket's future completes when a step fails or the state
# closes mid-step (a future left pending hangs DDP's backward for good).
import collections
import queue
import threading
import time

import pytest
import torch

import strait
import strait.torch as st


def bare_state(coalesce_bytes, reduce):
    """A state whose region and cross-region stages are `reduce(flat, key)`."""
    s = st.HierarchicalState.__new__(st.HierarchicalState)
    s.coalesce_bytes, s.backend, s._failed, s._closed = coalesce_bytes, "gloo", None, False
    s._queue = queue.Queue()
    s._scratch_buffers = collections.OrderedDict()
    s._reduce = reduce
    s._worker = threading.Thread(target=s._loop, daemon=True)
    s._worker.start()
    return s


def outcome(fut, seconds=10):
    deadline = time.monotonic() + seconds
    while not fut.done():
        assert time.monotonic() < deadline, "a bucket's future never completed"
        time.sleep(0.01)
    try:
        return fut.wait()
    except Exception as e:  # noqa: BLE001 -- the failure is the outcome under test
        return e


def test_buckets_are_coalesced_up_to_the_bound_and_the_last_one():
    keys = []

    def double(flat, key):
        keys.append((key, flat.numel()))
        flat.mul_(2)

    s = bare_state(16, double)
    bufs = [torch.full((n,), float(i + 1)) for i, n in enumerate((2, 3, 1, 1))]
    futs = [s.submit(b, i, last=(i == 3), layout=f"{b.numel()}") for i, b in enumerate(bufs)]
    for i, (b, f) in enumerate(zip(bufs, futs)):
        assert torch.equal(outcome(f), torch.full((b.numel(),), 2.0 * (i + 1)))
    # 8 + 12 bytes reach 16: buckets 0-1 as one; then 2-3, ended by the last bucket.
    assert [n for _, n in keys] == [5, 2]
    assert keys[0][0].startswith("ddp.bucket0-1.") and keys[1][0].startswith("ddp.bucket2-3.")
    s._queue.put(None)


def test_a_coalesced_run_reuses_its_buffer_across_steps_and_few_are_kept():
    # The concatenation of a run is a CPU buffer kept for the next steps (fresh multi-MiB
    # tensors cost page faults every step), never stale: each step's values come through.
    seen = []

    def double(flat, key):
        seen.append(flat.data_ptr())
        flat.mul_(2)

    s = bare_state(1 << 20, double)
    for step in range(3):
        bufs = [torch.full((n,), float(step * 10 + i)) for i, n in enumerate((5, 7))]
        futs = [s.submit(b, i, last=(i == 1)) for i, b in enumerate(bufs)]
        for i, (b, f) in enumerate(zip(bufs, futs)):
            assert torch.equal(outcome(f), torch.full((b.numel(),), 2.0 * (step * 10 + i)))
    assert len(seen) == 3 and len(set(seen)) == 1, seen
    assert [t.data_ptr() for t in s._scratch_buffers.values()] == seen[:1]
    # Runs of many sizes: only the most recent few buffers stay.
    for n in range(1, 20):
        futs = [s.submit(torch.ones(n), 0, last=False), s.submit(torch.ones(1), 1, last=True)]
        assert all(torch.equal(outcome(f), torch.full(f.wait().shape, 2.0)) for f in futs)
    assert len(s._scratch_buffers) <= st.HierarchicalState._SCRATCH_KEPT
    s._queue.put(None)


def test_a_failed_step_completes_every_future_it_holds_or_gets():
    def fail_first(flat, key):
        raise RuntimeError("peer died")

    for coalesce in (0, 8, 1 << 20):
        s = bare_state(coalesce, fail_first)
        # Bucket 0 fails; buckets 1.. may be held for coalescing at that moment, and the last
        # one comes after the failure: each future must still end, with the same error.
        futs = [s.submit(torch.ones(2), i, last=(i == 3)) for i in range(4)]
        errors = [outcome(f) for f in futs]
        assert all(isinstance(e, strait.StraitError) for e in errors), errors
        assert "inside the region (gloo): RuntimeError: peer died" in str(errors[0])
        assert s.error is errors[0]
        assert isinstance(outcome(s.submit(torch.ones(1), 4)), strait.StraitError)
        s._queue.put(None)


def test_a_bucket_held_when_the_step_fails_is_failed_too():
    # Bucket 0 (8 bytes, a run of its own) fails only once bucket 1 (4 bytes, held for
    # coalescing) is queued; the last bucket comes after the failure. Nothing else would ever
    # complete bucket 1's future.
    gate = threading.Event()

    def fail_at_gate(flat, key):
        gate.wait()
        raise RuntimeError("peer died")

    s = bare_state(8, fail_at_gate)
    f0 = s.submit(torch.ones(2), 0, last=False)
    f1 = s.submit(torch.ones(1), 1, last=False)
    gate.set()
    assert isinstance(outcome(f0), strait.StraitError)
    deadline = time.monotonic() + 10
    while not s._queue.empty():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)  # the worker has taken bucket 1
    f2 = s.submit(torch.ones(1), 2, last=True)
    for f in (f1, f2):
        assert isinstance(outcome(f), strait.StraitError)
    s._queue.put(None)


def test_closing_mid_step_fails_the_held_buckets():
    s = bare_state(1 << 20, lambda flat, key: None)
    held = s.submit(torch.ones(4), 0, last=False)
    s._queue.put(None)
    e = outcome(held)
    assert isinstance(e, strait.StraitError) and "closed mid-step" in str(e), e


def test_bad_coalesce_bytes_is_refused():
    for bad in (-1, 1.5, "64MiB"):
        with pytest.raises(strait.StraitError, match="coalesce_bytes=.*give a byte count >= 0"):
            st.HierarchicalState(None, coalesce_bytes=bad)
