"""Query graphs (Aurora style): the common shape of policy obligations and user queries.

Both sides of a request become a `QueryGraph`, so that merging is "merge each kind of operator".
A graph is a tree of operators ending in its sink; every operator names its input. Today the PEP
builds and merges linear pipelines `Source -> Filter -> Mask -> Map -> WindowAggregate` (any of
the last four optional, always in that order: security filters on raw values first, then the
masks, before anything else sees a value). `Join` and `Union` are
modelled (ASSIST's operators) so that graphs with several sources can be represented and
rendered; the merge refuses them explicitly rather than guessing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from pep.core.conditions import Expr, to_text
from pep.core.plan import PolicyWindowTerms, WindowAsk, WindowSpec

# Re-exported for callers of the graph model; defined in pep.core.schemas.
from pep.core.schemas import AIS_SCHEMA, BUILTIN_SCHEMAS, WEATHER_SCHEMA  # noqa: F401 - re-exported


@dataclass(frozen=True)
class Source:
    stream: str


@dataclass(frozen=True)
class Filter:
    input: Node
    condition: Expr  # bound to the stream schema
    text: str = ""  # as written, for messages

    def describe(self) -> str:
        return self.text.strip() or to_text(self.condition)


@dataclass(frozen=True)
class Mask:
    """Attributes shown masked (`pep.core.masks`): (attribute, mask spec) in schema order. In a
    policy's graph the owner's masks; in a user's graph the coarser masks the consumer asks
    for; in a merged graph what is applied, right after the filter."""

    input: Node
    masks: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Map:
    input: Node
    attributes: tuple[str, ...]  # canonical schema names, in schema order


@dataclass(frozen=True)
class WindowAggregate:
    """Windows over the input, aggregated (per group-by key, when keys are given): `spec`, the
    one window value (`pep.core.plan.WindowSpec`, which says what its fields mean in a policy's
    graph and in a consumer's). What only a policy says of its window is `policy` (set in a
    policy's graph), what only a consumer asks `ask` (set in a consumer's); a merged graph has
    neither."""

    input: Node
    spec: WindowSpec
    policy: PolicyWindowTerms | None = None
    ask: WindowAsk | None = None


@dataclass(frozen=True)
class Join:
    """Windowed join of two inputs (ASSIST section 5.1); not merged by this PEP yet."""

    left: Node
    right: Node
    condition: Expr
    left_window: tuple[int, int] | None = None  # (size, step)
    right_window: tuple[int, int] | None = None


@dataclass(frozen=True)
class Union_:
    """Union of inputs with one schema (ASSIST section 5.1); not merged by this PEP yet."""

    inputs: tuple[Node, ...]


Node = Source | Filter | Mask | Map | WindowAggregate | Join | Union_
Operator = Filter | Mask | Map | WindowAggregate
OperatorT = TypeVar("OperatorT", Filter, Mask, Map, WindowAggregate)


class UnsupportedGraph(ValueError):
    """The graph has an operator the merge does not handle (joins, unions)."""


@dataclass(frozen=True)
class QueryGraph:
    sink: Node

    @property
    def source(self) -> Source:
        return self.pipeline()[0]

    def pipeline(self) -> tuple[Source, tuple[Operator, ...]]:
        """Source and operators from the source to the sink, for a linear graph."""
        ops: list[Operator] = []
        node = self.sink
        while not isinstance(node, Source):
            if isinstance(node, (Join, Union_)):
                raise UnsupportedGraph(f"{type(node).__name__.rstrip('_')} operators are not "
                                       "supported by the merge yet")
            ops.append(node)
            node = node.input
        return node, tuple(reversed(ops))

    def operator(self, kind: type[OperatorT]) -> OperatorT | None:
        """The pipeline's operator of this kind (it has at most one of each)."""
        for op in self.pipeline()[1]:
            if isinstance(op, kind):
                return op
        return None

    @property
    def filter(self) -> Filter | None:
        return self.operator(Filter)

    @property
    def map(self) -> Map | None:
        return self.operator(Map)

    @property
    def window(self) -> WindowAggregate | None:
        return self.operator(WindowAggregate)

    @property
    def mask(self) -> Mask | None:
        return self.operator(Mask)


def pipeline_graph(stream: str, *, filter: tuple[Expr, str] | None = None,
                   map: tuple[str, ...] | None = None,
                   window: WindowSpec | None = None,
                   policy_window: PolicyWindowTerms | None = None,
                   window_ask: WindowAsk | None = None,
                   mask: tuple[tuple[str, str], ...] | None = None) -> QueryGraph:
    """Build Source -> Filter -> Mask -> Map -> WindowAggregate with the parts that are given
    (`policy_window` and `window_ask`: what only a policy or a consumer says of the window)."""
    node: Node = Source(stream)
    if filter is not None:
        node = Filter(node, filter[0], filter[1])
    if mask:
        node = Mask(node, tuple(mask))
    if map is not None:
        node = Map(node, tuple(map))
    if window is not None:
        node = WindowAggregate(node, window, policy_window, window_ask)
    return QueryGraph(node)

