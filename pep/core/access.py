"""An access request's way from XACML to an execution plan: decide, then plan what is granted.

Shared by `POST /explain` (which stops here) and `POST /requests` (which goes on to open a
handle). The order of the steps is the eXACML+ workflow (section 3.2): parse, bind the
authenticated subject, decide, obligations to a graph, user query to a graph, merge with NR/PR
analysis. Every failure is a `pep.core.errors.Refusal` of the kind that says what went wrong (a
denial carries the XACML response, for the edge to answer in XACML); nothing here starts a query.

A user query with a `join` (pep.core.join) asks for two streams: the request's own and a second
one. The second is decided with the same request, its resource-id replaced (same authenticated
subject, action and environment), rather than with one request holding two resource categories:
that way each side gets exactly the decision and obligations a request for that stream alone
would get, from the policies written for that stream (whose targets and `{resource:resource-id}`
placeholders see their own stream), owners need no join-specific policies, and the PDP stays
single-decision (two resource categories are the Multiple Decision Profile, which a stream
request refuses). The join is planned only when both are Permit; a denial names the stream.

The gateway's environment (stream events) is asked per stream: each decision sees the events
of the stream it decides, the second side of a join those of the second stream, never another
stream's (`pep.streams.events` says why). A refusal of a join carries both streams in its
details (`streams`) and, when it came from one side's own decision, query or merge, that side
(`side`): the audit trail shows each owner only what concerns its own side.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Protocol

from common.auth import Identity
from pdp import (
    ACCESS_SUBJECT as SUBJECT_CATEGORY,
    ACTION,
    ACTION_ID,
    ENVIRONMENT as ENVIRONMENT_CATEGORY,
    RESOURCE,
    RESOURCE_ID,
    STATUS_SYNTAX_ERROR,
    STRING,
    SUBJECT_ID,
    SUBJECT_ROLE,
    Decision,
    RequestContext,
    RequestSyntaxError,
    Response,
    Result,
    RuleGrant,
    Status,
    bind_environment,
    bind_join,
    bind_subject,
    media_kind,
    parse_request,
)
from pep.core.analysis import ConditionTooComplex, MergeWarning
from pep.core.errors import (
    AccessDenied,
    InvalidInput,
    MalformedRequest,
    NoResult,
    NotFound,
    NotPermitted,
    Refusal,
    TooComplex,
    Unprocessable,
    UnsupportedMedia,
)
from pep.core.explain import AnyPlanJson, GraphJson, graph_to_json, plan_to_json, render_sql
from pep.core.graph import QueryGraph, UnsupportedGraph
from pep.core.join import JoinSide, build_join, check_streams
from pep.core.joingrant import JoinGrant, apply_join_grants, read_join_grant, split_obligations
from pep.core.labels import LabelError
from pep.core.masks import Mask, policy_masks
from pep.core.merge import MergeResult, merge
from pep.core.obligations import ObligationError, grant_option, policy_graph, punctuation_defer
from pep.core.parsed import MemoKey, RequestMemo
from pep.core.plan import ExecutionPlan, JoinPlan, StreamSchema, UnionPlan
from pep.core.union import INTERSECTION, UNION, Alternative, merge_union
from pep.core.userquery import (
    JoinQuery,
    UserQuery,
    UserQueryError,
    parse_user_query,
    query_from_content,
    user_graph,
)

SchemaLookup = Callable[[str], "StreamSchema | None"]
Explained = tuple[str, AnyPlanJson, GraphJson]
"""A grant's renderings: (the SQL-like text, the plan's JSON, the graph's JSON)."""


class Decider(Protocol):
    """The PDP as a request is decided by it (`pdp.PolicyEngine`, `pdp.PolicyService`): the
    response, and per result the ids of the top-level policies that decided it."""

    def decide_with_trace(self, request: RequestContext) -> tuple[Response, list[set[str]]]: ...


