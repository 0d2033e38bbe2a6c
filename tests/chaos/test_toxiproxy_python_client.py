"""Every call of toxiproxy-python 0.1.1 (the PyPI client, used as is) against our server.

The checklist is docs/toxiproxy.md: each result is what a real Toxiproxy 2.x gives. Set
TOXIPROXY_URL to run the same tests against a real Toxiproxy instead of the embedded one.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest
from toxiproxy import Proxy, Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists
from toxiproxy.utils import can_connect_to

from chaos.toxiproxy.client import listen_address
from chaos.toxiproxy.testing import EchoServer, connect, free_port, recv_exactly, toxiproxy_api

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server():
    with toxiproxy_api() as url, EchoServer() as echo:
        parts = urlsplit(url)
        Toxiproxy().update_api_consumer(parts.hostname, parts.port)
        yield Toxiproxy(), echo


@pytest.fixture()
def toxiproxy(server):
    client, _ = server
    client.destroy_all()
    yield client
    client.destroy_all()


@pytest.fixture()
def upstream(server):
    return server[1].upstream


def test_running_and_version_bytes(toxiproxy):
    assert toxiproxy.running() is True
    version = toxiproxy.version()
    assert isinstance(version, bytes) and version.endswith(b"\n")
    assert json.loads(version)["version"].startswith("2.")


def test_create_binds_a_real_port_and_forwards(toxiproxy, upstream):
    proxy = toxiproxy.create(upstream=upstream, name="echo")
    assert isinstance(proxy, Proxy) and proxy.enabled is True and proxy.upstream == upstream
    host, port = listen_address(proxy)
    assert port != 0 and can_connect_to(host, port)
    with connect((host, port)) as sock:
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"


def test_create_disabled_echoes_listen_unchanged(toxiproxy, upstream):
    listen = f"127.0.0.1:{free_port()}"
    proxy = toxiproxy.create(upstream=upstream, name="off", listen=listen, enabled=False)
    assert proxy.listen == listen and proxy.enabled is False
    assert toxiproxy.get_proxy("off").enabled is False


def test_create_existing_name_raises_proxy_exists(toxiproxy, upstream):
    toxiproxy.create(upstream=upstream, name="dup")
    with pytest.raises(ProxyExists):  # the client-side check
        toxiproxy.create(upstream=upstream, name="dup")
    with pytest.raises(ProxyExists) as raised:  # the server's 409, as a raw POST
        APIConsumer.post("/proxies", json={"name": "dup", "upstream": upstream})
    assert json.loads(raised.value.args[0])["error"] == "proxy already exists"


def test_proxies_and_get_proxy(toxiproxy, upstream):
    toxiproxy.create(upstream=upstream, name="b")
    toxiproxy.create(upstream=upstream, name="a")
    assert sorted(toxiproxy.proxies()) == ["a", "b"]
    assert toxiproxy.get_proxy("a").name == "a"
    assert toxiproxy.get_proxy("missing") is None


def test_disable_enable_and_down_keep_the_port(toxiproxy, upstream):
    proxy = toxiproxy.create(upstream=upstream, name="flap")
    host, port = listen_address(proxy)
    proxy.disable()
    assert proxy.enabled is False and not can_connect_to(host, port)
    proxy.enable()
    assert proxy.enabled is True and can_connect_to(host, port)
    assert toxiproxy.get_proxy("flap").listen == proxy.listen
    with proxy.down():
        assert not can_connect_to(host, port)
        assert toxiproxy.get_proxy("flap").enabled is False
    assert can_connect_to(host, port)


def test_add_get_and_destroy_toxic(toxiproxy, upstream):
    proxy = toxiproxy.create(upstream=upstream, name="tox")
    assert proxy.add_toxic(type="latency", attributes={"latency": 123}) is None
    toxic = proxy.get_toxic("latency_downstream")
    assert toxic.attributes == {"latency": 123, "jitter": 0}
    assert (toxic.type, toxic.stream, toxic.toxicity) == ("latency", "downstream", 1)
    proxy.add_toxic(type="timeout", stream="upstream", name="hole", toxicity=0.5,
                    attributes={"timeout": 0})
    assert set(proxy.toxics()) == {"latency_downstream", "hole"}
    assert proxy.get_toxic("hole").toxicity == 0.5
    assert proxy.get_toxic("nope") is None
    assert proxy.destroy_toxic("latency_downstream") is True
    assert proxy.destroy_toxic("hole") is True
    assert proxy.toxics() == {}
    with pytest.raises(NotFound):
        proxy.destroy_toxic("hole")


def test_bad_toxics_raise_the_client_exceptions(toxiproxy, upstream):
    proxy = toxiproxy.create(upstream=upstream, name="bad")
    with pytest.raises(InvalidToxic) as raised:
        proxy.add_toxic(type="latency", stream="sideways")
    assert b"stream was invalid" in raised.value.args[0]
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="down")
    proxy.add_toxic(type="latency")
    with pytest.raises(ProxyExists):  # 409 for a duplicate toxic name
        proxy.add_toxic(type="latency")


def test_reset_enables_and_clears_toxics(toxiproxy, upstream):
    proxy = toxiproxy.create(upstream=upstream, name="r")
    proxy.add_toxic(type="latency", attributes={"latency": 10})
    proxy.disable()
    assert toxiproxy.reset() is True
    after = toxiproxy.get_proxy("r")
    assert after.enabled is True and after.toxics() == {}
    assert can_connect_to(*listen_address(after))


def test_destroy_destroy_all_and_not_found(toxiproxy, upstream):
    proxy = toxiproxy.create(upstream=upstream, name="gone")
    assert toxiproxy.destroy("gone") is False  # only Proxy objects are accepted (bug 2.4.2)
    assert toxiproxy.destroy(proxy) is True
    assert "gone" not in toxiproxy.proxies()
    with pytest.raises(NotFound):
        proxy.destroy()
    toxiproxy.create(upstream=upstream, name="x")
    toxiproxy.create(upstream=upstream, name="y")
    toxiproxy.destroy_all()
    assert toxiproxy.proxies() == {}


def test_populate_creates_then_keeps_identical_entries(toxiproxy, upstream):
    listen = f"127.0.0.1:{free_port()}"
    created = toxiproxy.populate([{"name": "pop", "upstream": upstream, "listen": listen}])
    assert [p.name for p in created] == ["pop"] and created[0].listen == listen
    toxiproxy.get_proxy("pop").add_toxic(type="latency")
    assert toxiproxy.populate([{"name": "pop", "upstream": upstream, "listen": listen}]) == []
    assert set(toxiproxy.get_proxy("pop").toxics()) == {"latency_downstream"}


def test_unknown_path_raises_not_found_with_go_body(toxiproxy):
    with pytest.raises(NotFound) as raised:
        APIConsumer.get("/nope")
    assert raised.value.args[0] == b"404 page not found\n"
