"""Policy files from paths, as `xsg policy test` and `xsg policy lint` read them: a directory
gives the XACML documents under it (what `xsg serve` seeds from one), a file is a XACML document
or, named `.json`, `.yaml` or `.yml`, a sharing rule, compiled to the XACML the gateway would
store for it."""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import yaml

from pdp import PolicyLoadError, PolicySource
from pep.core.errors import Refusal
from pep.core.rules import RuleError, rule_from_json, rule_to_xacml

RULE_SUFFIXES = (".json", ".yaml", ".yml")


def policy_sources(paths: Iterable[Path]) -> list[PolicySource]:
    """The documents of `paths`, in order; PolicyLoadError names the file that cannot be read
    (XACML that does not compile is the engine's to report, with its line)."""
    from pdp import policy_files

    out: list[PolicySource] = []
    for path in paths:
        if path.is_dir():
            out.extend(PolicySource(str(p), p.read_bytes()) for p in policy_files(path))
            continue
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PolicyLoadError(f"cannot read it: {exc.strerror or exc}", str(path)) from None
        if path.suffix.lower() in RULE_SUFFIXES:
            data = _rule(path, data)
        out.append(PolicySource(str(path), data))
    return out


def _rule(path: Path, data: bytes) -> bytes:
    try:
        text = data.decode("utf-8")
        value = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
        return rule_to_xacml(rule_from_json(value))
    except RuleError as exc:
        raise PolicyLoadError(f"not a sharing rule: {exc}", str(path)) from None
    except (UnicodeDecodeError, ValueError, yaml.YAMLError, Refusal) as exc:
        raise PolicyLoadError(f"not a sharing rule: {exc}", str(path)) from None


__all__ = ["policy_sources", "RULE_SUFFIXES"]
