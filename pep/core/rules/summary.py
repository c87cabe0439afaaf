"""One line that says what a policy grants: stream, who, actions, attributes, filter, window,
validity, events. Rules and hand-written policies alike, whenever `pep.core.rules.reading` can
read them; anything else is "custom XACML" (with its streams, when its target confines it).

    weather: lta (read, subscribe) gets avg(rainrate) per tuple window of 5 every 2, of tuples
    where rainrate > 5, from 2026-11-23T00:00:00Z, until 2026-11-24T00:00:00Z
    weather: other (read) gets samplingtime, rainrate where station = 'S1'
    ais: role port-authority (read-traffic) gets every attribute where ..., lat and lon as
    grid:0.1, mmsi as hash


Several rules are separated by " | ", in document order (under first-applicable the first that
applies wins).
"""
from __future__ import annotations

from pdp import confined_resource_ids
from pep.core.rules.model import RuleWindow, Who
from pep.core.rules.reading import GrantReading, PolicyReading, read_policy, rule_from_reading

CUSTOM = "custom XACML"
# a policy's form, as GET /policies, every write's answer and a 406 for a rule name it
FORMS = ("rule", "xacml", "custom")


def _short(attribute_id: str) -> str:
    return attribute_id.rsplit(":", 1)[-1] or attribute_id


def who_text(who: Who) -> str:
    if who.anyone:
        return "anyone"
    parts = list(who.subjects)
    parts += [f"role {r}" for r in who.roles]
    for m in who.attributes:
        value = ("true" if m.value else "false") if isinstance(m.value, bool) else m.value
        parts.append(f"{_short(m.id)}={value}")
    return " or ".join(parts)


def window_text(w: RuleWindow) -> str:
    """`avg(rainrate), max(windspeed) per tuple window of 5 every 2, ...`: with a window, the
    aggregates are all a consumer sees."""
    unit = "" if w.type == "tuple" else " s"
    aggregates = []
    for text in w.aggregates:
        attribute, _, function = text.rpartition(":")
        aggregates.append(f"{function.strip().lower()}({attribute.strip()})")
    out = f"{', '.join(aggregates)} per {w.type} window of {w.size}{unit} every {w.step}{unit}"
    if w.min_count is not None:
        out += f", at least {w.min_count} tuples"
    if w.group_by:
        out += f", by {', '.join(w.group_by)}"
    return out


def grant_text(grant: GrantReading) -> str:
    actions = ", ".join(grant.actions) if grant.actions else "any action"
    who = who_text(grant.who)
    if grant.effect == "Deny":
        if grant.who.anyone and not grant.actions and grant.valid is None and not grant.events:
            return "anyone else: denied"
        head = f"{who} ({actions}): denied"
    else:
        if grant.windows:
            what = " and ".join(window_text(w) for w in grant.windows)
        else:
            shown = grant.attributes
            what = ", ".join(shown) if shown is not None else "every attribute"
        head = f"{who} ({actions}) gets {what}"
        if grant.filters:
            head += (", of tuples where " if grant.windows else " where ") + (
                grant.filters[0] if len(grant.filters) == 1 else
                " AND ".join(f"({f})" for f in grant.filters))
        if grant.masks:
            head += ", " + ", ".join(f"{' and '.join(names.split(','))} as {spec}"
                                     for names, spec in grant.masks)
        filterable = sorted({a for w in grant.windows for a in w.filterable})
        if filterable:
            head += f" (own filter before the window on {', '.join(filterable)})"
        if grant.grant_option:
            head += ", with grant option"
    if grant.valid is not None:
        if grant.valid.start:
            head += f", from {grant.valid.start}"
        if grant.valid.end:
            head += f", until {grant.valid.end}"
    if grant.events:
        verb = "is" if len(grant.events) == 1 else "are"
        head += f", while {' and '.join(grant.events)} {verb} open"
    return head


def reading_text(reading: PolicyReading) -> str:
    grants = [grant_text(g) for g in reading.grants]
    if reading.combining == "deny-unless-permit":
        grants.append("anyone else: denied")
    return f"{', '.join(reading.streams)}: " + " | ".join(grants)


def describe_policy(data: bytes) -> dict[str, str]:
    """`{"summary": one line, "form": FORM}` for a stored document. The form's word is the one
    every answer uses for it (`FORMS`): "rule" when it is a sharing rule (it reads back as
    one), "xacml" when it is other XACML read by its grants (the summary lists them),
    "custom" when it cannot be read so (the summary says "custom XACML")."""
    reading = read_policy(data)
    if reading is None:
        streams = confined_resource_ids(data)
        prefix = f"{', '.join(sorted(streams))}: " if streams else ""
        return {"summary": prefix + CUSTOM, "form": "custom"}
    form = "rule" if rule_from_reading(reading) is not None else "xacml"
    return {"summary": reading_text(reading), "form": form}


__all__ = ["describe_policy", "reading_text", "grant_text", "who_text", "window_text", "CUSTOM",
           "FORMS"]
