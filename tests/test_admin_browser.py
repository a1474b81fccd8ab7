"""The operator page /admin in a real headless Chromium against a real server over the sample store: refused
without the token and from another origin; then label on the page, import the rest, calibrate, choose alpha,
apply, and ask on the kiosk page, whose footer then names the operator's certificate."""
from __future__ import annotations

import json
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra: pip install 'edge-rag[dev]'")
httpx = pytest.importorskip("httpx")

from admin_cases import OFF_TOPIC, logged_server, sample_labels  # noqa: E402
from browsing import WAIT_MS, ask, open_page, shot  # noqa: E402
from serving import TOKEN, WRITE  # noqa: E402

ASKED = 3  # times the visitors asked each question
FOREIGN_PAGE = "<!doctype html><title>another site</title><p>hello</p>"


def unlock(page, token: str) -> None:
    page.fill("#token", token)
    page.click("#unlock-button")


def labels(url: str) -> dict:
    listing = httpx.get(f"{url}/api/admin/questions", headers=WRITE, timeout=60).json()
    return {g["question"]: g["label"] for g in listing["questions"] if g["label"]}


@pytest.fixture
def foreign_site(tmp_path):
    """Another origin: a page on another port of this machine."""
    (tmp_path / "index.html").write_text(FOREIGN_PAGE, encoding="utf-8")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_the_operator_page_refuses_without_the_token_and_from_another_origin(browser, sample_db, tmp_path,
                                                                             foreign_site):
    rag, running = logged_server(sample_db, tmp_path)
    with running as url:
        context, page, errors = open_page(browser, f"{url}/admin", "1920x1080", ready="#token")
        assert page.is_hidden("#work") and page.locator("#questions li").count() == 0
        unlock(page, "not-the-token")
        page.wait_for_selector("#status:text-matches('^Refused')")
        assert "API token" in page.inner_text("#status") and page.is_hidden("#work")
        assert page.locator("#questions li").count() == 0
        shot(page, "admin-refused")
        assert not errors, errors
        context.close()

        # a script on another site, holding the token, can neither read the questions nor save a label
        context = browser.new_context()
        page = context.new_page()
        page.goto(foreign_site)
        tried = page.evaluate("""async ([url, token, question]) => {
            const out = [];
            for (const [path, init] of [["/api/admin/questions", {}],
                ["/api/admin/labels", {method: "POST", body: JSON.stringify({question, label: "off-topic"}),
                                       headers: {"content-type": "application/json"}}]]) {
              try {
                const r = await fetch(url + path, {...init, headers: {...(init.headers || {}),
                                                                      authorization: "Bearer " + token}});
                out.push(r.status + " " + await r.text());
              } catch (e) { out.push("blocked"); }
              try {  // a simple request: no preflight, no token
                const r = await fetch(url + path, {...init, mode: "no-cors"});
                out.push("opaque " + r.type);
              } catch (e) { out.push("blocked"); }
            }
            return out; }""", [url, TOKEN, OFF_TOPIC[0]])
        assert not any(t.startswith("200") for t in tried), tried
        frame = page.evaluate("""(url) => new Promise((done) => { const f = document.createElement("iframe");
            f.src = url + "/admin"; f.onload = () => done("loaded"); document.body.append(f);
            setTimeout(() => done("timeout"), 5000); })""", url)
        assert frame in ("loaded", "timeout")  # frame-ancestors 'none': Chromium shows its error page instead
        assert page.frames[-1].url.startswith("chrome-error:") and page.frames[-1].locator("#token").count() == 0
        context.close()
        assert labels(url) == {}  # nothing was saved from the other site


def test_a_visitor_going_back_from_the_kiosk_page_finds_the_operator_page_locked(browser, sample_db, tmp_path):
    """The operator unlocks /admin in the kiosk's own tab (the server listens on loopback: the kiosk's browser is the
    one that reaches it), then opens the kiosk page and leaves. A visitor swiping back found the operator page open:
    the logged questions, Calibrate and Apply (from Chromium's back/forward cache, or loaded again with the token the
    tab kept); typing /admin did too. Chromium with its back/forward cache on, as a kiosk runs it."""
    from browsing import CHROMIUM, CHROMIUM_ARGS

    kiosk_browser = browser.browser_type.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                                                ignore_default_args=["--disable-back-forward-cache"])
    try:
        rag, running = logged_server(sample_db, tmp_path)
        with running as url:
            page = kiosk_browser.new_context(has_touch=True).new_page()
            page.goto(f"{url}/admin")
            unlock(page, TOKEN)
            page.wait_for_selector("#questions li")
            page.goto(url)
            page.wait_for_selector("#suggestion-list button")
            page.go_back(wait_until="commit")  # a page restored from the cache fires no load event
            page.wait_for_selector("#unlock:not([hidden])", timeout=10_000)
            assert page.is_hidden("#work") and page.locator("#questions li").count() == 0
            page.goto(f"{url}/admin")
            page.wait_for_selector("#token")
            assert page.is_visible("#unlock") and page.is_hidden("#work")
    finally:
        kiosk_browser.close()


