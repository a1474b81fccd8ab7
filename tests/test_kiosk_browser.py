"""The kiosk page in a real headless Chromium (Debian's ``chromium``, driven by Playwright), against a real
server: a generated answer streams in, an off-topic question gets "I don't know" with the reason, at
800×480 and 1920×1080; on the small panel the certificate footer stays in view without scrolling. Screenshots
go to tests/.artifacts/ (git-ignored) for a person to look at.
"""
from __future__ import annotations

import json
import re
import shutil
from urllib.parse import parse_qs, urlsplit

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra: "
                               "pip install 'edge-rag[dev]' (make test installs it)")
httpx = pytest.importorskip("httpx")

from browsing import WAIT_MS, accessible, ask, described, open_page, shot  # noqa: E402
from serving import MULTI_HOP, OFF_TOPIC, running_server  # noqa: E402

from edge_rag.documents.text import split_sentences, whole_sentences  # noqa: E402

# The sample corpus answers this with a clause, not a name: the tallest answer of the suggested questions.
LONG_ANSWER = "Why is the museum called Harbourlight?"
# The sample corpus holds the answer, but the certified default is not sure enough of the reader's span to give it.
UNSURE_CANDIDATE = "When was the museum founded?"


def small_text(page) -> list:
    """Visible elements holding text whose computed size is under the 17 px the kiosk guide promises (docs/guides/kiosk.md)."""
    return page.evaluate("""() => [...document.querySelectorAll('body *')]
        .filter(e => e.getClientRects().length && [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim()))
        .map(e => [e.tagName + '#' + e.id + '.' + e.className, parseFloat(getComputedStyle(e).fontSize)])
        .filter(([, px]) => px < 17)""")


