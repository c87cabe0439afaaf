"""The Kafka identities and ACLs that delivery through plan topics needs (docs/operate/edges.md,
"Fencing"): the gateway's user may do anything under the prefix and put fences, each edge's
user may only read the plan topics and write its acknowledgements. Granted once by whoever
administers the brokers; `deploy/local-cluster.sh` runs this module for its own broker:

    python -m pep.delivery.grants --bootstrap 127.0.0.1:9092 --prefix xsg. \\
        --gateway xsg-gw --edge edge-1 --edge edge-2

The passwords of the SCRAM users come from the environment, never a command line:
`XSG_DELIVERY_PASSWORD_<USER>` (the user's name upper-cased, `-` and `.` as `_`). Without a
password a user's credentials are left as they are and only its ACLs are added.
`--bootstrap` must be a listener on which this client is allowed to administer the cluster.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pep.delivery.settings import ACKS

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
# what a Kafka topic name may hold (`delivery_topic_prefix` is checked the same way in
# pep/config/validation.py): an empty prefix would grant every edge every topic
PREFIX = re.compile(r"[A-Za-z0-9._-]{1,100}")
# a user name as principal `User:<name>` and in an environment variable's name: no blank, no
# `:`/`,`/`=` (principals' and SCRAM's separators)
USER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")


@dataclass(frozen=True)
class Grant:
    """One ALLOW ACL: `principal` may `operation` on the resource."""

    principal: str
    resource: str  # TOPIC, GROUP or BROKER (Kafka's ResourceType names)
    name: str
    pattern: str  # LITERAL or PREFIXED
    operation: str  # Kafka's AclOperation names


def delivery_grants(prefix: str, gateway: str, edges: Sequence[str]) -> list[Grant]:
    """The ACLs of docs/operate/edges.md's table, for these users."""
    gw = f"User:{gateway}"
    grants = [Grant(gw, "TOPIC", prefix, "PREFIXED", "ALL"),
              Grant(gw, "GROUP", prefix, "PREFIXED", "ALL"),
              Grant(gw, "BROKER", "kafka-cluster", "LITERAL", "ALTER")]
    for edge in edges:
        user = f"User:{edge}"
        grants += [Grant(user, "TOPIC", prefix, "PREFIXED", "READ"),
                   Grant(user, "TOPIC", prefix, "PREFIXED", "DESCRIBE"),
                   Grant(user, "TOPIC", prefix + ACKS, "LITERAL", "WRITE"),
                   Grant(user, "GROUP", prefix, "PREFIXED", "READ")]
    return grants


def apply_grants(admin_config: Mapping[str, str], grants: Sequence[Grant],
                 timeout: float = 30.0) -> None:
    """Add the ACLs (adding one that exists changes nothing)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient(dict(admin_config))
    bindings = [AclBinding(ResourceType[g.resource], g.name, ResourcePatternType[g.pattern],
                           g.principal, "*", AclOperation[g.operation], AclPermissionType.ALLOW)
                for g in grants]
    for future in admin.create_acls(bindings, request_timeout=timeout).values():
        future.result(timeout)


def upsert_scram_users(admin_config: Mapping[str, str], passwords: Mapping[str, str],
                       mechanism: str = "SCRAM-SHA-512", timeout: float = 30.0) -> None:
    """Create each user, or set its password."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialAlteration,
        UserScramCredentialUpsertion,
    )

    if not passwords:
        return
    kind = ScramMechanism.SCRAM_SHA_512 if mechanism == "SCRAM-SHA-512" \
        else ScramMechanism.SCRAM_SHA_256
    admin = AdminClient(dict(admin_config))
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(user, ScramCredentialInfo(kind, 4096), password.encode())
        for user, password in passwords.items()]
    for future in admin.alter_user_scram_credentials(upserts, request_timeout=timeout).values():
        future.result(timeout)


def password_variable(user: str) -> str:
    """The environment variable holding `user`'s password."""
    return "XSG_DELIVERY_PASSWORD_" + re.sub(r"[^A-Za-z0-9]", "_", user).upper()


_PORT = re.compile(r"[0-9]{1,5}")  # ASCII digits only (str.isdigit also takes "²")


def _bootstrap(text: str) -> str:
    """`host:port[,host:port...]`, each port 1 to 65535 (argparse's `type`)."""
    for server in text.split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port:
            raise argparse.ArgumentTypeError(f"expected host:port[,host:port...], got {text!r}")
        if not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
            raise argparse.ArgumentTypeError(f"the port of {server.strip()!r} must be a number "
                                             "from 1 to 65535")
    return text


def _matching(pattern: re.Pattern[str], expected: str) -> Callable[[str], str]:
    """An argparse `type` that takes a text `pattern` matches whole, else says `expected`."""
    def check(text: str) -> str:
        if not pattern.fullmatch(text):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return text
    return check


_prefix = _matching(PREFIX, "1 to 100 of the characters Kafka allows in a topic name "
                            "(letters, digits, '.', '_', '-')")
_user = _matching(USER, "a Kafka user name (1 to 128 letters, digits, '.', '_', '@', '-'; a "
                        "letter or digit first)")


def _check_users(parser: argparse.ArgumentParser, gateway: str, edges: Sequence[str]) -> None:
    """Each edge its own identity (it is fenced alone), never the gateway's; and each user its
    own password variable."""
    seen: dict[str, str] = {password_variable(gateway): gateway}
    for edge in edges:
        if edge == gateway:
            parser.error(f"argument --edge: {edge!r} is the gateway's user (--gateway): an edge "
                         "has an identity of its own")
        variable = password_variable(edge)
        if variable in seen:
            other = seen[variable]
            parser.error(f"argument --edge: {edge!r} given twice" if other == edge else
                         f"argument --edge: {edge!r} and {other!r} would share the password "
                         f"variable {variable}")
        seen[variable] = edge


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pep.delivery.grants",
        description="Create the Kafka users and ACLs of delivery through plan topics (the "
                    "gateway's and each edge's; docs/operate/edges.md). Passwords come from "
                    "XSG_DELIVERY_PASSWORD_<USER>.")
    parser.add_argument("--bootstrap", required=True, type=_bootstrap,
                        help="a listener on which this client administers the cluster "
                             "(host:port[,host:port...])")
    parser.add_argument("--prefix", default="xsg.", type=_prefix,
                        help="the delivery_topic_prefix (xsg.)")
    parser.add_argument("--gateway", required=True, type=_user, help="the gateway's Kafka user")
    parser.add_argument("--edge", action="append", default=[], type=_user,
                        help="an edge's Kafka user (repeatable)")
    parser.add_argument("--mechanism", default="SCRAM-SHA-512", choices=MECHANISMS)
    args = parser.parse_args(argv)
    _check_users(parser, args.gateway, args.edge)
    users = [args.gateway, *args.edge]
    passwords = {u: os.environ[password_variable(u)] for u in users
                 if os.environ.get(password_variable(u))}
    admin = {"bootstrap.servers": args.bootstrap}
    try:
        upsert_scram_users(admin, passwords, args.mechanism)
        apply_grants(admin, delivery_grants(args.prefix, args.gateway, args.edge))
    except Exception as exc:  # noqa: BLE001 - a KafkaException or a time-out: said, exit 1
        print(f"pep.delivery.grants: {exc}", file=sys.stderr)
        return 1
    print(f"granted: {len(passwords)} user(s) set, ACLs for {', '.join(users)} under "
          f"{args.prefix!r}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
