"""Issue 21, part 3, as reported: a policy filter `account = 9007199254740993` on a `long`
attribute delivered the row of account 9007199254740992 too, since Spark compared the values as
doubles. Through the real gateway (HTTP, PDP, ingest, Spark): the policy's filter, a consumer's
own filter with decimal bounds, and a stream event's condition each select exactly that account;
the rows reach the reader with every digit; a long beyond 64 bits is refused at ingest.
"""
from __future__ import annotations

import json
import time

import pytest
import requests

from tests.e2e.conftest import Reader, auth
from tests.e2e.test_restart_and_sse import ND, XML, S, sensor_request

STREAM = "exact_accounts"
POLICY_ID = f"urn:t:{STREAM}"
P53 = 2 ** 53
SUBJECT_ID = ('Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject" '
              'AttributeId="urn:oasis:names:tc:xacml:1.0:subject:subject-id"')


def policy() -> bytes:
    """lta sees account 9007199254740993 only; nea, the owner, reads everything."""
    def rule(who: str, obligations: str = "") -> str:
        return f"""<Rule RuleId="{who}" Effect="Permit"><Target><AnyOf><AllOf>
          <Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
            <AttributeValue DataType="{S}">{who}</AttributeValue>
            <AttributeDesignator {SUBJECT_ID} DataType="{S}" MustBePresent="false"/></Match>
          </AllOf></AnyOf></Target>{obligations}</Rule>"""
    pinned = f"""<ObligationExpressions>
      <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
        <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-filter-condition-id">
          <AttributeValue DataType="{S}">account = 9007199254740993</AttributeValue>
        </AttributeAssignmentExpression></ObligationExpression></ObligationExpressions>"""
    return f"""<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
      PolicyId="{POLICY_ID}" Version="1"
      RuleCombiningAlgId="urn:oasis:names:tc:xacml:3.0:rule-combining-algorithm:deny-unless-permit">
      <Target><AnyOf><AllOf><Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
        <AttributeValue DataType="{S}">{STREAM}</AttributeValue>
        <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
          AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id" DataType="{S}"
          MustBePresent="false"/></Match></AllOf></AnyOf></Target>
      {rule("lta", pinned)}{rule("nea")}</Policy>""".encode()


@pytest.mark.timeout(180)
def test_a_pinned_account_is_delivered_alone_not_with_its_double_neighbour(gateway):
    base = gateway.url
    r = requests.post(f"{base}/streams", headers=auth("nea"), timeout=30, json={
        "name": STREAM, "time_attribute": "ts", "source": {"kind": "ingest"},
        "schema": [{"name": "ts", "type": "timestamp"}, {"name": "account", "type": "long"},
                   {"name": "amount", "type": "double"}]})
    assert r.status_code == 201, r.text
    r = requests.post(f"{base}/policies", headers=auth("nea", **XML), data=policy(), timeout=30)
    assert r.status_code == 201, r.text
    handles = []
    try:
        # a long beyond 64 bits is refused, naming the line and the field; nothing is written
        r = requests.post(f"{base}/streams/{STREAM}/records", headers=auth("nea", **ND),
                          timeout=30, data=b'{"ts": 1, "account": 1, "amount": 1}\n'
                          b'{"ts": 1, "account": 9223372036854775808, "amount": 1}\n')
        assert r.status_code == 400 and r.json()["status"] == 400
        assert "line 2" in r.json()["error"] and "'account'" in r.json()["error"]
        r = requests.post(f"{base}/streams/{STREAM}/events", headers=auth("nea"), timeout=30,
                          json={"name": "pinned", "condition": "account = 9007199254740993",
                                "key": "account", "hold": 3600})
        assert r.status_code == 201, r.text
        # the consumer under the policy's filter
        r = requests.post(f"{base}/requests", headers=auth("lta", **XML),
                          data=sensor_request(STREAM), timeout=60)
        assert r.status_code == 201, r.text
        handles.append((r.json()["handle"], "lta"))
        pinned = Reader(r.json()["handle"]).start()
        # the owner with a filter of its own, in decimals: (2^53 + 0.5, 2^53 + 1.5) holds one long
        r = requests.post(f"{base}/requests", headers=auth("nea"), timeout=60, files={
            "request": ("r.xml", sensor_request(STREAM), XML["Content-Type"]),
            "query": ("q.json", json.dumps({"filter": "account > 9007199254740992.5 AND "
                                                      "account < 9007199254740993.5"}),
                      "application/json")})
        assert r.status_code == 201, r.text
        handles.append((r.json()["handle"], "nea"))
        own = Reader(r.json()["handle"], who="nea").start()
        now = time.time()
        accounts = [P53, P53 + 1, P53 + 2, P53 - 1, P53 + 1, 2 ** 63 - 1, -(2 ** 63), -P53 - 1]
        body = "".join(json.dumps({"ts": now + i / 1000, "account": a, "amount": float(i)}) + "\n"
                       for i, a in enumerate(accounts))
        r = requests.post(f"{base}/streams/{STREAM}/records", data=body.encode(), timeout=30,
                          headers=auth("nea", **ND))
        assert r.status_code == 201 and r.json()["appended"] == len(accounts), r.text
        want = [float(i) for i, a in enumerate(accounts) if a == P53 + 1]
        for reader in (pinned, own):
            rows = reader.wait_rows(len(want), timeout=90)
            time.sleep(1.0)  # a neighbour, if any, would arrive in the same micro-batch
            assert [row["account"] for row in reader.rows] == [P53 + 1] * len(want)
            assert [row["amount"] for row in rows] == want
        # the event met exactly that account: one key, the account itself
        events = requests.get(f"{base}/streams/{STREAM}/events", headers=auth("nea"),
                              timeout=30).json()["events"]
        assert events[0]["open"] is True and events[0]["keys"] == 1
        state = gateway.services.stream_events.state(gateway.services.stream_events.all(STREAM)[0])
        assert state.keys == {P53 + 1}
    finally:
        for handle, who in handles:
            requests.delete(handle, headers=auth(who), timeout=30)
        requests.delete(f"{base}/streams/{STREAM}/events/pinned", headers=auth("nea"), timeout=30)
        requests.delete(f"{base}/policies/{POLICY_ID}", headers=auth("nea"), timeout=30)
