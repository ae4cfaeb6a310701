"""Phoenix's own UI shows the scores: Debian's chromium, headless, driven by Playwright.

A trace is scored as in test_phoenix.py (real traces over OTLP, the real backfill, PhoenixSink);
the browser opens the scored span in Phoenix's UI, shows its annotations as a table and must
see every scorer's row with its kind, label, score and explanation. The screenshot goes to the
test's tmp dir (its path is printed); docs/phoenix-scores.png is one such screenshot.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration._drain import drain_and_close
from tests.integration._servers import Server, unavailable
from tests.integration._traces import JUDGE_SCORE, scored, send_otlp
from tests.integration.phoenix_scorers import SCORER_IDS
from tracing.sinks import PhoenixSink

CHROMIUM = "/usr/bin/chromium"


def test_the_ui_shows_each_score_on_its_span(
    phoenix: Server, project: str, tmp_path: Path, judge_env: dict[str, str]
) -> None:
    """The span's annotations table lists every scorer: LLM/CODE, score, label and explanation."""
    if not Path(CHROMIUM).exists():
        unavailable(f"{CHROMIUM} is missing: run `bash tests/integration/servers.sh` (installs Debian's chromium)")
    try:
        from playwright import sync_api as playwright
    except ImportError:
        unavailable("playwright is missing: pip install -e '.[integration]'")

    traces, records = scored(tmp_path, judge_env, project, lines=1)
    send_otlp(phoenix.url, traces)
    drain_and_close(PhoenixSink(phoenix.url), records)
    span_id = records[0].span_id
    on_span = {r.scorer_id: r for r in records if r.span_id == span_id}
    assert set(on_span) == set(SCORER_IDS)

    screenshot = tmp_path / "phoenix-scores.png"
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            page.set_default_timeout(60_000)
            # Phoenix's own link to a span by its OpenTelemetry id: the trace, with the span open.
            page.goto(f"{phoenix.url}/redirects/spans/{span_id}")
            page.get_by_role("button", name="Annotations", exact=True).click()
            page.get_by_role("radio", name="Table").click()
            table = page.get_by_role("table").filter(has_text="explanation")
            for scorer, record in on_span.items():
                row = table.get_by_role("row").filter(has_text=scorer)
                row.wait_for(state="visible")
                text = row.inner_text()
                kind = "LLM" if scorer == "judged-helpfulness" else "CODE"
                assert kind in text, (scorer, text)
                if record.reason:
                    assert record.reason in text, (scorer, text)
            judged = table.get_by_role("row").filter(has_text="judged-helpfulness").inner_text()
            assert f"{JUDGE_SCORE:g}" in judged
            assert "error" in table.get_by_role("row").filter(has_text="always-fails").inner_text()
            assert "not scorable" in table.get_by_role("row").filter(has_text="needs-ground-truth").inner_text()
            time.sleep(0.5)  # let the table's column widths settle before the picture (not an assertion)
            page.screenshot(path=str(screenshot))
        finally:
            browser.close()
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")
