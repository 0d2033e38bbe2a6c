"""The broker's command line: ``dledger-broker start --group a --id n0 --peers ... --listen ...``
(also ``python -m broker start ...``, whose entry, ``broker.__main__``, imports this module).
Prints one JSON ready line with the real addresses; stops cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import os
from typing import Any

import click

from broker.config import BROKER_CANARIES, BrokerConfig
from broker.features.acl.service import credentials_of
from broker.features.delay.model import DEFAULT_LEVELS, DEFAULT_MAX_DELAY_MS, DelayError, parse_levels
from broker.features.query.index import IndexConfig
from broker.server import BrokerServer
from dledger import evloop
from dledger.node.config import Address
from dledger.node_cli import (
    client_limits,
    node_config,
    node_options,
    parse_address,
    serve_until_signal,
    setup_logging,
)
from protocol.broker_kinds import MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES_CEILING
from protocol.cluster_key import ClusterKeyError, load_cluster_key
from protocol.namesrv_addrs import NameSrvAddressError, parse_namesrv_list
from protocol.topics import DEFAULT_QUEUES, MAX_QUEUES

log = logging.getLogger("broker")


@click.group()
def main() -> None:
    """The dledger broker: a broker group member on a Raft-replicated commitlog."""


@main.command()
@node_options
@click.option("--listen", "--client-listen", "client_listen", default="127.0.0.1:10911",
              show_default=True, help="Client address (producers, consumers, admin).")
@click.option("--auto-create/--no-auto-create", default=True, show_default=True,
              help="Create a topic (--default-queues queues) on its first send.")
@click.option("--default-queues", type=click.IntRange(1, MAX_QUEUES), default=DEFAULT_QUEUES,
              show_default=True, help="Read and write queues of a topic created by its first send.")
@click.option("--max-message-bytes", type=click.IntRange(1, MAX_MESSAGE_BYTES_CEILING),
              default=MAX_MESSAGE_BYTES, show_default=True,
              help="Largest message, and largest batch in total, this broker stores (sizes "
                   "counted as RocketMQ does: topic, body, properties, 20 bytes per message).")
@click.option("--admin-listen", default="127.0.0.1:0", show_default=True,
              help="Admin HTTP address (/status, /metrics, /livez, /readyz).")
@click.option("--namesrv", default="",
              help="NameServers to register with: host[:port] separated by ';' or ',' "
                   "(port 9876 if none is given).")
@click.option("--register-interval-s", type=float, default=30.0, show_default=True)
@click.option("--notify-consumers/--no-notify-consumers", default=True, show_default=True,
              help="Tell a consumer group's members at once when its members or their "
                   "subscriptions change, so that they rebalance now (RocketMQ's "
                   "notifyConsumerIdsChangedEnable); off: they learn it at their next heartbeat.")
@click.option("--protect-status", is_flag=True,
              help="/status answers only reads signed with the cluster credential (the "
                   "NameServer's, and `dledger status` with it in its environment); the health "
                   "probes and /metrics stay open.")
@click.option("--cluster-key-file", type=click.Path(dir_okay=False), default=None,
              help="The cluster credential (mode 0600) to sign registrations with, as the "
                   "NameServers have it; or $DLEDGER_CLUSTER_KEY_FILE, or the credential itself "
                   "in $DLEDGER_CLUSTER_KEY. Without one, registrations go unsigned and only a "
                   "NameServer started --insecure takes them.")
@click.option("--advertise", default=None, metavar="HOST[:PORT]",
              help="Client address to register instead of --listen's (NAT, a proxy, a listener "
                   "on 0.0.0.0); a host alone keeps the bound port. The gRPC endpoint is "
                   "registered at this host too.")
@click.option("--admin-advertise", default=None, metavar="HOST[:PORT]",
              help="Admin address to register instead of --admin-listen's (by default the "
                   "bound one, or its port at --advertise's host if bound to every interface).")
@click.option("--grpc-listen", default=None,
              help="Serve RocketMQ 5 clients (gRPC, apache.rocketmq.v2) at HOST:PORT "
                   "(off unless given; needs --namesrv).")
@click.option("--remoting-listen", default=None,
              help="Serve RocketMQ 4.x clients (the remoting protocol) at HOST:PORT "
                   "(off unless given; needs --namesrv).")
@click.option("--grpc-max-delivery-attempts", type=click.IntRange(1, 10_000), default=16,
              show_default=True,
              help="Deliveries of a message to a RocketMQ 5 consumer group before it goes to the "
                   "group's dead-letter queue (RocketMQ's maxReconsumeTimes + 1).")
@click.option("--checkpoint-interval-s", type=float, default=10.0, show_default=True,
              help="Persist the broker state this often, so a restart replays only the rest.")
@click.option("--delay-levels", default=DEFAULT_LEVELS, show_default=True,
              help="The delay levels (RocketMQ's messageDelayLevel): durations with a unit "
                   "(ms s m h d), level 1 first. Give every node of a group the same.")
@click.option("--max-delay-ms", type=click.IntRange(min=1), default=DEFAULT_MAX_DELAY_MS,
              show_default=True, help="The furthest ahead a timed message may be due.")
@click.option("--transaction-timeout-s", type=click.FloatRange(min=0.001), default=6.0,
              show_default=True, help="An open transaction is checked back after this long.")
@click.option("--transaction-check-interval-s", type=click.FloatRange(min=0.001), default=60.0,
              show_default=True, help="Time between check-backs of one open transaction.")
@click.option("--transaction-check-max", type=click.IntRange(min=0), default=15,
              show_default=True,
              help="Check-backs before an open transaction is rolled back (into "
                   "TRANS_CHECK_MAX_TIME_TOPIC).")
@click.option("--index-slots", type=click.IntRange(1, 1 << 26), default=IndexConfig.slots,
              show_default=True, help="Hash slots per key-index file (4 bytes each, in memory "
                                      "for the file being written). Give every node the same.")
@click.option("--index-entries-per-file", type=click.IntRange(1, 1 << 28),
              default=IndexConfig.entries_per_file, show_default=True,
              help="Keys per key-index file (28 bytes each) before the next file begins.")
@click.option("--index-files-max", type=click.IntRange(min=0), default=IndexConfig.files_max,
              show_default=True, help="Key-index files kept (the oldest deleted; 0: no bound).")
@click.option("--acl", is_flag=True,
              help="Access control: every request must be signed by an account with the "
                   "permission it needs (accounts: `dledger acl`). Off by default.")
@click.option("--acl-admin-key", "acl_admin_keys", multiple=True, metavar="KEY",
              help="A bootstrap admin account (repeatable); its secret is read from the "
                   "environment variable DLEDGER_ACL_SECRET_<KEY> (upper case, - and . as _). "
                   "Give every node of a group the same.")
@click.option("--acl-replay-window-s", type=click.FloatRange(min=1.0), default=60.0,
              show_default=True,
              help="A signed request's clock may differ from the node's by this much; within it "
                   "a replayed request is recognised and refused (a RocketMQ 5 client's "
                   "signature, which signs only its date-time, is good for any call within it).")
@click.option("--broker-canary", "broker_canaries", multiple=True,
              type=click.Choice(sorted(BROKER_CANARIES)),
              help="A seeded broker bug (tests only; needs --test-faults).")
def start(client_listen: str, auto_create: bool, default_queues: int, max_message_bytes: int,
          admin_listen: str, namesrv: str, register_interval_s: float, notify_consumers: bool,
          protect_status: bool, cluster_key_file: str | None,
          checkpoint_interval_s: float, advertise: str | None, admin_advertise: str | None,
          grpc_listen: str | None, remoting_listen: str | None,
          grpc_max_delivery_attempts: int,
          delay_levels: str,
          max_delay_ms: int, transaction_timeout_s: float, transaction_check_interval_s: float,
          transaction_check_max: int, index_slots: int, index_entries_per_file: int,
          index_files_max: int, acl: bool, acl_admin_keys: tuple[str, ...],
          acl_replay_window_s: float, broker_canaries: tuple[str, ...], **opts: Any) -> None:
    """Run one broker node."""
    setup_logging(opts, "dledger-broker")
    try:
        levels_ms = parse_levels(delay_levels)
    except DelayError as err:
        raise click.BadParameter(str(err), param_hint="'--delay-levels'") from err
    try:
        names = parse_namesrv_list(namesrv) if namesrv.strip() else ()
    except NameSrvAddressError as err:
        raise click.BadParameter(str(err), param_hint="'--namesrv'") from err
    if grpc_listen and not names:
        raise click.BadParameter("the gRPC endpoint routes through the NameServers: give "
                                 "--namesrv as well", param_hint="'--grpc-listen'")
    if remoting_listen and not names:
        raise click.BadParameter("the remoting endpoint routes through the NameServers: give "
                                 "--namesrv as well", param_hint="'--remoting-listen'")
    limits = client_limits(opts)
    try:
        cluster_key = load_cluster_key(cluster_key_file, os.environ)
    except ClusterKeyError as err:
        raise click.BadParameter(str(err), param_hint="'--cluster-key-file'") from err
    if names and cluster_key is None:
        log.warning("no cluster credential (--cluster-key-file or $DLEDGER_CLUSTER_KEY): "
                    "registrations go unsigned, and a NameServer not started --insecure "
                    "refuses them")
    try:
        admins = credentials_of(list(acl_admin_keys))
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="'--acl-admin-key'") from err
    try:
        config = BrokerConfig(node_config(opts), parse_address(client_listen),
                              auto_create_topics=auto_create, default_queues=default_queues,
                              max_message_bytes=max_message_bytes,
                              admin_listen=parse_address(admin_listen),
                              namesrv=names, register_interval_s=register_interval_s,
                              notify_consumers=notify_consumers,
                              cluster_key=cluster_key, protect_status=protect_status,
                              checkpoint_interval_s=checkpoint_interval_s,
                              advertise_client=_advertised(advertise, "--advertise"),
                              advertise_admin=_advertised(admin_advertise,
                                                          "--admin-advertise"),
                              grpc_listen=parse_address(grpc_listen) if grpc_listen else None,
                              remoting_listen=(parse_address(remoting_listen)
                                               if remoting_listen else None),
                              grpc_max_delivery_attempts=grpc_max_delivery_attempts,
                              max_connections=limits.connections_max,
                              input_buffer_bytes_max=limits.input_bytes_max,
                              delay_levels_ms=levels_ms, max_delay_ms=max_delay_ms,
                              transaction_timeout_s=transaction_timeout_s,
                              transaction_check_interval_s=transaction_check_interval_s,
                              transaction_check_max=transaction_check_max,
                              canaries=frozenset(broker_canaries),
                              acl=acl, acl_admins=admins,
                              acl_replay_window_ms=int(acl_replay_window_s * 1000),
                              index=IndexConfig(index_slots, index_entries_per_file,
                                                index_files_max))
    except ValueError as err:  # the configuration's own checks, named
        raise click.UsageError(str(err)) from err
    evloop.run(_serve(config), server=True)


def _advertised(text: str | None, option: str) -> Address | None:
    """``HOST[:PORT]`` (IPv6 in brackets) -> (host, port), port 0 if none: the bound one."""
    if text is None:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or "]" in port:  # a host alone
        host, port = text, "0"
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    if not host or (":" in host and not bracketed) or host.startswith("[") != bracketed \
            or not port.isdigit() or not 0 <= int(port) < 65536:
        raise click.BadParameter(f"expected HOST or HOST:PORT (IPv6 as [HOST]), got {text!r}",
                                 param_hint=option)
    return host, int(port)  # (a wildcard host: BrokerConfig refuses it, by name)


async def _serve(config: BrokerConfig) -> None:
    server = BrokerServer(config)
    await serve_until_signal(server, lambda: {
        "node": config.node.node_id, "peer": list(server.node.peer_address or ()),
        "client": list(server.client_address or ()), "admin": list(server.admin_address or ()),
        "grpc": list(server.grpc_address or ()),
        "remoting": list(server.remoting_address or ())}, "dledger-broker")