def overlaps(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and \
        a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


def footer_in_view(page) -> None:
    """The certificate footer is on screen without scrolling, over none of the question box, the Ask button, the
    answer or the reason; scrolled to the end, the page's last line is above it, not behind it."""
    footer = page.locator("#certificate").bounding_box()
    height = page.viewport_size["height"]
    assert footer and footer["y"] >= 0 and footer["y"] + footer["height"] <= height, footer
    for selector in ("#question", "#ask", "#answer", "#reason"):
        if page.is_visible(selector):
            box = page.locator(selector).bounding_box()
            assert not overlaps(footer, box), (selector, box, footer)
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    bottom = page.evaluate("""() => Math.max(...[...document.querySelectorAll('main > :not(footer)')]
        .filter(e => e.getClientRects().length).map(e => e.getBoundingClientRect().bottom))""")
    footer = page.locator("#certificate").bounding_box()
    assert bottom <= footer["y"] + 0.5, (bottom, footer)
    page.evaluate("window.scrollTo(0, 0)")


def footer_lines(page) -> int:
    """How many lines of text the certificate footer shows."""
    return page.evaluate("""() => { const f = document.querySelector('#certificate'), s = getComputedStyle(f);
        const inner = f.clientHeight - parseFloat(s.paddingTop) - parseFloat(s.paddingBottom);
        return Math.round(inner / parseFloat(s.lineHeight)); }""")


# pixels of the certificate's text that the footer cuts off (0: all of it shows)
HIDDEN_TEXT = "() => { const f = document.querySelector('#certificate'); return f.scrollHeight - f.clientHeight; }"


def test_kiosk_page_streams_answers_and_refuses(browser, served):
    url, questions = served
    gpt_question = questions[3]  # not asked by any other test: it streams, it is not a cache hit

    context, page, errors = open_page(browser, url, "1920x1080")
    # Keyboard-only: the question box comes first in tab order after "Start over", with a visible label.
    assert page.get_attribute("#question", "id") == "question"
    assert page.inner_text("label[for=question]").strip()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "question"
    shot(page, "1920x1080-start")
    # Record every text the answer shows while streaming.
    page.evaluate("""() => { window.seen = [];
        new MutationObserver(() => window.seen.push(document.querySelector('#answer').textContent))
          .observe(document.querySelector('#answer'), {childList: true, characterData: true, subtree: true}); }""")
    ask(page, gpt_question)
    final = page.inner_text("#answer")
    api = httpx.post(f"{url}/api/ask", json={"question": gpt_question}, timeout=60).json()
    assert api["route"] == "GPT" and api["cache_hit"]
    assert final == (api["answer"] or "I don't know.")
    assert page.inner_text("#badge") == "Written by the on-device model"
    partial = [s for s in page.evaluate("window.seen") if s and s != final]
    # streamed a whole sentence at a time: never a fragment, always the start of the answer shown at the end
    assert all(final.startswith(s) and whole_sentences(s, finished=True) == s for s in partial), partial
    if len(split_sentences(final)) > 1:
        assert partial, "the answer did not stream in"
    if api["answer"]:
        first_source = page.locator("#sources details").first
        first_source.locator("summary").click()  # tappable: opens the passage
        assert first_source.evaluate("d => d.open") and first_source.locator("p").inner_text().strip()
    shot(page, "1920x1080-answer")
    ask(page, OFF_TOPIC)
    assert page.inner_text("#answer") == "I don't know."
    assert page.is_visible("#reason") and page.inner_text("#reason").strip()
    assert page.inner_text("#badge") == "Not in the documents"
    shot(page, "1920x1080-refusal")
    assert not errors, errors
    context.close()

    context, page, errors = open_page(browser, url, "800x480")
    shot(page, "800x480-start")
    footer_in_view(page)
    # A suggestion is one tap: it asks and answers.
    page.locator("#suggestion-list button").first.tap()
    page.wait_for_selector("#meta:not(:empty)", state="attached", timeout=WAIT_MS)
    assert page.inner_text("#answer").strip()
    ask(page, gpt_question)  # cached now: same answer, no generation
    assert page.inner_text("#answer") == final
    # The question box and the answer are on screen without scrolling on the small panel.
    for selector in ("#question", "#answer"):
        box = page.locator(selector).bounding_box()
        assert box and box["y"] >= 0 and box["y"] + box["height"] <= 480, selector
    footer_in_view(page)
    shot(page, "800x480-answer")
    assert not small_text(page), small_text(page)
    ask(page, OFF_TOPIC)
    assert page.is_visible("#reason")
    footer_in_view(page)
    shot(page, "800x480-refusal")
    assert not small_text(page), small_text(page)
    page.click("#reset")
    assert page.input_value("#question") == "" and page.is_hidden("#result")
    # the footer says the seeds' decision answers this server, uncertified
    assert page.inner_text("#certificate").startswith("Answers not certified: the seeds' decision")
    assert not errors, errors
    context.close()


def test_the_footer_says_which_certificate_decides(browser, sample_db, tmp_path):
    """Certified by an own calibration: error bound, delta, questions and the file's name, as text (a name that is
    markup stays text); under a Config the calibration was not measured with: not certified, and why."""
    from edge_rag.config import Config
    from edge_rag.decision.certify import CALIBRATION_ASSET, Calibration
    from edge_rag.pipeline import EdgeRAG

    n_cal = Calibration.load().reader("neural").table.n_cal
    own = tmp_path / "<img src=x onerror=alert(1)>.json"
    shutil.copy(CALIBRATION_ASSET, own)
    expected = {Config(temperature=0.0): (f"Answers certified: error ≤ 40% among answered (δ 0.05), measured on "
                                          f"{n_cal:,} questions of an own calibration ({own.name})"),
                Config(temperature=0.0, retrieval="dense"): ("Answers not certified: not calibrated for this Config "
                                                             "(retrieval: calibrated 'hybrid', now 'dense')")}
    for n, (config, footer) in enumerate(expected.items()):
        db = tmp_path / f"db{n}"
        shutil.copytree(sample_db, db)
        with running_server(EdgeRAG(db, config=config.with_(index_threads=1), calibration=own)) as url:
            context, page, errors = open_page(browser, url, "800x480", ready="#certificate:not(:empty)")
            assert page.inner_text("#certificate").startswith(footer)
            assert page.locator("#certificate *").count() == 0, "the file name became markup"
            # two lines at most on the small panel, the whole text kept for the tooltip (and /api/health)
            assert footer_lines(page) <= 2 and page.get_attribute("#certificate", "title").startswith(footer)
            if footer.startswith("Answers not certified"):  # its fix may be cut off: a tap shows all, another hides it
                page.locator("#certificate").tap()
                assert page.evaluate(HIDDEN_TEXT) == 0 and page.is_visible("#question")
                page.locator("#certificate").tap()
                assert footer_lines(page) <= 2
            footer_in_view(page)
            shot(page, f"800x480-footer-{n}")
            if footer.startswith("Answers certified"):  # read next to a certified answer, unscrolled
                last = page.locator("#suggestion-list button").last
                last.focus()  # as Tab does: the focused suggestion scrolls clear of the footer, not behind it
                box = last.bounding_box()
                assert box["y"] + box["height"] <= page.locator("#certificate").bounding_box()["y"], box
                page.evaluate("window.scrollTo(0, 0)")
                ask(page, LONG_ANSWER)
                footer_in_view(page)
                page.locator("#sources summary").first.tap()  # an open passage makes the answer taller still
                footer_in_view(page)
                shot(page, f"800x480-footer-{n}-answer")
                ask(page, OFF_TOPIC)
                assert page.inner_text("#badge") == "Not in the documents"  # nothing close to it was found
                footer_in_view(page)
                shot(page, f"800x480-footer-{n}-refusal")
                assert not small_text(page), small_text(page)
                # refused for want of confidence, not for want of text: the badge does not claim it is absent
                asked = page.locator("#suggestion-list button").all_text_contents() + [UNSURE_CANDIDATE]
                unsure = [q for q in asked if (httpx.post(f"{url}/api/ask", json={"question": q}, timeout=60).json()
                                               ["refusal_reason"] or "").startswith("not sure enough")]
                assert unsure, f"none of {asked} is refused as not sure on the sample corpus"
                ask(page, unsure[0])
                assert page.inner_text("#badge") == "Not sure" and page.inner_text("#answer") == "I don't know."
                # a multi-hop question: no answer to its kind is certified, and the visitor is told how to ask instead
                ask(page, MULTI_HOP)
                assert page.inner_text("#badge") == "Not sure"
                assert page.inner_text("#reason").startswith("This question links two facts")
                assert page.get_attribute("#reason", "data-detail").startswith("a multi-hop question")
            else:  # every question refused: in plain words, the technical reason kept for the operator
                ask(page, LONG_ANSWER)
                assert page.inner_text("#answer") == "I don't know." and page.inner_text("#badge") == "Not sure"
                assert page.inner_text("#reason").startswith("This kiosk is not set up to give answers")
                assert page.get_attribute("#reason", "data-detail").startswith("not calibrated for this Config")
                footer_in_view(page)
                shot(page, f"800x480-footer-{n}-refusal")
            assert not errors, errors
            context.close()


def test_the_certificate_cut_on_a_small_screen_is_shown_whole_by_key(browser, served):
    """"A tap shows all of it" had no keyboard equivalent: the footer was no control, Tab passed it by and Enter did
    nothing, so a keyboard user on the small panel never read the certificate's cut lines. Where it is cut it is a
    button now, with aria-expanded; where nothing is cut, Tab passes it by."""
    url, _ = served
    context, page, errors = open_page(browser, url, "320x256", ready="#certificate:not(:empty)")
    assert page.evaluate(HIDDEN_TEXT) > 0, "the summary fits in two lines at 320 px: nothing to show"
    for _ in range(20):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "certificate":
            break
    assert page.evaluate("document.activeElement.id") == "certificate"
    assert accessible(page, "#certificate")["role"]["value"] == "button"
    expanded = "#certificate[aria-expanded=%s]"
    assert page.is_visible(expanded % "false")
    page.keyboard.press("Enter")
    assert page.evaluate(HIDDEN_TEXT) == 0 and page.is_visible(expanded % "true")
    page.keyboard.press("Space")
    assert page.evaluate(HIDDEN_TEXT) > 0 and page.is_visible(expanded % "false") and footer_lines(page) <= 2
    context.close()
    context, page, errors2 = open_page(browser, url, "1920x1080", ready="#certificate:not(:empty)")
    assert page.evaluate(HIDDEN_TEXT) == 0 and page.is_disabled("#certificate")  # nothing to show: no control
    assert page.get_attribute("#certificate", "aria-expanded") is None  # nor "collapsed"
    page.emulate_media(forced_colors="active")  # and in the text's colour, not greyed as a control out of use
    color = "e => getComputedStyle(e).color"
    assert page.eval_on_selector("#certificate", color) == page.eval_on_selector("#question-label", color)
    assert not errors and not errors2, errors + errors2
    context.close()


def test_an_open_page_shows_the_certificate_and_suggestions_in_force(browser, sample_db, tmp_path):
    """The operator applies another certificate (what /admin's Apply does) while the kiosk page is open: the footer
    beside the next answer names it, and the next visitor's suggestions are the ones it answers. The page read
    /api/kiosk once, at its load: it went on claiming the old certificate, and suggesting questions now refused."""
    from edge_rag.config import Config
    from edge_rag.decision.certify import CALIBRATION_ASSET
    from edge_rag.pipeline import EdgeRAG

    own = tmp_path / "own.json"
    shutil.copy(CALIBRATION_ASSET, own)
    shutil.copytree(sample_db, tmp_path / "db")
    rag = EdgeRAG(tmp_path / "db", config=Config(temperature=0.0, index_threads=1))
    with running_server(rag) as url:
        context, page, errors = open_page(browser, url, "800x480")
        before = httpx.get(f"{url}/api/kiosk", timeout=60).json()
        rag.use_calibration(own, 0.2)
        after = httpx.get(f"{url}/api/kiosk", timeout=60).json()
        assert after["decision"] != before["decision"] and after["questions"] != before["questions"]
        summary, first = (json.dumps(x, ensure_ascii=False) for x in (after["decision"]["summary"],
                                                                       after["questions"][0]))
        ask(page, OFF_TOPIC)  # the footer is fetched again beside the answer (not before it: waited for)
        page.wait_for_selector(f"#certificate[title={summary}]", timeout=30_000)
        page.click("#reset")
        page.wait_for_selector(f"#suggestion-list button:text-is({first})", timeout=30_000)
        assert page.locator("#suggestion-list button").all_text_contents() == after["questions"]
        assert not errors, errors
        context.close()


def test_long_unbroken_words_never_widen_the_page(browser, sample_db, tmp_path):
    """A URL or a long compound in the page's title, a suggested document title, a question typed, an answer or its
    passage wraps inside the 800 px panel: a 300-letter question made the page 3,053 px wide, to be panned
    sideways on a touch screen (a 90-character URL, 1,118 px)."""
    from serving import TOKEN, WRITE, test_config, wait_job

    from edge_rag.pipeline import EdgeRAG
    from edge_rag.serve.config import ServeConfig

    url_text = "https://harbourlight.example/" + "booking" * 12
    compound = "Museumspädagogikabteilungsleitung" * 3
    shutil.copytree(sample_db, tmp_path / "db")
    config = ServeConfig(port=0, token=TOKEN, title=compound, question_timeout_s=900)
    with running_server(EdgeRAG(tmp_path / "db", config=test_config()), config) as url:
        doc = f"# {compound}\n\nTickets for the {compound} tour are booked at {url_text} only.\n".encode()
        sent = httpx.post(f"{url}/api/documents", files={"file": ("tour.md", doc)}, headers=WRITE, timeout=60)
        assert wait_job(url, sent)["state"] == "done"
        context, page, errors = open_page(browser, url, "800x480", ready="#certificate:not(:empty)")
        wide = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        assert page.inner_text("#title") == compound and page.evaluate(wide) <= 0
        for question in ("x" * 300, f"Where are tickets for the {compound} tour booked?"):
            ask(page, question)
            for summary in page.locator("#sources summary").all():
                summary.tap()
            assert page.evaluate(wide) <= 0, question
        assert url_text in page.inner_text("#result")  # the answer or its passage held the URL
        assert not errors, errors
        context.close()


def test_an_idle_reset_longer_than_a_browser_timer_never_resets_the_page(browser, sample_db, tmp_path):
    """``--idle-reset`` of 30 days (a kiosk that should never clear itself): past setTimeout's 24.8 days the timer
    fired at once, so every touch reset the page and no answer ever showed."""
    from edge_rag.config import Config
    from edge_rag.pipeline import EdgeRAG
    from edge_rag.serve.config import ServeConfig

    shutil.copytree(sample_db, tmp_path / "db")
    config = ServeConfig(port=0, idle_reset_s=30 * 86400)
    with running_server(EdgeRAG(tmp_path / "db", config=Config(temperature=0.0)), config) as url:
        context, page, errors = open_page(browser, url, "800x480")
        page.fill("#question", OFF_TOPIC)
        page.keyboard.press("Enter")
        page.wait_for_selector("#meta:not(:empty)", timeout=60_000)
        page.wait_for_timeout(500)  # a reset would follow the answer's last event at once
        assert page.is_visible("#result") and page.inner_text("#answer") == "I don't know."
        assert not errors, errors
        context.close()


def test_the_next_question_never_shows_the_last_answers_badge(browser, served):
    """While the next question is looked up, the badge of the answer before it is gone: the badge's
    ``display: inline-block`` overrode ``hidden``, so "Written by the on-device model" stayed over "Looking it up…"
    (and over a refusal's wait, or an error) until the next route arrived, and a screen reader read it too."""
    url, questions = served
    context, page, errors = open_page(browser, url, "800x480")
    ask(page, questions[0])
    assert page.is_visible("#badge")
    page.route("**/api/ask/stream*", lambda route: None)  # the next question is still being looked up
    page.fill("#question", OFF_TOPIC)
    page.keyboard.press("Enter")
    page.wait_for_selector("#status:text-is('Looking it up…')")
    assert page.is_hidden("#badge"), page.inner_text("#result")
    assert not errors, errors
    context.close()



def test_an_empty_store_and_a_failed_question_are_told_in_plain_words(browser, sample_db, tmp_path):
    """A kiosk with no documents yet said "Not sure" and showed the pipeline's reason ("nothing to answer from: no
    documents are indexed"); a question that timed out kept the badge "Written by the on-device model" over no
    answer and showed the server's message ("no answer within 1 s"). The server's words are kept for the operator."""
    from serving import gpt_questions, test_config

    from edge_rag.config import Config
    from edge_rag.pipeline import EdgeRAG
    from edge_rag.serve.config import ServeConfig

    with running_server(EdgeRAG(tmp_path / "empty", config=Config(temperature=0.0, index_threads=1))) as url:
        context, page, errors = open_page(browser, url, "800x480", ready="#certificate:not(:empty)")
        ask(page, LONG_ANSWER)
        assert page.inner_text("#badge") == "Not in the documents" and page.inner_text("#answer") == "I don't know."
        assert page.inner_text("#reason") == "There are no documents on this kiosk yet, so I cannot answer."
        assert page.get_attribute("#reason", "data-detail").startswith("nothing to answer from")
        assert not errors, errors
        context.close()
    shutil.copytree(sample_db, tmp_path / "db")
    rag = EdgeRAG(tmp_path / "db", config=test_config())
    with running_server(rag, ServeConfig(port=0, question_timeout_s=0.01)) as url:  # no generation is that fast
        context, page, errors = open_page(browser, url, "800x480")
        page.fill("#question", gpt_questions(rag, 1)[0])
        page.keyboard.press("Enter")
        page.wait_for_selector("#reason:not([hidden])", timeout=60_000)
        assert page.inner_text("#answer") == "Sorry, that did not work." and page.is_hidden("#badge")
        assert page.inner_text("#reason") == "That took too long to answer here. Please try again in a moment."
        assert page.get_attribute("#reason", "data-detail").startswith(("no answer within", "timed out after"))
        shot(page, "800x480-timeout")
        assert not errors, errors
        context.close()


def test_a_server_that_stops_answering_mid_question_is_told(browser, sample_db, tmp_path):
    """A server stopped mid-question (SIGSTOP of `edge-rag serve`; a frozen box or a cut cable alike: no error, no
    event) left "Looking it up…" for 70 s, then "Still there?", and at 90 s the page cleared the question without a
    word. The page waits as long as the server's own timeout allows, then says it took too long."""
    from edge_rag.config import Config
    from edge_rag.pipeline import EdgeRAG
    from edge_rag.serve.config import ServeConfig

    shutil.copytree(sample_db, tmp_path / "db")
    rag = EdgeRAG(tmp_path / "db", config=Config(temperature=0.0, index_threads=1))
    with running_server(rag, ServeConfig(port=0, question_timeout_s=2)) as url:
        timeout_ms = httpx.get(f"{url}/api/kiosk", timeout=60).json()["question_timeout_s"] * 1000
        context, page, errors = open_page(browser, url, "800x480")
        page.route("**/api/ask/stream*", lambda route: None)  # taken, and nothing more said
        page.clock.install()
        page.fill("#question", LONG_ANSWER)
        page.keyboard.press("Enter")
        page.clock.run_for(timeout_ms)
        assert page.inner_text("#status") == "Looking it up…"  # within the server's own time, the page waits
        page.clock.run_for(10_000)
        assert page.inner_text("#reason") == "That took too long to answer here. Please try again in a moment."
        assert page.inner_text("#status") == "" and page.is_hidden("#idle")
        assert not errors, errors
        context.close()


def test_a_refusal_reads_plain_words_never_the_pipelines(browser, served):
    """A refusal's technical reason ("out of domain: nearest passage at squared distance 1.577 > 1.226 …") was the
    reason's title: a tooltip, and its accessible description, so a screen reader read it to the visitor after the
    plain sentence; a reason the page had no sentence for (an own calibration's "the calibration records no Config
    …: calibrate again …") was shown as it came. The visitor gets plain words; data-detail keeps the reason."""
    from edge_rag.config import Config
    from edge_rag.decision.calibrated_config import config_change

    url, _ = served
    context, page, errors = open_page(browser, url, "800x480")
    ask(page, OFF_TOPIC)
    assert described(page, "#reason") == "" and page.get_attribute("#reason", "title") is None
    assert page.get_attribute("#reason", "data-detail").startswith("out of domain")
    unplain = config_change({}, Config())  # what the server sends with an own calibration that records no Config
    answer = {"answer": None, "route": "REFUSE", "refusal_reason": unplain, "cache_hit": False, "sources": []}
    page.route("**/api/ask/stream*", lambda route: route.fulfill(
        status=200, content_type="text/event-stream", body=f"event: answer\ndata: {json.dumps(answer)}\n\n"))
    ask(page, LONG_ANSWER)
    assert page.get_attribute("#reason", "data-detail") == unplain and described(page, "#reason") == ""
    assert "calibrat" not in page.inner_text("#result").lower(), page.inner_text("#result")
    assert not errors, errors
    context.close()


def test_right_to_left_questions_answers_and_passages_read_right_to_left(browser, served):
    """An Arabic or Hebrew question, answer, document title or passage is laid out right to left, its question mark
    or full stop at its end (the left): in the left-to-right page "متى يفتح المتحف?" showed its "?" at the right,
    before the question as an Arabic reader reads it, in the question box, after "You asked:" and in an answer."""
    url, _ = served
    answer = {"answer": "يفتح المتحف في الساعة التاسعة.", "route": "RAG", "cache_hit": False,
              "sources": [{"title": "אגף הילדים", "text": "האגף פתוח בימי ראשון."},
                          {"title": "Opening hours", "text": "The museum opens at nine o'clock."}]}
    context, page, errors = open_page(browser, url, "800x480")
    # the sample corpus is English: the answer and its passages are the stream's, as the server would send them
    page.route("**/api/ask/stream*", lambda route: route.fulfill(
        status=200, content_type="text/event-stream", body=f"event: answer\ndata: {json.dumps(answer)}\n\n"))
    ask(page, "متى يفتح المتحف?")
    assert page.inner_text("#answer") == answer["answer"]
    direction = "() => [...document.querySelectorAll(%r)].map(e => getComputedStyle(e).direction)"
    assert page.evaluate(direction % "#question, #asked, #answer") == ["rtl"] * 3
    for passage in ("#sources summary", "#sources p"):  # the Hebrew title and passage; the English ones stay
        assert page.evaluate(direction % passage) == ["rtl", "ltr"], passage
    shot(page, "800x480-rtl")

    def suggest(route):  # an operator's suggestions in Arabic and English, read again at the next question
        route.fulfill(json={**route.fetch().json(), "questions": ["متى يفتح المتحف?", "When does it open?"]})
    page.route("**/api/kiosk*", suggest)
    ask(page, "When does it open?")
    page.wait_for_function("document.querySelectorAll('#suggestion-list button').length == 2")
    assert page.evaluate(direction % "#suggestion-list button") == ["rtl", "ltr"]
    assert not errors, errors
    context.close()


def test_a_question_of_spaces_is_asked_for_again(browser, served):
    """Ask with nothing but spaces in the box did nothing at all (the box's "required" takes spaces for a question,
    the page then dropped it); the box now tells the visitor to fill it, as it does when empty, and nothing is sent."""
    url, _ = served
    context, page, errors = open_page(browser, url, "800x480")
    sent = []
    page.on("request", lambda request: sent.append(request.url) if "/api/ask" in request.url else None)
    for submit in (lambda: page.keyboard.press("Enter"), lambda: page.click("#ask")):
        page.fill("#question", "   ")
        submit()
        assert page.evaluate("document.querySelector('#question').validationMessage")  # "Please fill out this field."
        assert page.evaluate("document.activeElement.id") == "question" and page.is_hidden("#result")
    assert not sent and not errors, (sent, errors)
    context.close()


def test_a_question_the_page_cannot_send_is_told_and_ask_works_again(browser, served):
    """A question holding a lone UTF-16 surrogate (a broken paste, set by a script) threw in encodeURIComponent:
    the page showed "Looking it up…" until it cleared itself. It now says so, sends nothing, and the next question
    is asked and answered."""
    url, questions = served
    context, page, errors = open_page(browser, url, "800x480")
    sent = []
    page.on("request", lambda request: sent.append(request.url) if "/api/ask" in request.url else None)
    page.evaluate("document.querySelector('#question').value = 'When \\ud800 open?'")
    page.click("#ask")
    page.wait_for_selector("#reason:not([hidden])", timeout=10_000)
    assert page.inner_text("#answer") == "Sorry, that did not work." and page.is_hidden("#badge")
    assert "cannot read" in page.inner_text("#reason") and page.inner_text("#status") == ""
    assert not sent and not errors, (sent, errors)
    ask(page, questions[0])
    assert page.is_visible("#badge") and not errors, errors
    context.close()


def test_a_question_of_control_characters_is_told_it_could_not_be_read(browser, served):
    """A question of control characters alone (a NUL, a bell "\\u0007", set by a paste or a script) is refused by the
    server with HTTP 400 ("the question is empty"), which an event stream cannot read: the page said "The connection
    to this kiosk was lost", which was false. It now says the question could not be read, sends nothing (the server
    would refuse it), and Ask works again."""
    url, questions = served
    context, page, errors = open_page(browser, url, "800x480")
    sent = []
    page.on("request", lambda request: sent.append(request.url) if "/api/ask" in request.url else None)
    for typed in ("\\u0000", "\\u0007 \\u001b\\u009f"):
        page.evaluate(f"document.querySelector('#question').value = '{typed}'")
        page.click("#ask")
        page.wait_for_selector("#reason:not([hidden])", timeout=10_000)
        assert page.inner_text("#answer") == "Sorry, that did not work." and page.is_hidden("#badge")
        assert "cannot read" in page.inner_text("#reason") and "connection" not in page.inner_text("#reason")
        assert page.inner_text("#status") == ""
    assert not sent, sent
    ask(page, questions[0])
    assert page.is_visible("#badge") and not errors, errors
    context.close()


def test_a_long_pasted_question_is_told_never_cut(browser, served):
    """A pasted question over the server's 500 characters was cut to 500 without a word (maxlength), and maxlength
    counts UTF-16 units where the server counts characters: 300 emoji were cut to 250. Nothing is cut now, the visitor
    is told and nothing is sent, and the page counts as the server does."""
    url, _ = served
    limit = httpx.get(f"{url}/api/kiosk", timeout=60).json()["max_question_chars"]
    context, page, errors = open_page(browser, url, "800x480")
    sent = []
    page.on("request", lambda request: sent.append(request.url) if "/api/ask" in request.url else None)
    assert not accessible(page, "#too-long").get("ignored")  # a live region before it speaks: NVDA reads none new
    page.focus("#question")
    page.keyboard.insert_text("a" * (limit + 1))  # as a paste inserts it
    assert len(page.input_value("#question")) == limit + 1
    assert page.is_visible("#too-long") and f"{limit} characters" in page.inner_text("#too-long")
    page.keyboard.press("Enter")
    assert page.evaluate("document.querySelector('#question').validationMessage") == page.inner_text("#too-long")
    assert not sent and page.is_hidden("#result")
    page.keyboard.press("Backspace")
    assert page.is_hidden("#too-long")
    page.fill("#question", "")
    emoji = "\N{GRINNING FACE}" * limit  # as many characters as the server takes, twice as many UTF-16 units
    page.keyboard.insert_text(emoji)
    assert page.input_value("#question") == emoji and page.is_hidden("#too-long")
    with page.expect_response("**/api/ask/stream*") as response:
        page.keyboard.press("Enter")
    assert response.value.status == 200, response.value.text()  # not 413: the server takes it too
    assert not errors, errors
    context.close()


# What a screen reader is sent, modelled in the page: each batch of changes (one task's) inside a live region, as the
# text added, or the whole region when it is aria-atomic; aria-busy is not counted on (screen readers differ on it).
LISTEN = """() => { window.said = [];
    new MutationObserver((records) => { const batch = new Map();
      for (const r of records) {
        const node = r.target.nodeType === 1 ? r.target : r.target.parentElement;
        const live = node.closest('[aria-live]:not([aria-live=off]), [role=status], [role=alert], [role=log]');
        const text = r.type === 'characterData' ? r.target.textContent : [...r.addedNodes].map(n => n.textContent).join(' ');
        if (!live || live.closest('[hidden]') || !text.trim()) continue;
        batch.set(live, live.getAttribute('aria-atomic') === 'true' ? live.textContent : text);
      }
      window.said.push(...batch.values());
    }).observe(document.body, {childList: true, characterData: true, subtree: true}); }"""


def test_a_streamed_answer_is_read_out_once_whole(browser, served):
    """The answer streamed into #result, the page's live region, marked aria-busy meanwhile: a screen reader that does
    not wait for aria-busy read each streamed sentence and then the whole answer again ("First." then "First. Second."
    with the badge), and "Thinking…" twice (at the route and at the queue). Each is read once now."""
    url, _ = served
    first, second = "The dome seats ninety.", " Shows run hourly."
    events = [("route", {"route": "GPT", "cache_hit": False}), ("queue", {"position": 0}),
              ("token", {"text": first}), ("token", {"text": second}),
              ("answer", {"answer": first + second, "route": "GPT", "cache_hit": False, "sources": []})]
    context, page, errors = open_page(browser, url, "800x480")
    page.route("**/api/ask/stream*", lambda route: route.fulfill(status=200, content_type="text/event-stream", body="".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)))
    page.evaluate(LISTEN)
    ask(page, "Tell me about the planetarium")
    said = page.evaluate("window.said")
    assert [s for s in said if first in s] == ["Written by the on-device model: " + first + second], said
    assert len(said) == len(set(said)), said
    assert not errors, errors
    context.close()


