"""Mutated documents: loading fails only with PolicyLoadError, deciding never raises."""
from __future__ import annotations

import json
import random

from pdp.engine import PolicyEngine, PolicySource, inspect_policy
from pdp.errors import PolicyLoadError
from pdp.results import Decision

from ._gen import AID, LEVEL, RID, SID, request_xml, simple_policy

SEED_POLICY = simple_policy(1, "doc", "read")
SEED_REQUEST = request_xml("alice", "doc", "read", 5)
SEED_JSON = json.dumps({"Request": {
    "AccessSubject": {"Attribute": [{"AttributeId": SID, "Value": "alice"},
                                    {"AttributeId": LEVEL, "Value": 5, "DataType": "integer"}]},
    "Resource": [{"Attribute": [{"AttributeId": RID, "Value": ["doc"]}]}],
    "Category": [{"CategoryId": "Action", "Attribute": [{"AttributeId": AID, "Value": "read"}]}],
}}).encode()


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        pos = rng.randrange(len(out))
        if op < 0.4:
            out[pos] = rng.choice(b'<>/="&;x9 -\x00')
        elif op < 0.7:
            del out[pos:pos + rng.randint(1, 20)]
        else:
            out[pos:pos] = data[rng.randrange(len(data)):][:rng.randint(1, 40)]
    return bytes(out)


def test_mutated_policies_load_or_fail_cleanly():
    rng = random.Random(7)
    for _ in range(300):
        doc = _mutate(rng, SEED_POLICY)
        try:
            inspect_policy(PolicySource("fuzz", doc))
        except PolicyLoadError as exc:
            assert exc.source == "fuzz" and exc.message


def test_mutated_requests_never_crash_the_engine():
    engine = PolicyEngine.compile([PolicySource("p", SEED_POLICY)])
    rng = random.Random(11)
    assert engine.decide_bytes(SEED_JSON, "application/json").results[0].decision is Decision.PERMIT
    for _ in range(300):
        for media, seed in (("application/xacml+xml", SEED_REQUEST),
                            ("application/xacml+json", SEED_JSON)):
            response = engine.decide_bytes(_mutate(rng, seed), media)
            assert response.results
            for result in response.results:
                assert isinstance(result.decision, Decision)
