"""A broker node's admin HTTP endpoints (aiohttp): ``/status`` (JSON), ``/metrics`` (Prometheus
text), ``/livez`` and ``/readyz``. Read-only views of the node and its state machine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from broker.server import BrokerServer


def make_app(server: BrokerServer) -> web.Application:
    app = web.Application(client_max_size=64 << 10)

    async def status(_: web.Request) -> web.Response:
        return web.json_response(server.status())

    async def livez(_: web.Request) -> web.Response:
        # A node whose log stopped (a failed write or fsync) is not alive as a member: 503, so
        # that a probe looking only at the status code (a supervisor, Kubernetes) restarts it.
        failure = server.node.failure
        if failure is None:
            return web.json_response({"ok": True})
        return web.json_response({"ok": False, "failure": f"{type(failure).__name__}: {failure}"},
                                 status=503)

    async def readyz(_: web.Request) -> web.Response:
        ready = server.caught_up()
        return web.json_response({"ready": ready, "leader": server.node.status().raft.leader_id},
                                 status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=_prometheus(server), content_type="text/plain")

    app.router.add_get("/status", status)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def _prometheus(server: BrokerServer) -> str:
    st = server.node.status()
    raft = st.raft
    labels = f'group="{server.group}",node="{raft.node_id}"'
    gauges: list[tuple[str, str, Any]] = [
        ("dledger_is_leader", "1 if this node leads its group", int(raft.role.value == "leader")),
        ("dledger_disk_full", "1 while a write failed for want of space (it takes no part)",
         int(st.disk_full)),
        ("dledger_term", "current Raft term", raft.term),
        ("dledger_last_index", "last log index", raft.last_index),
        ("dledger_commit_index", "commit index", raft.commit_index),
        ("dledger_applied_index", "index applied to the broker state", server.state.applied_index),
        ("dledger_pending_proposals", "proposals waiting for commit", st.pending_proposals),
        ("dledger_topics", "topics known", len(server.state.topics)),
        ("dledger_queue_messages_total", "messages in all consume queues",
         sum(len(u) for u in server.state.queues.values())),
        ("dledger_client_connections", "client connections open", len(server.limits.open)),
        ("dledger_client_connections_refused", "client connections refused at the limit",
         server.limits.refused),
        ("dledger_client_input_buffered_bytes", "bytes of partial frames held by clients",
         server.limits.held_bytes),
        ("dledger_client_connections_evicted", "client connections closed by the input budget",
         server.limits.evicted),
    ]
    lines = []
    for name, help_text, value in gauges:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {value}"]
    for f in raft.followers:
        lines.append(f'dledger_follower_match_index{{{labels},follower="{f.node_id}"}} {f.match_index}')
    return "\n".join(lines) + "\n"