# The ids of the page's live regions (an alert is read as it appears; these, only as their text changes).
LIVE = """() => [...document.querySelectorAll('[aria-live]:not([aria-live=off]), [role=status], [role=log]')]
    .map(e => e.id)"""
# What LISTEN records, each with the id of the live region that sends it.
SPEAKERS = LISTEN.replace("live.getAttribute('aria-atomic') === 'true' ? live.textContent : text",
                          "[live.id, live.getAttribute('aria-atomic') === 'true' ? live.textContent : text]")


def test_each_status_is_said_by_a_live_region_there_before_it(browser, served):
    """"Looking it up…" was written into #status as the answer's card was shown: a live region made with its text in
    it, which NVDA does not read (Chromium's accessibility tree had no #status, nor #said, until then). The page's
    live regions are in the tree from its load, at each question and after Start over, and say each status."""
    url, _ = served
    context, page, errors = open_page(browser, url, "800x480")
    page.evaluate(SPEAKERS)
    live = page.evaluate(LIVE)
    for _ in range(2):  # the page as loaded, then after Start over
        assert not [i for i in live if accessible(page, f"#{i}").get("ignored")], live
        ask(page, OFF_TOPIC)
        said = page.evaluate("window.said")
        assert "Looking it up…" in [text for _, text in said] and said[-1][1].startswith("Not in the documents"), said
        assert {region for region, _ in said} <= set(live), said
        page.click("#reset")
        page.evaluate("window.said = []")
    assert not errors, errors
    context.close()


