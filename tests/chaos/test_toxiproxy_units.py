"""Pure pieces of the Toxiproxy-compatible server: slicing, float32 toxicity, addresses."""

from __future__ import annotations

import random

import pytest

from chaos.toxiproxy.behaviours import slice_sizes
from chaos.toxiproxy.errors import ListenError
from chaos.toxiproxy.proxy import join_host_port, split_host_port
from chaos.toxiproxy.toxics import float32_json, to_float32


@pytest.mark.parametrize("length, average, variation", [
    (1, 1, 0), (100, 10, 0), (32768, 10, 5), (1000, 300, 299), (7, 100, 50),
])
def test_slice_sizes_cover_the_chunk_in_small_pieces(length, average, variation):
    sizes = slice_sizes(length, average, variation, random.Random(length))
    assert sum(sizes) == length and all(size >= 1 for size in sizes)
    assert all(size <= average + variation for size in sizes)


def test_float32_toxicity_serialises_like_go():
    assert float32_json(to_float32(1.0)) == 1 and isinstance(float32_json(1.0), int)
    assert float32_json(to_float32(0.2)) == 0.2
    assert float32_json(to_float32(0.1234567)) == 0.1234567


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:0", ("::1", 0)), (":8474", ("", 8474)),
    ("", ("", 0)), ("localhost:22222", ("localhost", 22222)),
])
def test_split_host_port(address, expected):
    assert split_host_port(address) == expected


@pytest.mark.parametrize("address", ["127.0.0.1", "::1:80", "h:port", "h:70000"])
def test_split_host_port_rejects_bad_addresses(address):
    with pytest.raises(ListenError):
        split_host_port(address)


def test_join_host_port_brackets_ipv6():
    assert join_host_port("::", 5) == "[::]:5" and join_host_port("10.0.0.1", 5) == "10.0.0.1:5"
