"""xsg's XACML PDP and py-abac 0.4.1 must decide alike on policies both can express.

The workload (tests/bench/pdp_workload.py) renders one seeded model as XACML and as py-abac JSON.
Each request is answered by xsg (from XML and from the JSON Profile), by py-abac, and by the
model's own reference semantics; all four must agree on Permit / Deny / NotApplicable. py-abac
only says allowed or not; the Deny/NotApplicable split on its side comes from its own
`Policy.fits` (see `pyabac_decision`).
"""
from __future__ import annotations

import pytest

from tests.bench import pdp_workload as wl

pytest.importorskip("py_abac", reason="py-abac 0.4.1 is not installed in the venv")


@pytest.fixture(scope="module")
def engine_mod():
    return pytest.importorskip(
        "pdp.engine",
        reason="pdp.engine is not importable yet: no XACML PDP to compare with py-abac",
    )


N_POLICIES = 200
N_REQUESTS = 500


@pytest.fixture(scope="module")
def workload() -> wl.Workload:
    return wl.generate(N_POLICIES, N_REQUESTS, seed=7)


@pytest.fixture(scope="module")
def engine(engine_mod, workload):
    sources = [engine_mod.PolicySource(name, xml) for name, xml in workload.xacml_policies()]
    return engine_mod.PolicyEngine.compile(sources, root_combining_alg="deny-overrides")


@pytest.fixture(scope="module")
def pyabac_decisions(workload) -> list[str]:
    pdp, storage = wl.build_pyabac(workload.pyabac_policies())
    return [wl.pyabac_decision(pdp, storage, wl.pyabac_request(q)) for q in workload.queries]


def _xsg(engine, body: bytes, media_type: str) -> str:
    response = engine.decide_bytes(body, media_type=media_type)
    assert len(response.results) == 1
    return response.results[0].decision.value


def test_workload_exercises_every_decision(workload, pyabac_decisions):
    counts = wl.decision_counts(pyabac_decisions)
    for decision in (wl.PERMIT, wl.DENY, wl.NOT_APPLICABLE):
        assert counts[decision] >= N_REQUESTS // 10, counts


def test_pyabac_agrees_with_the_model(workload, pyabac_decisions):
    assert pyabac_decisions == workload.expected()


@pytest.mark.parametrize("media_type, render", [
    ("application/xacml+xml", wl.request_xml),
    ("application/xacml+json", wl.request_json),
], ids=["xml", "json"])
def test_xsg_agrees_with_pyabac(workload, engine, pyabac_decisions, media_type, render):
    disagreements = []
    for i, (query, expected) in enumerate(zip(workload.queries, pyabac_decisions, strict=True)):
        got = _xsg(engine, render(query), media_type)
        if got != expected:
            disagreements.append((i, query, expected, got))
    assert not disagreements, (
        f"{len(disagreements)} of {len(workload.queries)} decisions differ; first: "
        + "; ".join(f"#{i} {q}: py-abac {e}, xsg {g}" for i, q, e, g in disagreements[:3]))


def test_changed_policy_changes_both(engine_mod, workload):
    """Guards against a vacuous agreement: flipping one applicable policy's effect must flip the
    decision in both engines for a request it decides alone."""
    for query, expected in zip(workload.queries, workload.expected(), strict=True):
        applicable = [p for p in workload.policies if wl.applies(p, query)]
        if len(applicable) == 1 and expected == wl.PERMIT:
            break
    else:
        pytest.fail("the workload has no request decided by a single Permit policy")
    target = applicable[0]
    flipped = [wl.PolicySpec(p.policy_id, p.resources, p.actions, wl.DENY, p.condition)
               if p is target else p for p in workload.policies]
    engine = engine_mod.PolicyEngine.compile(
        [engine_mod.PolicySource(f"{p.policy_id}.xml", wl.policy_xml(p)) for p in flipped],
        root_combining_alg="deny-overrides")
    pdp, storage = wl.build_pyabac(wl.pyabac_policy_json(p) for p in flipped)
    assert _xsg(engine, wl.request_xml(query), "application/xacml+xml") == wl.DENY
    assert wl.pyabac_decision(pdp, storage, wl.pyabac_request(query)) == wl.DENY