def test_enter_that_confirms_a_composition_never_asks(browser, served):
    """Japanese input: Enter confirms the characters being composed ("とうきょう" before it becomes 東京), and the page took
    it as Ask, sending the half-typed question; it asks at the next Enter now."""
    url, _ = served
    context, page, errors = open_page(browser, url, "800x480")
    sent = []
    page.on("request", lambda request: sent.append(request.url) if "/api/ask" in request.url else None)
    page.route("**/api/ask/stream*", lambda route: None)  # only whether it is asked matters here
    ime = context.new_cdp_session(page)
    page.focus("#question")
    ime.send("Input.imeSetComposition", {"text": "とうきょう", "selectionStart": 5, "selectionEnd": 5})
    page.keyboard.press("Enter")
    ime.send("Input.insertText", {"text": "東京"})  # the composition confirmed
    assert not sent and page.is_hidden("#result"), sent
    assert page.input_value("#question") == "東京"
    with page.expect_request("**/api/ask/stream*"):
        page.keyboard.press("Enter")
    assert not errors, errors
    context.close()


def contrast(a: str, b: str) -> float:
    """The WCAG contrast ratio of two CSS rgb() colours."""
    def luminance(colour: str) -> float:
        srgb = [float(v) / 255 for v in re.findall(r"[\d.]+", colour)[:3]]
        r, g, b = (v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in srgb)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


