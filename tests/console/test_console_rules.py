"""From nothing to a consumer's live handle through the console, without typing XML (issue 23):
an owner writes a sharing rule in the Policies page's form (stream and attribute pickers, a live
preview of the XACML and of what a sample consumer would get), sees what saving it would do,
saves it; the consumer opens a handle; the owner appends records; the consumer's live view gets
the rows the rule lets through; the owner narrows the rule and is told first which handle that
changes.

Headless Chromium (Debian's, through Playwright) against an in-process gateway on its HTTP
server. Spark is replaced by `IngestRuntime` below: it reads the batches appended to the stream
(the catalogue's feeds, as the join runtime does) and applies each attached plan's filter and
projection, so the rows a handle gets come from the records ingested, through the plan the
gateway decided."""
from __future__ import annotations

import json
import operator
import threading
from pathlib import Path

import pytest

from tests.console.conftest import RecordingRuntime
from tests.console.test_console_browser import sign_in, wait_true

pytestmark = pytest.mark.timeout(180)

OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
       "=": operator.eq, "!=": operator.ne}


class IngestRuntime(RecordingRuntime):
    """A stand-in for Spark that is fed by ingest: every batch appended to a stream after a
    handle attaches is filtered (the plan's DNF of plain comparisons) and projected, and the
    rows that pass are delivered to the handle. No windows: the rule in this test has none."""

    def __init__(self, work: Path) -> None:
        super().__init__()
        self.work = work
        self.catalog = None
        self.feeds: dict[str, tuple[str, Path, object, set]] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def attach_handle(self, handle_id, stream, plan, deliver):
        super().attach_handle(handle_id, stream, plan, deliver)
        assert plan.window is None
        feed = self.work / handle_id[:16]
        name = getattr(stream, "name", stream)  # the handle service passes the definition
        self.catalog.open_feed(name, feed)
        with self.lock:
            self.feeds[handle_id] = (name, feed, plan, set())

    def detach(self, handle_id):
        super().detach(handle_id)
        with self.lock:
            entry = self.feeds.pop(handle_id, None)
        if entry is not None:
            self.catalog.close_feed(entry[0], entry[1])

    def stop(self):
        self.stopping.set()

    @staticmethod
    def passes(plan, record: dict) -> bool:
        if plan.filter_dnf is None:
            return True
        return any(all(record.get(p.attribute) is not None
                       and OPS[p.op](record[p.attribute], p.value) for p in conjunct)
                   for conjunct in plan.filter_dnf)

    def run(self) -> None:
        while not self.stopping.wait(0.05):
            with self.lock:
                feeds = list(self.feeds.items())
            for handle_id, (_, feed, plan, seen) in feeds:
                for path in sorted(feed.glob("*.json")):
                    if path.name in seen:
                        continue
                    seen.add(path.name)
                    records = [json.loads(line) for line in path.read_text().splitlines() if line]
                    rows = [{name: r.get(name) for name in plan.projection}
                            for r in records if self.passes(plan, r)]
                    if rows:
                        self.push(handle_id, rows)


