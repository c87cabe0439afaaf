"""The console in real headless Chromium (Debian's chromium, driven by Playwright) against an
in-process gateway on its HTTP server whose stream runtime is the RecordingRuntime: the test
pushes the rows Spark would deliver. Each page is screenshotted (see conftest: `shots`)."""
from __future__ import annotations

import time

import pytest

from server.streaming import STREAM_BODY
from tests.console.conftest import POLICIES, TOKENS, WEATHER_POLICY_ID

pytestmark = pytest.mark.timeout(120)

VIEWPORT = {"width": 1280, "height": 900}
WEATHER_POLICY = (POLICIES / "weather" / "nea-weather-policy.xml").read_text()


def sign_in(browser, gw, who: str, page: str = "streams"):
    context = browser.new_context(viewport=VIEWPORT)
    tab = context.new_page()
    tab.set_default_timeout(10_000)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(f"{gw.url}/console#{page}")
    tab.fill("#signin-token", TOKENS[who])
    tab.click("#signin-form button[type=submit]")
    tab.wait_for_selector("#nav:not([hidden])")
    tab.wait_for_selector(f"#page-{page}:not([hidden])")
    tab.js_errors = errors
    return tab


def wait_true(tab, expression: str, timeout: float = 10_000) -> None:
    # a function, not an expression string: the console's CSP forbids eval
    tab.wait_for_function(f"() => {expression}", timeout=timeout)


def test_sign_in_is_required_and_a_bad_token_is_refused(browser, gateway, shots):
    tab = browser.new_context(viewport=VIEWPORT).new_page()
    tab.goto(f"{gateway.url}/console#policies")
    assert tab.is_visible("#page-signin") and not tab.is_visible("#page-policies")
    tab.screenshot(path=str(shots / "signin.png"))
    tab.fill("#signin-token", "not-a-token")
    tab.click("#signin-form button[type=submit]")
    tab.wait_for_selector("#signin-error:not([hidden])")
    assert "not valid" in tab.inner_text("#signin-error")
    assert tab.input_value("#signin-token") == ""  # never left in the field
    # nothing about the session is stored where another page's script could read it
    assert tab.evaluate("() => [localStorage.length, sessionStorage.length, document.cookie]") \
        == [0, 0, ""]
    tab.fill("#signin-token", TOKENS["lta"])
    tab.click("#signin-form button[type=submit]")
    tab.wait_for_selector("#page-streams:not([hidden])")  # a consumer has no Policies page
    assert not tab.is_visible("a[data-page=policies]")
    assert tab.evaluate("() => [localStorage.length, sessionStorage.length, document.cookie]") \
        == [0, 0, ""]
    tab.click("#signout")
    tab.wait_for_selector("#page-signin:not([hidden])")
    tab.context.close()


def test_owner_registers_a_stream_and_appends_records_from_a_file(browser, gateway, shots,
                                                                   tmp_path):
    gateway.add_weather()
    tab = sign_in(browser, gateway, "nea")
    tab.wait_for_selector("#streams-table tr[data-stream=weather]")
    tab.fill("#reg-name", "station2")
    tab.fill("#reg-schema", "samplingtime timestamp\nrainrate double")
    tab.fill("#reg-time", "samplingtime")
    tab.click("#stream-register button[type=submit]")
    tab.wait_for_selector("#reg-result.ok")
    tab.wait_for_selector("#streams-table tr[data-stream=station2]")
    assert "rainrate: double" in tab.inner_text("#streams-table tr[data-stream=station2]")
    tab.select_option("#reg-source", "generator:ais")
    tab.fill("#reg-name", "ships")
    tab.click("#stream-register button[type=submit]")
    tab.wait_for_selector("#streams-table tr[data-stream=ships]")

    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"samplingtime": "2026-01-01T00:00:00Z", "rainrate": 1.5}\n'
                   '{"samplingtime": "2026-01-01T00:00:01Z", "rainrate": "lots"}\n')
    tab.select_option("#append-stream", "station2")
    tab.set_input_files("#append-file", str(bad))
    tab.click("#stream-append button[type=submit]")
    tab.wait_for_selector("#append-result.bad")
    message = tab.inner_text("#append-result")
    assert "400" in message and "line" in message and "rainrate" in message
    good = tmp_path / "good.ndjson"
    good.write_text("".join(f'{{"samplingtime": "2026-01-01T00:00:0{i}Z", "rainrate": {i}.5}}\n'
                            for i in range(3)))
    tab.set_input_files("#append-file", str(good))
    tab.click("#stream-append button[type=submit]")
    tab.wait_for_selector("#append-result.ok")
    assert "Appended 3 record(s) to station2" in tab.inner_text("#append-result")
    tab.screenshot(path=str(shots / "streams.png"), full_page=True)
    assert tab.js_errors == []
    tab.context.close()


