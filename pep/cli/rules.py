"""The sharing rule of `xsg policy new`: its flags (`add_rule_flags`) and the rule they write
over a rule file's fields (`rule_from_flags`); the gateway checks it and compiles it to XACML."""
from __future__ import annotations

import argparse
import json
from datetime import date, time
from pathlib import Path

from pep.cli.common import EXIT_USAGE, CliError, read_file
from pep.core.jsontypes import JsonObject


def _attribute_value(text: str) -> bool | int | float | str:
    """`--attribute id=value`: a number or true/false when it reads so, else the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            number: int | float = kind(text)
            return number
        except ValueError:
            pass
    return text


def _csv(values: list[str] | None) -> list[str]:
    return [part.strip() for v in values or [] for part in v.split(",") if part.strip()]


def rule_from_flags(args: argparse.Namespace) -> JsonObject:
    """The sharing rule of `xsg policy new`: the file's (if any), then each flag given over it.
    The gateway checks it (errors name the field)."""
    rule: JsonObject = {}
    if args.file:
        import yaml

        text = read_file(args.file).decode("utf-8", errors="replace")
        try:
            loaded = yaml.safe_load(text) if Path(args.file).suffix.lower() in (
                ".yaml", ".yml") else json.loads(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise CliError(f"cannot read the rule in {args.file}: {exc}", EXIT_USAGE) from None
        if not isinstance(loaded, dict):
            raise CliError(f"{args.file}: a rule is an object (stream, who, ...)", EXIT_USAGE)
        rule = loaded
    for flag, key in (("id", "id"), ("version", "version"), ("stream", "stream"),
                      ("description", "description"), ("filter", "filter")):
        if getattr(args, flag) is not None:
            rule[key] = getattr(args, flag)
    if args.anyone:
        rule["who"] = "anyone"
    elif args.subject or args.role or args.attribute:
        who: JsonObject = {}
        if args.subject:
            who["subjects"] = _csv(args.subject)
        if args.role:
            who["roles"] = _csv(args.role)
        for item in args.attribute or []:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise CliError(f"--attribute {item!r}: write ID=VALUE", EXIT_USAGE)
            who.setdefault("attributes", {}).setdefault(name.strip(), []).append(
                _attribute_value(value))
        rule["who"] = who
    if args.any_action:
        rule["actions"] = "any"
    elif args.action:
        rule["actions"] = _csv(args.action)
    if args.attributes is not None:
        rule["attributes"] = _csv([args.attributes])
    for item in args.mask or []:
        names, sep, spec = item.partition(":")  # lat,lon:grid:0.1: the attributes come first
        if not sep or not names.strip() or not spec.strip():
            raise CliError(f"--mask {item!r}: write ATTR:MASK (speed:round:10, "
                           "lat,lon:grid:0.1, mmsi:hash)", EXIT_USAGE)
        rule.setdefault("mask", {})[names.strip()] = spec.strip()
    if args.window is not None:
        parts = args.window.split(":")
        if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
            raise CliError(f"--window {args.window!r}: write TYPE:SIZE or TYPE:SIZE:STEP "
                           "(tuple:5:2, time:600)", EXIT_USAGE)
        window = dict(rule.get("window") or {})
        window.update(type=parts[0], size=parts[1], step=parts[2] if len(parts) == 3 else
                      parts[1])
        rule["window"] = window
    extras = {"aggregates": _csv(args.aggregate), "group_by": _csv(args.group_by),
              "filterable": _csv(args.filterable)}
    if any(extras.values()) or args.min_count is not None:
        if not rule.get("window"):
            raise CliError("--aggregate, --group-by, --filterable and --min-count need --window",
                           EXIT_USAGE)
        rule["window"].update({k: v for k, v in extras.items() if v})
        if args.min_count is not None:
            rule["window"]["min_count"] = args.min_count
    if args.valid_from is not None or args.valid_until is not None:
        valid = dict(rule.get("valid") or {})
        if args.valid_from is not None:
            valid["from"] = args.valid_from
        if args.valid_until is not None:
            valid["until"] = args.valid_until
        rule["valid"] = valid
    if args.event:
        rule["events"] = _csv(args.event)
    if getattr(args, "grant_option", False):
        rule["grant_option"] = True
    return rule


def jsonable(value: object) -> str:
    """YAML's dates and times (a rule file's `from: 2026-11-23`) as the text they were."""
    if isinstance(value, (date, time)):  # a datetime is a date
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a rule value")


def add_rule_flags(n: argparse.ArgumentParser) -> None:
    """The flags that write a rule: the stream, who, what, the window, when."""
    n.add_argument("--file", metavar="RULE", help="a rule file (.json, .yaml, .yml)")
    n.add_argument("--stream", help="the stream shared")
    n.add_argument("--id", help="the policy id (default urn:xsg:rule:<stream>:<who>)")
    n.add_argument("--version", help="the XACML Version (default 1.0)")
    n.add_argument("--description")
    who = n.add_argument_group("who (any one of them)")
    who.add_argument("--subject", action="append", metavar="ID", help="a subject id")
    who.add_argument("--role", action="append", help="a role")
    who.add_argument("--attribute", action="append", metavar="ID=VALUE",
                     help="an attribute the gateway vouches for (auth file or token)")
    who.add_argument("--anyone", action="store_true", help="every authenticated caller")
    what = n.add_argument_group("what")
    what.add_argument("--action", action="append",
                      help="an action id (default: read and subscribe)")
    what.add_argument("--any-action", action="store_true", help="every action")
    what.add_argument("--filter", metavar="CONDITION", help="only tuples meeting it: "
                                                            "'rainrate > 5'")
    what.add_argument("--attributes", metavar="A,B,..", help="the attributes shown "
                                                             "(default: all)")
    what.add_argument("--mask", action="append", metavar="ATTR:MASK",
                      help="shown coarser or hashed: speed:round:10, lat,lon:grid:0.1, "
                           "ts:truncate:minute, speed:bands:0,10,20, name:prefix:3, mmsi:hash, "
                           "name:null")
    window = n.add_argument_group("window (only aggregates are shown)")
    window.add_argument("--window", metavar="TYPE:SIZE[:STEP]",
                        help="tuple:5:2 (tuples) or time:600 (seconds); step defaults to size")
    window.add_argument("--aggregate", action="append", metavar="ATTR:FN",
                        help="rainrate:avg (avg max min sum count firstval lastval)")
    window.add_argument("--min-count", type=int, metavar="N",
                        help="windows of fewer tuples are not shown")
    window.add_argument("--group-by", action="append", metavar="ATTR")
    window.add_argument("--filterable", action="append", metavar="ATTR",
                        help="an attribute the consumer's own filter may use before the window")
    when = n.add_argument_group("when")
    when.add_argument("--valid-from", metavar="DATETIME", help="2026-11-23T00:00:00Z")
    when.add_argument("--valid-until", metavar="DATETIME")
    when.add_argument("--event", action="append", metavar="NAME",
                      help="a stream event that must be open")
    n.add_argument("--grant-option", action="store_true",
                   help="the consumers may re-share what they get as derived streams of their "
                        "own (`xsg stream derive`), never wider than this grant")
