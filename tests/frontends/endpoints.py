"""The gRPC addresses a user gives the RocketMQ 5 client, read from the NameServer."""

from __future__ import annotations

import json
import urllib.request


def grpc_endpoints(ns: str) -> str:
    """Every node's gRPC address as the NameServer lists it: what a user gives the client."""
    with urllib.request.urlopen(f"http://{ns}/v1/cluster", timeout=5) as resp:
        groups = json.loads(resp.read())["groups"]
    return ";".join(n["grpc_address"] for g in groups for n in g["nodes"] if "grpc_address" in n)


def node_grpc_endpoints(ns: str) -> dict[str, str]:
    """Each node's gRPC address by node id, as the NameServer lists them."""
    with urllib.request.urlopen(f"http://{ns}/v1/cluster", timeout=5) as resp:
        groups = json.loads(resp.read())["groups"]
    return {n["node_id"]: n["grpc_address"] for g in groups for n in g["nodes"]
            if "grpc_address" in n}
