"""Real engines for the conversion tests, started once per session and bound to 127.0.0.1 only.

moto's S3 server starts first, so the engines' worker processes inherit its endpoint and
credentials from the environment.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astream.testing import moto_s3

from .convertkit import write_parquet

ROWS = 48


@pytest.fixture(scope="session")
def s3() -> Iterator[Any]:
    """A botocore client of moto's S3 server on 127.0.0.1 (environment set for every process)."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    # The engines' worker processes import the tests' helpers (udfs) by module name.
    tests = str(Path(__file__).resolve().parent.parent)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tests, saved) if p)
    try:
        with moto_s3(None) as client:
            yield client
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="session")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROWS rows of every supported type in two Parquet files."""
    return write_parquet(tmp_path_factory.mktemp("parquet"), ROWS)


@pytest.fixture(scope="session")
def spark(s3: Any) -> Iterator[Any]:
    """Spark in local mode with two threads and task retries (local[N] alone never retries)."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime (.ci/run installs openjdk-17-jre-headless)")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,2]").appName("astream-convert-tests")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false").config("spark.task.maxFailures", "2")
        .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def dask_client(s3: Any) -> Iterator[Any]:
    """A Dask LocalCluster of two worker processes on 127.0.0.1."""
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    with LocalCluster(processes=True, n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


def loopback_only() -> bool:
    """Whether this process's network namespace has no interface but ``lo``."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


@pytest.fixture(scope="session")
def ray_session(s3: Any) -> Iterator[Any]:
    """Ray on two CPUs, no dashboard, inside a network namespace that has only loopback.

    Ray's GCS, raylet and workers listen on every interface whatever ``_node_ip_address``
    says, so its tests run only where nothing but ``lo`` exists: test_ray_netns.py starts
    them in such a namespace (``unshare -n``).
    """
    ray = pytest.importorskip("ray")
    if not loopback_only():
        pytest.skip("Ray listens on all interfaces: these tests run in a loopback-only namespace (test_ray_netns.py)")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    yield ray
    ray.shutdown()


def kill_first_attempt(marker_dir: str, key: str) -> None:
    """Kill this process the first time ``key`` gets here (a marker file remembers it)."""
    marker = os.path.join(marker_dir, key)
    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os._exit(17)
