"""What of an audit entry each reader sees: administrators everything, a stream owner its side.

Most entries concern one stream, and its owner reads them whole. A join's entries concern two
streams that may have two owners; each owner must learn that a consumer reads its stream through
a join, and with which stream, but nothing of the other side: its policies (ids and versions),
its plan (filter, map, window: which attributes the other owner hides, from whom), or a reason
that came from the other side's policy. So an entry of a join names both streams (`streams`) and
carries per-side parts (`sides`: each side's stream, plan and policies, see `pep.audit.trail`);
an owner of one side gets:

- the entry's common fields (time, seq, kind, subject, stream, streams, handle_ref, new);
- `sides` reduced to the sides of streams it owns;
- without the whole join's `plan`, `plan_key` and `policies`, and without a `reason`, unless
  the reason is known to come from a side it owns (`side`, set for a refusal from one side's
  own decision, query or merge); a `withheld` list names what was left out.

An owner of every stream an entry names reads it whole. Policy changes keep their own rule: an
owner reads the change of a policy confined to streams it owns (all of them), nothing else.

An entry about a derived stream (issue 48) names the streams it derives from, nearest first
(`derived_from`), and keeps what belongs to the source's owner under `upstream` (the policies
behind the deriving grant, the reason it ended). The derived stream's owner reads the entry
without `upstream`; the owner of its source reads it without what is the derived stream's
owner's (its policies and plans for its consumers, `plan_key`, a refusal's or an ending's
`reason`) but with `upstream`; the owner of a stream farther up the chain reads neither. So
each owner sees the chain, who derived and who reads what was derived, and nothing of another
owner's policy; a `withheld` list names what was left out.
Entries written before joins carried `streams` and `sides` are read the same way: their join
plan names both streams, and their sides are cut from it (without policies, which cannot be
split after the fact).
"""
from __future__ import annotations

from collections.abc import Callable

from pep.core.jsontypes import JsonObject, JsonValue

# An entry as written and read back: a JSON object, its fields per kind (`pep.audit.trail`).
AuditEntry = JsonObject
# What a reader sees of an entry (None: nothing); `owner_view` with the reader's `Owns`.
EntryView = Callable[[AuditEntry], "AuditEntry | None"]
# Whether the reader owns a stream, asked of an entry's field as read (so of any JSON value).
Owns = Callable[[JsonValue], bool]

WHOLE_JOIN_FIELDS = ("plan", "plan_key", "policies")
# a derived stream's entry: its owner's fields, and the source owner's part
DERIVED_OWNER_FIELDS = ("plan", "plan_key", "policies", "reason", "sides")
UPSTREAM = "upstream"
# reasons that are the gateway's own words, whatever the streams (a consumer's release)
PLAIN_REASONS = frozenset({"released by its owner"})


def _join_plan(entry: AuditEntry) -> JsonObject | None:
    plan = entry.get("plan")
    join = plan.get("join") if isinstance(plan, dict) else None
    return join if isinstance(join, dict) else None


def is_policy_entry(entry: AuditEntry) -> bool:
    return str(entry.get("kind", "")).startswith("policy-")


def entry_streams(entry: AuditEntry) -> list[str]:
    """Every stream the entry concerns: its `stream`, a join's `streams` (both sides), a join
    plan's two streams; for a policy change, the streams its policy is confined to."""
    out: list[str] = []
    if isinstance(entry.get("stream"), str):
        out.append(entry["stream"])
    streams = entry.get("streams")
    if isinstance(streams, list):
        out.extend(s for s in streams if isinstance(s, str))
    out.extend(_derived_from(entry))
    join = _join_plan(entry)
    if join is not None:
        for side in ("left", "right"):
            part = join.get(side)
            if isinstance(part, dict) and isinstance(part.get("stream"), str):
                out.append(part["stream"])
    return list(dict.fromkeys(out))


def _derived_from(entry: AuditEntry) -> list[str]:
    chain = entry.get("derived_from")
    return [s for s in chain if isinstance(s, str)] if isinstance(chain, list) else []


def _derived_view(entry: AuditEntry, owns: Owns) -> AuditEntry | None:
    """A derived stream's entry as an owner sees it (module docstring)."""
    chain = _derived_from(entry)
    stream_owner = owns(entry.get("stream"))
    source_owner = bool(chain) and owns(chain[0])
    if stream_owner and source_owner:
        return entry
    if not stream_owner and not any(owns(s) for s in chain):
        return None
    left_out = [] if stream_owner else [k for k in DERIVED_OWNER_FIELDS if k in entry]
    if not source_owner and UPSTREAM in entry:
        left_out.append(UPSTREAM)
    if not left_out:
        return entry
    view = {k: v for k, v in entry.items() if k not in left_out}
    view["withheld"] = left_out
    return view


def _sides(entry: AuditEntry) -> list[JsonObject]:
    sides = entry.get("sides")
    if isinstance(sides, list):
        return [s for s in sides if isinstance(s, dict)]
    join = _join_plan(entry)
    if join is None:
        return []
    return [{"stream": join[side].get("stream"), "plan": join[side]}
            for side in ("left", "right") if isinstance(join.get(side), dict)]


def owner_view(entry: AuditEntry, owns: Owns) -> AuditEntry | None:
    """The entry as a non-administrator sees it, `owns(stream)` telling its streams; None when
    it concerns none of them (see the module docstring)."""
    if is_policy_entry(entry):
        streams = entry.get("streams")
        return entry if streams and all(owns(s) for s in streams) else None
    if _derived_from(entry):
        return _derived_view(entry, owns)
    streams = entry_streams(entry)
    owned = [s for s in streams if owns(s)]
    if not owned:
        return None
    if len(owned) == len(streams):
        return entry
    view = {k: v for k, v in entry.items() if k not in WHOLE_JOIN_FIELDS and k != "sides"}
    withheld = [k for k in WHOLE_JOIN_FIELDS if k in entry]
    sides = _sides(entry)
    if sides:
        view["sides"] = [s for s in sides if owns(s.get("stream"))]
    if "streams" not in view:
        view["streams"] = streams
    reason = entry.get("reason")
    if reason is not None and not (isinstance(reason, str) and reason in PLAIN_REASONS) \
            and not (isinstance(entry.get("side"), str) and owns(entry["side"])):
        del view["reason"]
        withheld.append("reason")
    if withheld:
        view["withheld"] = withheld
    return view


__all__ = ["AuditEntry", "EntryView", "Owns", "owner_view", "entry_streams", "is_policy_entry"]