def test_owner_uploads_a_policy_with_errors_sees_them_at_their_line_and_fixes_it(
        browser, gateway, shots):
    gateway.add_weather()
    tab = sign_in(browser, gateway, "nea", "policies")
    tab.click("#policy-new")

    # 1. not well-formed: line and column from the parser
    lines = WEATHER_POLICY.split("\n")
    broken_at = next(i for i, line in enumerate(lines) if line.strip() == "</Target>") + 1
    malformed = "\n".join(line.replace("</Target>", "</Targte>") if i + 1 == broken_at else line
                          for i, line in enumerate(lines))
    tab.fill("#editor-text", malformed)
    tab.click("#editor-save")
    tab.wait_for_selector("#editor-error:not([hidden])")
    assert tab.get_attribute("#editor-error", "data-line") == str(broken_at)
    assert int(tab.get_attribute("#editor-error", "data-column")) > 0
    assert tab.inner_text("#editor-error").startswith(f"Line {broken_at}, column ")
    assert tab.inner_text("#editor-gutter .err") == str(broken_at)
    # the caret sits on that line
    caret_line = tab.evaluate("() => { const t = document.getElementById('editor-text'); "
                              "return t.value.slice(0, t.selectionStart).split('\\n').length; }")
    assert caret_line == broken_at

    # 2. well-formed but wrong: an unknown function, at its element's line
    wrong_at = next(i for i, line in enumerate(lines) if "function:string-equal" in line) + 1
    wrong = WEATHER_POLICY.replace("function:string-equal", "function:string-equalz", 1)
    tab.fill("#editor-text", wrong)
    tab.click("#editor-save")
    wait_true(tab, f"document.getElementById('editor-error').dataset.line === '{wrong_at}'")
    assert "unknown function" in tab.inner_text("#editor-error")
    assert "element Match" in tab.inner_text("#editor-error")
    tab.screenshot(path=str(shots / "policy-error.png"), full_page=True)

    # 3. fixed: stored, listed, no error left
    tab.fill("#editor-text", WEATHER_POLICY)
    tab.click("#editor-save")
    tab.wait_for_selector("#editor-result.ok")
    assert tab.is_hidden("#editor-error")
    assert "store version 1" in tab.inner_text("#editor-result")
    tab.wait_for_selector(f"#policies-table tr[data-policy='{WEATHER_POLICY_ID}']")

    # 4. a second version, its history and the diff between the two
    tab.fill("#editor-text", WEATHER_POLICY.replace("rainrate &gt; 5", "rainrate &gt; 6"))
    tab.click("#editor-save")
    wait_true(
        tab, "document.getElementById('editor-result').textContent.includes('store version 2')"
    )
    tab.click("#editor-history")
    tab.wait_for_selector("#history-table tr[data-store-version='2']")
    assert tab.locator("#history-table tbody tr").count() == 2
    tab.click("#history-diff")
    tab.wait_for_selector("#diff:not([hidden])")
    assert tab.get_attribute("#diff", "data-changes") == "2"
    assert "- " in tab.inner_text("#diff .del") and "rainrate &gt; 5" in tab.inner_text(
        "#diff .del"
    )
    assert "rainrate &gt; 6" in tab.inner_text("#diff .add")
    tab.locator("#policy-history").scroll_into_view_if_needed()
    tab.screenshot(path=str(shots / "policy-history.png"), full_page=True)
    assert tab.js_errors == []
    tab.context.close()


