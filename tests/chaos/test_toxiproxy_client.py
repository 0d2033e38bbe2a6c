"""The checked wrapper ``chaos.toxiproxy.client``: it raises where toxiproxy-python swallows a
failure (docs/toxiproxy.md), addresses proxies by name, updates toxics, and honours TOXIPROXY_URL.
Also the embedded server's ``-config`` loading.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.toxiproxy import ToxiproxyServer
from chaos.toxiproxy.client import (
    DEFAULT_URL,
    ENV_URL,
    ToxiproxyApiError,
    ToxiproxyClient,
    listen_address,
    resolve_url,
)
from chaos.toxiproxy.testing import EchoServer, connect, recv_exactly, toxiproxy_api

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def env():
    with toxiproxy_api() as url, EchoServer() as echo:
        yield url, echo.upstream


@pytest.fixture()
def client(env):
    client = ToxiproxyClient(env[0])
    client.destroy_all()
    yield client
    client.destroy_all()


@pytest.fixture()
def upstream(env):
    return env[1]


def test_url_comes_from_argument_then_environment_then_default(monkeypatch, env):
    monkeypatch.delenv(ENV_URL, raising=False)
    assert resolve_url() == DEFAULT_URL
    monkeypatch.setenv(ENV_URL, env[0])
    assert resolve_url() == env[0] and resolve_url("http://h:1") == "http://h:1"
    assert ToxiproxyClient().version().startswith("2.")


def test_bind_failure_raises_instead_of_key_error(client, upstream):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        listen = f"127.0.0.1:{busy.getsockname()[1]}"
        with pytest.raises(ToxiproxyApiError) as raised:
            client.create_proxy("busy", upstream, listen=listen)
    assert raised.value.status == 500 and "address already in use" in raised.value.message
    with pytest.raises(NotFound):
        client.get_proxy("busy")


def test_enable_failure_raises_and_state_is_reread(client, upstream):
    proxy = client.create_proxy("p", upstream)
    client.disable("p")
    # someone else took the port meanwhile
    with socket.create_server(listen_address(proxy)), pytest.raises(ToxiproxyApiError) as raised:
        client.enable("p")
    assert raised.value.status == 500
    assert client.get_proxy("p").enabled is False


def test_client_errors_keep_toxiproxy_python_exceptions(client, upstream):
    client.create_proxy("p", upstream)
    with pytest.raises(ProxyExists):
        client.create_proxy("p", upstream)
    with pytest.raises(InvalidToxic):
        client.add_toxic("p", "latency", stream="sideways")
    with pytest.raises(NotFound):
        client.remove_toxic("p", "nope")


def test_toxic_add_update_remove_round_trip(client, upstream):
    proxy = client.create_proxy("p", upstream)
    added = client.add_toxic("p", "latency", attributes={"latency": 300, "jitter": 10})
    assert (added.name, added.attributes) == ("latency_downstream", {"latency": 300,
                                                                     "jitter": 10})
    updated = client.update_toxic("p", "latency_downstream", attributes={"latency": 0},
                                  toxicity=0.25)
    assert updated.attributes == {"latency": 0, "jitter": 10} and updated.toxicity == 0.25
    assert set(client.toxics("p")) == {"latency_downstream"}
    client.remove_toxic("p", "latency_downstream")
    assert client.toxics("p") == {}
    with connect(listen_address(proxy)) as sock:
        sock.sendall(b"ok")
        assert recv_exactly(sock, 2) == b"ok"


def test_down_populate_and_reset(client, upstream):
    created = client.populate([{"name": "a", "upstream": upstream, "listen": "127.0.0.1:0"},
                               {"name": "b", "upstream": upstream, "enabled": False}])
    assert [p.name for p in created] == ["a", "b"]
    with client.down("a"):
        assert client.get_proxy("a").enabled is False
    assert client.get_proxy("a").enabled is True
    client.reset()
    assert all(p.enabled for p in client.proxies().values())
    client.delete_proxy("b")
    assert list(client.proxies()) == ["a"]


def test_config_file_is_loaded_at_start(tmp_path):
    config = tmp_path / "proxies.json"
    config.write_text(json.dumps([{"name": "cfg", "upstream": "127.0.0.1:9",
                                   "listen": "127.0.0.1:0"}]))

    async def scenario() -> list[str]:
        server = ToxiproxyServer("127.0.0.1", 0, config_path=str(config))
        await server.start()
        try:
            return sorted(server.registry.proxies)
        finally:
            await server.stop()

    assert asyncio.run(scenario()) == ["cfg"]
