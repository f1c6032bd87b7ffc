# Unit tests of strait.Comm (the ctypes wrapper of the C API's host backend) against the built
# libstrait.so and real straitd processes on loopback: results of every dtype and op, in place,
# keys, and each bad input or failure giving one StraitError with the right code in time.
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import torch

import strait
from conftest import ROOT


def job():
    return "pytest-" + uuid.uuid4().hex[:10]


def per_region(gateways, fn, shard=0, keep_open=False, timeout=20, comm_shard=None,
               **comm_args):
    """Runs fn(comm, region) in one thread per region, each with a 1-rank comm on the straitd
    of `shard` (naming comm_shard to it, when given); returns the results (or raises the first
    exception). The comms are closed after fn unless keep_open."""
    if comm_shard is not None:
        comm_args["shard"] = comm_shard
    out, errs = [None, None], []
    comm_args.setdefault("job_id", job())

    def run(r):
        try:
            c = strait.Comm(region=f"r{r}", gateway=gateways.socket(r, shard), timeout=timeout,
                            **comm_args)
            try:
                out[r] = fn(c, r)
            finally:
                if not keep_open:
                    c.close()
        except BaseException as e:  # noqa: BLE001 -- re-raised below
            errs.append(e)
    ts = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts), "a region's thread hung"
    if errs:
        raise errs[0]
    return out


def open_pair(gateways, timeout=20, **comm_args):
    """One 1-rank comm per region on the straitds of index 0, created concurrently (creating a
    comm joins the job with every region's gateway, so a lone region would wait)."""
    comm_args.setdefault("job_id", job())
    return per_region(gateways, lambda c, r: c, keep_open=True, timeout=timeout, **comm_args)


def test_version_matches_the_project(library):
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        text = f.read()
    want = text.split("project(Strait VERSION ", 1)[1].split()[0]
    assert ".".join(map(str, strait.version())) == want
    assert os.path.samefile(strait.library_path(), library)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                   torch.int32, torch.int64, torch.uint8, torch.int8])
def test_torch_sum_of_every_dtype_in_place(gateways, dtype):
    n = 1000
    def fn(c, r):
        x = (torch.arange(n) % 7 + r).to(dtype)
        ptr = x.data_ptr()
        y = c.allreduce(x, key=f"t.{dtype}")
        assert y is x and x.data_ptr() == ptr
        return x
    a, b = per_region(gateways, fn, compression="none")
    want = ((torch.arange(n) % 7) * 2 + 1).to(dtype)
    assert torch.equal(a, want) and torch.equal(b, want)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32", "uint64"])
def test_numpy_arrays(gateways, dtype):
    def fn(c, r):
        x = np.array([1, 5, 3, 2], dtype=dtype) * (r + 1)
        c.allreduce(x, op="max")
        y = np.arange(10, dtype=dtype)
        c.allreduce(y)  # derived key: dtype and count
        return x, y
    (xa, ya), (xb, yb) = per_region(gateways, fn, compression="none")
    np.testing.assert_array_equal(xa, np.array([2, 10, 6, 4], dtype=dtype))
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, 2 * np.arange(10, dtype=dtype))


def test_avg_min_prod(gateways):
    def fn(c, r):
        a = torch.full((5,), 2.0 + 2 * r)
        b = torch.tensor([3, -4, 5], dtype=torch.int32) * (1 if r == 0 else -1)
        p = torch.tensor([2.0, 3.0]) + r
        c.allreduce(a, op="avg")
        c.allreduce(b, op="min")
        c.allreduce(p, op="prod")
        return a, b, p
    (a, b, p), (a2, b2, p2) = per_region(gateways, fn, compression="none")
    assert torch.equal(a, torch.full((5,), 3.0)) and torch.equal(a, a2)
    assert b.tolist() == [-3, -4, -5] and torch.equal(b, b2)
    assert p.tolist() == [6.0, 12.0] and torch.equal(p, p2)