@dataclass
class Grant:
    """A permitted access request, planned: what the consumer will get and why."""

    decision: Response
    stream: str
    subject: str
    plan: ExecutionPlan | JoinPlan | UnionPlan  # a join's, or a union of grants' (pep.core.union)
    warnings: list[MergeWarning]
    policy_ids: set[str]
    # (sql, plan_json, graph_json), rendered when first asked for: a revocation pass plans
    # every live handle again and compares keys only (rendering was 0.1-0.2 ms of each)
    explain: Callable[[], Explained] = field(repr=False, compare=False)
    # every rule that permitted it gave the consumer the grant option (`pep.core.obligations`):
    # it may re-share this single stream's plan as a derived stream (`pep.core.derived`)
    grant_option: bool = False

    @property
    def decided_key(self) -> str:
        """What a handle opened on this grant holds, and a re-decision compares: the plan's key,
        and whether the grant option came with it (`decided_key`)."""
        return decided_key(self.plan.key(), self.grant_option)

    @cached_property
    def _explained(self) -> Explained:
        return self.explain()

    @property
    def sql(self) -> str:
        return self._explained[0]

    @property
    def plan_json(self) -> AnyPlanJson:
        return self._explained[1]

    @property
    def graph_json(self) -> GraphJson:
        return self._explained[2]


def decided_key(plan_key: str, grant_option: bool) -> str:
    """A decision's key: the plan's, or for a grant with the grant option a key of its own, so
    that a policy change that gives or takes the option changes what a live handle was granted
    (it is revoked as for any other obligation change, and a derived stream it feeds ends).
    Without the option the key is the plan's, as handles stored before the option hold it."""
    if not grant_option:
        return plan_key
    return hashlib.sha256(f"{plan_key}:grant-option".encode()).hexdigest()


EnvironmentAttributes = list[tuple[str, str, list[str]]]
# the gateway's environment attributes for a decision about one stream
StreamEnvironment = Callable[[str], EnvironmentAttributes]


def caller_resolver(identity: Identity, stream: str,
                    environment: Sequence[tuple[str, str, list[str]]] = ()
                    ) -> Callable[[str, str], list[str]]:
    """What a policy's placeholders may stand for: only what the gateway itself vouches for.

    `{subject:...}` is the authenticated caller: subject-id, role, or one of the identity's
    attributes (from the auth file or the token), by its full AttributeId or, when exactly one
    attribute ends so, its last segment. `{resource:resource-id}` is the stream being asked for.
    `{environment:...}` is one of the gateway's own environment attributes (stream events, by
    full id). Nothing else resolves, and nothing is ever read from the request document: a
    request can add, repeat or respell attributes in any category without changing what a
    placeholder becomes.
    """
    subject: list[tuple[str, list[str]]] = [
        (SUBJECT_ID, [identity.subject]), (SUBJECT_ROLE, list(identity.roles))]
    for attribute_id, values in identity.attributes:
        subject.append((attribute_id, [_lexical(v) for v in values]))
    by_category = {SUBJECT_CATEGORY: subject, RESOURCE: [(RESOURCE_ID, [stream])],
                   ENVIRONMENT_CATEGORY: [(a, list(v)) for a, _, v in environment]}

    def resolve(category: str, attribute: str) -> list[str]:
        known = by_category.get(category, [])
        exact = [values for name, values in known if name == attribute]
        if exact:
            return exact[0]
        if category == ENVIRONMENT_CATEGORY:
            return []  # the gateway's environment attributes are named in full
        short = [values for name, values in known if name.rsplit(":", 1)[-1] == attribute]
        if len(short) > 1:
            raise ObligationError(f"placeholder {attribute!r} is ambiguous: several of the "
                                  "caller's attributes end so; write the full AttributeId")
        return short[0] if short else []

    return resolve


@dataclass(frozen=True)
class AccessPlanner:
    """`decide_and_plan` with what the gateway adds to every decision about a stream: the time
    attribute of each stream (its catalogue entry), the gateway's environment for a stream
    (its stream events), how several rules' obligations combine on it (its owner's choice, else
    the gateway's). One object, built once (`pep.services`), that `POST /requests`, `POST
    /explain`, sharing rules' previews and the revocation service each receive: a request is
    decided the same way when it opens a handle and when it is decided again."""

    time_attribute: Callable[[str], str | None]
    environment: StreamEnvironment
    combining: Callable[[str], str]

    def decide_and_plan(self, engine: Decider, body: bytes, media_type: str, identity: Identity,
                        schema_lookup: SchemaLookup, user_query: bytes | None = None,
                        user_query_type: str | None = None, *, refuse_nr: bool = True,
                        parsed: RequestMemo | None = None,
                        explain_missing_action: bool = False) -> Grant:
        """`decide_and_plan(...)` (below) with this gateway's lookups."""
        return decide_and_plan(engine, body, media_type, identity, schema_lookup, user_query,
                               user_query_type, refuse_nr=refuse_nr,
                               time_attribute_lookup=self.time_attribute,
                               environment=self.environment, combining=self.combining,
                               parsed=parsed, explain_missing_action=explain_missing_action)