# The focused element's id or text, the colours of its focus rings (outline, box-shadow) and the colour behind it.
FOCUS_RINGS = """() => { const e = document.activeElement, s = getComputedStyle(e);
    let behind = 'rgb(255, 255, 255)';
    for (let p = e.parentElement; p; p = p.parentElement) {
      const c = getComputedStyle(p).backgroundColor; if (c !== 'rgba(0, 0, 0, 0)') { behind = c; break; } }
    const rings = (s.outlineStyle === 'none' ? [] : [s.outlineColor]).concat(s.boxShadow.match(/rgba?\\([^)]*\\)/g) || []);
    return [e.id || e.textContent.slice(0, 30), rings, behind]; }"""


def test_focus_is_seen_on_every_control_a_key_reaches(browser, served):
    """The focus ring was amber (#ffbf00) alone: 1.5:1 on the page's paper and 1.7:1 on the answer's white card, where
    a focus indicator needs 3:1 against what it replaces. Each control Tab reaches, a passage's title included, now
    has a ring of 3:1 or more."""
    url, _ = served
    answer = {"answer": "At nine.", "route": "RAG", "cache_hit": False,
              "sources": [{"title": "Opening hours", "text": "The museum opens at nine."}]}
    context, page, errors = open_page(browser, url, "800x480")
    page.route("**/api/ask/stream*", lambda route: route.fulfill(
        status=200, content_type="text/event-stream", body=f"event: answer\ndata: {json.dumps(answer)}\n\n"))
    reached = []
    for _ in range(2):  # the start page, then an answer with its passage
        page.keyboard.press("Tab")
        while page.evaluate("document.activeElement !== document.body"):  # past the last control: the body
            name, rings, behind = page.evaluate(FOCUS_RINGS)
            assert max((contrast(ring, behind) for ring in rings), default=0) >= 3, (name, rings, behind)
            reached.append(name)
            page.keyboard.press("Tab")
        ask(page, "When does the museum open?")
        page.evaluate("document.activeElement.blur()")
    assert {"question", "ask", "Opening hours"} <= set(reached), reached
    assert not errors, errors
    context.close()


