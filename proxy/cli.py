"""`xsg proxy --upstream URL --port P`: the caching proxy in front of a gateway.

Secrets come from the environment by default (command lines are visible to every local user):
`XSG_PROXY_TOKEN` is the bearer token for the gateway's invalidation feed, `XSG_PROXY_SECRET` the
HMAC key of its webhooks. Without a feed token the proxy still forwards, but never caches: it
cannot know when a cached handle dies.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from urllib.parse import urlsplit

from common.logs import configure_logging, flush_repeats
from common.numbers import float_argument, int_argument
from proxy.app import ProxyConfig, create_app, runtime_of
from proxy.edges import edge_urls
from proxy.forward import Timeouts
from server.serving import HttpServer, run_until_signal

MAX_SECONDS = 10 ** 9  # a duration flag beyond this (31 years) is a typo


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xsg proxy", description="Caching proxy in front of an xsg "
                                "gateway: forwards its API, caches stream-request answers.")
    p.add_argument("--upstream", required=True,
                   help="gateway base URL, e.g. http://127.0.0.1:8080; several, comma-separated, "
                        "for the processes of one gateway (requests are spread over them and "
                        "sent to another when one refuses; no caching then)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int_argument(1, 65535), default=8081,
                   help="port to listen on (default 8081)")
    p.add_argument("--threads", type=int_argument(1, 100_000), default=32,
                   help="threads that run forwarded calls, at start (relayed handle streams "
                        "hold none; default 32)")
    p.add_argument("--max-threads", type=int_argument(1, 100_000), default=1000,
                   help="ceiling of that pool: calls forwarded at once (default 1000)")
    p.add_argument("--cache-size", type=int_argument(1, 100_000_000), default=10_000,
                   help="max cached answers (LRU)")
    p.add_argument("--ttl", type=float_argument(0.001, MAX_SECONDS), default=300.0,
                   help="seconds a cached answer lives")
    p.add_argument("--feed-token", default=None,
                   help="bearer token for the invalidation feed (default: $XSG_PROXY_TOKEN)")
    p.add_argument("--webhook-secret", default=None,
                   help="HMAC key of invalidation webhooks (default: $XSG_PROXY_SECRET)")
    p.add_argument("--webhook-url", default=None,
                   help="URL at which the gateway reaches this proxy's /proxy/invalidate "
                        "(default: http://<host>:<port>/proxy/invalidate when a secret is set)")
    p.add_argument("--public-base", default=None,
                   help="base URL consumers use for this proxy (default: the Host they used)")
    p.add_argument("--edges", default="",
                   help="the gateway's edges (xsg edge), comma-separated base URLs: a read the "
                        "gateway redirects to an edge (delivery = \"kafka\") is relayed from "
                        "one of these, the same for a handle while it answers, the next when it "
                        "does not (default: the redirect goes to the reader)")
    p.add_argument("--no-rewrite-handles", action="store_true",
                   help="leave handle URLs pointing at the gateway")
    p.add_argument("--feed-timeout", type=float_argument(0.1, MAX_SECONDS), default=6.0,
                   help="seconds without a feed heartbeat before caching stops (default 6)")
    p.add_argument("--upstream-timeout", type=float_argument(0.1, MAX_SECONDS), default=60.0,
                   help="read timeout for ordinary gateway calls (default 60)")
    p.add_argument("--upstream-ca", default=None,
                   help="CA file to verify a gateway on HTTPS (default: $XSG_PROXY_UPSTREAM_CA, "
                        "else the system's CAs)")
    p.add_argument("--tls-cert", default=None,
                   help="serve HTTPS with this PEM certificate (default: $XSG_PROXY_TLS_CERT)")
    p.add_argument("--tls-key", default=None,
                   help="the certificate's PEM key (default: $XSG_PROXY_TLS_KEY)")
    p.add_argument("--forwarded-allow-ips", default="",
                   help="comma-separated addresses of reverse proxies whose X-Forwarded-For "
                        "and X-Forwarded-Proto are trusted (default: none)")
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="lowest level logged (default INFO)")
    p.add_argument("--log-format", default="text", choices=("text", "json"),
                   help="log lines as text or one JSON object each, as `xsg serve` writes them "
                        "(UTC times; default text)")
    return p


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    for upstream in args.upstream.split(","):
        parts = urlsplit(upstream.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SystemExit(f"xsg proxy: --upstream must be http(s)://host[:port] (several "
                             f"comma-separated), got {args.upstream!r}")
    if not 0 < args.port < 65536:
        raise SystemExit(f"xsg proxy: --port must be 1-65535, got {args.port}")
    if args.cache_size < 1 or args.ttl <= 0:
        raise SystemExit("xsg proxy: --cache-size must be at least 1 and --ttl positive")
    token = args.feed_token or os.environ.get("XSG_PROXY_TOKEN") or None
    secret = args.webhook_secret or os.environ.get("XSG_PROXY_SECRET") or None
    webhook_url = args.webhook_url
    if webhook_url is None and secret:
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        webhook_url = f"http://{host}:{args.port}/proxy/invalidate"
    try:
        edges = edge_urls(args.edges)
    except ValueError as exc:
        raise SystemExit(f"xsg proxy: --edges: {exc}") from None
    return ProxyConfig(upstream=args.upstream, edges=edges, feed_token=token, webhook_secret=secret,
                       webhook_url=webhook_url if secret else None, max_entries=args.cache_size,
                       ttl=args.ttl, feed_read_timeout=args.feed_timeout,
                       public_base=args.public_base,
                       rewrite_handles=not args.no_rewrite_handles,
                       timeouts=Timeouts(read=args.upstream_timeout),
                       upstream_ca=args.upstream_ca or os.environ.get("XSG_PROXY_UPSTREAM_CA")
                       or None,
                       start_feed=False)  # started once the port serves: webhooks can land


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = configure_logging(args.log_level, args.log_format)
    config = config_from_args(args)
    if not config.feed_token:
        logging.getLogger("proxy").warning(
            "no feed token ($XSG_PROXY_TOKEN): the proxy cannot follow invalidations and will "
            "pass every request through uncached")
    if not config.webhook_secret:
        logging.getLogger("proxy").warning(
            "no webhook secret ($XSG_PROXY_SECRET): invalidations arrive only by the feed, "
            "not before a revocation call returns")
    app = create_app(config)
    runtime = runtime_of(app)
    cert = args.tls_cert or os.environ.get("XSG_PROXY_TLS_CERT") or None
    key = args.tls_key or os.environ.get("XSG_PROXY_TLS_KEY") or None
    if bool(cert) != bool(key):
        raise SystemExit("xsg proxy: --tls-cert and --tls-key go together")
    server = HttpServer(app, args.host, args.port, threads=args.threads,
                        max_threads=max(args.threads, args.max_threads), name="xsg-proxy",
                        tls_cert=cert, tls_key=key,
                        forwarded_allow_ips=[p.strip() for p in args.forwarded_allow_ips.split(",")
                                             if p.strip()])
    try:
        run_until_signal(server, on_start=runtime.start, on_stop=runtime.close)
    finally:
        flush_repeats(handler)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