def _lexical(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _deny(reason: str, media_type: str) -> AccessDenied:
    response = Response((Result(Decision.DENY, Status(message=reason)),))
    return AccessDenied(reason, response, media_type)


def decide_and_plan(engine: Decider, body: bytes, media_type: str, identity: Identity,
                    schema_lookup: SchemaLookup,
                    user_query: bytes | None = None, user_query_type: str | None = None, *,
                    refuse_nr: bool = True,
                    time_attribute_lookup: Callable[[str], str | None] | None = None,
                    environment: StreamEnvironment | None = None,
                    combining: Callable[[str], str] | None = None,
                    parsed: RequestMemo | None = None,
                    explain_missing_action: bool = False) -> Grant:
    """Decide and plan one stream request; raises a Refusal saying why on any failure.
    `environment(stream)` gives the gateway's own environment attributes for a decision about
    that stream (its events); `combining(stream)` how the obligations of several applicable
    rules combine on it (`pep.core.union`: "intersection", the default, or "union").
    `parsed` keeps the parsed request and user query for the next time the same bytes are
    decided (`pep.core.parsed`: a revocation pass decides every live handle's request again);
    what it keeps is bound to the caller afresh at every decision.
    `explain_missing_action`: the denial of a request that names no action id says so (its
    message and the XACML status message), not a bare Deny: policies grant named actions, and
    the caller left its out. The decision itself is XACML's, unchanged (the PDP's /pdp answers
    the same request NotApplicable, or Indeterminate where a policy needs the attribute), so
    a policy that grants whatever the action still permits such a request, and a denial for
    another reason (a closed stream event, say) stays a 403 rather than an error that would
    blame the action. New requests set it; a stored one decided again needs no hint."""
    try:
        media_kind(media_type)
    except RequestSyntaxError as exc:
        raise UnsupportedMedia(str(exc)) from None
    memo = _Memo(parsed, body, media_type, user_query, user_query_type)
    try:
        ctx = memo.request()
    except RequestSyntaxError as exc:
        status = Status(code=getattr(exc, "status_code", STATUS_SYNTAX_ERROR), message=str(exc))
        response = Response((Result(Decision.INDETERMINATE, status),))
        raise MalformedRequest(str(exc), response, media_type) from None
    asked_session = ctx.values(SUBJECT_CATEGORY, SESSION)
    ctx = bind_subject(ctx, identity)

    streams = list(dict.fromkeys(ctx.values(RESOURCE, RESOURCE_ID)))
    if not streams:
        raise InvalidInput(f"the request names no stream: give the resource attribute "
                           f"{RESOURCE_ID}")
    if len(streams) > 1:
        raise InvalidInput(f"the request names {len(streams)} streams ({', '.join(streams)}); "
                           "a stream request is for exactly one")
    stream = streams[0]
    schema = schema_lookup(stream)
    if schema is None:
        raise NotFound(f"unknown stream {stream!r}", stream=stream)
    session = session_level(asked_session, identity, schema, stream)
    if session is not None:
        ctx = ctx.with_attribute(SUBJECT_CATEGORY, SESSION, STRING, [session])
        identity = _with_session(identity, session)
    environment = environment if environment is not None else _no_environment
    gateway_environment = environment(stream)
    ctx = bind_environment(ctx, gateway_environment)
    # The user query, read once (a revocation pass decides a thousand handles again); a query
    # that does not parse is refused only after the decision, as before: a denial comes first.
    asked = _read_user_query(ctx, user_query, user_query_type, memo)
    # which stream this one is joined with is the gateway's to say (`pep.core.joingrant`)
    ctx = bind_join(ctx, asked.join_with)
    settings = _Settings(refuse_nr, time_attribute_lookup, environment, schema_lookup,
                         combining or _intersection, explain_missing_action)

    try:
        return _plan(_Planning(engine, ctx, stream, schema, identity, media_type,
                               gateway_environment, settings), asked)
    except Refusal as exc:
        exc.details.setdefault("stream", stream)  # for the audit trail and the error body
        raise


SESSION = "urn:xsg:subject:session"
CLEARANCE = "clearance"


def session_level(asked: list[str], identity: Identity, schema: StreamSchema, stream: str
                  ) -> str | None:
    """The security label the request runs at (MLS DSMS: a user logs in as one of its
    principals, at or below its clearance), or None when there is nothing to bind.

    The caller's clearance is the identity attribute `clearance` (from the auth file or the
    token, never the request); the request may name a lower session level in its access-subject
    attribute `urn:xsg:subject:session` (the one subject attribute a request states; the
    gateway checks it), else it runs at its clearance. Both are labels of the stream's label
    attributes' lattices; a session not dominated by the clearance is refused (403), as is one
    on a stream without labels (400)."""
    lattices = list(dict.fromkeys(f.lattice for f in schema.fields if f.lattice is not None))
    clearance = [v for a, values in identity.attributes
                 if a == CLEARANCE or a.endswith(":" + CLEARANCE) for v in values]
    wanted = list(dict.fromkeys(asked))
    if len(wanted) > 1:
        raise InvalidInput(f"the request names {len(wanted)} session levels "
                           f"({SESSION}); a request runs at one")
    if not lattices:
        if wanted:
            raise InvalidInput(f"stream {stream!r} has no security labels: a session level "
                               f"({SESSION}) means nothing for it", stream=stream)
        return None
    if len(clearance) != 1:
        if wanted:
            raise NotPermitted(f"you have no clearance (attribute {CLEARANCE!r}) to run at "
                               f"session level {wanted[0][:64]!r}", stream=stream)
        return None
    session = wanted[0] if wanted else str(clearance[0])
    for lattice in lattices:
        try:
            cleared = lattice.parse(str(clearance[0]))
        except LabelError as exc:
            if not wanted:  # a clearance of another kind (a number): no session to bind
                return None
            raise NotPermitted(f"your clearance is not a label of stream {stream!r}: {exc}",
                               stream=stream) from None
        try:
            level = lattice.parse(session)
        except LabelError as exc:
            raise InvalidInput(f"session level ({SESSION}): {exc}", stream=stream) from None
        if not level.dominated_by(cleared):
            raise NotPermitted(f"session level {str(level)!r} is not dominated by your "
                               f"clearance {str(cleared)!r}: no session above it", stream=stream)
        session = str(level)
    return session


def _with_session(identity: Identity, session: str) -> Identity:
    """The identity with its session level among its attributes (`{subject:session}`)."""
    attributes = tuple((a, v) for a, v in identity.attributes if a != SESSION)
    return replace(identity, attributes=attributes + ((SESSION, (session,)),))


def _no_environment(stream: str) -> EnvironmentAttributes:
    return []


def _intersection(stream: str) -> str:
    return INTERSECTION


@dataclass(frozen=True)
class _Settings:
    refuse_nr: bool
    time_attribute_lookup: Callable[[str], str | None] | None
    environment: StreamEnvironment
    schema_lookup: SchemaLookup | None
    combining: Callable[[str], str]
    explain_missing_action: bool = False

    def time_attribute(self, stream: str) -> str | None:
        return self.time_attribute_lookup(stream) if self.time_attribute_lookup else None


@dataclass(frozen=True)
class _Planning:
    """One stream's part of a request being decided and planned: what every step reads. A join's
    second side is the first's with its own stream, schema, request context and environment."""

    engine: Decider
    ctx: RequestContext  # the XACML request, bound to the caller, `environment` and the join
    stream: str
    schema: StreamSchema
    identity: Identity  # who authenticated (with its session level, if one was asked for)
    media_type: str  # the request's, for the XACML of a denial
    environment: EnvironmentAttributes  # the gateway's environment of `stream`, as in `ctx`
    settings: _Settings


@dataclass(frozen=True)
class _Decided:
    """One stream's decision, planned as far as the policy side goes: the alternatives (one in
    the intersection mode; one per applicable rule's grant in the union mode), each a policy
    graph with the join grants it carries."""

    response: Response
    policy_ids: set[str]
    alternatives: tuple[Alternative, ...]
    joins: tuple[tuple[JoinGrant, ...], ...]  # per alternative
    grant_option: bool = False  # every permitting rule gave it (`pep.core.obligations`)
    punctuation_defer: bool = False  # every permitting rule defers to the punctuations

    @property
    def policy(self) -> QueryGraph:
        return self.alternatives[0].policy


def _masks_of(decided: _Decided) -> dict[str, Mask]:
    """The masks a consumer's query is read against: the grant's; under the union mode, each
    attribute's mask from the first grant that masks it (a masked grant is never united with
    another: `pep.core.union`)."""
    masks: dict[str, Mask] = {}
    for alt in decided.alternatives:
        for name, mask in policy_masks(alt.policy).items():
            masks.setdefault(name, mask)
    return masks


def _decide(req: _Planning, join: str | None = None, partner: str | None = None,
            mode: str = INTERSECTION, schemas: dict[str, StreamSchema] | None = None) -> _Decided:
    """One stream's decision and its policy side (`_Decided`). `join`, when the request is a
    join, words a denial so that it names the stream; `partner` is the other stream of the
    join (None: the stream alone)."""
    stream, schema, media_type = req.stream, req.schema, req.media_type
    response, traces = req.engine.decide_with_trace(req.ctx)
    if len(response.results) != 1:
        raise InvalidInput(f"the request asks for {len(response.results)} decisions (Multiple "
                           "Decision Profile); a stream request must ask for exactly one")
    result = response.results[0]
    if result.decision is not Decision.PERMIT:
        reason = result.status.message or f"decision is {result.decision.value}"
        if req.settings.explain_missing_action and not any(
                str(v).strip() for v in req.ctx.values(ACTION, ACTION_ID)):
            reason += (f"; note: the request names no action (attribute {ACTION_ID} in the "
                       f"category {ACTION}), and a policy that grants only named actions, "
                       "such as 'read', does not apply to it")
            response = _with_status_message(response, reason)
        if join is None:
            raise AccessDenied(f"access denied: {reason}", response, media_type)
        raise _join_denial(response, stream, join, media_type)
    policy_ids: set[str] = set().union(*traces) if traces else set()
    resolver = caller_resolver(req.identity, stream, req.environment)
    grants = (result.rule_grants() if mode == UNION
              else (RuleGrant("", result.obligations),))
    where = f" on stream {stream!r} ({join})" if join else ""
    alternatives: list[Alternative] = []
    joins: list[tuple[JoinGrant, ...]] = []
    skipped: list[str] = []
    for grant in grants:
        rest, join_obligations = split_obligations(grant.obligations)
        try:
            found = tuple(read_join_grant(ob, stream, partner, schemas or {stream: schema},
                                          resolver) for ob in join_obligations)
        except ObligationError as exc:
            if partner is None and len(grants) > 1:
                # under union, a grant for joins only is no grant of the stream alone
                skipped.append(exc.message)
                continue
            raise _deny(f"obligation cannot be fulfilled{where}: {exc.message}", media_type) \
                from None
        try:
            policy = policy_graph(rest, stream, schema, resolver=resolver)
        except ObligationError as exc:
            raise _deny(f"obligation cannot be fulfilled{where}: {exc.message}", media_type) \
                from None
        alternatives.append(Alternative((grant.rule_id,), policy))
        joins.append(found)
    if not alternatives:
        raise _deny(f"obligation cannot be fulfilled{where}: {skipped[0]}", media_type)
    try:
        option = grant_option(g.obligations for g in result.rule_grants())
        defer = punctuation_defer(g.obligations for g in result.rule_grants())
    except ObligationError as exc:
        raise _deny(f"obligation cannot be fulfilled{where}: {exc.message}", media_type) \
            from None
    return _Decided(response, policy_ids, tuple(alternatives), tuple(joins), option, defer)


def _with_status_message(response: Response, message: str) -> Response:
    """The one-result response with `message` as its status message (the XACML a denial is
    answered with: what the caller reads)."""
    result = response.results[0]
    return replace(response, results=(replace(result, status=replace(result.status,
                                                                      message=message)),))


def _join_denial(response: Response, stream: str, join: str, media_type: str) -> AccessDenied:
    """A join side's denial, its XACML status message naming the stream that is refused."""
    result = response.results[0]
    reason = result.status.message or f"decision is {result.decision.value}"
    message = f"access denied to stream {stream!r} ({join}): {reason}"
    named = Response((Result(result.decision, Status(result.status.code, message,
                                                      result.status.subcodes,
                                                      result.status.missing_attributes)),))
    return AccessDenied(message, named, media_type, stream=stream)


def _user_query(ctx: RequestContext, user_query: bytes | None, user_query_type: str | None
                ) -> UserQuery | None:
    """The user query, from the request's resource Content or beside it (None: there is none)."""
    content = ctx.content(RESOURCE)
    if content is not None and user_query is not None:
        raise InvalidInput("two user queries: one in the request's resource Content and one "
                           "beside it; send only one")
    try:
        if content is not None:
            return query_from_content(content)
        if user_query is not None:
            return parse_user_query(user_query, user_query_type)
    except UserQueryError as exc:
        raise InvalidInput(f"user query: {exc.message}", position=exc.position) from None
    return None


@dataclass(frozen=True)
class _AskedQuery:
    """The request's user query as read: the query (None: there is none), or why it cannot be
    read (raised when planning needs it, after the decision)."""

    query: UserQuery | None
    refusal: Refusal | None

    @property
    def join_with(self) -> str | None:
        """The second stream, when the user query parses and asks for a join."""
        q = self.query
        return q.join.stream if q is not None and q.join is not None else None

    def get(self) -> UserQuery | None:
        if self.refusal is not None:
            raise self.refusal
        return self.query


def _read_user_query(ctx: RequestContext, user_query: bytes | None,
                     user_query_type: str | None, memo: _Memo) -> _AskedQuery:
    try:
        return _AskedQuery(memo.query(lambda: _user_query(ctx, user_query, user_query_type)),
                           None)
    except Refusal as exc:
        return _AskedQuery(None, exc)


class _Memo:
    """One request's way to `pep.core.parsed`: its keys, or plain parsing without a memo (or
    for a body or query that is not bytes, which could not be a key)."""

    __slots__ = ("parsed", "body", "media_type", "query_key")

    def __init__(self, parsed: RequestMemo | None, body: bytes, media_type: str,
                 user_query: bytes | None, user_query_type: str | None) -> None:
        usable = (parsed is not None and type(body) is bytes
                  and (user_query is None or type(user_query) is bytes))
        self.parsed = parsed if usable else None
        self.body = body
        self.media_type = media_type
        # a query in the resource Content comes from the body, one beside it from its bytes
        self.query_key: MemoKey = ("query", body, media_type, user_query, user_query_type)

    def request(self) -> RequestContext:
        """The parsed XACML request (the RequestSyntaxError of one that does not parse)."""
        if self.parsed is None:
            return parse_request(self.body, self.media_type)
        return self.parsed.get_or_parse(("request", self.body, self.media_type),
                                        lambda: parse_request(self.body, self.media_type))

    def query(self, read: Callable[[], UserQuery | None]) -> UserQuery | None:
        """The parsed user query (None: there is none), or the Refusal of one that does not
        parse (never kept: it is read, and refused, again every time)."""
        if self.parsed is None:
            return read()
        return self.parsed.get_or_parse(self.query_key, read)


def _merge(policy: QueryGraph, user: QueryGraph | None, schema: StreamSchema,
           time_attribute: str | None) -> MergeResult:
    try:
        return merge(policy, user, schema, time_attribute=time_attribute)
    except ConditionTooComplex as exc:
        raise TooComplex(str(exc)) from None
    except UnsupportedGraph as exc:
        raise InvalidInput(str(exc)) from None


def _plan(req: _Planning, asked: _AskedQuery) -> Grant:
    """The request's own stream decided and planned, or the join it asks for (`_plan_join`)."""
    stream, schema, settings = req.stream, req.schema, req.settings
    second = asked.join_with
    second_schema = None
    if second is not None and settings.schema_lookup is not None:
        second_schema = settings.schema_lookup(second)
    schemas = {stream: schema}
    if second is not None and second_schema is not None:
        schemas[second] = second_schema
    mode = settings.combining(stream)
    try:
        decided = _decide(req, partner=second if second_schema is not None else None, mode=mode,
                          schemas=schemas)
    except AccessDenied as exc:
        if second is None:
            raise
        _mark_side(exc, stream, second, stream)
        if exc.decision is None or len(exc.decision.results) != 1 \
                or exc.decision.results[0].decision is Decision.PERMIT:
            raise
        # a join: say which side is refused (here the first, the request's own stream)
        raise _mark_side(_join_denial(exc.decision, stream,
                                      f"the first stream of the join with {second!r}",
                                      req.media_type), stream, second, stream) from None

    query = asked.get()
    try:
        try:
            user = (user_graph(query, stream, schema, _masks_of(decided))
                    if query is not None else None)
        except UserQueryError as exc:
            raise InvalidInput(f"user query: {exc.message}", position=exc.position) from None
    except Refusal as exc:
        if second is not None:
            _mark_side(exc, stream, second, stream)
        raise
    if query is not None and query.join is not None:
        return _plan_join(req, decided, user, query.join)

    time_attribute = settings.time_attribute(stream)
    plan: ExecutionPlan | UnionPlan
    if len(decided.alternatives) == 1:
        merged = _merge(decided.policy, user, schema, time_attribute)
        plan, warnings = merged.plan, list(merged.warnings)
        graph = merged.graph

        def graph_json() -> GraphJson:
            return graph_to_json(graph, schema)
    else:
        try:
            united = merge_union(decided.alternatives, user, schema, time_attribute)
        except ConditionTooComplex as exc:
            raise TooComplex(str(exc)) from None
        plan, warnings, united_json = united.plan, list(united.warnings), united.graph_json

        def graph_json() -> GraphJson:
            return united_json
    if decided.punctuation_defer and isinstance(plan, ExecutionPlan):
        # in the plan's key: a grant that stops deferring is a different grant
        plan = replace(plan, punctuation_defer=True)
    if settings.refuse_nr and any(w.kind == "NR" for w in warnings):
        nr = [w for w in warnings if w.kind == "NR"]
        raise NoResult("no result: " + nr[0].message, warnings=[w.to_json() for w in warnings])
    return Grant(
        decision=decided.response, stream=stream, subject=req.identity.subject, plan=plan,
        warnings=warnings, policy_ids=decided.policy_ids,
        explain=lambda: (render_sql(plan, schema), plan_to_json(plan), graph_json()),
        grant_option=decided.grant_option)


def _one_alternative(decided: _Decided, stream: str
                     ) -> tuple[Alternative, tuple[JoinGrant, ...]]:
    """A join side's one grant: a join of a union of grants is not supported (each pair of
    grants would be a join of its own); refused rather than narrowed or widened."""
    if len(decided.alternatives) > 1:
        raise Unprocessable(
            f"stream {stream!r} combines its grants by union and {len(decided.alternatives)} of "
            "them apply to you; a join of a union of grants is not supported: read the stream "
            "on its own, or ask its owner for one grant", stream=stream)
    return decided.alternatives[0], decided.joins[0]


def _plan_join(req: _Planning, decided: _Decided, user: QueryGraph | None,
               join: JoinQuery) -> Grant:
    """A join (pep.core.join): the second side is decided with the first side's request, its
    resource-id replaced (same authenticated subject and action; the environment of the second
    stream, not the first's; `join-with` the first stream), the join grants of both decisions
    (`pep.core.joingrant`) are added to the sides' policies, each side is merged with its part
    of the user query like any stream request, and both sides are joined."""
    stream, schema, settings = req.stream, req.schema, req.settings
    second = join.stream
    lookup = settings.schema_lookup
    second_schema = lookup(second) if lookup is not None else None
    if second_schema is None:
        raise NotFound(f"unknown stream {second!r} (the join's second stream)", stream=second)
    schemas = {stream: schema, second: second_schema}
    try:
        check_streams(stream, second)
        try:
            first_alt, first_joins = _one_alternative(decided, stream)
        except Refusal as exc:
            _mark_side(exc, stream, second, stream)
            raise
        try:
            second_environment = settings.environment(second)
            second_ctx = bind_join(bind_environment(
                req.ctx.with_attribute(RESOURCE, RESOURCE_ID, STRING, [second]),
                second_environment), stream)
            second_req = replace(req, ctx=second_ctx, stream=second, schema=second_schema,
                                 environment=second_environment)
            second_decided = _decide(
                second_req, join=f"the second stream of the join with {stream!r}",
                partner=stream, mode=settings.combining(second), schemas=schemas)
            second_alt, second_joins = _one_alternative(second_decided, second)
            try:
                second_user = user_graph(join.side, second, second_schema,
                                         policy_masks(second_alt.policy))
            except UserQueryError as exc:
                raise InvalidInput(f"user query (join): {exc.message}",
                                   position=exc.position) from None
        except Refusal as exc:
            _mark_side(exc, stream, second, second)
            raise
        try:
            terms = apply_join_grants(first_joins + second_joins,
                                      (stream, first_alt.policy, schema),
                                      (second, second_alt.policy, second_schema))
        except ObligationError as exc:
            raise _mark_side(_deny(f"a join grant cannot be fulfilled: {exc.message}",
                                   req.media_type), stream, second, stream) from None
        first_time = settings.time_attribute(stream)
        second_time = settings.time_attribute(second)
        try:
            merged = _merge(terms.left, user, schema, first_time)
        except Refusal as exc:
            _mark_side(exc, stream, second, stream)
            raise
        try:
            second_merged = _merge(terms.right, second_user, second_schema, second_time)
        except Refusal as exc:
            _mark_side(exc, stream, second, second)
            raise
        on = tuple(join.on) + tuple(p for p in terms.on if p not in join.on)
        within = join.within
        if terms.min_within is not None and (within is None or within < terms.min_within):
            within = terms.min_within  # none asked: the grant's; fewer: raised, said below
        query = replace(join, on=on, within=within)
        result = build_join(
            JoinSide(stream, schema, merged, terms.left, user, first_time),
            JoinSide(second, second_schema, second_merged, terms.right, second_user,
                     second_time), query)
    except Refusal as exc:
        exc.details.setdefault("stream", second)
        exc.details.setdefault("streams", [stream, second])
        raise
    warnings = list(result.warnings)
    if terms.min_within is not None and join.within is not None \
            and join.within < terms.min_within:
        warnings.append(MergeWarning(
            "PR", "join", f"partial result: your time bound of {join.within:g} s was raised to "
            f"{terms.min_within:g} s, the least a join grant allows", (f"within {join.within:g}",)))
    if settings.refuse_nr and result.nr:
        nr = [w for w in warnings if w.kind == "NR"]
        raise NoResult("no result: " + nr[0].message, warnings=[w.to_json() for w in warnings],
                       streams=[stream, second])
    return Grant(decision=decided.response, stream=stream, subject=req.identity.subject,
                 plan=result.plan, warnings=warnings,
                 policy_ids=decided.policy_ids | second_decided.policy_ids,
                 explain=lambda: (result.sql, result.plan_json, result.graph_json))


def _mark_side(exc: Refusal, first: str, second: str, side: str) -> Refusal:
    """A join's refusal that came from one side alone: both streams, and which side. What the
    refusal says then concerns that side's stream (its policy, its query), not the other's."""
    exc.details.setdefault("streams", [first, second])
    exc.details.setdefault("side", side)
    exc.details.setdefault("stream", side)
    return exc


def decision_name(decision: object) -> str:
    """'Permit', 'Deny', ... from a Decision or from a one-result XACML Response."""
    results = getattr(decision, "results", None)
    if results is not None:
        if len(results) != 1:
            return "Indeterminate"
        decision = results[0].decision
    return str(getattr(decision, "value", decision))


__all__ = ["AccessPlanner", "Grant", "decide_and_plan", "decided_key", "caller_resolver",
           "decision_name", "SchemaLookup", "RESOURCE", "RESOURCE_ID"]
