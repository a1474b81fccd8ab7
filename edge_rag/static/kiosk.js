// Kiosk page: ask over Server-Sent Events (/api/ask/stream), show the route, streamed text, the answer,
// its sources, or "I don't know" with the reason. Clears itself after a while without a touch.
"use strict";

const $ = (id) => document.getElementById(id);
const BADGE = { RAG: "From the documents", GPT: "Written by the on-device model", REFUSE: "Not in the documents",
                UNSURE: "Not sure" };
let stream = null;
let idleTimer = null, warnTimer = null, waitTimer = null;
let waitMs = 65000;  // the server's question_timeout_s and 5 s, read from /api/kiosk
const WARN_MS = 20000;  // the visitor is told this long before the page clears (WCAG 2.2.1: at least 20 s)
let idleMs = 90000;
let maxChars = 500;  // the server's max_question_chars, read from /api/kiosk

function text(el, value) { el.textContent = value == null ? "" : String(value); }

function plainReason(reason) {
  // The pipeline's reasons are precise but technical; lead with a sentence a visitor understands.
  if (!reason) return "I could not find an answer in the documents here.";
  if (reason.startsWith("nothing to answer from")) return "There are no documents on this kiosk yet, so I cannot answer.";
  if (reason.startsWith("out of domain")) return "That does not seem to be covered by the documents here.";
  if (reason.startsWith("insufficient evidence")) return "The documents here do not say enough about that to answer.";
  if (reason.startsWith("no confident")) return "I found related text, but not a clear answer.";
  if (reason.startsWith("not sure enough")) return "I found related text, but I am not sure enough of an answer to give one.";
  if (reason.startsWith("the reader found no answer")) return "I found related text, but no answer to that in it.";
  if (reason.startsWith("not calibrated")) return "This kiosk is not set up to give answers it can vouch for yet, so it gives none.";
  if (reason.startsWith("the generated answer was cut off")) return "The answer I began was too long to finish here, so I give none rather than half of one.";
  if (reason.startsWith("the generator gave no answer")) return "I found related text, but could not put an answer to that into words.";
  if (reason.startsWith("no score threshold")) return "No answer here can be given within this kiosk's error limit.";
  if (reason.startsWith("a multi-hop question")) return "This question links two facts, and I answer only what one passage says. Try asking each part on its own.";
  return "I cannot give an answer to that here that I can vouch for.";  // never the operator's words ("calibrate again …")
}

function refusalBadge(reason) {
  // "Not in the documents" only when nothing close to the question was found; the other refusals are for want of
  // confidence in an answer the documents may well hold, and saying "not in the documents" there would mislead.
  const absent = ["out of domain", "insufficient evidence", "nothing to answer from"];
  return !reason || absent.some((a) => reason.startsWith(a)) ? "REFUSE" : "UNSURE";
}

function plainFailure(status) {
  // The server's message ("no answer within 60 s", "generation failed: RuntimeError: …") is the operator's; the
  // visitor is told what happened and what to do, the message kept for the operator (see showDetail).
  if (status === 503) return "This kiosk is busy or restarting. Please ask again in a moment.";
  if (status === 504) return "That took too long to answer here. Please try again in a moment.";
  return "Something went wrong on this kiosk. Please try again.";
}

function showDetail(detail) {
  // The pipeline's or server's own words ("out of domain: … squared distance 1.577 > 1.226") are for the operator,
  // in the developer tools: as a title they were a tooltip and the reason's accessible description, read aloud.
  $("reason").dataset.detail = detail || "";
}

function clearResult() {
  if (stream) { stream.close(); stream = null; }
  clearTimeout(waitTimer);
  $("result").hidden = true;
  for (const id of ["asked", "status", "answer", "reason", "meta", "said"]) text($(id), "");
  for (const id of ["badge", "reason", "sources-block"]) $(id).hidden = true;
  $("sources").replaceChildren();
}

