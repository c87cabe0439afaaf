"""`xsg edge`: an edge process in the foreground (pep/edge; docs/operate/edges.md)."""
from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.logs import configure_logging
from common.numbers import NumberError, parse_int
from pep.cli.common import EXIT_USAGE, CliError

if TYPE_CHECKING:
    from pep.config import GatewayConfig
    from server.bridge import WsgiApp
    from server.serving import HttpServer

EDGE_DESCRIPTION = """Run an edge: a stateless process that serves handle reads (GET /handles/<id>,
SSE or NDJSON, bearer or read tokens, Last-Event-ID) from the plan topics a gateway with delivery =
"kafka" writes. Any number of edges may run, on any host; a reader may reconnect to any of them and
resumes exactly where it was (event ids are positions in the plan topic).

It reads the gateway's configuration (--config FILE or XSG_CONFIG, and the XSG_* environment):
the PostgreSQL store (every reader's handle is checked there at every connection), the token
file and OIDC issuers (who a reader is), the brokers (delivery_brokers and the delivery_*
settings). Give each edge its own Kafka identity (--username, and its password in
XSG_DELIVERY_PASSWORD, never on a command line): a gateway can then fence one edge off.

An edge that cannot reach the store or the control topic for 3 s stops serving (its readers get
`shutdown` and reconnect elsewhere; new ones get 503) until both are back.

Readers that connect at once (thousands, when a proxy or another edge restarts) are checked
together, one store query for all those waiting, on one of the edge's --store-pool-size
connections; the others keep the edge's own looks at the store free. A reader whose check does
not come within 5 s gets 503 with Retry-After (it retries), never rows.

examples:
  xsg edge --config deploy/xsg.toml --port 8091
  XSG_DELIVERY_PASSWORD=... xsg edge --config xsg.toml --port 8092 --username edge-2 --id edge-2
"""


EDGE_POOL_SIZE = 4
MAX_POOL_SIZE = 1000


def _pool_size(text: str) -> int:
    """--store-pool-size: a whole number from 2 (the readers' checks and the edge's looks each
    need a connection of their own, or a burst of readers delays the looks)."""
    try:
        return parse_int(text, "--store-pool-size", low=2, high=MAX_POOL_SIZE)
    except NumberError as exc:
        raise argparse.ArgumentTypeError(f"expected 2 to {MAX_POOL_SIZE} connections: "
                                         f"{exc.message}") from None


def edge_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The gateway settings the edge's flags set (delivery is kafka for an edge)."""
    flags: dict[str, Any] = {"delivery": "kafka"}
    for flag, name in (("store", "store"), ("auth", "auth_file"), ("brokers", "delivery_brokers"),
                       ("username", "delivery_username"), ("log_level", "log_level"),
                       ("log_format", "log_format")):
        value = getattr(args, flag, None)
        if value is not None:
            flags[name] = value
    return flags


def edge_server(app: WsgiApp, config: GatewayConfig, host: str, port: int, name: str
                ) -> HttpServer:
    """The edge's HTTP server with the configuration's limits on connections, as the gateway's
    (`pep.serve.gateway_server`): without `max_connections` an edge answered 429 past 4,096
    readers whatever the configuration said (bench_edges, 5,000 handles on one edge)."""
    from server.serving import HttpServer

    return HttpServer(app, host=host, port=port, name=name, threads=8,
                      max_connections=config.max_connections,
                      write_timeout=config.write_timeout, idle_timeout=config.idle_timeout,
                      header_timeout=config.header_timeout,
                      forwarded_allow_ips=config.forwarded_allow_ips)