def test_consumer_chart_gets_rows_and_shows_revoked_when_the_owner_deletes_the_policy(
        browser, gateway, shots):
    gateway.add_weather()
    gateway.add_weather_policy()

    # the consumer explains a request, then opens it
    lta = sign_in(browser, gateway, "lta", "try")
    lta.wait_for_selector("#try-stream option[value=weather]", state="attached")
    lta.select_option("#try-stream", "weather")
    lta.select_option("#try-window-type", "tuple")
    lta.fill("#try-window-size", "6")
    lta.fill("#try-window-step", "2")
    lta.fill("#try-window-aggs", "rainrate:avg, windspeed:max")
    # a filter the policy's can never meet: NR, shown (explain does not refuse it)
    lta.fill("#try-filter", "rainrate < 2")
    lta.click("#try-explain")
    lta.wait_for_selector("#try-warnings li.NR")
    # one the policy's narrows: PR, with the decision, the merged plan and its SQL
    lta.fill("#try-filter", "rainrate > 3")
    lta.click("#try-explain")
    lta.wait_for_selector("#try-warnings li.PR")
    assert lta.inner_text("#try-decision") == "Permit"
    # why (POST /pdp?explain=1): a consumer gets the reason, nothing of nea's policy
    wait_true(lta, "document.getElementById('try-why').textContent.includes('reason: permitted')")
    assert "nea-policy" not in lta.inner_text("#try-why")
    assert "SELECT" in lta.inner_text("#try-sql").upper()
    assert '"window"' in lta.inner_text("#try-plan")
    assert "<FilterCondition>rainrate &gt; 3</FilterCondition>" in lta.text_content("#try-xml")
    # a coarser mask of the consumer's own: in the request, the plan and the SQL (issue 24)
    lta.fill("#try-masks", "rainrate:round:10")
    lta.click("#try-explain")
    lta.wait_for_selector("#try-warnings li.PR")
    wait_true(lta, "document.getElementById('try-sql').textContent"
                   ".includes('floor(`rainrate` / 10) * 10')")
    assert '"rainrate": "round:10"' in lta.inner_text("#try-plan")
    assert "<Mask><Attribute>rainrate:round:10</Attribute></Mask>" in lta.text_content("#try-xml")
    lta.fill("#try-masks", "")
    lta.screenshot(path=str(shots / "try.png"), full_page=True)
    lta.click("#try-open")
    lta.wait_for_selector("#try-watch")
    hid = lta.get_attribute("#try-watch", "data-handle")
    assert hid in gateway.runtime.attached
    lta.click("#try-watch")
    lta.wait_for_selector("#live[data-status=live]")

    # rows as Spark would deliver them: the chart and the table follow
    for i in range(40):
        at = f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"
        gateway.runtime.push(hid, [{"lastval_samplingtime": at,
                                    "avg_rainrate": round(8.5 + (i % 9) * 0.6 + (i % 4) * 0.2, 2),
                                    "max_windspeed": 10 + (i * 7) % 13}])
        time.sleep(0.01)
    wait_true(lta, "Number(document.getElementById('live').dataset.rows) >= 40")
    wait_true(lta, "Number(document.getElementById('live-chart').dataset.points) >= 40")
    assert lta.get_attribute("#live-chart", "data-attr") == "avg_rainrate"
    assert lta.locator("#live-rows tbody tr").count() >= 20
    lta.screenshot(path=str(shots / "handles.png"), full_page=True)

    # the owner deletes the policy; the confirmation counts the live handle
    nea = sign_in(browser, gateway, "nea", "policies")
    nea.click(f"#policies-table tr[data-policy='{WEATHER_POLICY_ID}'] button")
    nea.wait_for_selector("#editor-delete:not([hidden])")
    nea.click("#editor-delete")
    nea.wait_for_selector("#modal:not([hidden])")
    assert nea.get_attribute("#modal-count", "data-count") == "1"
    assert "stream weather: 1 handle" in nea.inner_text("#modal-body")
    nea.screenshot(path=str(shots / "policy-delete.png"))
    started = time.monotonic()
    nea.click("#modal-confirm")
    # ... and the consumer's page says `revoked` within a second
    lta.wait_for_selector("#live[data-status=revoked]", timeout=1000)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, elapsed
    lta.wait_for_selector("#live-events li[data-kind=revoked]")
    assert lta.is_disabled("#live-release")
    nea.wait_for_selector("#modal", state="hidden")
    lta.screenshot(path=str(shots / "revoked.png"), full_page=True)
    assert lta.js_errors == [] and nea.js_errors == []
    lta.context.close()
    nea.context.close()


AIS_POLICY = """<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
  PolicyId="urn:test:ais-owner" Version="1.0"
  RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
  <Target><AnyOf><AllOf>
    <Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">ais</AttributeValue>
      <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
        AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
        DataType="http://www.w3.org/2001/XMLSchema#string" MustBePresent="false"/>
    </Match></AllOf></AnyOf></Target>
  <Rule RuleId="urn:test:ais-owner:permit" Effect="Permit"/>
</Policy>"""