def test_owner_goes_from_nothing_to_a_consumers_live_handle_without_xml(
        browser, gateway_factory, shots, tmp_path):
    runtime = IngestRuntime(tmp_path / "feeds")
    gw = gateway_factory(runtime=runtime)
    runtime.catalog = gw.services.catalog
    gw.add_weather()  # an already registered stream, no policy at all

    nea = sign_in(browser, gw, "nea", "policies")
    nea.wait_for_selector("#policies-empty:not([hidden])")
    nea.click("#rule-new")
    nea.wait_for_selector("#rule-editor:not([hidden])")
    nea.select_option("#rule-stream", "weather")
    # the attribute pickers come from the stream's schema
    assert nea.locator("#rule-attrs-table tbody tr").count() == 8
    nea.fill("#rule-subjects", "lta")
    nea.fill("#rule-description", "LTA sees heavy rain")
    # a mistake is shown at its field
    nea.fill("#rule-filter", "rainfall > 5")
    wait_true(nea, "document.getElementById('rule-error').dataset.field === '/filter'")
    assert nea.is_visible("#rule-error")
    assert "rainfall" in nea.inner_text("#rule-error")
    assert "field-error" in nea.get_attribute("#rule-filter", "class")
    nea.fill("#rule-filter", "rainrate > 5")
    for attribute in ("samplingtime", "rainrate", "windspeed"):
        nea.check(f"#rule-attrs-table input[data-kind=show][data-attr={attribute}]")
    # a mask (issue 24): a bad one shown at its field, a good one in the summary and the
    # XACML, then taken off again
    nea.fill("#rule-masks", "rainrate:blur")
    wait_true(nea, "document.getElementById('rule-error').dataset.field === '/mask/rainrate'")
    assert "field-error" in nea.get_attribute("#rule-masks", "class")
    nea.fill("#rule-masks", "rainrate:round:0.5; samplingtime:truncate:hour")
    wait_true(nea, "document.getElementById('rule-summary').textContent.includes("
                   "'rainrate as round:0.5, samplingtime as truncate:hour')")
    assert "rainrate:round:0.5" in nea.text_content("#rule-xacml")
    nea.fill("#rule-masks", "")
    wait_true(nea, "!document.getElementById('rule-summary').textContent.includes('round')")
    # the grant option (issue 48): in the summary and the XACML, then taken off again
    nea.check("#rule-grant-option")
    wait_true(nea, "document.getElementById('rule-summary').textContent.includes("
                   "'with grant option')")
    assert "exacml:obligation:stream-grant-option" in nea.text_content("#rule-xacml")
    nea.uncheck("#rule-grant-option")
    wait_true(nea, "!document.getElementById('rule-summary').textContent.includes('grant')")
    # a window, previewed, then taken off again
    nea.select_option("#rule-window-type", "tuple")
    nea.check("#rule-attrs-table input[data-kind=agg][data-attr=rainrate][data-fn=avg]")
    wait_true(nea, "document.getElementById('rule-summary').textContent.includes("
                   "'gets avg(rainrate) per tuple window of 5 every 5')")
    assert nea.is_disabled("#rule-attrs-table input[data-kind=agg][data-attr=samplingtime]"
                           "[data-fn=avg]")  # no average of a timestamp
    nea.select_option("#rule-window-type", "")
    wait_true(nea, "!document.getElementById('rule-summary').textContent.includes('window')")
    nea.wait_for_selector("#rule-editor[data-state=ok][data-decision=Permit]")
    assert nea.inner_text("#rule-summary") == (
        "weather: lta (read, subscribe) gets samplingtime, rainrate, windspeed where "
        "rainrate > 5")
    xacml = nea.text_content("#rule-xacml")
    assert 'PolicyId="urn:xsg:rule:weather:lta"' in xacml
    assert "exacml:obligation:stream-filter" in xacml and "rainrate &gt; 5" in xacml
    assert ">weather</AttributeValue>" in xacml  # the owner-confinement target
    # what lta would get, as POST /explain would answer
    assert "lta (read) would get: filter rainrate > 5" in nea.inner_text("#rule-explain-note")
    assert "WHERE `rainrate` > 5" in nea.text_content("#rule-explain-sql")
    nea.locator("#rule-editor").scroll_into_view_if_needed()
    nea.screenshot(path=str(shots / "rule-form.png"), full_page=True)

    # saving: first what it would do (nothing is live yet), then the confirmation
    nea.click("#rule-save")
    nea.wait_for_selector("#modal:not([hidden])")
    assert nea.get_attribute("#what-if-count", "data-handles") == "0"
    nea.click("#modal-confirm")
    nea.wait_for_selector("#rule-result.ok")
    row = "#policies-table tr[data-policy='urn:xsg:rule:weather:lta']"
    nea.wait_for_selector(row)
    assert nea.get_attribute(row, "data-form") == "rule"
    assert "lta (read, subscribe) gets samplingtime, rainrate, windspeed where rainrate > 5" \
        in nea.inner_text(f"{row} td.summary")

    # the consumer asks for the stream and watches its handle
    lta = sign_in(browser, gw, "lta", "try")
    lta.wait_for_selector("#try-stream option[value=weather]", state="attached")
    lta.select_option("#try-stream", "weather")
    lta.click("#try-open")
    lta.wait_for_selector("#try-watch")
    hid = lta.get_attribute("#try-watch", "data-handle")
    lta.click("#try-watch")
    lta.wait_for_selector("#live[data-status=live]")

    # the owner appends a few records from the Streams page
    records = tmp_path / "records.ndjson"
    records.write_text("".join(json.dumps({
        "samplingtime": f"2026-11-23T08:00:0{i}Z", "temperature": 27.0 + i, "humidity": 80.0,
        "solarradiation": 100.0, "rainrate": rain, "windspeed": 10.0 + i, "winddirection": 90,
        "barometer": 1010.0}) + "\n" for i, rain in enumerate([2.0, 7.5, 4.0, 12.25, 5.0])))
    nea.click("a[data-page=streams]")
    nea.wait_for_selector("#append-stream option[value=weather]", state="attached")
    nea.select_option("#append-stream", "weather")
    nea.set_input_files("#append-file", str(records))
    nea.click("#stream-append button[type=submit]")
    nea.wait_for_selector("#append-result.ok")

    # ... and the consumer's live view gets the two rows the rule lets through, as it shows them
    wait_true(lta, "document.getElementById('live').dataset.rows === '2'")
    head = lta.locator("#live-rows thead th").all_inner_texts()
    assert head == ["id", "samplingtime", "rainrate", "windspeed"]
    cells = lta.locator("#live-rows tbody tr td:nth-child(3)").all_inner_texts()
    assert sorted(cells) == ["12.25", "7.500"]
    lta.screenshot(path=str(shots / "rule-handle.png"), full_page=True)

    # the owner narrows the rule; before saving it is told the handle's view would change
    nea.click("a[data-page=policies]")
    nea.wait_for_selector(f"{row} button[data-action=rule]")
    nea.click(f"{row} button[data-action=rule]")
    # the editor is still open from the first save: reopening it clears that save's "ok" (a
    # later wait for "ok" would otherwise be met by the first save's while the second runs)
    wait_true(nea, "document.getElementById('rule-result').className === 'result'")
    assert nea.input_value("#rule-filter") == "rainrate > 5"
    assert nea.is_checked("#rule-attrs-table input[data-kind=show][data-attr=windspeed]")
    nea.fill("#rule-filter", "rainrate > 8")
    wait_true(nea, "document.getElementById('rule-summary').textContent.endsWith('rainrate > 8')")
    nea.click("#rule-save")
    nea.wait_for_selector("#modal:not([hidden])")
    assert nea.get_attribute("#what-if-count", "data-changed") == "1"
    assert nea.inner_text("#what-if-table tr[data-subject=lta] td.changed") == "changed"
    nea.screenshot(path=str(shots / "rule-what-if.png"))
    assert hid in {r.id for r in gw.services.handles.live()}  # nothing applied yet
    nea.click("#modal-confirm")
    lta.wait_for_selector("#live[data-status=revoked]", timeout=3000)
    nea.wait_for_selector("#rule-result.ok")
    assert "store version 2" in nea.inner_text("#rule-result")
    assert lta.js_errors == [] and nea.js_errors == []
    lta.context.close()
    nea.context.close()