def cmd_edge(args: argparse.Namespace) -> int:
    from common.db import StoreError, StoreUnavailable, open_storage
    from common.oidc import build_authenticator
    from pep.config import SERVE_DEFAULTS, ConfigError, load_settings
    from pep.delivery.settings import DeliverySettings
    from pep.delivery.store import DeliveryStore
    from pep.edge.node import EdgeNode
    from pep.handles.records import HandleStore
    from pep.http.edge import create_edge_app
    from pep.http.read_tokens import ReadTokens
    from server.serving import run_until_signal

    config_file = args.config or os.environ.get("XSG_CONFIG") or None
    try:
        config = load_settings(edge_flags(args), os.environ, config_file, SERVE_DEFAULTS)
    except ConfigError as exc:
        raise CliError(f"cannot start the edge: {exc}", EXIT_USAGE) from None
    configure_logging(config.log_level, config.log_format)
    settings = DeliverySettings.of(config)
    edge_id = args.id or f"{socket.gethostname()}-{os.getpid()}"
    try:
        storage = open_storage(config.data_dir, config.store, pool_size=args.store_pool_size,
                               timeout=config.store_timeout)
    except (StoreError, StoreUnavailable) as exc:
        raise CliError(f"cannot start the edge: store: {exc}") from None
    authenticator = build_authenticator(config.effective_auth_file, config.oidc,
                                        remember_file=Path(config.data_dir)
                                        / "edge-oidc-identities.json")
    try:
        store = DeliveryStore(storage.database("delivery"))
        key = config.read_token_key or HandleStore(storage.database("handles")).shared_key(
            "read_token_key")
        node = EdgeNode(settings, store, edge_id)
        app = create_edge_app(node, authenticator, ReadTokens(
            key, config.read_token_ttl, lambda: authenticator.identities),
            config.heartbeat, config.max_readers_per_subject)
        server = edge_server(app, config, args.host, args.port, f"xsg-edge {edge_id}")
        authenticator.watch()

        def started() -> None:
            node.start(args.advertise or server.url)
            print(f"xsg edge {edge_id} on {server.url} (brokers {settings.brokers})",
                  flush=True)

        run_until_signal(server, on_start=started, on_stop=node.stop)
    except ValueError as exc:
        raise CliError(f"cannot start the edge: {exc}", EXIT_USAGE) from None
    finally:
        authenticator.stop()
        storage.close()
    return 0


def add_edge_command(sub: Any) -> None:
    """`xsg edge [--config FILE] [--host H] [--port P] [--id ID] ...`."""
    e = sub.add_parser("edge", help="serve handle reads from plan topics (delivery = kafka)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=EDGE_DESCRIPTION)
    e.add_argument("--config", metavar="FILE", default=None,
                   help="the gateway's TOML configuration file (env XSG_CONFIG)")
    e.add_argument("--host", default="127.0.0.1", help="interface to listen on "
                                                       "(default: 127.0.0.1)")
    e.add_argument("--port", type=int, default=8090, help="port to listen on (default: 8090)")
    e.add_argument("--id", default=None, metavar="ID",
                   help="this edge's id among the edges (default: host name and pid)")
    e.add_argument("--advertise", default=None, metavar="URL",
                   help="the URL readers reach this edge at (default: from host and port)")
    e.add_argument("--store", default=None, metavar="URL",
                   help="the gateway's PostgreSQL store (postgresql://...; env XSG_STORE)")
    e.add_argument("--store-pool-size", type=_pool_size, default=EDGE_POOL_SIZE, metavar="N",
                   help="connections to the store this edge keeps at most, 2 or more: one for "
                        "the readers' checks (batched), the others for the edge's own looks "
                        f"(default: {EDGE_POOL_SIZE})")
    e.add_argument("--auth", default=None, metavar="FILE",
                   help="the gateway's token file (env XSG_AUTH_FILE)")
    e.add_argument("--brokers", default=None, metavar="HOST:PORT,...",
                   help="the brokers of the plan topics (env XSG_DELIVERY_BROKERS)")
    e.add_argument("--username", default=None, metavar="USER",
                   help="this edge's own Kafka identity (its password: env "
                        "XSG_DELIVERY_PASSWORD)")
    e.add_argument("--log-level", default=None, metavar="LEVEL", help="log level (INFO)")
    e.add_argument("--log-format", default=None, choices=("text", "json"),
                   help="log lines as text or one JSON object each (text; env XSG_LOG_FORMAT)")
    e.set_defaults(func=cmd_edge)


__all__ = ["add_edge_command", "cmd_edge"]
