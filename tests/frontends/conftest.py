"""The gRPC tests' cluster: a NameServer and a 3-node group started as ``dledger up`` starts them
(every node with ``--grpc-listen``), once every node's gRPC address is registered."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clusters import namesrv_group
from tests.frontends.endpoints import grpc_endpoints


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with namesrv_group(tmp_path, "--grpc-listen", "127.0.0.1:0",
                       "--grpc-max-delivery-attempts", "3", "--transaction-timeout-s", "1",
                       "--transaction-check-interval-s", "1") as (ns, _group):
        deadline = time.monotonic() + 30
        while grpc_endpoints(ns).count(";") < 2:
            assert time.monotonic() < deadline, "the nodes' gRPC addresses were not registered"
            time.sleep(0.1)  # (polling the NameServer: a condition with a deadline)
        yield ns, grpc_endpoints(ns)
