"""The gRPC tests' cluster: a NameServer and a 3-node group started as ``dledger up`` starts them
(every node with ``--grpc-listen``), once every node's gRPC address is registered: ``cluster``
for one test, ``module_cluster`` shared by a module's tests (each on topics of its own)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.localcluster import LocalCluster
from tests.clusters import namesrv_group
from tests.frontends.endpoints import grpc_endpoints


@contextlib.contextmanager
def _grpc_group(base: Path) -> Iterator[tuple[str, str, LocalCluster]]:
    with namesrv_group(base, "--grpc-listen", "127.0.0.1:0",
                       "--grpc-max-delivery-attempts", "3", "--transaction-timeout-s", "1",
                       "--transaction-check-interval-s", "1") as (ns, group):
        deadline = time.monotonic() + 30
        while grpc_endpoints(ns).count(";") < 2:
            assert time.monotonic() < deadline, "the nodes' gRPC addresses were not registered"
            time.sleep(0.1)  # (polling the NameServer: a condition with a deadline)
        yield ns, grpc_endpoints(ns), group


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with _grpc_group(tmp_path) as (ns, endpoints, _):
        yield ns, endpoints


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[str, str, LocalCluster]]:
    """(NameServer, every node's gRPC address ``;``-joined, the group's processes)."""
    with _grpc_group(tmp_path_factory.mktemp("grpc")) as found:
        yield found