function foldable() {  // the certificate is a control only where it cuts its text, or shows it all on a press
  const c = $("certificate"), open = c.classList.contains("open");
  c.disabled = !open && c.scrollHeight <= c.clientHeight && c !== document.activeElement;  // focus never falls away
  if (c.disabled) c.removeAttribute("aria-expanded"); else c.setAttribute("aria-expanded", open);
}

function tooLong() {
  // Counted as the server counts (characters of the trimmed question) and told, never cut: maxlength cut a paste
  // silently, and counted UTF-16 units, so 300 emoji were cut to 250 where the server takes 500.
  const over = [...$("question").value.trim()].length > maxChars;
  const message = over ? `Please shorten your question: this kiosk takes up to ${maxChars} characters.` : "";
  if ($("too-long").textContent !== message) text($("too-long"), message);  // read out once, as it appears
  $("question").setCustomValidity(message);
  return over;
}

function resetPage() {
  clearResult();
  $("idle").hidden = true;
  $("question").value = "";
  tooLong();
  $("suggestions").hidden = false;
  loadKiosk();  // the next visitor sees the certificate and the suggestions in force now, not those of the page's load
}

function touched() {
  // The page cleared itself with no warning: a visitor reading a long answer with a screen reader (whose reading
  // keys never reach the page) or slowly lost it mid-sentence. A warning comes first now, when there is something
  // of the visitor's to clear; any touch or key, or its button, keeps the page.
  clearTimeout(idleTimer); clearTimeout(warnTimer);
  $("idle").hidden = true;
  const lead = Math.min(WARN_MS, idleMs / 2);
  warnTimer = setTimeout(() => {
    if (stream && stream.readyState !== EventSource.CLOSED) return touched();  // waiting on the kiosk is no idling
    if ($("result").hidden && !$("question").value) return;
    text($("idle-text"), `Still there? This page clears in ${Math.round(lead / 1000)} seconds for the next visitor.`);
    $("idle").hidden = false;
  }, idleMs - lead);
  idleTimer = setTimeout(resetPage, idleMs);
}

function status(message) {
  // Shown in the card, read from #said, a live region since the page's load: #status, in the card hidden until then,
  // came with "Looking it up…" in it, and NVDA reads no region as it appears. The same text set again is read again.
  if ($("status").textContent !== message) { text($("status"), message); text($("said"), message); }
}

function announce() {
  // The answer is read out once, whole, from one live region written in one statement. #result was the live region,
  // aria-busy while the answer streamed in, but screen readers differ on aria-busy: some read each streamed sentence
  // and then the answer again, NVDA reads nothing of what changed while it was set.
  const badge = $("badge").hidden ? "" : $("badge").textContent + ": ";
  text($("said"), badge + $("answer").textContent + ($("reason").hidden ? "" : " " + $("reason").textContent));
}

function showRoute(route) {
  const badge = $("badge");
  badge.className = "badge " + route;
  text(badge, BADGE[route] || route);
  badge.hidden = false;
}

function showSources(sources) {
  // Passages are sentences: those of one document are shown together, under its title, in rank order.
  const byTitle = new Map();
  for (const s of sources || []) {
    const title = s.title || "Untitled passage";
    if (!byTitle.has(title)) byTitle.set(title, []);
    byTitle.get(title).push(s.text);
  }
  const list = $("sources");
  list.replaceChildren();
  for (const [title, texts] of byTitle) {
    const li = document.createElement("li");
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    text(summary, title);
    const p = document.createElement("p");
    text(p, texts.join(" … "));
    summary.dir = p.dir = "auto";  // a Hebrew or Arabic title or passage reads right to left, its stops at its end
    details.append(summary, p);
    li.append(details);
    list.append(li);
  }
  $("sources-block").hidden = list.children.length === 0;
}

