# scripts/*.sh as a new user meets them: --help prints what the script does and exits 0, a bad
# argument is one line and exit 2, and neither installs nor builds anything; the arguments the
# scripts pass on (demo.sh to strait-bench codec, tsan.sh to ctest) still get through. Stubs of
# apt-get, dpkg-query, cmake, ctest and sudo first on PATH record any call (and fail it), so a
# mistake here runs nothing real.
import os
import re
import subprocess

import pytest

from conftest import ROOT

SCRIPTS = ("demo", "setup", "test", "tsan")
STUBS = ("apt-get", "dpkg-query", "cmake", "ctest", "sudo", "nproc", "clang")


@pytest.fixture
def run(tmp_path):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "calls"
    for name in STUBS:
        stub = stubs / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >>"{calls}"\nexit 1\n')
        stub.chmod(0o755)

    def run(script, *args):
        env = dict(os.environ, PATH=f"{stubs}{os.pathsep}/usr/bin{os.pathsep}/bin")
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", script + ".sh"), *args],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
        ran = calls.read_text().splitlines() if calls.exists() else []
        if calls.exists():
            calls.unlink()
        return r, ran
    return run


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_says_what_the_script_does_and_runs_nothing(run, script):
    for flag in ("--help", "-h"):
        r, ran = run(script, flag)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert ran == [], f"{script}.sh {flag} ran {ran}"
        text = r.stdout
        assert f"scripts/{script}.sh --help" in text and "#!" not in text, text
        assert re.search(r"\d+ (s|min|minutes)\b", text), f"no duration in:\n{text}"
        assert "environment variable" in text or "TSAN_OPTIONS" in text, text
        assert "nstall" in text, text  # every script installs what is missing (setup.sh)


@pytest.mark.parametrize("script,args", [
    ("setup", ["--bogus"]), ("setup", ["all"]), ("test", ["--bogus"]), ("test", ["ci"]),
    ("demo", ["--bogus"]), ("demo", ["16MiB"]), ("demo", ["--size"]),
    ("demo", ["--iters", "3", "stray"]), ("tsan", ["Tunnel"]), ("tsan", ["-R", "a", "b"])])
def test_a_bad_argument_is_one_line_and_runs_nothing(run, script, args):
    r, ran = run(script, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"{script}.sh: ") and f"scripts/{script}.sh --help" in r.stderr
    assert ran == [], f"{script}.sh {' '.join(args)} ran {ran}"


@pytest.mark.parametrize("script,args", [
    ("setup", []), ("test", []), ("demo", []), ("demo", ["--size", "1MiB", "--json"]),
    ("demo", ["--codecs=int8", "--iters", "2"]), ("tsan", []), ("tsan", ["-R", "Tunnel"]),
    ("tsan", ["-R", "Tunnel", "--output-on-failure", "-j", "2"])])
def test_arguments_the_scripts_take_get_past_the_check(run, script, args):
    # The stubs fail setup.sh's first step: reaching it is what is checked.
    r, ran = run(script, *args)
    assert r.returncode not in (0, 2), r.stdout + r.stderr
    assert ran and ran[0].startswith("dpkg-query "), (ran, r.stderr)


def test_demo_knows_every_option_of_strait_bench_codec():
    # demo.sh checks its extra arguments against a copy of strait-bench codec's options: a new
    # option there must be added to it (or a user's valid option is refused before the build).
    with open(os.path.join(ROOT, "bench", "codec_bench_cli.cc")) as f:
        bench = set(re.findall(r'add_option\("(--[a-z0-9-]+)"', f.read()))
    with open(os.path.join(ROOT, "scripts", "demo.sh")) as f:
        m = re.search(r"codec_options=\(([^)]*)\)", f.read())
    demo = set(m.group(1).split())
    assert bench and bench <= demo, f"missing from demo.sh's codec_options: {bench - demo}"
