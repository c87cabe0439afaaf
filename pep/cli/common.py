"""What every `xsg` command shares: exit statuses, `CliError`, the flag readers, and the HTTP
client of the commands that talk to a running gateway (--url / XSG_URL, --token / XSG_TOKEN).

Exit status: 0 on success, 1 when the gateway refused or failed, 2 on a usage or input error.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used at run time: `xsg --help` stays fast
    import requests

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_URL = "http://127.0.0.1:8080"
URL_HELP = f"the gateway's URL (env XSG_URL; default {DEFAULT_URL})"


def seconds(text: str) -> float:
    """`--timeout`: common.numbers' parser, imported when a flag is read (`xsg --help` stays
    fast)."""
    from common.numbers import float_argument

    return float_argument(0.001, 86400)(text)


def whole_number(text: str) -> int:
    from common.numbers import int_argument

    return int_argument(0)(text)


class CliError(Exception):
    def __init__(self, message: str, status: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.status = status


# -- the HTTP client ------------------------------------------------------------------------------

def session_for(args: argparse.Namespace) -> requests.Session:
    import requests

    if not args.token:
        raise CliError("no token: pass --token or set XSG_TOKEN (see the banner of `xsg serve`)",
                       EXIT_USAGE)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {args.token}"
    return session


def gateway_url(args: argparse.Namespace) -> tuple[str, str]:
    """(the gateway's URL, where it came from): --url, else XSG_URL, else the default."""
    if getattr(args, "url", None):
        return args.url, "from --url"
    from_env = os.environ.get("XSG_URL", "").strip()
    if from_env:
        return from_env, "from XSG_URL"
    return DEFAULT_URL, "the default: neither --url nor XSG_URL is set"


def _unreachable(url: str, source: str, exc: Exception, timeout: float) -> CliError:
    """Which gateway the command tried, why it got no answer, and how to name another."""
    import re

    import requests

    if isinstance(exc, requests.Timeout):
        why = f"no answer within {timeout:g} s"
    elif isinstance(exc, requests.exceptions.SSLError):
        why = "the TLS handshake failed"
    else:
        found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", str(exc))
        why = found.group(1).strip() if found else type(exc).__name__
    return CliError(
        f"cannot reach the gateway at {url} ({source}): {why}.\n"
        "  Start one with `xsg serve` (or `make run`), or name yours: --url URL, or\n"
        "  export XSG_URL=URL XSG_TOKEN=TOKEN (the banner of `xsg serve` prints the lines to "
        "paste).")


def call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> requests.Response:
    import requests

    base, source = gateway_url(args)
    if not base.startswith(("http://", "https://")):
        raise CliError(f"the gateway URL {base!r} ({source}) is not an http:// or https:// "
                       "URL", EXIT_USAGE)
    url = base.rstrip("/") + path
    session = session_for(args)
    try:
        response = session.request(method, url, timeout=args.timeout, **kwargs)
    except requests.RequestException as exc:
        raise _unreachable(base, source, exc, args.timeout) from None
    if response.status_code >= 400:
        raise CliError(f"{method} {path} failed: HTTP {response.status_code}: "
                       f"{describe_error(response)}")
    return response


def describe_error(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason
    if isinstance(body, dict) and "error" in body:
        where = ", ".join(f"{k} {body[k]}" for k in ("source", "element", "line") if body.get(k))
        error: str = body["error"]
        return error + (f" ({where})" if where else "")
    return json.dumps(body)


def read_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", EXIT_USAGE) from None


def client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None,
                        help=URL_HELP)
    parser.add_argument("--token", default=os.environ.get("XSG_TOKEN"),
                        help="bearer token (env XSG_TOKEN)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP call")