def test_int8_is_lossy_bit_identical_and_close(gateways):
    g = torch.Generator().manual_seed(3)
    data = [torch.randn(4096, generator=g) * 1e-3 for _ in range(2)]
    want = data[0] + data[1]
    def fn(c, r):
        x = data[r].clone()
        c.allreduce(x, key="grad.w")
        return x
    a, b = per_region(gateways, fn, compression="int8,noef")
    assert torch.equal(a, b), "regions differ after a lossy all-reduce"
    assert not torch.equal(a, want), "int8 gave the exact sum: did the codec run?"
    assert (a - want).abs().max() <= 0.02 * want.abs().max()


def test_the_second_shard_is_its_own_mesh(gateways):
    # Straitds of index 1 reach only each other: what each torch rank of the hook uses.
    def fn(c, r):
        x = torch.ones(10) * (r + 1)
        return c.allreduce(x, key="shard1")
    a, b = per_region(gateways, fn, shard=1, compression="none")
    assert a.tolist() == [3.0] * 10 and torch.equal(a, b)


def two_ranks_per_region(gw, n):
    # The C API's own region step (nranks = 2): rank k of region r through gw.socket(r, k);
    # checks every rank's sum of an n-element tensor.
    from strait.cluster import free_ports
    ports = free_ports(2)
    j, out, errs = job(), {}, []
    def run(r, k):
        try:
            with strait.Comm(region=f"r{r}", rank=k, nranks=2, gateway=gw.socket(r, k),
                             root_address=f"127.0.0.1:{ports[r]}", job_id=j,
                             compression="none", timeout=20) as c:
                x = torch.arange(n, dtype=torch.float32) + 10 * r + 100 * k
                out[(r, k)] = c.allreduce(x, key="hb")
        except BaseException as e:  # noqa: BLE001
            errs.append(e)
    ts = [threading.Thread(target=run, args=(r, k)) for r in range(2) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errs, errs
    want = 4 * torch.arange(n, dtype=torch.float32) + 20 + 200
    assert len(out) == 4
    for v in out.values():
        assert torch.equal(v, want)


def test_two_ranks_per_region_through_the_host_backend(gateways):
    two_ranks_per_region(gateways, 9)
    # 256 KiB: the tensors go to straitd through shared memory (libstrait's default from 64 KiB).
    two_ranks_per_region(gateways, 1 << 16)


def test_one_straitd_serves_both_ranks_of_a_region(node_gateways):
    # One straitd per region for shards 0 and 1: both ranks of a host-backend comm use its one
    # socket (each names its rank's shard), and 1-rank comms name theirs with shard=.
    g = node_gateways
    assert g.socket(0, 0) == g.socket(0, 1)
    two_ranks_per_region(g, 9)
    a, b = per_region(g, lambda c, r: c.allreduce(torch.ones(10) * (r + 1), key="s1"),
                      shard=1, comm_shard=1, compression="none")
    assert a.tolist() == [3.0] * 10 and torch.equal(a, b)
    # A 1-rank comm that names no shard cannot use a straitd serving two: the error says so.
    expect(strait.ERROR_MISMATCH,
           lambda: per_region(g, lambda c, r: None, compression="none", timeout=5),
           "must name its shard")
    with pytest.raises(strait.StraitError) as e:
        strait.Comm(region="r0", gateway=g.socket(0, 0), job_id=job(), shard=4096)
    assert e.value.code == strait.ERROR_INVALID_ARGUMENT


def expect(code, fn, contains):
    with pytest.raises(strait.StraitError) as e:
        fn()
    assert e.value.code == code, str(e.value)
    assert contains in str(e.value), str(e.value)
    return e.value


def test_bad_inputs(gateways):
    IA = strait.ERROR_INVALID_ARGUMENT
    c, other = open_pair(gateways, timeout=5)
    other.close()
    try:
        expect(IA, lambda: c.allreduce(torch.zeros(4, dtype=torch.complex64)), "complex64")
        expect(IA, lambda: c.allreduce(np.zeros(4, dtype=bool)), "bool")
        expect(IA, lambda: c.allreduce(torch.zeros(4, 4).t()), "not contiguous")
        expect(IA, lambda: c.allreduce(np.zeros((4, 4), np.float32).T), "not C-contiguous")
        expect(IA, lambda: c.allreduce(torch.zeros(4, device="meta")), "on meta")
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        expect(IA, lambda: c.allreduce(ro), "read-only")
        expect(IA, lambda: c.allreduce(torch.zeros(4, requires_grad=True)), "requires grad")
        expect(IA, lambda: c.allreduce([1.0, 2.0]), "list")
        expect(IA, lambda: c.allreduce(torch.zeros(4), op="mean"), "op must be")
        # The C API checks the key: 1-200 bytes.
        expect(IA, lambda: c.allreduce(torch.zeros(4), key="k" * 201), "key")
        # A NUL would end the C string early ("a\0b" read as "a"): refused, not truncated.
        expect(IA, lambda: c.allreduce(torch.zeros(4), key="layer\0.grad"), "key contains a NUL")
        # Nothing above reached the gateway or failed the comm: a zero-size call still works.
        c.allreduce(torch.zeros(0))
    finally:
        c.close()
    c.close()  # idempotent
    assert c.closed
    expect(IA, lambda: c.allreduce(torch.zeros(4)), "closed")
    expect(IA, lambda: strait.Comm(region="r0", gateway=gateways.socket(0, 0), job_id=job(),
                                   timeout=-1), "timeout")
    expect(IA, lambda: strait.Comm(region="r0\0r1", gateway=gateways.socket(0, 0), job_id=job(),
                                   timeout=5), "region contains a NUL")


def test_unreachable_gateway_fails_within_the_deadline(library, tmp_path):
    # The library retries until the deadline (a straitd may still be starting), then says why.
    t0 = time.monotonic()
    e = expect(strait.ERROR_UNAVAILABLE,
               lambda: strait.Comm(region="r0", gateway=str(tmp_path / "no.sock"), job_id=job(),
                                   timeout=2), "no.sock")
    assert "is straitd running?" in str(e)
    assert time.monotonic() - t0 < 4, e


def test_a_region_that_never_comes_fails_creation_within_the_deadline(gateways):
    t0 = time.monotonic()
    with pytest.raises(strait.StraitError) as e:
        strait.Comm(region="r0", gateway=gateways.socket(0, 0), job_id=job(), timeout=3)
    took = time.monotonic() - t0
    assert e.value.code in (strait.ERROR_TIMEOUT, strait.ERROR_UNAVAILABLE), str(e.value)
    assert took < 10, f"took {took:.1f} s for a 3 s deadline"


def test_a_region_that_stops_calling_fails_the_step_within_the_deadline(gateways):
    c, other = open_pair(gateways, timeout=3, compression="none")
    try:
        t0 = time.monotonic()
        with pytest.raises(strait.StraitError) as e:
            c.allreduce(torch.ones(100), key="lonely")  # region 1 never calls it
        took = time.monotonic() - t0
        assert e.value.code in (strait.ERROR_TIMEOUT, strait.ERROR_UNAVAILABLE,
                                strait.ERROR_ABORTED), str(e.value)
        assert took < 10, f"took {took:.1f} s for a 3 s deadline"
        # The comm is failed from now on, and says so.
        expect(strait.ERROR_COMM_FAILED, lambda: c.allreduce(torch.ones(100), key="again"),
               "destroy the comm")
    finally:
        c.close()
        other.close()


def mixed_policy_run(gateways):
    """Region 0 asks for int8, region 1 for zstd, same job: both all-reduce one tensor.
    Returns (the two regions' data, results or StraitErrors)."""
    g = torch.Generator().manual_seed(5)
    data = [torch.randn(10000, generator=g) for _ in range(2)]
    out = [None, None]
    j = job()
    def run(r):
        try:
            with strait.Comm(region=f"r{r}", gateway=gateways.socket(r, 0), job_id=j, timeout=8,
                             compression="int8" if r == 0 else "zstd") as c:
                out[r] = c.allreduce(data[r].clone(), key="w")
        except strait.StraitError as e:
            out[r] = e
    ts = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts), "a region hung"
    return data, out