# Words of the page's own controls, label and headings that a line break cuts in two.
BROKEN_WORDS = """() => [...document.querySelectorAll('#reset, #ask, #question-label, h1, h2')]
    .filter(e => e.getClientRects().length && e.firstChild && e.firstChild.nodeType === 3).flatMap(e => {
      const t = e.firstChild;
      return [...t.textContent.matchAll(/\\S+/g)].filter(m => { const r = document.createRange();
        r.setStart(t, m.index); r.setEnd(t, m.index + m[0].length);
        return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size > 1; }).map(m => m[0]); })"""


def test_the_page_at_400_percent_zoom_breaks_no_word_of_its_own(browser, served):
    """At 400% zoom (1280x1024 seen as 320x256) "Start over" was squeezed to "Star / t / over": the page lets any
    word break (a long URL must not widen it), and the header's flex box shrank the button to one letter's width."""
    url, _ = served
    context, page, errors = open_page(browser, url, "320x256")
    assert page.evaluate(BROKEN_WORDS) == []
    assert page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth") <= 0
    shot(page, "320x256-start")
    assert not errors, errors
    context.close()


def test_the_generated_answers_badge_stays_on_a_320_px_screen(browser, served):
    """At 400% zoom (320 px wide) the badge "Written by the on-device model", kept on one line, ran 67 px out of the
    answer's card and the page panned sideways by 51 px (a real generated answer). It wraps where it must now."""
    url, _ = served
    answer = {"answer": "Big Mary is a steam engine.", "route": "GPT", "cache_hit": False, "sources": []}
    context, page, errors = open_page(browser, url, "320x256")
    page.route("**/api/ask/stream*", lambda route: route.fulfill(
        status=200, content_type="text/event-stream", body=f"event: answer\ndata: {json.dumps(answer)}\n\n"))
    ask(page, "Tell me about Big Mary")
    badge, card = page.locator("#badge").bounding_box(), page.locator("#result").bounding_box()
    assert badge["x"] + badge["width"] <= card["x"] + card["width"], (badge, card)
    assert page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth") <= 0
    assert not errors, errors
    context.close()


