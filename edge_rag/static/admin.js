// Operator page: label the kiosk's logged questions, calibrate on them, apply the certificate (/api/admin/…).
// Every call carries the API token the operator types (kept for this tab only); the page itself holds no data.
"use strict";

const $ = (id) => document.getElementById(id);
const KINDS = [["answer", "The documents say:"], ["not-in-documents", "The documents do not say"],
               ["off-topic", "Off-topic"]];
const pct = (x) => (100 * x).toFixed(1) + "%";
const PAGE = 100, MAX_PAGE = 1000;  // questions asked for at a time, at most (the server's limits)
let calibration = null;  // the finished calibration job
let shown = 0;  // questions on the page: a full log holds ~150,000, so they come a page at a time

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  Object.assign(e, props || {});
  e.append(...children);
  return e;
}

function status(id, message, bad) {
  $(id).textContent = message || "";
  $(id).classList.toggle("bad", !!bad);
}

async function api(path, options) {
  const opts = options || {};
  const headers = Object.assign({ authorization: "Bearer " + sessionStorage.getItem("token") }, opts.headers || {});
  const response = await fetch(path, Object.assign({}, opts, { headers }));
  const type = response.headers.get("content-type") || "";
  const data = type.includes("json") ? await response.json() : await response.text();
  if (!response.ok) throw new Error((data && data.error) || response.status + " " + response.statusText);
  return data;
}

async function load() {
  try {
    const limit = Math.min(Math.max(shown, PAGE), MAX_PAGE);  // after a save: the questions shown, again
    const [listing, health] = await Promise.all([api("/api/admin/questions?offset=0&limit=" + limit),
                                                 api("/api/health")]);
    $("work").hidden = false;
    $("unlock").hidden = true;
    status("status", "");
    showInForce(health.decision);
    showQuestions(listing);
  } catch (err) {
    $("work").hidden = true;
    $("unlock").hidden = false;
    status("status", "Refused: " + err.message, true);
  }
}

function showInForce(decision) {
  const c = decision.certificate;
  const who = c.source === "operator" ? "yours, applied " + c.applied + " (labels up to " + c.labelled + ")"
    : c.source === "shipped" ? "the shipped one (SQuAD-2 and HotpotQA questions, not this kiosk's)" : "a calibration file";
  $("in-force").textContent = "Certificate in force: " + who + ", on " + c.questions + " questions. " + decision.summary;
}

function showQuestions(listing) {
  const items = listing.questions.map((group, i) => questionItem(group, listing.offset + i));
  $("counts").textContent = "Labelled: " + listing.labelled + " questions" +
    (listing.stale ? ", " + listing.stale + " saved before the documents changed (check and save again)" : "") +
    "; calibrating needs " + listing.least + " labelled askings." +
    (listing.question_log ? "" : " No question log: start the server with --question-log to collect questions.");
  if (listing.offset) $("questions").append(...items);
  else $("questions").replaceChildren(...items);
  shown = listing.offset + items.length;
  $("more").hidden = !listing.more;
}

async function more() {
  try {
    showQuestions(await api("/api/admin/questions?offset=" + shown + "&limit=" + PAGE));
  } catch (err) { status("status", err.message, true); }
}

function questionItem(group, i) {
  const label = group.label;
  const answers = el("textarea", { placeholder: "the answer as the documents give it (one wording per line)",
                                   value: label && label.answer ? label.answer.join("\n") : "" });
  const kinds = el("div", { className: "kinds" }, ...KINDS.map(([kind, text]) =>
    el("label", {}, el("input", { type: "radio", name: "kind-" + i, value: kind,
                                  checked: label ? label.label === kind : false }), " " + text)));
  const save = el("button", { type: "button", textContent: "Save" });
  const clear = el("button", { type: "button", className: "quiet", textContent: "Clear label" });
  const note = el("span", { className: "status" });
  save.addEventListener("click", async () => {
    const chosen = kinds.querySelector("input:checked");
    if (!chosen) { note.textContent = "choose one of the three"; return; }
    const texts = answers.value.split("\n").map((s) => s.trim()).filter(Boolean);
    try {
      await api("/api/admin/labels", { method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ question: group.question, label: chosen.value, answers: texts }) });
      await load();
    } catch (err) { note.textContent = err.message; }
  });
  clear.addEventListener("click", async () => {
    await api("/api/admin/labels", { method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ question: group.question, label: null }) });
    await load();
  });
  const when = group.times ? "asked " + group.times + "×, last " + group.asked : "imported, not asked here";
  const state = label ? (group.stale ? "saved before the documents changed" : "labelled " + label.labelled) : "not labelled";
  return el("li", { className: "question" },
    el("div", { className: "q" }, group.question),
    el("div", { className: "meta" }, when + " · ", el("span", { className: group.stale ? "stale" : "" }, state)),
    kinds, answers, el("div", { className: "row" }, save, clear, note));
}