def test_a_saved_rule_opens_as_xacml_and_a_hand_written_policy_is_summarised(
        browser, gateway, shots):
    gateway.add_weather()
    gateway.add_weather_policy()
    nea = sign_in(browser, gateway, "nea", "policies")
    row = "#policies-table tr[data-policy='urn:xsg:example:weather:nea-policy']"
    nea.wait_for_selector(row)
    # Figure 2, read by its grants; not a rule: no rule button
    assert nea.get_attribute(row, "data-form") == "xacml"
    assert nea.inner_text(f"{row} td.summary").startswith(
        "weather: nea (any action) gets every attribute | lta (read, subscribe) gets "
        "lastval(samplingtime), avg(rainrate), max(windspeed) per tuple window of 5 every 2")
    assert nea.locator(f"{row} button[data-action=rule]").count() == 0
    # a new rule: Edit as XACML opens the compiled document in the XML editor
    nea.click("#rule-new")
    nea.select_option("#rule-stream", "weather")
    nea.check("#rule-anyone")
    nea.wait_for_selector("#rule-editor[data-state=ok]")
    wait_true(nea, "document.getElementById('rule-summary').textContent.startsWith("
                   "'weather: anyone')")
    nea.click("#rule-as-xacml")
    nea.wait_for_selector("#policy-editor:not([hidden])")
    assert nea.is_hidden("#rule-editor")
    assert 'PolicyId="urn:xsg:rule:weather:anyone"' in nea.input_value("#editor-text")
    assert nea.js_errors == []
    nea.context.close()
