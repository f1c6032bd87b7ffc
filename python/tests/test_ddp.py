# End to end: 2 regions x 2 ranks (one process each, started by strait.launch) on loopback with a
# real straitd per rank; DDP with strait.torch.hierarchical_hook against plain gloo DDP on the
# same batches (tests/ddp_worker.py), a short training run of examples/pytorch/train_ddp.py, a
# rank killed mid-run (every other rank must fail with one clear error, in time), and the
# `strait` process-group backend.
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, TEST_POLICY

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(ROOT, "examples", "pytorch", "train_ddp.py")


def env():
    return dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + HERE,
                OMP_NUM_THREADS="1")


def launch(straitd, workdir, command, regions=2, ranks=2, timeout=150, deadline="20s", extra=(),
           **kw):
    args = [sys.executable, "-m", "strait.launch", "--regions", str(regions), "--ranks",
            str(ranks), "--straitd", straitd, "--workdir", str(workdir), "--policy", TEST_POLICY,
            "--deadline", deadline, "--grace", "40", *extra, "--"] + command
    return subprocess.run(args, env=env(), capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def ddp_records(library, straitd, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    r = launch(straitd, out / "gw", [sys.executable, os.path.join(HERE, "ddp_worker.py"),
                                     str(out), ",".join(POLICIES)])
    assert r.returncode == 0, r.stdout + r.stderr
    return {(rank, p): torch.load(out / f"rank{rank}_{p}.pt")
            for rank in range(4) for p in POLICIES}


POLICIES = ("exact", "exact-coalesced", "int8")


@pytest.mark.parametrize("policy", ["exact", "exact-coalesced"])
def test_lossless_hook_gives_gloos_gradients_bit_for_bit(ddp_records, policy):
    for rank in range(4):
        rec = ddp_records[(rank, policy)]
        assert len(rec["strait"]) == 6
        # Several buckets per step (DDP's first step has one, then it rebuilds them); with
        # coalescing, one cross-region step per training step.
        assert rec["hook_calls"] > 6, rec["hook_calls"]
        want = rec["hook_calls"] if policy == "exact" else 6
        assert rec["cross_region_steps"] == want, (rec["cross_region_steps"], want)
        for step, (g, s) in enumerate(zip(rec["gloo"], rec["strait"])):
            for a, b in zip(g, s):
                assert torch.equal(a, b), f"rank {rank} step {step}: {a} != {b}"
        # Not all zero: the check above compared something.
        assert any(bool(a.abs().sum() > 0) for a in rec["gloo"][0])
        assert rec["wan_elements"] > 0


def test_int8_hook_is_close_to_gloo_and_identical_on_every_rank(ddp_records):
    recs = [ddp_records[(rank, "int8")] for rank in range(4)]
    differs = False
    for step in range(6):
        for i, (g, s) in enumerate(zip(recs[0]["gloo"][step], recs[0]["strait"][step])):
            rel = float((s - g).norm() / g.norm().clamp_min(1e-12))
            assert rel < 0.1, f"step {step} param {i}: relative error {rel:.3f}"
            differs |= not torch.equal(g, s)
            for r in recs[1:]:
                assert torch.equal(r["strait"][step][i], s), "ranks got different gradients"
    assert differs, "int8 gave gloo's gradients exactly: did the codec run?"
    for r in recs[1:]:
        for a, b in zip(r["params"], recs[0]["params"]):
            assert torch.equal(a, b)


def test_training_example_learns_digits(library, straitd, tmp_path):
    log = tmp_path / "run.json"
    r = launch(straitd, tmp_path / "gw",
               [sys.executable, EXAMPLE, "--hook", "strait", "--compression", "int8,ef",
                "--steps", "80", "--quiet", "--log", str(log)])
    assert r.returncode == 0, r.stdout + r.stderr
    import json
    run = json.loads(log.read_text())
    assert run["identical"] and run["accuracy"] > 0.85, run["accuracy"]
    assert run["steps"][-1]["loss"] < run["steps"][0]["loss"] / 3
    png = tmp_path / "loss.png"
    p = subprocess.run([sys.executable, EXAMPLE, "--plot", str(png), str(log)], env=env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and png.stat().st_size > 1000, p.stderr


def test_a_killed_rank_fails_every_other_rank_in_time(library, straitd, tmp_path):
    # Rank 3 (region 1) is killed after a few steps; every other rank must exit 1 with one
    # "train_ddp: error:" line within the deadline (10 s), not hang.
    args = [sys.executable, "-m", "strait.launch", "--regions", "2", "--ranks", "2", "--straitd",
            straitd, "--workdir", str(tmp_path / "gw"), "--policy", TEST_POLICY, "--deadline",
            "10s", "--grace", "60", "--", sys.executable, EXAMPLE, "--hook", "strait", "--steps",
            "100000", "--timeout", "10"]
    p = subprocess.Popen(args, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        # Wait for training to run, then kill rank 3 (a child of the launcher with RANK=3).
        line = ""
        while "step   10" not in line:
            line = p.stdout.readline()
            assert line or p.poll() is None, p.stderr.read()
        victim = None
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    e = f.read().split(b"\0")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"RANK=3" in e and b"train_ddp.py" in cmd and os.getpgid(int(pid)) == p.pid:
                victim = int(pid)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = p.communicate(timeout=90)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode != 0
    errors = [ln for ln in err.splitlines() if ln.startswith("train_ddp: error:")]
    assert len(errors) == 3, err  # ranks 0, 1, 2: one line each
    # Each rank learns it from Strait (its cross-region step timed out, or its region's peer
    # is gone) or from gloo (a world-group call of the script meeting a closed connection, once
    # a failed rank exited): either way one line that says what happened.
    for ln in errors:
        assert "StraitError: STRAIT_ERROR_" in ln or "gloo/transport" in ln, ln
    assert took < 45, f"the other ranks took {took:.0f} s to fail (deadline 10 s):\n{err}"


def test_strait_process_group_backend(library, straitd, tmp_path):
    # One rank per region in a `strait` group: dist.all_reduce is the cross-region all-reduce.
    script = (
        "import datetime, os, torch, torch.distributed as dist, strait.torch as st\n"
        "st.register_backend()\n"
        "os.environ['STRAIT_JOB_ID'] = 'pg-test-' + os.environ['MASTER_PORT']\n"
        "os.environ['STRAIT_COMPRESSION'] = 'none'\n"
        "dist.init_process_group('strait', timeout=datetime.timedelta(seconds=20))\n"
        "r = dist.get_rank()\n"
        "t = torch.arange(6, dtype=torch.float32) * (r + 1)\n"
        "dist.all_reduce(t)\n"
        "m = torch.tensor([r * 10], dtype=torch.int64)\n"
        "dist.all_reduce(m, op=dist.ReduceOp.MAX)\n"
        "dist.barrier()\n"
        "assert t.tolist() == [3.0 * i for i in range(6)], t\n"
        "assert m.item() == 10, m\n"
        "try:\n"
        "    dist.broadcast(t, 0)\n"
        "    raise SystemExit('broadcast should not be supported')\n"
        "except RuntimeError as e:\n"
        "    assert any(w in str(e) for w in ('broadcast', 'not supported', 'implement')), e\n"
        "print('PG-OK', r, flush=True)\n"
        "os._exit(0)\n")
    r = launch(straitd, tmp_path / "gw", [sys.executable, "-c", script], ranks=1)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PG-OK") == 2, r.stdout + r.stderr


# --max-rate and --cc become each straitd's link.max_rate (straitd then paces its links) and
# link.congestion_control; a value straitd refuses (a rate it cannot read, an algorithm the
# kernel lacks: its error names what the kernel offers) fails the launch with straitd's error,
# before any rank runs.
@pytest.mark.parametrize("option,good,line,bad,said", [
    ("--max-rate", "50mbit", 'max_rate = "50mbit"', "50", ("link.max_rate",)),
    ("--cc", "reno", 'congestion_control = "reno"', "nosuchcc", ("nosuchcc", "reno")),
])
def test_launch_link_options_reach_every_straitd_and_bad_values_are_refused(
        straitd, tmp_path, option, good, line, bad, said):
    r = launch(straitd, tmp_path / "ok", [sys.executable, "-c", "print('RAN')"], ranks=1,
               extra=(option, good))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("RAN") == 2, r.stdout + r.stderr
    configs = sorted(p for p in os.listdir(tmp_path / "ok") if p.endswith(".toml"))
    assert len(configs) == 2, configs
    for name in configs:
        with open(tmp_path / "ok" / name) as f:
            assert line in f.read(), name
    r = launch(straitd, tmp_path / "bad", [sys.executable, "-c", "print('RAN')"], ranks=1,
               extra=(option, bad), timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "RAN" not in r.stdout
    assert "strait.launch: cannot start the straitds" in r.stderr, r.stderr
    assert all(w in r.stderr for w in said) and "Traceback" not in r.stderr, r.stderr


def test_launch_with_one_straitd_per_region_serves_both_ranks_shards(library, straitd,
                                                                     tmp_path):
    # --straitds-per-region 1: one straitd per region serves the shards of both its ranks
    # behind one socket; the hook's steps go through it and every rank ends identical.
    log = tmp_path / "run.json"
    r = launch(straitd, tmp_path / "gw",
               [sys.executable, EXAMPLE, "--hook", "strait", "--compression", "int8,ef",
                "--steps", "12", "--quiet", "--log", str(log)],
               extra=("--straitds-per-region", "1"))
    assert r.returncode == 0, r.stdout + r.stderr
    configs = sorted(p for p in os.listdir(tmp_path / "gw") if p.endswith(".toml"))
    assert configs == ["straitd_r0_0.toml", "straitd_r1_0.toml"], configs
    for name in configs:
        with open(tmp_path / "gw" / name) as f:
            assert 'shards = "0-1"' in f.read(), name
    import json
    assert json.loads(log.read_text())["identical"]
    # A count that does not divide the ranks is refused in one line before anything starts.
    r = run_launch(["--ranks", "2", "--straitds-per-region", "3", "--straitd", straitd, "--",
                    sys.executable, "-c", "print('RAN')"])
    one_line_error(r, "strait.launch: --straitds-per-region 3: give a divisor of --ranks 2")
    assert "RAN" not in r.stdout


def test_launch_without_a_straitd_says_where_it_looked(tmp_path):
    # A setup problem is one line naming what to fix, exit status 2, and no rank runs.
    for straitd_env, expect in ((str(tmp_path / "nowhere"), "$STRAITD is"),
                                (None, "straitd not found (looked at")):
        e = env()
        e.pop("STRAITD", None)
        if straitd_env:
            e["STRAITD"] = straitd_env
        else:  # no build tree under the working directory, nothing on PATH
            e["PATH"] = str(tmp_path)
            e["PYTHONPATH"] = str(tmp_path / "site")
            shutil.copytree(os.path.join(ROOT, "python", "strait"), tmp_path / "site" / "strait",
                            ignore=shutil.ignore_patterns("__pycache__"))
        r = subprocess.run([sys.executable, "-m", "strait.launch", "--regions", "2", "--ranks",
                            "1", "--", sys.executable, "-c", "print('RAN')"], env=e,
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "RAN" not in r.stdout
        assert r.stderr.startswith("strait.launch: cannot start the straitds: " + expect), r.stderr
        assert "Traceback" not in r.stderr, r.stderr


def run_launch(args, timeout=60):
    return subprocess.run([sys.executable, "-m", "strait.launch", *args], env=env(),
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(r, start):
    # A usage problem: exit 2 and a single line on stderr naming it, not a traceback.
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(start) and r.stderr.count("\n") == 1, r.stderr


def test_launch_refuses_a_workdir_it_cannot_use(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for workdir, why in ((afile, "it exists and is not a directory"),
                         (afile / "sub", "Not a directory"),
                         ("/proc/strait-nope", "No such file or directory")):
        r = run_launch(["--no-gateways", "--regions", "1", "--ranks", "1", "--workdir",
                        str(workdir), "--", sys.executable, "-c", "print('RAN')"])
        one_line_error(r, f"strait.launch: cannot use --workdir {workdir}: {why}; name a "
                          "directory")
        assert "RAN" not in r.stdout


def test_launch_says_when_the_command_cannot_run(straitd, tmp_path):
    r = run_launch(["--no-gateways", "--regions", "1", "--ranks", "1", "--",
                    str(tmp_path / "nonexistent-cmd")])
    one_line_error(r, f"strait.launch: cannot run {tmp_path / 'nonexistent-cmd'}: No such file "
                      "or directory; check the command after --")
    # With straitds already up, they are stopped too: nothing of the launch outlives it.
    workdir = tmp_path / "gw"
    r = launch(straitd, workdir, [str(tmp_path / "nonexistent-cmd")], ranks=1, timeout=60)
    one_line_error(r, "strait.launch: cannot run ")
    assert any(name.endswith(".toml") for name in os.listdir(workdir)), "no straitd started"
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(workdir).encode() in f.read():
                    left.append(pid)
        except OSError:
            continue
    assert not left, f"processes of the launch still running: {left}"


def test_launch_with_one_region_needs_no_gateways(tmp_path):
    # The straitds reduce across regions: one region has no peer, so it is refused at parse
    # time; plain DDP (--no-gateways) in one region is fine.
    r = run_launch(["--regions", "1", "--ranks", "1", "--", sys.executable, "-c",
                    "print('RAN')"])
    # One line like the launch's other setup errors, not argparse's usage block above it.
    one_line_error(r, "strait.launch: --regions 1: the straitds' cross-region all-reduce needs "
                      "at least 2 regions")
    assert "RAN" not in r.stdout and "--no-gateways" in r.stderr, r.stderr
    r = run_launch(["--no-gateways", "--regions", "1", "--ranks", "1", "--", sys.executable,
                    "-c", "print('RAN')"])
    assert r.returncode == 0 and r.stdout.count("RAN") == 1, r.stdout + r.stderr


def test_launch_refuses_bad_arguments_in_one_line():
    for args, start in ((["--regions", "x", "--", "true"],
                         "strait.launch: argument --regions: invalid int value: 'x'; see "
                         "python3 -m strait.launch --help"),
                        (["--bogus", "--", "true"], "strait.launch: unrecognized arguments: "
                                                    "--bogus"),
                        (["--regions", "0", "--", "true"], "strait.launch: --regions 0 --ranks "
                                                           "2: both must be at least 1"),
                        (["--regions", "2"], "strait.launch: no command given: put it after --")):
        one_line_error(run_launch(args), start)


def test_training_example_without_a_launcher_says_how_to_run_it(tmp_path):
    e = env()
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"):
        e.pop(v, None)
    r = subprocess.run([sys.executable, EXAMPLE, "--hook", "none"], env=e, capture_output=True,
                       text=True, timeout=60)
    one_line_error(r, "train_ddp: error: $RANK, $WORLD_SIZE, $MASTER_ADDR, $MASTER_PORT not "
                      "set")
    assert "python3 -m strait.launch --regions 2 --ranks 2" in r.stderr, r.stderr
    assert "torchrun" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, EXAMPLE, "--hook", "none"], capture_output=True,
                       env=dict(e, RANK="0", WORLD_SIZE="two", MASTER_ADDR="127.0.0.1",
                                MASTER_PORT="1"), text=True, timeout=60)
    one_line_error(r, "train_ddp: error: $WORLD_SIZE='two' is not a whole number")


def test_training_example_refuses_run_logs_without_plot_and_bad_options(tmp_path):
    # Training ignores positional run logs: given without --plot they are refused (before the
    # launcher's variables are looked at), not silently dropped. A bad option is one line too.
    e = env()
    for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(v, None)
    for args, start in ((["run_none.json", "run_int8.json"],
                         "train_ddp: error: run logs given without --plot (run_none.json "
                         "run_int8.json): they are only read with --plot; plot them with "
                         "train_ddp.py --plot OUT.png"),
                        (["--hook", "none", "300"], "train_ddp: error: run logs given without "
                                                    "--plot (300)"),
                        (["--hook", "gloo"], "train_ddp: error: argument --hook: invalid "
                                             "choice: 'gloo'"),
                        (["--coalesce-mb", "-1"], "train_ddp: error: --coalesce-mb -1.0: give "
                                                  "MiB >= 0"),
                        (["--steps", "0"], "train_ddp: error: --steps 0: give a number of "
                                           "steps >= 1")):
        r = subprocess.run([sys.executable, EXAMPLE, *args], env=e, cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
        one_line_error(r, start)
        assert r.stdout == "", r.stdout


def test_training_example_plot_refuses_bad_run_logs(tmp_path):
    png = tmp_path / "loss.png"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text('{"steps": []}')
    for runs, start in (([tmp_path / "missing.json"],
                         f"cannot read run log {tmp_path / 'missing.json'}: No such file"),
                        ([bad], f"{bad} is not valid JSON"),
                        ([other], f"{other} is not a run log written by --log: it has no "
                                  "'label'"),
                        ([], "--plot: no runs given")):
        r = subprocess.run([sys.executable, EXAMPLE, "--plot", str(png), *map(str, runs)],
                           env=env(), capture_output=True, text=True, timeout=60)
        one_line_error(r, "train_ddp: error: " + start)
        assert not png.exists()


def test_launch_gives_each_rank_one_thread_unless_told_otherwise():
    # Like torchrun with several processes per node: ranks sharing the machine's cores get
    # OMP_NUM_THREADS=1 (torch's and OpenBLAS's pools), and a value the user set is kept.
    # One write(2) per rank: the ranks share the pipe, and print() may write the text and its
    # newline apart (unbuffered), interleaving two ranks' lines.
    show = [sys.executable, "-c", "import os; os.write(1, ('OMP=' + os.environ.get("
                                  "'OMP_NUM_THREADS', 'unset') + '\\n').encode())"]
    base = {k: v for k, v in env().items() if k != "OMP_NUM_THREADS"}
    for extra, ranks, want in (({}, "2", ["OMP=1"] * 2), ({"OMP_NUM_THREADS": "3"}, "2",
                                                          ["OMP=3"] * 2),
                               ({}, "1", ["OMP=unset"])):
        r = subprocess.run([sys.executable, "-m", "strait.launch", "--no-gateways", "--regions",
                            "1", "--ranks", ranks, "--", *show], env=dict(base, **extra),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert sorted(r.stdout.split()) == want, r.stdout

