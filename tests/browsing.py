"""Headless Chromium (Debian's ``chromium``, driven by Playwright) for the page tests (the ``browser`` fixture is in
conftest.py): opening a page that records script errors and what its Content-Security-Policy blocked, asking on
the kiosk page, and screenshots in tests/.artifacts/ (git-ignored) for a person to look at."""
from __future__ import annotations

import shutil
from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parent / ".artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Offline and quiet: no sandbox (root in CI), no GPU, no background fetches, never a downloaded browser.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SIZES = {"800x480": (800, 480), "1920x1080": (1920, 1080), "320x256": (320, 256)}  # the last: 1280x1024 at 400%
WAIT_MS = 900_000


def open_page(browser, url: str, size: str, ready: str = "#suggestion-list button"):
    width, height = SIZES[size]
    context = browser.new_context(viewport={"width": width, "height": height}, has_touch=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # what the page's Content-Security-Policy blocked (Chromium reports it on the console) is an error too
    page.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    page.goto(url)
    page.wait_for_selector(ready)
    return context, page, errors


def ask(page, question: str) -> None:
    """Ask through the page and wait until it shows an answer, a refusal or an error."""
    page.fill("#question", question)
    page.keyboard.press("Enter")
    # selectors, not wait_for_function: the page's Content-Security-Policy forbids the eval that one needs
    page.wait_for_selector("#meta:not(:empty), #reason:not([hidden]), #answer:text-matches('^Sorry')",
                           state="attached", timeout=WAIT_MS)
    assert not page.inner_text("#answer").startswith("Sorry"), page.inner_text("#result")


def shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def accessible(page, selector: str) -> dict:
    """Chromium's accessibility node for ``selector``'s element: what a screen reader is given ("ignored": nothing)."""
    cdp = page.context.new_cdp_session(page)
    root = cdp.send("DOM.getDocument")["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    ax = cdp.send("Accessibility.getPartialAXTree", {"nodeId": node, "fetchRelatives": False})["nodes"][0]
    cdp.detach()
    return ax


def described(page, selector: str) -> str:
    """The accessible description of ``selector``'s element: what a screen reader reads after its text."""
    return (accessible(page, selector).get("description") or {}).get("value", "")