def test_mixed_policies_never_give_a_wrong_or_region_dependent_result(gateways):
    data, out = mixed_policy_run(gateways)
    failed = [isinstance(o, strait.StraitError) for o in out]
    if any(failed):
        assert all(failed), f"one region got a result, the other an error: {out}"
    else:
        assert torch.equal(out[0], data[0] + data[1]) and torch.equal(out[1], out[0])


def test_regions_asking_for_different_policies_agree_on_the_conservative_one(gateways):
    # The gateways merge the regions' policies (lib/gateway/policy.h: the most conservative one
    # every region allows): int8 in one region and zstd in the other run lossless, and both
    # regions end with the exact sum.
    data, out = mixed_policy_run(gateways)
    assert not any(isinstance(o, strait.StraitError) for o in out), out
    assert torch.equal(out[0], data[0] + data[1]) and torch.equal(out[1], out[0])


def test_regions_disagreeing_on_a_step_fail_it_in_time(gateways):
    # Region 0 all-reduces 100 elements under a key, region 1 101: never a result, one error each.
    errs = {}
    def fn(c, r):
        try:
            c.allreduce(torch.ones(100 + r), key="w")
        except strait.StraitError as e:
            errs[r] = e
    t0 = time.monotonic()
    per_region(gateways, fn, timeout=5, compression="none")
    assert time.monotonic() - t0 < 20
    assert sorted(errs) == [0, 1], errs
    for e in errs.values():
        assert e.code in (strait.ERROR_MISMATCH, strait.ERROR_TIMEOUT, strait.ERROR_ABORTED), e