function showAnswer(a) {
  showRoute(a.answer == null ? refusalBadge(a.refusal_reason) : a.route);
  status("");
  if (a.answer == null) {
    text($("answer"), "I don't know.");
    text($("reason"), plainReason(a.refusal_reason));
    showDetail(a.refusal_reason);
    $("reason").hidden = false;
  } else {
    text($("answer"), a.answer);
    showSources(a.sources);
  }
  const ms = Object.values(a.timings_ms || {}).reduce((x, y) => x + y, 0);
  text($("meta"), a.cache_hit ? "Answered on this device (asked before)" :
       `Answered on this device in ${ms < 1000 ? Math.round(ms) + " ms" : (ms / 1000).toFixed(1) + " s"}`);
  announce();
}

function showFailure(reason, detail) {
  // Every failure ends the wait with words and leaves Ask working: a question whose request could not be made
  // (a lone surrogate threw in encodeURIComponent) stayed on "Looking it up…" until the page cleared itself.
  if (stream) stream.close(); touched();  // read from now on: a wait that timed out was no idle time either
  $("badge").hidden = true;  // a "Written by the on-device model" badge over no answer would mislead
  status("");
  text($("answer"), "Sorry, that did not work.");
  text($("reason"), reason);
  showDetail(detail);
  $("reason").hidden = false;
  announce();
}

function ask(question) {
  question = question.trim();
  // spaces alone passed "required" and Ask did nothing: the box says what it wants, as when empty
  if (!question) { $("question").value = ""; $("question").reportValidity(); return; }
  if (tooLong()) { $("question").reportValidity(); return; }
  // A second tap on Ask while the same question is looked up restarted it: asked and logged twice, begun again
  if (stream && stream.readyState !== EventSource.CLOSED && question === $("asked").textContent) return;
  clearResult();
  touched();
  $("suggestions").hidden = true;
  $("result").hidden = false;
  text($("asked"), question);  // a <bdi>: an Arabic question keeps its "?" at its end
  status("Looking it up…");
  let finished = false;
  let streamed = "";
  loadKiosk();  // the footer beside this answer names the certificate deciding it (the operator may have applied one)
  try {  // control characters alone are no question (HTTP 400, unread by an event stream: "connection lost" was said)
    if (!question.replace(/[\x00-\x1f\x7f-\x9f]/g, "").trim()) throw new Error("only control characters");
    stream = new EventSource("/api/ask/stream?q=" + encodeURIComponent(question));
  } catch (err) {  // URIError: a lone UTF-16 surrogate (a broken paste, a script) has no URL form
    showFailure("Your question holds a character this kiosk cannot read. Please type it again.", String(err));
    return;
  }
  // an event the script cannot show (a server's reply it does not parse) is told too, never "Looking it up…" for good
  const on = (name, fn) => stream.addEventListener(name, (e) => {
    touched();
    try { fn(JSON.parse(e.data)); } catch (err) { finished = true; showFailure(plainFailure(0), String(err)); }
  });
  on("route", (d) => {
    if (d.route === "GPT" && !d.cache_hit) { showRoute("GPT"); status("Thinking…"); }
  });
  on("queue", (d) => {
    status(d.position > 0 ? `Thinking… (${d.position} ${d.position === 1 ? "question" : "questions"} ahead of yours)` : "Thinking…");
  });
  on("token", (d) => { streamed += d.text; text($("answer"), streamed); });
  on("answer", (d) => { finished = true; stream.close(); showAnswer(d); });
  on("failed", (d) => { finished = true; showFailure(plainFailure(d.status), d.error); });
  // the server answers or fails in its timeout; one stopped or cut off silently left "Looking it up…" until the reset
  waitTimer = setTimeout(() => finished || showFailure(plainFailure(504), "no event within " + waitMs + " ms"), waitMs);
  stream.onerror = () => {
    if (finished) return;
    showFailure("The connection to this kiosk was lost. Please try again.", "the event stream failed");
  };
}