def test_an_administrator_sees_why_with_every_policy_and_rule(browser, gateway):
    gateway.add_weather()
    gateway.add_weather_policy()
    nea = sign_in(browser, gateway, "nea", "try")
    nea.wait_for_selector("#try-stream option[value=weather]", state="attached")
    nea.select_option("#try-stream", "weather")
    nea.click("#try-explain")
    wait_true(nea, "document.getElementById('try-why').textContent.includes('first-applicable')")
    why = nea.inner_text("#try-why")
    assert "Policy urn:xsg:example:weather:nea-policy" in why
    assert "rule urn:xsg:example:weather:nea-owner-reads-raw was the first child that applied" \
        in why
    assert nea.js_errors == []
    nea.context.close()


def test_ais_positions_move_on_the_map_with_gap_and_ended_events(browser, gateway_factory, shots):
    gw = gateway_factory(buffer_rows=30)
    r = gw.api("POST", "/streams", json={"name": "ais", "source": {"kind": "generator",
                                                                   "schema": "ais", "rate": 5}})
    assert r.status_code == 201, r.text
    gw.add_policy(AIS_POLICY)
    tab = sign_in(browser, gw, "nea", "try")
    tab.wait_for_selector("#try-stream option[value=ais]", state="attached")
    tab.select_option("#try-stream", "ais")
    tab.click("#try-open")
    tab.wait_for_selector("#try-watch")
    hid = tab.get_attribute("#try-watch", "data-handle")

    def positions(step: int) -> list[dict]:
        return [{"mmsi": 563000100 + s, "shipname": f"SHIP {s}", "shiptype": "cargo",
                 "lat": round(1.20 + 0.02 * s + 0.004 * step, 5),
                 "lon": round(103.70 + 0.03 * s + 0.006 * step * (1 if s % 2 else -1), 5),
                 "speed": 10.0 + s, "course": 90.0, "ts": f"2026-01-01T00:00:{step:02d}Z"}
                for s in range(6)]

    # 10 steps of 6 ships before anyone reads: the 30-row buffer drops the oldest 30
    for step in range(10):
        gw.runtime.push(hid, positions(step))
    tab.click("#try-watch")
    tab.wait_for_selector("#live-events li[data-kind=gap]")
    assert "30 row(s) were dropped" in tab.inner_text("#live-events li[data-kind=gap]")
    for step in range(10, 16):
        gw.runtime.push(hid, positions(step))
        time.sleep(0.02)
    wait_true(tab, "Number(document.getElementById('live').dataset.rows) >= 66")
    tab.wait_for_selector("#live-map-box:not([hidden])")
    wait_true(tab, "document.getElementById('live-map').dataset.points === '6'")
    tab.locator("#live-map").scroll_into_view_if_needed()
    tab.screenshot(path=str(shots / "ais-map.png"), full_page=True)
    # the gateway ends the handle (e.g. its stream failed): shown as it happens
    gw.services.handles.end(hid, "the stream's source stopped")
    tab.wait_for_selector("#live[data-status=ended]", timeout=2000)
    assert "the stream's source stopped" in tab.inner_text("#live-events li[data-kind=ended]")
    assert tab.js_errors == []
    tab.context.close()


class ConnectionCutter:
    """WSGI middleware: `cut()` ends every handle stream open at that moment (as a proxy or a
    network failure would) without ending the handle; later connections are left alone."""

    def __init__(self, app) -> None:
        self.app = app
        self.cut_at = -1.0
        self.mints = 0  # read tokens asked for

    def cut(self) -> None:
        self.cut_at = time.monotonic()

    def __call__(self, environ, start_response):
        if environ["REQUEST_METHOD"] == "POST" and environ["PATH_INFO"].endswith("/read-token"):
            self.mints += 1
        streaming = (environ["REQUEST_METHOD"] == "GET"
                     and environ["PATH_INFO"].startswith("/handles/"))
        if streaming:
            # the route would hand the stream to the server's I/O thread, out of our reach;
            # without the hook it falls back to a WSGI body we can cut
            environ.pop(STREAM_BODY, None)
        body = self.app(environ, start_response)
        if streaming:
            return self.cuttable(body, time.monotonic())
        return body

    def cuttable(self, body, opened: float):
        try:
            for chunk in body:
                yield chunk
                if self.cut_at > opened:
                    return
        finally:
            if hasattr(body, "close"):
                body.close()


