"""What GET /health says about the gateway's streams (the PDP's blueprint serves the route)."""
from __future__ import annotations

from typing import Any

from pep.ports import StreamRuntimePort


def stream_health(runtime: StreamRuntimePort, detailed: bool) -> dict[str, Any]:
    """The streams' part of GET /health: how many stream queries are in each state, and a
    problem per stalled or failed one. Stream names and errors only for an administrator's
    token (the endpoint is public); a runtime that has not started reports nothing."""
    states = runtime.health()
    counts: dict[str, int] = {}
    problems = []
    for name, state in sorted(states.items()):
        kind = state.get("state", "unknown")
        counts[kind] = counts.get(kind, 0) + 1
        if kind not in ("stalled", "failed"):
            continue
        if not detailed:
            problems.append(f"a stream is {kind}")
        elif kind == "failed" and state.get("last_error"):
            problems.append(f"stream {name} is failed: {state['last_error']}")
        else:
            problems.append(f"stream {name} is {kind}")
    out: dict[str, Any] = {"streams": counts}
    if detailed:
        out["stream_states"] = states
    if problems:
        out["problems"] = problems
    return out


__all__ = ["stream_health"]
