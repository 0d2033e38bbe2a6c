"""Golden tests of the HTTP API: status code, headers and body shape of every endpoint and error,
as docs/toxiproxy.md gives them for Toxiproxy 2.12 (error strings as upstream api_test.go
asserts them). Runs against $TOXIPROXY_URL when set, else an embedded server.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import requests

from chaos.toxiproxy.client import ENV_URL
from chaos.toxiproxy.testing import EchoServer, free_port, toxiproxy_api

pytestmark = pytest.mark.timeout(60)
TIMEOUT_S = 10


@pytest.fixture(scope="module")
def env():
    with toxiproxy_api() as url, EchoServer() as echo:
        yield url, echo.upstream


@pytest.fixture()
def api(env):
    url, _ = env
    session = requests.Session()

    def call(method, path, body=None, raw=None, headers=None):
        data = raw if raw is not None else (None if body is None else json.dumps(body))
        return session.request(method, url + path, data=data, headers=headers, timeout=TIMEOUT_S)

    for name in call("GET", "/proxies").json():
        call("DELETE", f"/proxies/{name}")
    yield call
    call("POST", "/reset")
    for name in call("GET", "/proxies").json():
        call("DELETE", f"/proxies/{name}")
    session.close()


@pytest.fixture()
def upstream(env):
    return env[1]


def error_of(response) -> tuple[int, dict]:
    assert response.text.endswith("\n")
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    return response.status_code, response.json()


def make(api, upstream, name="p", **extra):
    response = api("POST", "/proxies", {"name": name, "upstream": upstream,
                                        "listen": "127.0.0.1:0", **extra})
    assert response.status_code == 201, response.text
    return response.json()


def test_list_and_create_proxy_shapes(api, upstream):
    empty = api("GET", "/proxies")
    assert (empty.status_code, empty.text) == (200, "{}")
    assert empty.headers["Content-Type"].startswith("application/json")
    assert "X-Toxiproxy-Request-Id" in empty.headers
    created = make(api, upstream, name="b")
    assert list(created) == ["name", "listen", "upstream", "enabled", "toxics"]
    assert created["toxics"] == [] and created["enabled"] is True
    assert created["listen"].startswith("127.0.0.1:") and not created["listen"].endswith(":0")
    make(api, upstream, name="a")
    listed = api("GET", "/proxies")
    assert list(listed.json()) == ["a", "b"] and listed.json()["b"] == created
    assert " " not in listed.text  # compact JSON


@pytest.mark.parametrize("raw, message", [
    ("", "bad request body: EOF"),
    ('{"upstream": "127.0.0.1:1"}', "missing required field: name"),
    ('{"name": "x"}', "missing required field: upstream"),
    ('{"name": "", "upstream": ""}', "missing required field: name"),
])
def test_create_proxy_bad_requests(api, raw, message):
    assert error_of(api("POST", "/proxies", raw=raw)) == (400, {"error": message, "status": 400})


def test_create_proxy_type_mismatch_is_bad_body(api, upstream):
    status, body = error_of(api("POST", "/proxies", {"name": 5, "upstream": upstream}))
    assert status == 400 and body["error"].startswith("bad request body: ")


def test_create_duplicate_is_409_and_bind_failure_500(api, upstream):
    make(api, upstream, name="dup")
    dup = api("POST", "/proxies", {"name": "dup", "upstream": upstream})
    assert error_of(dup) == (409, {"error": "proxy already exists", "status": 409})
    with socket.create_server(("127.0.0.1", 0)) as busy:
        listen = f"127.0.0.1:{busy.getsockname()[1]}"
        status, body = error_of(api("POST", "/proxies", {"name": "busy", "upstream": upstream,
                                                         "listen": listen}))
    assert status == 500 and body["status"] == 500
    assert body["error"] == f"listen tcp {listen}: bind: address already in use"
    assert api("GET", "/proxies/busy").status_code == 404


def test_get_update_and_delete_proxy(api, upstream):
    created = make(api, upstream)
    assert api("GET", "/proxies/p").json() == created
    missing = api("GET", "/proxies/zz")
    assert error_of(missing) == (404, {"error": "proxy not found", "status": 404})
    disabled = api("POST", "/proxies/p", {"enabled": False, "name": "ignored"})
    assert disabled.status_code == 200
    assert disabled.json() == {**created, "enabled": False}
    enabled = api("PATCH", "/proxies/p", {"enabled": True})
    assert enabled.status_code == 200 and enabled.json() == created  # same port again
    status, body = error_of(api("PATCH", "/proxies/p", raw=""))
    assert (status, body["error"]) == (400, "bad request body: EOF")
    assert error_of(api("PATCH", "/proxies/zz", {"enabled": False}))[0] == 404
    deleted = api("DELETE", "/proxies/p")
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert error_of(api("DELETE", "/proxies/p")) == (404, {"error": "proxy not found",
                                                           "status": 404})


def test_wildcard_listen_is_reported_like_go(api, upstream):
    created = api("POST", "/proxies", {"name": "w", "upstream": upstream, "listen": ":0"})
    assert created.status_code == 201
    assert created.json()["listen"].startswith("[::]:")


def test_update_proxy_moves_listen_and_keeps_toxics(api, upstream):
    make(api, upstream)
    api("POST", "/proxies/p/toxics", {"type": "latency"})
    listen = f"127.0.0.1:{free_port()}"
    moved = api("PATCH", "/proxies/p", {"listen": listen})
    assert moved.status_code == 200
    assert moved.json()["listen"] == listen and len(moved.json()["toxics"]) == 1


def test_toxic_create_shapes_and_defaults(api, upstream):
    make(api, upstream)
    assert api("GET", "/proxies/p/toxics").text == "[]"
    created = api("POST", "/proxies/p/toxics", {"type": "latency", "attributes": {"latency": 5}})
    assert created.status_code == 200
    assert created.text == ('{"attributes":{"latency":5,"jitter":0},"name":"latency_downstream",'
                            '"type":"latency","stream":"downstream","toxicity":1}')
    odd = api("POST", "/proxies/p/toxics", {"type": "slicer", "stream": "UpStream",
                                            "toxicity": 0.2,
                                            "attributes": {"average_size": 10, "extra": 1}})
    assert odd.json() == {"attributes": {"average_size": 10, "size_variation": 0, "delay": 0},
                          "name": "slicer_UpStream", "type": "slicer", "stream": "UpStream",
                          "toxicity": 0.2}
    listed = api("GET", "/proxies/p/toxics").json()
    assert [t["name"] for t in listed] == ["slicer_UpStream", "latency_downstream"]  # up first
    assert api("GET", "/proxies/p").json()["toxics"] == listed
    for toxic_type in ("noop", "bandwidth", "slow_close", "timeout", "reset_peer", "limit_data"):
        reply = api("POST", "/proxies/p/toxics", {"type": toxic_type, "toxicity": 0})
        assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("body, status, message", [
    (None, 400, "bad request body: EOF"),
    ({"type": "latency", "stream": "sideways"}, 400,
     "stream was invalid, can be either upstream or downstream"),
    ({"type": "down"}, 400, "invalid toxic type"),
    ({"stream": "upstream"}, 400, "invalid toxic type"),
    ({"type": "latency", "name": "taken"}, 409, "toxic already exists"),
    ({"type": "latency", "name": "taken", "stream": "upstream"}, 409, "toxic already exists"),
])
def test_toxic_create_errors(api, upstream, body, status, message):
    make(api, upstream)
    api("POST", "/proxies/p/toxics", {"type": "noop", "name": "taken"})
    reply = api("POST", "/proxies/p/toxics", body) if body else \
        api("POST", "/proxies/p/toxics", raw="")
    assert error_of(reply) == (status, {"error": message, "status": status})


@pytest.mark.parametrize("attributes", [
    {"latency": 100.0}, {"latency": 1e3}, {"latency": "100"}, {"latency": True},
])
def test_toxic_attribute_type_mismatch_is_bad_body(api, upstream, attributes):
    make(api, upstream)
    reply = api("POST", "/proxies/p/toxics", {"type": "latency", "attributes": attributes})
    status, body = error_of(reply)
    assert status == 400 and body["error"].startswith("bad request body: ")


@pytest.mark.skipif(bool(os.environ.get(ENV_URL)), reason="these values crash a real Toxiproxy")
@pytest.mark.parametrize("toxic_type, attributes", [
    ("bandwidth", {"rate": -1}), ("slicer", {}), ("slicer", {"average_size": 4,
                                                             "size_variation": 4}),
])
def test_values_that_crash_go_are_rejected(api, upstream, toxic_type, attributes):
    make(api, upstream)
    reply = api("POST", "/proxies/p/toxics", {"type": toxic_type, "attributes": attributes})
    assert error_of(reply)[0] == 400


def test_toxic_get_update_delete(api, upstream):
    make(api, upstream)
    assert error_of(api("POST", "/proxies/zz/toxics", {"type": "latency"})) == \
        (404, {"error": "proxy not found", "status": 404})
    api("POST", "/proxies/p/toxics", {"type": "latency", "toxicity": 0.5,
                                      "attributes": {"latency": 10, "jitter": 3}})
    got = api("GET", "/proxies/p/toxics/latency_downstream")
    assert got.status_code == 200 and got.json()["attributes"] == {"latency": 10, "jitter": 3}
    assert error_of(api("GET", "/proxies/p/toxics/nope")) == \
        (404, {"error": "toxic not found", "status": 404})
    assert error_of(api("GET", "/proxies/zz/toxics/nope"))[1]["error"] == "proxy not found"
    patched = api("PATCH", "/proxies/p/toxics/latency_downstream",
                  {"attributes": {"latency": 20}, "name": "ignored", "type": "bandwidth"})
    assert patched.status_code == 200
    assert patched.json() == {"attributes": {"latency": 20, "jitter": 3},
                              "name": "latency_downstream", "type": "latency",
                              "stream": "downstream", "toxicity": 0.5}
    posted = api("POST", "/proxies/p/toxics/latency_downstream", {"toxicity": 1.0})
    assert posted.json()["toxicity"] == 1 and posted.json()["attributes"]["latency"] == 20
    assert error_of(api("PATCH", "/proxies/p/toxics/latency_downstream", raw=""))[0] == 400
    deleted = api("DELETE", "/proxies/p/toxics/latency_downstream")
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert error_of(api("DELETE", "/proxies/p/toxics/latency_downstream"))[0] == 404


def test_reset(api, upstream):
    make(api, upstream)
    api("POST", "/proxies/p/toxics", {"type": "latency"})
    api("POST", "/proxies/p", {"enabled": False})
    reply = api("POST", "/reset")
    assert (reply.status_code, reply.content) == (204, b"")
    after = api("GET", "/proxies/p").json()
    assert after["enabled"] is True and after["toxics"] == []


def test_populate(api, upstream):
    listen = f"127.0.0.1:{free_port()}"
    entries = [{"name": "one", "upstream": upstream, "listen": listen},
               {"name": "two", "upstream": upstream, "listen": "127.0.0.1:0", "enabled": False}]
    reply = api("POST", "/populate", entries)
    assert reply.status_code == 201
    proxies = reply.json()["proxies"]
    assert [p["name"] for p in proxies] == ["one", "two"]
    assert proxies[0]["listen"] == listen and proxies[1]["enabled"] is False
    api("POST", "/proxies/one/toxics", {"type": "latency"})
    api("POST", "/proxies/one", {"enabled": False})
    again = api("POST", "/populate", entries[:1])  # identical: left completely untouched
    assert again.status_code == 201
    after = api("GET", "/proxies/one").json()
    assert after["enabled"] is False and len(after["toxics"]) == 1
    assert api("POST", "/populate", []).json() == {"proxies": None}


def test_populate_validates_everything_first(api, upstream):
    entries = [{"name": "ok", "upstream": upstream}, {"upstream": upstream}]
    reply = api("POST", "/populate", entries)
    assert error_of(reply) == (400, {"error": "missing required field: name at proxy 2",
                                     "status": 400, "proxies": None})
    assert api("GET", "/proxies").json() == {}
    assert error_of(api("POST", "/populate", raw=""))[0] == 400


def test_populate_stops_at_a_bind_failure(api, upstream):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        entries = [{"name": "first", "upstream": upstream, "listen": "127.0.0.1:0"},
                   {"name": "second", "upstream": upstream,
                    "listen": f"127.0.0.1:{busy.getsockname()[1]}"}]
        status, body = error_of(api("POST", "/populate", entries))
    assert status == 500 and [p["name"] for p in body["proxies"]] == ["first"]


def test_version(api):
    reply = api("GET", "/version")
    assert reply.status_code == 200
    assert reply.text == '{"version": "2.12.0"}\n'
    assert reply.headers["Content-Type"] == "application/json;charset=utf-8"


def test_routing_errors_and_browser_guard(api):
    unknown = api("GET", "/nope")
    assert (unknown.status_code, unknown.text) == (404, "404 page not found\n")
    assert api("GET", "/proxies/").status_code == 404  # no trailing-slash normalisation
    assert api("GET", "/metrics").status_code == 404  # metrics are off by default
    wrong = api("DELETE", "/proxies")
    assert (wrong.status_code, wrong.content) == (405, b"")
    assert api("GET", "/reset").status_code == 405
    browser = api("GET", "/proxies", headers={"User-Agent": "Mozilla/5.0"})
    assert (browser.status_code, browser.text) == (403, "User agent not allowed\n")