async function loadKiosk() {
  // Title, settings, suggestions and certificate, fetched again at each reset and question: an operator's Apply,
  // an upload or a removal, or a server restarted with another certificate, changes them under an open page.
  try {
    const response = await fetch("/api/kiosk");
    if (!response.ok) throw new Error(response.status);  // a JSON error, not the page's settings
    const k = await response.json();
    text($("title"), k.title);
    document.title = k.title;
    // setTimeout fires at once past 2^31 - 1 ms (24.8 days): a longer --idle-reset reset the page at each touch
    idleMs = Math.min(k.idle_reset_s * 1000, 2 ** 31 - 1);
    maxChars = k.max_question_chars;
    waitMs = Math.min(((k.question_timeout_s ?? 60) + 5) * 1000, 2 ** 31 - 1);
    tooLong();
    // Which certificate decides, in a discreet footer; a server's text, so textContent only, never markup.
    text($("certificate"), k.decision.summary);
    $("certificate").title = k.decision.summary;  // whole, where the small panel shows two lines of it
    $("certificate").classList.toggle("uncertified", !k.decision.certified);
    foldable();
    // the same suggestions are kept, not made again: a key user's focus on one (Tab, then Enter) fell to nothing
    // when this fetch, begun by Start over, replaced the button under it
    const shown = [...$("suggestion-list").querySelectorAll("button")].map((b) => b.textContent);
    if (shown.length > 0 && JSON.stringify(shown) === JSON.stringify(k.questions)) return;
    const items = k.questions.map((q) => {
      const li = document.createElement("li");
      const b = document.createElement("button");
      b.type = "button";
      b.dir = "auto";  // an operator's question in Arabic or Hebrew reads right to left, as the visitor's does
      text(b, q);
      b.addEventListener("click", (e) => {
        $("question").value = q;
        ask(q);
        // the list it was in is hidden now: chosen by key (detail 0), focus went to nothing; a tap keeps the
        // on-screen keyboard away
        if (e.detail === 0) $("question").focus();
      });
      li.append(b);
      return li;
    });
    $("suggestion-list").replaceChildren(...items);
    if (items.length === 0) $("suggestions").hidden = true;
  } catch (err) {  // the server is down or restarting: the page keeps what it showed, and tries again later
    if ($("suggestion-list").children.length === 0) $("suggestions").hidden = true;
  }
}

function init() {
  // The operator may have unlocked /admin in this tab: the kiosk page is a visitor's, whose swipe back must not
  // find the operator's page open (admin.js keeps the token for its tab). A browser that keeps no site data (a kiosk
  // locked down so) refuses sessionStorage itself: no token is kept there, and the page must run on (it stopped here,
  // Ask disabled for good).
  try { sessionStorage.removeItem("token"); } catch { /* no storage: no token */ }
  $("ask-form").addEventListener("submit", (e) => { e.preventDefault(); ask($("question").value); });
  // Ask is disabled in the page until now: Enter before this script had run (a slow start) sent the form itself, to
  // /?q=…, a reload that lost the question and left it in the browser's history for the next visitor
  $("ask").disabled = false;
  $("question").addEventListener("input", tooLong);
  $("question").addEventListener("keydown", (e) => {
    // Enter that confirms a Japanese, Chinese or Korean composition is the input method's: it submitted the half-typed
    // question (keyCode 229: Safari ends the composition before this keydown)
    if (e.key === "Enter" && (e.isComposing || e.keyCode === 229)) e.preventDefault();
  });
  $("reset").addEventListener("click", () => { resetPage(); $("question").focus(); });
  $("stay").addEventListener("click", touched);  // a screen reader's activation is a click, without pointer or key
  for (const ev of ["pointerdown", "keydown"]) document.addEventListener(ev, touched, { passive: true });
  // a tap, Enter or Space shows all of the certificate where the small panel's two lines cut it; again, two lines
  $("certificate").addEventListener("click", () => { $("certificate").classList.toggle("open"); foldable(); });
  new ResizeObserver(foldable).observe($("certificate"));
  $("certificate").addEventListener("blur", foldable);  // closed on a screen grown since it opened: disabled once left
  loadKiosk();
  touched();
}

init();