async function search(event) {
  event.preventDefault();
  const q = $("search").value.trim();
  if (!q) return;
  try {
    const data = await api("/api/admin/search?q=" + encodeURIComponent(q));
    $("passages").replaceChildren(...data.passages.map((p) => el("li", {}, el("strong", {}, p.title || "(untitled)"),
                                                                   " " + p.text)));
    if (!data.passages.length) $("passages").replaceChildren(el("li", {}, "nothing found"));
  } catch (err) { $("passages").replaceChildren(el("li", {}, err.message)); }
}

async function calibrate() {
  $("result").hidden = true;
  status("cal-status", "Calibrating…");
  try {
    const started = await api("/api/admin/calibrate", { method: "POST" });
    let job = started;
    while (job.state !== "done" && job.state !== "failed") {
      await new Promise((r) => setTimeout(r, 400));
      job = await api(started.url);
      if (job.passages_planned) status("cal-status", "Calibrating: " + job.passages_done + " of " + job.passages_planned + " questions measured");
    }
    if (job.state === "failed") throw new Error(job.error);
    calibration = job;
    status("cal-status", "Measured on " + job.questions + " questions (" + job.without_answer +
      " without an answer in the documents). Choose the error you accept, then Apply.");
    showResult(job);
  } catch (err) { status("cal-status", "Not calibrated: " + err.message, true); }
}

function showResult(job) {
  $("rows").replaceChildren(...job.table.map((r) => el("tr", {},
    el("td", {}, el("input", { type: "radio", name: "alpha", value: String(r.alpha), disabled: r.threshold === null,
                               ariaLabel: "alpha " + r.alpha })),
    el("td", {}, String(r.alpha)), el("td", {}, r.threshold === null ? "—" : r.threshold.toFixed(3)),
    el("td", {}, r.threshold === null ? "nothing" : pct(r.answered)), el("td", {}, pct(r.error)),
    el("td", {}, r.threshold === null ? "—" : r.upper.toFixed(3)))));
  for (const input of $("rows").querySelectorAll("input")) input.addEventListener("change", () => plot(job));
  plot(job);
  $("result").hidden = false;
}

function plot(job) {
  // risk–coverage: share answered (x) against the error among answered (y), one point per threshold
  const NS = "http://www.w3.org/2000/svg", W = 420, H = 260, L = 44, B = 30, T = 10, R = 10;
  const x = (v) => L + v * (W - L - R), y = (v) => H - B - v * (H - B - T);
  const svg = $("plot");
  const node = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text) e.textContent = text;
    return e;
  };
  const points = job.curve.filter((p) => p.answered > 0).map((p) => x(p.answered) + "," + y(p.error));
  const parts = [node("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
    node("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }),
    node("text", { x: W / 2, y: H - 6, "text-anchor": "middle" }, "share of questions answered"),
    node("text", { x: L + 6, y: T + 10 }, "error among answered"),
    node("text", { x: L - 4, y: H - B, "text-anchor": "end" }, "0"),
    node("text", { x: L - 4, y: T + 10, "text-anchor": "end" }, "100%"),
    node("text", { x: W - R, y: H - B + 14, "text-anchor": "end" }, "100%"),
    node("polyline", { class: "curve", points: points.join(" ") })];
  const chosen = $("rows").querySelector("input:checked");
  const row = chosen && job.table.find((r) => String(r.alpha) === chosen.value);
  if (row) parts.push(node("circle", { class: "chosen", cx: x(row.answered), cy: y(row.error), r: 5 }));
  svg.replaceChildren(...parts);
}

async function apply() {
  const chosen = $("rows").querySelector("input:checked");
  if (!calibration || !chosen) { status("cal-status", "Choose an α in the table first.", true); return; }
  try {
    const data = await api("/api/admin/apply", { method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ calibration: calibration.id, max_error_rate: Number(chosen.value) }) });
    status("cal-status", "Applied. " + data.decision.summary);
    showInForce(data.decision);
  } catch (err) { status("cal-status", "Not applied: " + err.message, true); }
}

async function exportLabels() {
  try {
    const text = await api("/api/admin/export");
    const a = el("a", { href: URL.createObjectURL(new Blob([text], { type: "application/x-ndjson" })),
                        download: "labelled-questions.jsonl" });
    a.click();
    URL.revokeObjectURL(a.href);
  } catch (err) { status("cal-status", "Not exported: " + err.message, true); }
}

async function importLabels() {
  const file = $("import").files[0];
  if (!file) return;
  try {
    const data = await api("/api/admin/import", { method: "POST", body: await file.text() });
    status("cal-status", data.labelled + " questions labelled from " + file.name);
    await load();
  } catch (err) { status("cal-status", "Not imported: " + err.message, true); }
  $("import").value = "";
}

$("unlock").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("token", $("token").value.trim());
  load();
});
$("search-form").addEventListener("submit", search);
$("calibrate").addEventListener("click", calibrate);
$("apply").addEventListener("click", apply);
$("export").addEventListener("click", exportLabels);
$("import").addEventListener("change", importLabels);
$("more").addEventListener("click", more);
if (sessionStorage.getItem("token")) load();
// Back from the kiosk page, which forgot the token: a page kept in the browser's back/forward cache would show the
// questions as the operator left them; it starts afresh instead.
window.addEventListener("pageshow", (event) => {
  if (event.persisted && !sessionStorage.getItem("token")) location.reload();
});