def test_the_stream_resumes_with_a_fresh_read_token_after_the_old_one_expired(
        browser, gateway_factory):
    cutter = []
    gw = gateway_factory(read_token_ttl=1, wrap=lambda app: cutter.append(ConnectionCutter(app))
                         or cutter[0])
    gw.add_weather()
    gw.add_weather_policy()
    tab = sign_in(browser, gw, "lta", "try")
    tab.wait_for_selector("#try-stream option[value=weather]", state="attached")
    tab.click("#try-open")
    tab.wait_for_selector("#try-watch")
    hid = tab.get_attribute("#try-watch", "data-handle")
    tab.click("#try-watch")
    tab.wait_for_selector("#live[data-status=live]")
    gw.runtime.push(hid, [{"avg_rainrate": 6.0 + i} for i in range(3)])
    wait_true(tab, "document.getElementById('live').dataset.rows === '3'")
    # under load the first token can expire before the browser opens the stream with it; the
    # console then asks for another, so count from the stream that is open now
    minted = cutter[0].mints
    assert minted >= 1
    time.sleep(1.2)  # the token has expired; the open stream goes on
    gw.runtime.push(hid, [{"avg_rainrate": 10.0}])
    wait_true(tab, "document.getElementById('live').dataset.rows === '4'")
    assert cutter[0].mints == minted
    # the connection drops: the console gets a fresh token and resumes after its last row
    cutter[0].cut()  # takes effect at the next heartbeat
    deadline = time.monotonic() + 10
    while cutter[0].mints == minted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cutter[0].mints > minted
    tab.wait_for_selector("#live[data-status=live]")
    gw.runtime.push(hid, [{"avg_rainrate": 11.0}, {"avg_rainrate": 12.0}])
    wait_true(tab, "document.getElementById('live').dataset.rows === '6'")
    ids = tab.evaluate("() => [...document.querySelectorAll('#live-rows tbody tr td:first-child')]"
                       ".map((td) => Number(td.textContent))")
    assert ids == [6, 5, 4, 3, 2, 1]  # newest first: none twice, none lost
    assert tab.js_errors == []
    tab.context.close()


def test_owner_chooses_who_sees_a_stream_and_others_see_only_what_they_may(browser, gateway,
                                                                           shots):
    """The streams page lists only the streams the caller may see; an owner registers a
    restricted stream and switches a stream between listed and restricted."""
    gateway.add_weather()
    owner = sign_in(browser, gateway, "nea")
    owner.wait_for_selector("#streams-table tr[data-stream=weather][data-visibility=listed]")
    owner.fill("#reg-name", "hidden1")
    owner.fill("#reg-schema", "ts timestamp\nvalue double")
    owner.select_option("#reg-visibility", "restricted")
    owner.click("#stream-register button[type=submit]")
    owner.wait_for_selector("#reg-result.ok")
    assert "restricted" in owner.inner_text("#reg-result")
    owner.wait_for_selector("#streams-table tr[data-stream=hidden1][data-visibility=restricted]")

    consumer = sign_in(browser, gateway, "lta")
    consumer.wait_for_selector("#streams-table tr[data-stream=weather]")
    assert consumer.query_selector("#streams-table tr[data-stream=hidden1]") is None
    # a consumer may not change another's stream: no switch is offered
    assert consumer.query_selector("#streams-table tr[data-stream=weather] button") is None

    # the owner restricts weather; with no policy permitting lta anything, lta no longer sees it
    owner.click("#streams-table tr[data-stream=weather] button[data-visibility-to=restricted]")
    owner.wait_for_selector("#streams-table tr[data-stream=weather][data-visibility=restricted]")
    assert "now restricted" in owner.inner_text("#flash")
    owner.screenshot(path=str(shots / "streams-visibility.png"), full_page=True)
    consumer.click("#streams-refresh")
    wait_true(consumer, "!document.querySelector('#streams-table tr[data-stream=weather]')")
    assert "No streams yet." in consumer.inner_text("#streams-table")
    # a policy that permits lta makes it visible again, restricted as it is
    gateway.add_weather_policy()
    consumer.click("#streams-refresh")
    consumer.wait_for_selector("#streams-table tr[data-stream=weather][data-visibility=restricted]")
    # and listed again for everyone
    owner.click("#streams-table tr[data-stream=weather] button[data-visibility-to=listed]")
    owner.wait_for_selector("#streams-table tr[data-stream=weather][data-visibility=listed]")
    other = sign_in(browser, gateway, "other")
    other.wait_for_selector("#streams-table tr[data-stream=weather][data-visibility=listed]")
    assert other.query_selector("#streams-table tr[data-stream=hidden1]") is None
    for tab in (owner, consumer, other):
        assert tab.js_errors == []
        tab.context.close()