def _load_in_subprocess(env, cwd):
    code = ("import strait, strait._lib as l\ntry:\n    l.load()\n"
            "except strait.LibraryNotFound as e:\n    print('CODE', e.code); print(e)\n"
            "else:\n    print('LOADED', l.loaded_path())\n")
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_a_bad_strait_library_is_the_one_error_and_no_other_library_loads(tmp_path):
    # $STRAIT_LIBRARY names the library: one that does not load is the error, even though the
    # source tree's build has a good one (a user who names a library never gets another).
    bogus = tmp_path / "libstrait.so"
    bogus.write_text("not a library")
    env = dict(os.environ, STRAIT_LIBRARY=str(bogus), PYTHONPATH=os.path.join(ROOT, "python"))
    out = _load_in_subprocess(env, tmp_path)
    assert "CODE 3" in out.stdout, out.stdout + out.stderr
    assert str(bogus) in out.stdout and "$STRAIT_LIBRARY" in out.stdout, out.stdout
    assert "LOADED" not in out.stdout


def _copy_of_the_package(tmp_path):
    # The package outside any source tree, as pip installs it.
    site = tmp_path / "site"
    shutil.copytree(os.path.join(ROOT, "python", "strait"), site / "strait",
                    ignore=shutil.ignore_patterns("__pycache__", "libstrait.so*"))
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("STRAIT_LIBRARY", None)
    env.pop("LD_LIBRARY_PATH", None)
    return env


def test_missing_library_names_the_paths_tried(tmp_path):
    env = _copy_of_the_package(tmp_path)
    out = _load_in_subprocess(env, tmp_path)
    assert "CODE 3" in out.stdout, out.stdout + out.stderr
    assert "next to the package" in out.stdout, out.stdout
    assert "libstrait.so.0" in out.stdout  # the loader's path was tried too
    # and the build directories under the current directory
    assert str(tmp_path / "build" / "release" / "lib" / "api" / "libstrait.so") in out.stdout


def test_an_installed_package_run_from_a_source_tree_finds_its_build(library, tmp_path):
    # pip install ./python, then run from the clone's root: the build there is found.
    env = _copy_of_the_package(tmp_path)
    out = _load_in_subprocess(env, ROOT)
    assert "LOADED " + os.path.join(ROOT, "build") in out.stdout, out.stdout + out.stderr
