"""A log server process: one replicated-log node plus a client port speaking ``protocol``.

    python -m dledger.server --group g --id n0 \\
        --peers n0=127.0.0.1:20911,n1=127.0.0.1:20912,n2=127.0.0.1:20913 \\
        --client-listen 127.0.0.1:0 --data-dir ./data/g-n0

On start it prints one JSON line ``{"event": "ready", "peer": [...], "client": [...]}`` so a
parent process can read the real ports. SIGTERM and SIGINT stop it cleanly. Owns request
handling and the command line; replication is the runtime's business.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict
from typing import Any

import click

from dledger import evloop
from dledger.local_load import run_local_load
from dledger.node.runtime import Address, Committed, Node, NodeConfig
from dledger.node_cli import (
    client_limits,
    node_config,
    node_options,
    parse_address,
    serve_until_signal,
    setup_logging,
)
from protocol.envelope import (
    LOCAL_LOAD,
    MAX_PROPOSAL_BYTES,
    POWER_LOSS,
    PROPOSE,
    PROPOSE_BATCH,
    READ,
    STATUS,
    TRANSFER,
    BadRequestError,
    Request,
    decode_request,
    encode_decode_error,
    encode_error,
    encode_result,
)
from protocol.errors import DLedgerError, WireError
from protocol.framed import ConnectionLimits, FramedProtocol


class _ClientConnection(FramedProtocol):
    """One client connection: requests in, replies out (coalesced per loop pass)."""

    def __init__(self, server: LogServer) -> None:
        super().__init__(limits=server.limits)
        self.server = server
        self.tasks: set[asyncio.Task[None]] = set()

    def payload_received(self, payload: bytes) -> None:
        try:
            req = decode_request(payload)
        except WireError as err:
            self.reply(encode_decode_error(err))
            return
        if req.kind == PROPOSE and self.server.propose_fast(req, self):
            return
        task = asyncio.ensure_future(self.server.handle(req, self))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def reply(self, payload: bytes) -> None:
        self.send_payload(payload)


class LogServer:
    def __init__(self, config: NodeConfig, client_listen: Address,
                 propose_timeout_s: float = 3.0, enable_bench: bool = False,
                 limits: ConnectionLimits | None = None) -> None:
        self.node = Node(config)
        self.limits = limits or ConnectionLimits()
        self.enable_bench = enable_bench
        self.client_listen = client_listen
        self.propose_timeout_s = propose_timeout_s
        self._server: asyncio.Server | None = None
        self.client_address: Address | None = None

    async def start(self) -> None:
        await self.node.start()
        loop = asyncio.get_running_loop()
        host, port = self.client_listen
        tls = self.node.config.tls
        self._server = await loop.create_server(lambda: _ClientConnection(self), host, port,
                                                ssl=tls.server_context() if tls else None)
        sock = self._server.sockets[0].getsockname()
        self.client_address = (sock[0], sock[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self.node.stop()

    def propose_fast(self, req: Request, conn: _ClientConnection) -> bool:
        """The hot path: a proposal without a task per request. The node's pending future is
        bounded (max_pending_proposals) and always ends: committed, leadership lost, or stop;
        the client enforces its own deadline."""
        try:
            (data,) = req.args
            fut = self.node.submit(_bytes_arg(data))
        except DLedgerError as err:
            conn.reply(encode_error(req.request_id, err))
            return True
        except ValueError:
            return False  # malformed: let the slow path answer with a named error
        rid = req.request_id

        def done(f: asyncio.Future[Committed]) -> None:
            err = f.exception()
            if err is None:
                c = f.result()
                conn.reply(encode_result(rid, [c.index, c.term, c.position]))
            elif isinstance(err, DLedgerError):
                conn.reply(encode_error(rid, err))

        fut.add_done_callback(done)
        return True

    async def handle(self, req: Request, conn: _ClientConnection) -> None:
        try:
            result = await self._dispatch(req)
        except DLedgerError as err:
            conn.reply(encode_error(req.request_id, err))
        except (TypeError, ValueError, IndexError) as err:
            conn.reply(encode_error(req.request_id, BadRequestError(str(err))))
        else:
            conn.reply(encode_result(req.request_id, result))

    async def _dispatch(self, req: Request) -> Any:
        node, args = self.node, req.args
        if req.kind == PROPOSE:
            (data,) = args
            c = await node.propose(_bytes_arg(data), self.propose_timeout_s)
            return [c.index, c.term, c.position]
        if req.kind == PROPOSE_BATCH:
            (items,) = args
            if not isinstance(items, list):
                raise BadRequestError("batch must be a list")
            done = await node.propose_batch([_bytes_arg(d) for d in items], self.propose_timeout_s)
            return [[c.index, c.term, c.position] for c in done]
        if req.kind == READ:
            lo, max_entries = args
            return [[e.index, e.term, int(e.kind), e.data, e.position]
                    for e in node.read_committed(int(lo), min(int(max_entries), 4096))]
        if req.kind == STATUS:
            return {**status_dict(node, self.client_address),
                    "client_connections": self.limits.stats()}
        if req.kind == TRANSFER:
            (to,) = args
            await node.transfer_leadership(str(to))
            return True
        if req.kind == LOCAL_LOAD:
            if not self.enable_bench:
                raise BadRequestError("local load needs --enable-bench")
            size, count, concurrency, warmup = (int(a) for a in args)
            return await run_local_load(node, size, count, concurrency, warmup)
        if req.kind == POWER_LOSS:
            (tear,) = args
            discarded = await node.power_loss(bool(tear))
            _exit_soon()
            return discarded
        raise BadRequestError(f"unknown request kind {req.kind}")


def _bytes_arg(data: Any) -> bytes:
    if not isinstance(data, bytes):
        raise BadRequestError("proposal data must be bytes")
    if len(data) > MAX_PROPOSAL_BYTES:
        raise BadRequestError(f"proposal of {len(data)} bytes exceeds {MAX_PROPOSAL_BYTES}")
    return data


def _exit_soon() -> None:
    """After a simulated power loss the process dies without flushing anything."""
    asyncio.get_running_loop().call_later(0.05, os._exit, 137)


def peers_last_heard(last_heard_s: dict[str, float], now_s: float) -> dict[str, dict[str, int]]:
    """peer -> when this node last heard from it: ``at_ms`` (its wall clock, ms since the epoch)
    and ``ago_ms`` (by this node's clock, so a reader's clock skew does not matter)."""
    return {peer: {"at_ms": int(at_s * 1000), "ago_ms": max(0, int((now_s - at_s) * 1000))}
            for peer, at_s in sorted(last_heard_s.items())}


def status_dict(node: Node, client_address: Address | None) -> dict[str, Any]:
    st = node.status()
    raft = asdict(st.raft)
    # A node riding out a full disk takes no part in its group: its role says so (the status
    # table shows it), and disk_full_error says which write failed.
    raft["role"] = "disk_full" if st.disk_full else st.raft.role.value
    return {"group": st.group, "flush_mode": st.flush_mode, "raft": raft,
            "tick_ms": round(node.config.tick_interval_s * 1000),  # (last_contact_ticks' unit)
            "members": sorted(st.raft.voters + st.raft.learners),
            "membership": st.membership,
            "disk_full": st.disk_full, "disk_full_error": st.disk_full_error,
            "peers_last_heard": peers_last_heard(st.last_heard_s, time.time()),
            "peer_address": list(st.peer_address or ()), "client_address": list(client_address or ()),
            "pending_proposals": st.pending_proposals, "inbox_dropped": st.inbox_dropped,
            "storage_first_index": st.storage_first_index, "storage_last_index": st.storage_last_index}


# -- command line ---------------------------------------------------------------------------------

@click.command()
@node_options
@click.option("--client-listen", default="127.0.0.1:0", show_default=True)
@click.option("--enable-bench", is_flag=True, help="Allow the benchmark's in-leader load requests.")
def main(client_listen: str, enable_bench: bool, **opts: Any) -> None:
    """Run one node of a replicated log group."""
    setup_logging(opts, "dledger-server")
    config = node_config(opts)
    evloop.run(_serve(config, parse_address(client_listen), enable_bench, client_limits(opts)),
               server=True)


async def _serve(config: NodeConfig, client_listen: Address, enable_bench: bool,
                 limits: ConnectionLimits) -> None:
    server = LogServer(config, client_listen, enable_bench=enable_bench, limits=limits)
    await serve_until_signal(server, lambda: {
        "node": config.node_id, "peer": list(server.node.peer_address or ()),
        "client": list(server.client_address or ())})


if __name__ == "__main__":
    main()
