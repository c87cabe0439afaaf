"""The `stream-punctuations-defer` obligation (`pep.core.obligations`): a grant defers to the
stream's security punctuations only when every permitting rule says so; it is in the plan's
key (a grant that stops deferring is another grant); with an attribute it is a deny."""
from __future__ import annotations

import pytest

from common.auth import Identity
from pdp import Obligation
from pdp.engine import PolicyEngine
from pep.core.access import decide_and_plan
from pep.core.errors import AccessDenied
from pep.core.graph import BUILTIN_SCHEMAS
from pep.core.obligations import PUNCTUATION_DEFER_ID, punctuation_defer

from .test_access import inline_policy, obligation, request_json

DEFER = obligation(PUNCTUATION_DEFER_ID)
MAP = obligation("exacml:obligation:stream-map", ("stream-map-attribute-id", "rainrate"))


def decide(*sources):
    engine = PolicyEngine.compile(list(sources))
    return decide_and_plan(engine, request_json("weather", subject="lta"),
                           "application/xacml+json", Identity("lta"), BUILTIN_SCHEMAS.get)


def test_the_plan_defers_only_when_every_permitting_rule_does():
    deferring = inline_policy("urn:t:a", "weather", "lta", MAP + DEFER)
    plain = inline_policy("urn:t:b", "weather", "lta", MAP)
    granted = decide(deferring)
    assert granted.plan.punctuation_defer is True
    assert decide(plain).plan.punctuation_defer is False
    assert granted.plan.key() != decide(plain).plan.key()
    assert granted.plan.projection == decide(plain).plan.projection  # the view is the same
    assert decide(deferring, plain).plan.punctuation_defer is False
    assert not punctuation_defer([])


def test_a_deferral_with_attributes_is_a_deny():
    odd = obligation(PUNCTUATION_DEFER_ID, ("stream-punctuations-defer-mode-id", "all"))
    with pytest.raises(AccessDenied, match="takes none"):
        decide(inline_policy("urn:t:c", "weather", "lta", MAP + odd))
    assert punctuation_defer([[Obligation(PUNCTUATION_DEFER_ID)]])