def test_owner_changes_a_stream_then_deletes_it_after_seeing_what_depends_on_it(
        browser, gateway, shots):
    """Change (description, lateness, an added attribute) and delete from the Streams page:
    the confirmation counts the live handles to be revoked and shows what becomes of each
    policy; the consumer's handle is revoked."""
    gateway.add_weather()
    gateway.add_weather_policy()
    r = gateway.api("POST", "/requests", who="lta",
                    data=(POLICIES / "weather" / "lta-request.xml").read_bytes(),
                    headers={"Content-Type": "application/xacml+xml"})
    assert r.status_code == 201, r.text
    handle_id = r.json()["id"]
    consumer = sign_in(browser, gateway, "lta")
    consumer.wait_for_selector("#streams-table tr[data-stream=weather]")
    assert consumer.query_selector("#streams-table tr[data-stream=weather] [data-delete]") is None

    owner = sign_in(browser, gateway, "nea")
    owner.click("#streams-table tr[data-stream=weather] button[data-change=weather]")
    owner.wait_for_selector("#stream-change:not([hidden])")
    owner.fill("#change-description", "NEA's weather stations")
    owner.fill("#change-lateness", "4")
    owner.fill("#change-attributes", "uvindex double")
    owner.click("#stream-change button[type=submit]")
    owner.wait_for_selector("#change-result.ok")
    assert "Added uvindex; 0 handles revoked" in owner.inner_text("#change-result")
    row = owner.inner_text("#streams-table tr[data-stream=weather]")
    assert "NEA's weather stations" in row and "lateness 4 s" in row and "uvindex: double?" in row
    owner.fill("#change-attributes", "bad line here")
    owner.click("#stream-change button[type=submit]")
    owner.wait_for_selector("#change-result.bad")
    assert 'expected "name type"' in owner.inner_text("#change-result")
    assert gateway.services.handle_store.get(handle_id).live  # its grant lists its attributes

    # Delete, then Cancel: nothing happens
    owner.click("#streams-table tr[data-stream=weather] button[data-delete=weather]")
    owner.wait_for_selector("#modal:not([hidden])")
    assert owner.get_attribute("#modal-count", "data-count") == "1"
    owner.click("#modal-cancel")
    assert gateway.api("GET", "/streams/weather").status_code == 200

    owner.click("#streams-table tr[data-stream=weather] button[data-delete=weather]")
    owner.wait_for_selector("#modal:not([hidden])")
    assert "1 live handle on this stream will be revoked" in owner.inner_text("#modal-body")
    owner.wait_for_selector(f"#delete-policies li[data-policy='{WEATHER_POLICY_ID}']"
                            "[data-action=keep]")
    owner.check("#delete-remove-policies")
    owner.wait_for_selector(f"#delete-policies li[data-policy='{WEATHER_POLICY_ID}']"
                            "[data-action=remove]")
    owner.screenshot(path=str(shots / "streams-delete.png"), full_page=True)
    owner.click("#modal-confirm")
    wait_true(owner, "!document.querySelector('#streams-table tr[data-stream=weather]')")
    flash = owner.inner_text("#flash")
    assert "Deleted stream weather: 1 handle revoked" in flash
    assert f"policies removed: {WEATHER_POLICY_ID}" in flash and "files were removed" in flash
    assert owner.is_hidden("#stream-change")
    record = gateway.services.handle_store.get(handle_id)
    assert record.state.value == "revoked" and "was deleted by 'nea'" in record.reason
    assert gateway.api("GET", f"/policies/{WEATHER_POLICY_ID}").status_code == 404
    consumer.click("#streams-refresh")
    wait_true(consumer, "!document.querySelector('#streams-table tr[data-stream=weather]')")
    for tab in (owner, consumer):
        assert tab.js_errors == []
        tab.context.close()