def test_a_double_tap_on_ask_asks_once(browser, served):
    """Ask tapped twice (0.4 s apart, a real server with --question-log) asked the same question twice: the first
    stream dropped, its generation begun again, and the question logged twice, two askings for calibrate. A second
    tap while it is looked up does nothing now; another question is still asked at once."""
    url, _ = served
    context, page, errors = open_page(browser, url, "800x480")
    sent = []
    page.on("request", lambda request: sent.append(request.url) if "/api/ask" in request.url else None)
    page.route("**/api/ask/stream*", lambda route: None)  # still being looked up
    page.fill("#question", LONG_ANSWER)
    with page.expect_request("**/api/ask/stream*"):
        page.tap("#ask")
    page.tap("#ask")
    page.fill("#question", OFF_TOPIC)
    with page.expect_request("**/api/ask/stream*bread*"):  # requests are sent in order: a second ask came before
        page.keyboard.press("Enter")
    assert [parse_qs(urlsplit(u).query)["q"] for u in sent] == [[LONG_ANSWER], [OFF_TOPIC]], sent
    assert not errors, errors
    context.close()


def test_a_question_typed_before_the_script_runs_is_kept_and_asked(browser, served):
    """Enter in the box while kiosk.js was still on its way (a kiosk starting slowly) sent the form itself: the page
    reloaded at /?q=When+does…, the question gone from the box, nothing asked, and the question left in the browser's
    history for the next visitor. It stays in the box now and is asked once the script runs."""
    url, _ = served
    context = browser.new_context(viewport={"width": 800, "height": 480})
    page = context.new_page()
    held = []
    page.route("**/static/kiosk.js", lambda route: held.append(route))  # answered later
    page.goto(url, wait_until="commit")
    page.fill("#question", LONG_ANSWER)
    page.keyboard.press("Enter")
    page.click("#ask", force=True)  # a tap on Ask too
    assert held and page.url.rstrip("/") == url and page.input_value("#question") == LONG_ANSWER, page.url
    held[0].continue_()
    page.wait_for_selector("#suggestion-list button")
    with page.expect_request("**/api/ask/stream*") as asked:
        page.press("#question", "Enter")
    assert parse_qs(urlsplit(asked.value.url).query)["q"] == [LONG_ANSWER]
    context.close()


def test_a_suggestion_chosen_by_key_leaves_the_focus_on_the_page(browser, served):
    """A suggestion chosen with Tab and Enter hid the list it was in, and the focus with it: it fell to the page's
    body, where a screen reader loses its place. It goes to the question box now (a tap leaves it, so the on-screen
    keyboard does not cover the answer)."""
    url, _ = served
    context, page, errors = open_page(browser, url, "800x480")
    page.route("**/api/ask/stream*", lambda route: None)  # only where the focus goes matters here
    page.locator("#suggestion-list button").first.tap()
    assert page.is_visible("#result") and page.evaluate("document.activeElement.id") != "question"
    page.click("#reset")
    page.locator("#suggestion-list button").first.focus()
    # Start over fetches the kiosk's settings again; the suggestions it brings, the same, left the focused one
    # replaced under the key user's focus (a race that a busy box lost: Enter then asked nothing)
    page.evaluate("loadKiosk()")
    assert page.evaluate("document.activeElement.closest('#suggestion-list') !== null")
    page.keyboard.press("Enter")
    assert page.is_visible("#result") and page.evaluate("document.activeElement.id") == "question"
    assert not errors, errors
    context.close()