def test_the_questions_come_a_page_at_a_time_and_stay_shown_after_a_save(browser, sample_db, tmp_path):
    """A log of more questions than a page: the first page and "Show older questions"; the next page appended; a label
    saved on it keeps every question shown (the listing asked again for as many)."""
    from edge_rag.serve.admin import PAGE
    from edge_rag.serve.question_log import QuestionLog

    rag, running = logged_server(sample_db, tmp_path)
    log = QuestionLog(tmp_path / "questions.jsonl")
    for n in range(PAGE):
        log.add(f"Visitor question number {n}?")
    total = PAGE + len(sample_labels())
    with running as url:
        context, page, errors = open_page(browser, f"{url}/admin", "1920x1080", ready="#token")
        unlock(page, TOKEN)
        page.wait_for_selector("#more:not([hidden])")
        assert page.locator("#questions > li").count() == PAGE
        page.click("#more")
        page.wait_for_selector("#more", state="hidden")
        assert page.locator("#questions > li").count() == total
        oldest = page.locator("#questions > li").last
        oldest.locator("input[value='off-topic']").check()
        oldest.locator("button", has_text="Save").click()
        page.wait_for_selector("#counts:text-matches('^Labelled: 1 ')")
        assert page.locator("#questions > li").count() == total
        assert page.locator("#questions > li").last.locator("input[value='off-topic']").is_checked()
        assert not errors, errors
        context.close()


def test_label_calibrate_apply_and_ask(browser, sample_db, tmp_path):
    """A kiosk whose visitors asked each question three times: enough askings that some alpha certifies answers."""
    rag, running = logged_server(sample_db, tmp_path, times=ASKED)
    typed = sample_labels()[:3]  # labelled on the page; the rest imported as a file, as the page's import does
    rest = tmp_path / "rest.json"
    rest.write_text(json.dumps(sample_labels()[3:]), encoding="utf-8")
    with running as url:
        context, page, errors = open_page(browser, f"{url}/admin", "1920x1080", ready="#token")
        unlock(page, TOKEN)
        page.wait_for_selector("#questions li")
        assert page.inner_text("#in-force").startswith("Certificate in force: the shipped one")
        for entry in typed:
            item = page.locator("#questions > li", has=page.locator(".q", has_text=entry["question"])).first
            kind = entry["label"]
            item.locator(f"input[value='{kind}']").check()
            if entry["answer"]:
                item.locator("textarea").fill(entry["answer"])
            item.locator("button", has_text="Save").click()
            page.wait_for_selector(f"#counts:text-matches('^Labelled: {typed.index(entry) + 1} ')")
        saved = labels(url)
        assert {q.casefold(): (x["label"], x["answer"]) for q, x in saved.items()} == {
            e["question"].casefold(): (e["label"], [e["answer"]] if e["answer"] else None) for e in typed}

        page.fill("#search", "museum close 31 December")
        page.click("#search-form button")
        page.wait_for_selector("#passages li")
        assert "15:00" in page.inner_text("#passages")

        page.set_input_files("#import", str(rest))
        page.wait_for_selector("#cal-status:text-matches('questions labelled from rest.json')")
        assert len(labels(url)) == len(sample_labels())

        page.click("#calibrate")
        page.wait_for_selector("#result:not([hidden])", timeout=WAIT_MS)
        assert page.locator("#rows tr").count() >= 1 and page.locator("#plot polyline").count() == 1
        choices = page.locator("#rows input:not([disabled])")
        assert choices.count() >= 1, page.inner_text("#table")  # some alpha certifies answers on these questions
        choices.last.check()
        assert page.locator("#plot circle").count() == 1  # the chosen alpha marked on the curve
        alpha = float(choices.last.get_attribute("value"))
        shot(page, "admin-calibrated")
        page.click("#apply")
        page.wait_for_selector("#cal-status:text-matches('^Applied')")
        assert page.inner_text("#in-force").startswith("Certificate in force: yours")
        decision = httpx.get(f"{url}/api/health", timeout=60).json()["decision"]
        assert decision["certificate"]["source"] == "operator" and decision["max_error_rate"] == alpha
        assert decision["certificate"]["questions"] == ASKED * len(sample_labels()) + 1  # the first once more
        assert not errors, errors
        context.close()

        context, page, errors = open_page(browser, url, "1920x1080", ready="#certificate:not(:empty)")
        assert "labelled by its operator" in page.inner_text("#certificate")
        ask(page, sample_labels()[1]["question"])
        answered = httpx.post(f"{url}/api/ask", json={"question": sample_labels()[1]["question"]},
                              timeout=300).json()
        assert answered["n_cal"] == decision["certificate"]["questions"] and answered["alpha"] == alpha
        shot(page, "admin-kiosk-after-apply")
        assert not errors, errors
        context.close()
