# Shared fixtures of the Python tests: the built libstrait.so (fail, not skip, when it is missing:
# CI must run these), the straitd binary, and straitd sets on loopback (strait.cluster).
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

# A lossy codec must apply to the tests' small shards: min_lossy_bytes far below them.
TEST_POLICY = ('allowed_codecs = ["none", "zstd", "int8", "int4", "fp8"]\n'
               'max_relative_error = 1.0\nmin_lossy_bytes = "1KiB"\n')


def _find_library():
    env = os.environ.get("STRAIT_LIBRARY")
    if env:
        return env
    for preset in ("release", "ci", "dev", "asan"):
        p = os.path.join(ROOT, "build", preset, "lib", "api", "libstrait.so")
        if os.path.exists(p):
            return p
    return None


LIBRARY = _find_library()
if LIBRARY is not None:
    os.environ["STRAIT_LIBRARY"] = LIBRARY  # for the package and every subprocess


@pytest.fixture(scope="session")
def library():
    if LIBRARY is None or not os.path.exists(LIBRARY):
        pytest.fail("libstrait.so not found: build strait_api (build/<preset>/lib/api) or set "
                    "STRAIT_LIBRARY")
    return LIBRARY


@pytest.fixture(scope="session")
def straitd():
    from strait import cluster
    try:
        return cluster.find_straitd(ROOT)
    except FileNotFoundError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def gateways(library, straitd, tmp_path_factory):
    """2 regions x 2 straitds (shard 0 and 1) on loopback, for the module's tests."""
    from strait import cluster
    g = cluster.Gateways(straitd, regions=2, shards=2, workdir=str(tmp_path_factory.mktemp("gw")),
                         policy=TEST_POLICY, deadline="20s")
    g.start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def node_gateways(library, straitd, tmp_path_factory):
    """2 regions x ONE straitd serving shards 0 and 1 (config `shards`) on loopback."""
    from strait import cluster
    g = cluster.Gateways(straitd, regions=2, shards=2, per_gateway=2,
                         workdir=str(tmp_path_factory.mktemp("nodegw")), policy=TEST_POLICY,
                         deadline="20s")
    g.start()
    yield g
    g.stop()