def test_the_page_warns_before_it_clears_and_a_touch_keeps_it(browser, served):
    """The page cleared itself 90 s after the last touch or key with no warning: a visitor reading a long answer
    slowly, or with a screen reader (whose reading keys never reach the page), lost it mid-sentence. A warning comes
    20 s before, only when there is something of the visitor's to clear; its button, a touch or a key keeps the page."""
    url, _ = served
    idle = httpx.get(f"{url}/api/kiosk", timeout=60).json()["idle_reset_s"] * 1000
    answer = {"answer": "At nine.", "route": "RAG", "cache_hit": False, "sources": []}
    context, page, errors = open_page(browser, url, "800x480")
    page.route("**/api/ask/stream*", lambda route: route.fulfill(
        status=200, content_type="text/event-stream", body=f"event: answer\ndata: {json.dumps(answer)}\n\n"))
    page.clock.install()  # the page's timers from here on run when the test says
    page.keyboard.press("Shift")  # a visitor's key: the timers start again, on this clock
    page.clock.run_for(idle - 15_000)
    assert page.is_hidden("#idle"), "warned with nothing to clear"
    ask(page, "When does the museum open?")
    page.clock.run_for(idle - 15_000)
    assert page.is_visible("#idle") and "20 seconds" in page.inner_text("#idle") and page.is_visible("#result")
    page.click("#stay")
    assert page.is_hidden("#idle")
    page.clock.run_for(idle - 5_000)
    assert page.is_visible("#result")  # kept
    page.clock.run_for(10_000)
    assert page.is_hidden("#result") and page.is_hidden("#idle")  # cleared for the next visitor
    assert not errors, errors
    context.close()


def test_a_browser_that_keeps_no_site_data_can_ask(browser, served, tmp_path):
    """A kiosk's browser locked down to keep no site data (Chromium's cookies setting 'block': sessionStorage itself
    throws) stopped kiosk.js at its first line ("Failed to read the 'sessionStorage' property"): Ask stayed disabled,
    no suggestions, nothing could be asked. The page runs now."""
    from browsing import CHROMIUM, CHROMIUM_ARGS

    url, _ = served
    profile = tmp_path / "profile"
    (profile / "Default").mkdir(parents=True)
    (profile / "Default" / "Preferences").write_text(
        json.dumps({"profile": {"default_content_setting_values": {"cookies": 2}}}))
    context = browser.browser_type.launch_persistent_context(str(profile), executable_path=CHROMIUM,
                                                             args=CHROMIUM_ARGS, headless=True,
                                                             viewport={"width": 800, "height": 480})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(url)
        page.wait_for_selector("#suggestion-list button")
        ask(page, "When does the museum open?")
        assert not errors, errors
    finally:
        context.close()


def test_a_question_still_waited_for_is_never_cleared_as_idle(browser, served):
    """`--timeout` past `--idle-reset` less its 20 s warning (the test server's 900 s against 90 s): a visitor waiting
    for an answer was asked "Still there?" and, at 90 s, the page cleared the question it was still waiting for. The
    page counts no idle time while a question is in flight; from its answer or failure on it counts again."""
    url, _ = served
    kiosk = httpx.get(f"{url}/api/kiosk", timeout=60).json()
    idle, timeout = kiosk["idle_reset_s"] * 1000, kiosk["question_timeout_s"] * 1000
    assert timeout > idle, kiosk  # the combination this is about
    held: list = []
    context, page, errors = open_page(browser, url, "800x480")
    page.route("**/api/ask/stream*", lambda route: held.append(route))  # still being looked up
    page.clock.install()
    page.fill("#question", LONG_ANSWER)
    page.keyboard.press("Enter")
    page.clock.run_for(idle + 5_000)
    assert page.is_hidden("#idle") and page.inner_text("#status") == "Looking it up…"
    answer = {"answer": "At nine.", "route": "RAG", "cache_hit": False, "sources": []}
    held[0].fulfill(status=200, content_type="text/event-stream", body=f"event: answer\ndata: {json.dumps(answer)}\n\n")
    page.wait_for_selector("#meta:not(:empty)")
    page.clock.run_for(idle - 15_000)
    assert page.is_visible("#idle") and page.is_visible("#result")  # the answer read, then idle: warned as ever
    page.clock.run_for(20_000)
    assert page.is_hidden("#result")
    page.fill("#question", LONG_ANSWER)
    page.keyboard.press("Enter")
    page.clock.run_for(timeout + 5_000)  # no answer: the page says so, and gives the visitor time to read it
    assert page.inner_text("#reason") == "That took too long to answer here. Please try again in a moment."
    page.clock.run_for(idle - 25_000)
    assert page.is_hidden("#idle") and page.is_visible("#result")
    assert not errors, errors
    context.close()



def test_the_certificate_closed_on_a_grown_screen_keeps_the_focus(browser, served):
    """Opened on a small screen, then the screen grew (a tablet turned) until its text fits in two lines: the press
    that closed it disabled the button under the key user's focus, which fell to the page's body."""
    url, _ = served
    context, page, errors = open_page(browser, url, "320x256", ready="#certificate:not(:empty)")
    page.focus("#certificate")
    page.keyboard.press("Enter")
    assert page.is_visible("#certificate[aria-expanded=true]")
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.keyboard.press("Enter")
    page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")  # focus fixup: a frame
    assert page.evaluate("document.activeElement.id") == "certificate"
    assert page.evaluate(HIDDEN_TEXT) == 0 and page.is_visible("#certificate[aria-expanded=false]")
    page.keyboard.press("Tab")  # gone from it, nothing to show: no control any more
    assert page.is_disabled("#certificate") and page.get_attribute("#certificate", "aria-expanded") is None
    assert not errors, errors
    context.close()
