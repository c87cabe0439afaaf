"""The gateway of a comparison, in the benchmark's process as `xsg serve` runs it, and what a
benchmark says to it over HTTP (its accounts, a policy, a request).
"""
from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tests.bench.readers import ReadJob, handle_path


def started_spark(stack: ExitStack, master: str = "local[*]", app_name: str = "xsg",
                  extra: dict[str, str] | None = None) -> Any:
    """The gateway's SparkSession as `xsg serve` makes it (its settings, its warm-up), stopped
    with `stack`."""
    from pep.runtime.session import create_spark_session
    t = time.time()
    spark = create_spark_session(master, app_name, extra)
    stack.callback(spark.stop)
    print(f"the gateway's Spark on {spark.sparkContext.master} started in {time.time() - t:.1f} s "
          "(with its warm-up)")
    return spark


class Gateway:
    """One gateway in this process as `xsg serve` runs it (services, app, the configured HTTP
    server, its garbage collector tuned once started) on a free loopback port, over `runtime`.
    `accounts` are the auth file's entries; `config` overrides GatewayConfig's defaults."""

    def __init__(self, runtime: Any, data_dir: Path, accounts: list[dict[str, Any]],
                 **config: Any) -> None:
        from common.auth import write_auth_file
        from pep.config import GatewayConfig
        from pep.http.app import create_app
        from pep.serve import gateway_server
        from pep.services import build_services
        from server.serving import tune_gc

        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        auth = data_dir / "auth.json"
        write_auth_file(auth, accounts)
        self.runtime = runtime
        cfg = GatewayConfig(data_dir=data_dir, auth_file=auth, policies_dir=None, port=0,
                            **config)
        self.services = build_services(cfg, runtime=runtime)
        self.server = gateway_server(create_app(services=self.services), cfg).start()
        self.url: str = self.server.url
        tune_gc()  # as `xsg serve` does once started (server.serving.GC_THRESHOLDS)

    @property
    def port(self) -> int:
        return int(self.server.port)

    def ingest_dir(self, stream: str) -> Path:
        return self.data_dir / "streams" / stream / "ingest"

    def register(self, name: str, schema: list[tuple[str, str]], source: dict[str, Any],
                 time_attribute: str) -> None:
        import requests
        r = requests.post(f"{self.url}/streams", headers=hdr(ADMIN_TOKEN), timeout=60, json={
            "name": name, "time_attribute": time_attribute, "source": source,
            "schema": [{"name": n, "type": t} for n, t in schema]})
        assert r.status_code == 201, r.text

    def add_policy(self, xml: bytes) -> None:
        import requests
        r = requests.post(f"{self.url}/policies", headers=hdr(ADMIN_TOKEN, **XML), data=xml,
                          timeout=60)
        assert r.status_code == 201, r.text

    def delete_policy(self, policy_id: str) -> None:
        import requests
        r = requests.delete(f"{self.url}/policies/{policy_id}", headers=hdr(ADMIN_TOKEN),
                            timeout=300)
        assert r.status_code in (200, 204), r.text

    def open(self, token: str, body: bytes, media: str = "application/xacml+json"
             ) -> dict[str, Any]:
        """POST /requests: the handle's answer (its URL under "handle")."""
        import requests
        r = requests.post(f"{self.url}/requests", headers=hdr(token, **{"Content-Type": media}),
                          data=body, timeout=120)
        assert r.status_code in (200, 201), (r.status_code, r.text)
        return dict(r.json())

    def release(self, token: str, handle: str) -> None:
        import requests
        requests.delete(handle, headers=hdr(token), timeout=60)

    def reader(self, handles: list[tuple[int, str, str]], out: Path, **job: Any) -> ReadJob:
        """A ReadJob for `handles` (index, handle URL or id, token) of this gateway."""
        return ReadJob("127.0.0.1", self.port, [(i, handle_path(h), t) for i, h, t in handles],
                       str(out), **job)

    def close(self) -> None:
        steps = [self.services.close_stream_side, self.server.stop, self.services.close]
        stop = getattr(self.runtime, "stop", None)
        if stop is not None:
            steps.append(stop)
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - printed; the other steps still run
                print(f"(cleanup: {getattr(step, '__qualname__', step)} failed: {exc!r})")


# -- talking to the gateway over HTTP --------------------------------------------------------------

ADMIN_TOKEN = "tok-bench-nea-0123456789"
XML = {"Content-Type": "application/xacml+xml"}
NDJSON = {"Content-Type": "application/x-ndjson"}


def consumer_token(i: int) -> str:
    return f"tok-bench-c{i:03d}-0123456789"


def accounts(consumers: int) -> list[dict[str, Any]]:
    """The auth file: the owner `nea` (an administrator), `lta` (consumer 0) and consumers
    c001..c<consumers>."""
    return ([{"token": ADMIN_TOKEN, "subject": "nea", "roles": ["data-owner"], "admin": True},
             {"token": consumer_token(0), "subject": "lta", "roles": ["consumer"],
              "admin": False}]
            + [{"token": consumer_token(i), "subject": f"c{i:03d}", "roles": ["consumer"],
                "admin": False} for i in range(1, consumers + 1)])


def hdr(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


def inline_policy(policy_id: str, streams: list[str], condition: str, fields: list[str]) -> bytes:
    """A plain filter+map grant for every authenticated subject on the given streams."""
    s = "http://www.w3.org/2001/XMLSchema#string"
    rid = "urn:oasis:names:tc:xacml:1.0:resource:resource-id"
    res = "urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
    eq = "urn:oasis:names:tc:xacml:1.0:function:string-equal"
    all_ofs = "".join(
        f'<AllOf><Match MatchId="{eq}"><AttributeValue DataType="{s}">{name}</AttributeValue>'
        f'<AttributeDesignator Category="{res}" AttributeId="{rid}" DataType="{s}" '
        f'MustBePresent="false"/></Match></AllOf>' for name in streams)
    maps = "".join(
        f'<AttributeAssignmentExpression AttributeId="exacml:obligation:stream-map-attribute-id">'
        f'<AttributeValue DataType="{s}">{f}</AttributeValue></AttributeAssignmentExpression>'
        for f in fields)
    cond = condition.replace(">", "&gt;").replace("<", "&lt;")
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17" PolicyId="{policy_id}" Version="1.0"
 RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
 <Target><AnyOf>{all_ofs}</AnyOf></Target>
 <Rule RuleId="{policy_id}:read" Effect="Permit">
  <ObligationExpressions>
   <ObligationExpression ObligationId="exacml:obligation:stream-filter" FulfillOn="Permit">
    <AttributeAssignmentExpression AttributeId="exacml:obligation:stream-filter-condition-id">
     <AttributeValue DataType="{s}">{cond}</AttributeValue>
    </AttributeAssignmentExpression>
   </ObligationExpression>
   <ObligationExpression ObligationId="exacml:obligation:stream-map" FulfillOn="Permit">{maps}
   </ObligationExpression>
  </ObligationExpressions>
 </Rule>
</Policy>""".encode()


def request_json(stream: str) -> bytes:
    return json.dumps({"Request": {
        "AccessSubject": {"Attribute": [{
            "AttributeId": "urn:oasis:names:tc:xacml:1.0:subject:subject-id", "Value": "whoever"}]},
        "Resource": {"Attribute": [{
            "AttributeId": "urn:oasis:names:tc:xacml:1.0:resource:resource-id", "Value": stream}]},
        "Action": {"Attribute": [{
            "AttributeId": "urn:oasis:names:tc:xacml:1.0:action:action-id",
            "Value": "read"}]}}}).encode()
