"""The shared query's adaptive trigger: short while one stream is busy, longer while many are.

Every micro-batch costs Spark's driver a fixed share (listing, the offset and commit logs,
planning the job, ~0.1-0.2 s here) plus a share that grows with the streams it carries (each
busy stream's frames are analysed and planned). With one busy stream the fixed share is all,
and the shortest interval gives the lowest latency; with many, batches that come as fast as
they can keep the driver busy all the time and each tuple waits behind the batch before it.
So the pause after a batch follows its own work: the next batch starts no sooner than
`work / duty` seconds after this one began (the driver busy at most `duty` of the time, by
default three quarters), and never sooner than `low` nor later than `high` seconds, the operator's
bounds. A batch of one busy stream (or none) pauses no longer than `low` asks.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_LOW = 0.25
DEFAULT_HIGH = 2.0
DEFAULT_DUTY = 0.75


@dataclass(frozen=True)
class TriggerBounds:
    """The operator's bounds in seconds between micro-batches' starts, and the share of the
    time the driver may spend in them."""

    low: float = DEFAULT_LOW
    high: float = DEFAULT_HIGH
    duty: float = DEFAULT_DUTY

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ValueError(f"trigger bounds: need 0 <= min ({self.low}) <= max ({self.high})")
        if not 0 < self.duty <= 1:
            raise ValueError(f"trigger duty {self.duty} is not in (0, 1]")

    def interval(self, work: float, busy: int) -> float:
        """Seconds from this batch's start to the next one's, after `work` seconds of it with
        `busy` streams bringing tuples."""
        if busy <= 1:
            return self.low
        return min(self.high, max(self.low, work / self.duty))

    def pause(self, work: float, busy: int) -> float:
        """Seconds to hold the batch before it returns. The query's own trigger is `low`: the
        next batch starts at the first multiple of `low` after this one returned, so holding
        it `interval - work - low` starts the next within `low` before the interval's end."""
        return max(0.0, self.interval(work, busy) - work - self.low)


__all__ = ["DEFAULT_DUTY", "DEFAULT_HIGH", "DEFAULT_LOW", "TriggerBounds"]
