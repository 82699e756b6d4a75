// trajforge view: a single page over the viewer's JSON API. Routes live in the URL hash:
//   #/{source}/{trajectories|filtered|pairs|quarantine|rows}?q=...&filters   a list
//   #/{source}/t/{id}  trajectory      #/{source}/f/{id}  filtered record   #/{source}/p/{id}  pair
//   #/{source}/q/{id}  quarantined     #/{source}/r/{n}   export row
//   #/report/{r}       an eval (per-task pass rates, failures) or an improve run (before / after, rounds)
// Every value from the data goes into the page as text (never as HTML).
"use strict";

const main = document.getElementById("main");
const sourceSelect = document.getElementById("source");
const tabs = document.getElementById("tabs");
const reportNav = document.getElementById("reports");
let SOURCES = [];
let REPORTS = [];
const facetCache = new Map();
const PAGE = 50;

// ---- small helpers --------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// Like el.replaceChildren, but takes nested arrays and skips null (as `h` does).
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

async function api(path) {
  const response = await fetch(path);
  let body;
  try { body = await response.json(); } catch { body = {error: response.statusText}; }
  if (!response.ok) { const err = new Error(body.error || response.statusText); err.status = response.status; throw err; }
  return body;
}

const enc = encodeURIComponent;
const fmtNum = (n) => (n === null || n === undefined ? "–" : typeof n === "number" && !Number.isInteger(n) ? n.toFixed(3) : String(n));
const pretty = (value) => JSON.stringify(value, null, 2);
const badge = (text, cls, title) => h("span", {class: `badge ${cls || ""}`.trim(), title}, text);
const link = (href, text, cls) => h("a", {href, class: cls}, text);
const pre = (text, cls) => h("pre", {class: cls}, text);
const section = (title, cls, ...children) => h("section", {class: cls}, h("h2", {text: title}), ...children);
const collapsed = (summary, cls, ...children) => h("details", {class: cls}, h("summary", {text: summary}), ...children);

function errorBox(message) { return h("p", {class: "error"}, message); }

function maybeJson(text) {
  if (typeof text !== "string") return text;
  try { return JSON.parse(text); } catch { return null; }
}

// ---- routing --------------------------------------------------------------------------------------

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?", 2);
  const parts = path.split("/");
  return {
    source: parts[0] === "" || parts[0] === undefined ? null : Number(parts[0]),
    view: parts[1] || null,
    arg: parts.length > 2 ? decodeURIComponent(parts.slice(2).join("/")) : null,
    params: new URLSearchParams(query || ""),
  };
}

function go(source, view, params) {
  const query = params && [...params].length ? `?${params}` : "";
  location.hash = `#/${source}/${view}${query}`;
}

async function route() {
  const r = parseHash();
  drawReportNav(parts0() === "report" ? Number(parseHash().view) : null);
  if (parts0() === "report") {
    fill(tabs);
    fill(main, h("p", {class: "muted"}, "loading…"));
    try { await reportPage(Number(r.view)); } catch (err) { fill(main, errorBox(err.message)); }
    window.scrollTo(0, 0);
    return;
  }
  if (r.source === null || Number.isNaN(r.source) || !SOURCES[r.source]) {
    // A run's report first (an improve run, else an eval), when the folder holds one.
    const report = REPORTS.find((x) => x.kind === "improve") || REPORTS.find((x) => x.kind === "eval");
    const first = SOURCES[0];
    location.replace(report && r.source === null ? `#/report/${report.index}` : `#/0/${first && first.kind === "export" ? "rows" : "trajectories"}`);
    return;
  }
  sourceSelect.value = String(r.source);
  drawTabs(r.source, r.view);
  fill(main, h("p", {class: "muted"}, "loading…"));
  try {
    const views = {t: trajectoryPage, f: trajectoryPage, p: pairPage, q: quarantinedPage, r: exportRowPage};
    if (views[r.view]) await views[r.view](r);
    else await listPage(r);
  } catch (err) {
    fill(main, errorBox(err.message));
  }
  window.scrollTo(0, 0);
}

function drawTabs(i, view) {
  const source = SOURCES[i];
  const tables = source.kind === "export" ? [["rows", "rows", null]] : [
    ["trajectories", "trajectories", source.counts.trajectories], ["pairs", "pairs", source.counts.pairs],
    ["quarantine", "quarantine", source.counts.quarantine], ["filtered", "filtered", source.counts.filtered]];
  const current = {t: "trajectories", f: "filtered", p: "pairs", q: "quarantine", r: "rows"}[view] || view;
  fill(tabs, ...tables.map(([table, label, n]) => link(`#/${i}/${table}`,
    n === null ? label : `${label} (${n})`, `tab ${current === table ? "active" : ""}`)));
}

// ---- lists ----------------------------------------------------------------------------------------

const CONTROLS = {
  trajectories: ["source", "method", "tool", "task", "success", "label", "masked", "reward_min", "reward_max"],
  filtered: ["source", "method", "filter", "reason", "success", "label", "masked", "reward_min", "reward_max"],
  pairs: ["source", "level"],
  quarantine: ["stage", "error"],
  rows: [],
};
const SORTS = {
  trajectories: ["order", "id", "reward", "steps", "source"],
  filtered: ["order", "id", "reward", "steps", "source", "filter"],
  pairs: ["order", "id", "prefix_len", "source"],
  quarantine: ["order", "id", "stage", "created_at"],
  rows: [],
};
const CHOICES = {success: ["true", "false", "unknown"], label: ["good", "bad"], masked: ["yes", "no"],
  level: ["trajectory", "step"]};
// Which facet feeds each free-text filter's suggestions, and the facet row's key.
const SUGGEST = {source: ["sources", "source"], method: ["methods", "method"], tool: ["tools_used", "function"],
  filter: ["filter_reasons", "filter"], reason: ["filter_reasons", "reason"], stage: ["quarantine_reasons", "stage"],
  error: ["quarantine_reasons", "error"]};

function facetsOf(i) {
  if (!facetCache.has(i)) facetCache.set(i, api(`/api/${i}/facets`));
  return facetCache.get(i);
}

function control(name, params) {
  const value = params.get(name) || "";
  const id = `f-${name}`;
  let input;
  if (CHOICES[name]) {
    input = h("select", {id, name}, h("option", {value: ""}, "any"),
      CHOICES[name].map((c) => h("option", {value: c, selected: c === value}, c)));
  } else if (name.startsWith("reward_")) {
    input = h("input", {id, name, type: "number", step: "any", value, size: 6});
  } else {
    input = h("input", {id, name, value, list: `${id}-list`, size: 14});
  }
  return h("label", {class: "control"}, name.replace("_", " "), input,
    SUGGEST[name] ? h("datalist", {id: `${id}-list`}) : null);
}

function fillSuggestions(form, facets) {
  for (const [name, [key, field]] of Object.entries(SUGGEST)) {
    const list = form.querySelector(`#f-${name}-list`);
    if (!list || !facets[key]) continue;
    const values = [...new Set(facets[key].map((row) => row[field]).filter((v) => v !== null && v !== undefined))];
    fill(list, ...values.map((v) => h("option", {value: v})));
  }
}

async function listPage(r) {
  const i = r.source, table = r.view;
  if (!CONTROLS[table]) throw new Error(`unknown page ${table}`);
  const params = r.params;
  const form = h("form", {class: "controls", id: "controls"},
    h("input", {id: "q", name: "q", type: "search", placeholder: table === "rows" ? "search the rows' text" : table === "pairs" ? "search pair, chosen or rejected id" : table === "quarantine" ? "search id, error, location, raw input" : "search step text, tool, source, method, id",
      value: params.get("q") || "", size: 40}),
    CONTROLS[table].map((name) => control(name, params)),
    SORTS[table].length ? h("label", {class: "control"}, "sort",
      h("select", {id: "sort", name: "sort"}, SORTS[table].map((s) => h("option", {value: s, selected: s === (params.get("sort") || "order")}, s))),
      h("label", {class: "inline"}, h("input", {type: "checkbox", id: "desc", name: "desc", value: "1", checked: params.get("desc") === "1"}), "desc")) : null,
    h("button", {type: "submit", id: "apply"}, "apply"),
    link(`#/${i}/${table}`, "clear", "clear"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v !== "") next.set(k, v);
    go(i, table, next);
  });
  form.querySelectorAll("select, input[type=checkbox]").forEach((el) => el.addEventListener("change", () => form.requestSubmit()));
  const summary = h("p", {class: "summary"}, "counting…");
  const results = h("div", {class: "results"});
  const aside = h("aside", {class: "facets"}, h("p", {class: "muted"}, "facets…"));
  fill(main, h("div", {class: "list-page"}, aside, h("div", {class: "list-main"}, form, summary, results)));

  if (SOURCES[i].kind === "dataset") {
    facetsOf(i).then((facets) => { fillSuggestions(form, facets); drawFacets(aside, i, table, facets, params); })
      .catch((err) => fill(aside, errorBox(err.message)));
  } else {
    fill(aside, h("p", {}, `export${SOURCES[i].format ? ` (${SOURCES[i].format})` : ""}`), h("p", {class: "muted"}, SOURCES[i].path));
  }

  const query = new URLSearchParams(params);
  const offset = Number(query.get("offset") || 0);
  query.set("limit", PAGE);
  const counted = new URLSearchParams(params);
  ["offset", "sort", "desc"].forEach((k) => counted.delete(k));
  // The count comes apart from the page: a search counts by a scan of every step, the page does not wait for it.
  const total = SOURCES[i].kind === "dataset" ? SOURCES[i].counts[table] : null;
  const count = h("span", {id: "count", class: "counting"}, "counting…");
  const shown = h("span", {});
  fill(summary, count, total === null || total === undefined ? ` ${table}` : [" of ", h("span", {id: "total"}, String(total)), ` ${table}`], shown);
  api(`/api/${i}/count/${table}?${counted}`).then((res) => { count.textContent = String(res.total); count.className = "counted"; })
    .catch((err) => { count.textContent = "?"; count.title = err.message; });
  const page = await api(`/api/${i}/list/${table}?${query}`);
  shown.textContent = page.rows.length ? ` · showing ${offset + 1}–${offset + page.rows.length}` : "";
  fill(results, page.rows.length ? resultTable(i, table, page.rows) : h("p", {class: "muted"}, "nothing matches"),
    pager(i, table, params, offset, page.more));
}

function pager(i, table, params, offset, more) {
  const at = (o) => { const p = new URLSearchParams(params); if (o) p.set("offset", o); else p.delete("offset"); return `#/${i}/${table}${[...p].length ? `?${p}` : ""}`; };
  return h("div", {class: "pager"},
    offset > 0 ? link(at(Math.max(0, offset - PAGE)), "← previous", "prev") : null,
    more ? link(at(offset + PAGE), "next →", "next") : null);
}

function successBadge(success) {
  if (success === true) return badge("success", "ok");
  if (success === false) return badge("failed", "bad");
  return badge("success unknown", "muted");
}

function resultTable(i, table, rows) {
  const cols = {
    trajectories: ["id", "source", "method", "steps", "reward", "outcome", "marks", "task"],
    filtered: ["id", "filter", "reason", "source", "steps", "reward", "task"],
    pairs: ["id", "level", "prefix", "chosen", "rejected", "rewards"],
    quarantine: ["id", "stage", "error", "location", "raw"],
    rows: ["row", "id", "source", "first message"],
  }[table];
  const cell = (row, col) => {
    switch (`${table}:${col}`) {
      case "trajectories:id": return link(`#/${i}/t/${enc(row.id)}`, row.id, "record-link");
      case "filtered:id": return link(`#/${i}/f/${enc(row.id)}`, row.id, "record-link");
      case "pairs:id": return link(`#/${i}/p/${enc(row.id)}`, row.id, "record-link");
      case "quarantine:id": return link(`#/${i}/q/${enc(row.id)}`, row.id, "record-link");
      case "rows:row": return link(`#/${i}/r/${row.row}`, `#${row.row}`, "record-link");
      case "trajectories:outcome": return successBadge(row.success);
      case "trajectories:marks": case "filtered:marks": return [
        row.masked ? badge(`${row.masked} masked`, "masked") : null, row.good ? badge(`${row.good} good`, "good") : null,
        row.bad ? badge(`${row.bad} bad`, "bad") : null, row.spliced ? badge("spliced", "revision") : null,
        row.reflection ? badge("reflection", "revision") : null, row.judged ? badge("judged", "judge") : null];
      case "filtered:reason": return h("span", {class: "reason"}, row.reason);
      case "pairs:prefix": return String(row.prefix_len);
      case "pairs:rewards": return `${fmtNum(row.chosen_reward)} / ${fmtNum(row.rejected_reward)}`;
      case "quarantine:error": return h("span", {class: "quarantine-reason"}, row.error);
      case "quarantine:raw": return h("code", {class: "raw-head"}, row.raw || "");
      case "rows:first message": return firstMessage(row);
      default: { const v = row[col]; return typeof v === "number" ? fmtNum(v) : v === null || v === undefined ? "" : String(v); }
    }
  };
  return h("table", {class: `results-table ${table}`},
    h("thead", {}, h("tr", {}, cols.map((c) => h("th", {text: c})))),
    h("tbody", {}, rows.map((row) => h("tr", {"data-id": row.id ?? row.row}, cols.map((c) => h("td", {class: `col-${c.replace(" ", "-")}`}, cell(row, c)))))));
}

function firstMessage(row) {
  for (const key of ["messages", "prompt", "conversations"]) {
    const turns = row[key];
    if (Array.isArray(turns) && turns.length) {
      const t = turns.find((m) => (m.role || m.from) === "user" || m.from === "human") || turns[0];
      return String(t.content ?? t.value ?? "").slice(0, 200);
    }
  }
  return "";
}

function drawFacets(aside, i, table, facets, params) {
  // A facet narrows what is shown: it joins the current search and filters.
  const narrowed = (filter, value) => { const p = new URLSearchParams(params); p.delete("offset"); p.set(filter, value); return `#/${i}/${table}?${p}`; };
  const facetList = (title, rows, key, filter, countKey) => rows && rows.length ? h("div", {class: "facet-group"},
    h("h3", {text: title}),
    h("ul", {}, rows.slice(0, 25).map((row) => h("li", {},
      filter ? h("a", {class: "facet", href: narrowed(filter, row[key]), "data-facet": filter, "data-value": row[key]}, String(row[key]))
        : h("span", {}, String(row[key])),
      h("span", {class: "n"}, String(row[countKey])))))) : null;
  const hist = facets.steps_histogram || [];
  const peak = Math.max(1, ...hist.map((b) => b.records));
  const groups = {
    trajectories: [
      facetList("sources", facets.sources, "source", "source", "records"),
      facetList("methods", facets.methods, "method", "method", "records"),
      facetList("tools", facets.tools_used, "function", "tool", "calls"),
      facetList("outcomes", facets.outcomes, "success", "success", "records"),
      facetList("step labels", facets.labels, "label", null, "steps"),
      facetList("step kinds", facets.step_kinds, "kind", null, "steps"),
      hist.length ? h("div", {class: "facet-group"}, h("h3", {text: "steps per trajectory"}),
        h("div", {class: "histogram"}, hist.map((b) => h("div", {class: "bar-row", title: `${b.from}–${b.to} steps: ${b.records}`},
          h("span", {class: "bar-label"}, b.from === b.to ? String(b.from) : `${b.from}–${b.to}`),
          h("span", {class: "bar", style: `width:${Math.max(2, (100 * b.records) / peak)}%`}),
          h("span", {class: "n"}, String(b.records)))))) : null,
      facets.reward && facets.reward.count ? h("div", {class: "facet-group"}, h("h3", {text: "reward"}),
        h("p", {}, `n=${facets.reward.count} min=${fmtNum(facets.reward.min)} mean=${fmtNum(facets.reward.mean)} max=${fmtNum(facets.reward.max)}`)) : null,
    ],
    filtered: [facetList("filter reasons", facets.filter_reasons, "reason", "reason", "records")],
    quarantine: [facetList("stages", facets.quarantine_reasons, "stage", "stage", "records"),
      facetList("errors", facets.quarantine_reasons, "error", "error", "records")],
    pairs: [],
  }[table] || [];
  fill(aside, h("h2", {text: "facets"}),
    h("p", {class: "muted"}, `${facets.records} trajectories · ${facets.pairs} pairs · ${facets.quarantined} quarantined · ${facets.filtered} filtered`),
    ...groups);
}

// ---- steps ----------------------------------------------------------------------------------------

// A loss-masked step: train = false, except the system prompt's step (context, never a training target).
const isMasked = (s) => s.train === false && s.name !== "system";
const SEGMENTS = {prefix: "shared prefix", bad: "bad segment (masked)", revision: "revision", continuation: "good continuation"};
const ACTIONS = new Set(["api", "code", "message"]);

function mediaUrl(i, path) { return `/media/${i}/${path.split("/").map(enc).join("/")}`; }

function image(i, ref, cls) {
  const img = h("img", {class: cls, src: mediaUrl(i, ref.path), alt: `${cls} ${ref.path}`, loading: "lazy"});
  img.addEventListener("error", () => img.replaceWith(h("p", {class: "missing"}, `${cls} not found in the dataset directory: ${ref.path}`)));
  return h("figure", {}, img, h("figcaption", {text: ref.path}));
}

function stepRole(step) {
  if (ACTIONS.has(step.kind)) return "assistant";
  if (step.kind === "text") return step.source === "agent" ? "assistant" : step.source === "user" ? "user" : "environment";
  return "environment";
}

function stepBody(i, step) {
  switch (step.kind) {
    case "api": return [h("div", {class: "call"}, h("span", {class: "function"}, step.function), "(…)"), pre(pretty(step.arguments), "arguments")];
    case "code": return [h("div", {class: "lang", text: step.language}), pre(step.content, "code")];
    case "message": return [h("div", {class: "message"}, step.content)];
    case "text": return [pre(step.content, "text")];
    case "json": return [pre(pretty(step.content), "json")];
    case "image": return [image(i, step.image, "image")];
    case "web": return [
      step.url ? h("div", {class: "url"}, "URL ", h("code", {text: step.url})) : null,
      step.screenshot ? image(i, step.screenshot, "screenshot") : null,
      step.axtree ? h("details", {class: "axtree", open: true}, h("summary", {text: "accessibility tree"}), pre(step.axtree)) : null,
      step.html ? collapsed(`html (${step.html.length} chars)`, "html", pre(step.html)) : null,
    ];
    default: return [pre(pretty(step))];
  }
}

function stepCard(i, step, index, opts) {
  const segment = opts.segments ? opts.segments[index] : null;
  const role = stepRole(step);
  const extra = {...(step.extra || {})};
  const reason = extra.judge_reason;
  delete extra.judge_reason;
  const revision = extra.kind === "revision" || segment === "revision";
  const masked = isMasked(step);
  const classes = ["step", `kind-${step.kind}`, `role-${role}`, segment ? `seg-${segment}` : "", masked ? "masked" : "",
    revision ? "revision" : "", opts.system && opts.system.includes(index) ? "system" : "", opts.fork === index ? "fork" : ""];
  const who = step.kind === "text" || step.kind === "json" ? `${step.source}${step.name ? ` · ${step.name}` : ""}` : role;
  return h("div", {class: classes.filter(Boolean).join(" "), "data-index": index, id: `${opts.prefix || "step"}-${index}`},
    h("div", {class: "step-head"},
      h("span", {class: "idx", text: `#${index}`}), h("span", {class: "kind", text: step.kind}), h("span", {class: "who", text: who}),
      opts.fork === index ? badge("fork", "fork-badge") : null,
      segment ? badge(SEGMENTS[segment], `segment seg-${segment}`) : revision ? badge("revision", "segment seg-revision") : null,
      masked ? badge("train=false (masked)", "masked") : null,
      step.label && step.label !== "unknown" ? badge(step.label, `label ${step.label}`, reason) : null,
      reason ? h("span", {class: "judge-reason", text: reason}) : null,
      step.reward !== null && step.reward !== undefined ? badge(`reward ${fmtNum(step.reward)}`, "reward") : null,
      opts.system && opts.system.includes(index) ? badge("system", "system") : null,
      opts.task === index ? badge("task", "task") : null,
      step.tool_call_id ? h("span", {class: "call-id", text: step.tool_call_id}) : null),
    step.thought ? collapsed("thought", "thought", h("div", {text: step.thought})) : null,
    step.reasoning ? collapsed("reasoning", "reasoning", pre(step.reasoning)) : null,
    stepBody(i, step),
    Object.keys(extra).length && !(Object.keys(extra).length === 1 && extra.kind === "revision") ? collapsed("extra", "extra", pre(pretty(extra))) : null);
}

// ---- trajectory -----------------------------------------------------------------------------------

function judgeBadges(details) {
  const judge = details && details.judge;
  if (!judge || typeof judge !== "object") return [];
  const entries = "success" in judge || "score" in judge || "thoughts" in judge ? [["judge", judge]] : Object.entries(judge);
  return entries.filter(([, v]) => v && typeof v === "object").map(([kind, v]) => {
    const verdict = v.error ? `error: ${v.error}` : "success" in v ? (v.success ? "success" : "failed") : "score" in v ? `score ${v.score}` : "";
    return h("div", {class: "judge"}, badge(`${kind} judge`, "judge"), h("span", {class: "verdict", text: verdict}),
      h("span", {class: "judge-text", text: v.reason || v.thoughts || ""}));
  });
}

function provenance(i, view) {
  const p = view.trajectory.provenance || {};
  const rows = ["method", "source_dataset", "source_id", "model", "seed", "task_id", "prompt_template_hash", "trajforge_version", "created_at"]
    .filter((k) => p[k] !== null && p[k] !== undefined).map((k) => [h("dt", {text: k}), h("dd", {text: String(p[k])})]);
  const parents = (view.parents || []).map((parent) => h("li", {}, link(`#/${i}/t/${enc(parent.id)}`, parent.id, "parent-link"),
    parent.role ? ` (${parent.role})` : ""));
  return section("provenance", "provenance", h("dl", {}, rows),
    parents.length ? [h("h3", {text: "parents"}), h("ul", {class: "parents"}, parents)] : null);
}

function steps(from, to) {
  return to < from ? "none" : from === to ? `step ${from}` : `steps ${from}–${to}`;
}

function revisionSummary(i, view) {
  const rev = view.revision;
  if (!rev) return null;
  const masked = rev.masked || [];
  const span = masked.length ? steps(Math.min(...masked), Math.max(...masked)) : "none";
  const index = rev.kind === "splice" ? rev.revision_index : rev.reflection_index;
  const sources = (view.parents || []).map((p) => link(`#/${i}/t/${enc(p.id)}`, p.role || p.id, "source-path"));
  return section(rev.kind === "splice" ? "spliced revision (Agent-R)" : "reflection", "revision-summary",
    h("ol", {class: "segments"},
      rev.kind === "splice" ? h("li", {class: "seg-prefix"}, `shared prefix: ${steps(0, rev.prefix_len - 1)}`) : h("li", {class: "seg-prefix"}, `before the error: ${steps(0, rev.first_error - 1)}`),
      h("li", {class: "seg-bad"}, `bad segment, loss masked: ${span} (first error at step ${rev.first_error}${rev.error_source ? `, found by ${rev.error_source}` : ""})`),
      h("li", {class: "seg-revision"}, `revision thought: step ${index}`),
      h("li", {class: "seg-continuation"}, `good continuation: steps ${index + 1}–end`)),
    rev.reason ? h("p", {class: "reason"}, `why: ${rev.reason}`) : null,
    sources.length ? h("p", {class: "sources"}, "source paths: ", sources.flatMap((s, k) => (k ? [" · ", s] : [s]))) : null);
}

async function trajectoryPage(r) {
  const i = r.source, table = r.view === "f" ? "filtered" : "trajectories";
  let view;
  try {
    view = await api(`/api/${i}/trajectory?${new URLSearchParams({id: r.arg, table})}`);
  } catch (err) {
    if (err.status === 404 && table === "trajectories") {
      const found = await api(`/api/locate?${new URLSearchParams({id: r.arg})}`);
      if (found.sources.length) { location.replace(`#/${found.sources[0]}/t/${enc(r.arg)}`); return; }
      throw new Error(`${err.message} (nor in any other source shown)`);
    }
    throw err;
  }
  const decision = view.decision ? h("div", {class: "decision"}, badge("filtered", "bad"),
    h("span", {}, ` dropped by `, h("b", {text: view.decision.filter}), ": "), h("span", {class: "reason", text: view.decision.reason}),
    view.decision.score !== null && view.decision.score !== undefined ? ` (score ${fmtNum(view.decision.score)})` : "") : null;
  if (view.invalid) {
    fill(main, h("article", {class: "trajectory"}, h("h1", {class: "record-id", text: r.arg}), decision,
      errorBox(`this record does not validate: ${view.invalid}`), pre(pretty(view.raw))));
    return;
  }
  const t = view.trajectory;
  const opts = {segments: view.segments, system: view.system_steps, task: view.task_step};
  const system = (view.system_steps || []).map((k) => t.steps[k].content).join("\n\n");
  const task = view.task_step !== null && view.task_step !== undefined ? t.steps[view.task_step] : null;
  fill(main, h("article", {class: "trajectory", "data-id": t.id},
    h("h1", {class: "record-id", text: t.id}),
    h("div", {class: "badges"}, badge(t.source, "source"), t.provenance.method ? badge(t.provenance.method, "method") : null,
      successBadge(t.success), t.reward !== null ? badge(`reward ${fmtNum(t.reward)}`, "reward") : null,
      badge(`${t.steps.length} steps`, "muted"),
      t.steps.some(isMasked) ? badge(`${t.steps.filter(isMasked).length} masked`, "masked") : null),
    decision, judgeBadges(t.details),
    revisionSummary(i, view),
    system ? h("details", {class: "system-prompt", open: true}, h("summary", {text: "system / policy"}), pre(system)) : null,
    task ? section("task", "task", h("div", {class: "task-text", text: typeof task.content === "string" ? task.content : pretty(task.content)})) : null,
    t.tools.length ? collapsed(`tools (${t.tools.length})`, "tools", pre(pretty(t.tools))) : null,
    view.pairs.length ? section("in pairs", "pairs-of", h("ul", {}, view.pairs.map((p) => h("li", {},
      link(`#/${i}/p/${enc(p.id)}`, p.id, "pair-link"), ` (${p.level}, ${p.chosen_id === t.id ? "chosen" : "rejected"}, fork at step ${p.prefix_len})`)))) : null,
    section("steps", "steps", t.steps.map((s, k) => stepCard(i, s, k, opts))),
    provenance(i, view),
    previewSection(i, view.formats, view.token_formats, {id: t.id, table}),
    Object.keys(t.details || {}).length ? collapsed("details", "details-json", pre(pretty(t.details))) : null));
}

// ---- pair -----------------------------------------------------------------------------------------

async function pairPage(r) {
  const i = r.source;
  const view = await api(`/api/${i}/pair?${new URLSearchParams({id: r.arg})}`);
  if (view.invalid) { fill(main, errorBox(`this pair does not validate: ${view.invalid}`), pre(pretty(view.raw))); return; }
  const p = view.pair, k = p.prefix_len;
  const side = (name) => view[name] && view[name].trajectory ? view[name].trajectory : null;
  const chosen = side("chosen"), rejected = side("rejected");
  const head = h("div", {class: "badges"}, badge(p.level, "level"), badge(p.source, "source"), badge(`fork at step ${k}`, "fork-badge"),
    badge(`chosen reward ${fmtNum(p.chosen_reward)}`, "ok"), badge(`rejected reward ${fmtNum(p.rejected_reward)}`, "bad"));
  const links = h("p", {class: "pair-members"}, "chosen: ", link(`#/${i}/t/${enc(p.chosen_id)}`, p.chosen_id, "chosen-link"),
    " · rejected: ", link(`#/${i}/t/${enc(p.rejected_id)}`, p.rejected_id, "rejected-link"));
  const problems = [!chosen ? errorBox(`chosen trajectory ${p.chosen_id} is not in this dataset`) : null,
    !rejected ? errorBox(`rejected trajectory ${p.rejected_id} is not in this dataset`) : null,
    view.prefix_shared === false ? errorBox(`the two trajectories differ within their first ${k} steps (the DPO export skips this pair: prefix mismatch)`) : null];
  const grid = h("div", {class: "side-by-side"}, h("div", {class: "col-head chosen"}, "chosen"), h("div", {class: "col-head rejected"}, "rejected"));
  if (chosen && rejected) {
    const segs = (name) => view[name].segments;
    for (let j = k; j < Math.max(chosen.steps.length, rejected.steps.length); j++) {
      for (const [name, t] of [["chosen", chosen], ["rejected", rejected]]) {
        const cell = h("div", {class: `cell ${name} ${j === k ? "fork" : ""}`.trim()});
        if (j < t.steps.length) cell.append(stepCard(i, t.steps[j], j, {segments: segs(name), fork: k, prefix: name}));
        grid.append(cell);
      }
    }
  }
  fill(main, h("article", {class: "pair", "data-id": p.id},
    h("h1", {class: "record-id", text: p.id}), head, links, problems,
    chosen ? h("details", {class: "prefix", open: true}, h("summary", {text: `shared prefix: ${steps(0, k - 1)}`}),
      chosen.steps.slice(0, k).map((s, j) => stepCard(i, s, j, {prefix: "prefix"}))) : null,
    section(`after the fork (step ${k} on)`, "fork-section", grid),
    previewSection(i, view.formats, [], {pair: p.id})));
}

// ---- quarantine and export rows -------------------------------------------------------------------

async function quarantinedPage(r) {
  const view = await api(`/api/${r.source}/quarantined?${new URLSearchParams({id: r.arg})}`);
  fill(main, h("article", {class: "quarantined"}, h("h1", {class: "record-id", text: r.arg}),
    view.records.map((q) => {
      const parsed = maybeJson(q.raw);
      return h("div", {class: "quarantine-record"},
        h("div", {class: "badges"}, badge(`stage: ${q.stage}`, "stage"), q.created_at ? badge(q.created_at, "muted") : null),
        h("div", {class: "reason-box"}, h("h2", {text: "reason"}), h("p", {class: "quarantine-reason reason", text: q.error})),
        q.location ? h("p", {class: "location"}, "location: ", h("code", {text: q.location})) : null,
        h("h2", {text: "raw input"}), pre(parsed !== null ? pretty(parsed) : q.raw, "raw"));
    })));
}

function chatTurns(turns) {
  return h("div", {class: "chat"}, (turns || []).map((m) => {
    const role = m.role || m.from || "?";
    const calls = m.tool_calls || [];
    return h("div", {class: `turn role-${role}`},
      h("div", {class: "turn-head"}, h("span", {class: "role", text: role}), m.weight !== undefined ? badge(`weight ${m.weight}`, m.weight ? "ok" : "masked") : null,
        m.tool_call_id ? h("span", {class: "call-id", text: m.tool_call_id}) : null),
      m.reasoning_content ? collapsed("reasoning", "reasoning", pre(m.reasoning_content)) : null,
      (m.content ?? m.value) ? pre(m.content ?? m.value, "content") : null,
      calls.map((c) => h("div", {class: "call"}, h("span", {class: "function", text: c.function.name}),
        pre(typeof c.function.arguments === "string" ? pretty(maybeJson(c.function.arguments) ?? c.function.arguments) : pretty(c.function.arguments), "arguments"))));
  }));
}

const CONVERSATIONS = ["messages", "prompt", "completion", "chosen", "rejected", "conversations"];

function exportRow(row) {
  const scalars = Object.entries(row).filter(([k, v]) => !CONVERSATIONS.includes(k) && k !== "tools" && (v === null || typeof v !== "object"));
  const tools = maybeJson(row.tools) ?? row.tools;
  return h("div", {class: "export-row"},
    scalars.length ? h("dl", {class: "scalars"}, scalars.map(([k, v]) => [h("dt", {text: k}), h("dd", {text: v === null ? "null" : String(v)})])) : null,
    CONVERSATIONS.filter((k) => Array.isArray(row[k])).map((k) => h("div", {class: `conversation conv-${k}`}, h("h3", {text: k}), chatTurns(row[k]))),
    tools ? collapsed("tools", "tools", pre(pretty(tools))) : null);
}

async function exportRowPage(r) {
  const view = await api(`/api/${r.source}/row?n=${enc(r.arg)}`);
  fill(main, h("article", {class: "export-row-page"}, h("h1", {text: `row ${r.arg}${view.format ? ` (${view.format})` : ""}`}), exportRow(view.row)));
}

// ---- export preview -------------------------------------------------------------------------------

function tokenView(tokens) {
  const loss = tokens.filter(([, l]) => l).length;
  return h("div", {class: "token-row"}, h("p", {class: "muted"}, `${tokens.length} tokens, ${loss} carry loss`),
    h("div", {class: "tokens"}, tokens.map(([text, l]) => h("span", {class: l ? "tok loss" : "tok", title: l ? "loss" : "no loss"}, text))));
}

function previewSection(i, formats, tokenFormats, target) {
  if (!formats || !formats.length || SOURCES[i].kind !== "dataset") return null;
  const out = h("div", {class: "preview-out"});
  const select = h("select", {id: "preview-format"}, formats.map((f) => h("option", {value: f}, f)));
  const load = async () => {
    fill(out, h("p", {class: "muted"}, "rendering…"));
    try {
      const res = await api(`/api/${i}/preview?${new URLSearchParams({format: select.value, ...target})}`);
      fill(out, h("p", {class: "about", text: res.about}),
        res.skipped ? h("p", {class: "skipped"}, `the export skips this record: ${res.skipped}`) : null,
        res.rows.map((row, k) => h("div", {class: "preview-row"}, h("h3", {text: `row ${k + 1} of ${res.rows.length}`}), exportRow(row),
          res.tokens && res.tokens[k] ? tokenView(res.tokens[k]) : null)),
        res.tokens_error ? errorBox(`no token view: ${res.tokens_error}`) : null);
    } catch (err) { fill(out, errorBox(err.message)); }
  };
  select.addEventListener("change", load);
  const hint = tokenFormats.length ? "tokens that carry loss are highlighted" : "start with --tokenizer DIR to see which tokens carry loss";
  const sec = section("export preview", "preview", h("label", {}, "format ", select), h("span", {class: "muted"}, ` ${hint}`), out);
  load();
  return sec;
}

// ---- eval and improve reports ---------------------------------------------------------------------

function parts0() { return location.hash.replace(/^#\/?/, "").split(/[/?]/, 1)[0]; }

function drawReportNav(current) {
  fill(reportNav, REPORTS.map((x) => link(`#/report/${x.index}`, `${x.kind}: ${x.name}`, `tab report-tab ${current === x.index ? "active" : ""}`)));
}

const pct = (v) => (v === null || v === undefined ? "n/a" : `${(100 * v).toFixed(1)}%`);
const points = (v) => (v === null || v === undefined ? "n/a" : `${v >= 0 ? "+" : "−"}${Math.abs(100 * v).toFixed(1)}`);
const interval = (d) => (d ? `${points(d.mean)} points [${points(d.low)}, ${points(d.high)}]` : "n/a");
const reportTable = (cls, head, rows) => h("table", {class: `report-table ${cls}`},
  h("thead", {}, h("tr", {}, head.map((c) => h("th", {text: c})))),
  h("tbody", {}, rows));
const listHref = (source, params) => `#/${source}/trajectories?${new URLSearchParams(params)}`;

function plotsSection(r, files) {
  if (!files.length) return null;
  return section("plots", "plots", files.map((f) => h("figure", {},
    h("img", {class: "plot", src: `/report-media/${r}/${f.split("/").map(enc).join("/")}`, alt: f}), h("figcaption", {text: f}))));
}

function episodeChip(source, e) {
  const title = e.spoiled ? "spoiled by the simulated user (left out)" : e.success ? "success" : `failed: ${e.failed.join(", ") || "outcome"}`;
  const a = link(`#/${source}/t/${enc(e.id)}`, e.id, `episode ${e.spoiled ? "spoiled" : e.success ? "ok" : "bad"}`);
  a.title = title;
  a.dataset.id = e.id;
  return a;
}

function evalReport(view) {
  const src = view.source, k = view.k;
  const fails = (view.failures && view.failures.by_criterion) || {};
  // Failed episodes per criterion, from the episodes the page lists.
  const byCriterion = {};
  for (const t of view.tasks) for (const e of t.episodes) for (const c of e.failed) (byCriterion[c] = byCriterion[c] || []).push(e);
  const taskRow = (t) => h("tr", {"data-task": t.task},
    h("td", {class: "col-task"}, src !== null ? link(listHref(src, {task: t.task}), t.task, "task-link") : t.task),
    h("td", {text: `${t.successes}/${t.samples}`}),
    h("td", {class: "col-pass1", text: pct(t["pass@1"])}),
    h("td", {class: "col-passk", text: pct(t["pass@k"])}),
    h("td", {class: "col-passhatk", text: pct(t["pass^k"])}),
    h("td", {text: fmtNum(t.reward_mean)}),
    h("td", {class: "col-failures"}, Object.entries(t.failures || {}).map(([c, n]) => badge(`${c}: ${n}`, "bad criterion"))),
    h("td", {class: "col-episodes"}, src !== null ? t.episodes.map((e) => episodeChip(src, e)) : null,
      t.errors ? badge(`${t.errors} quarantined`, "muted") : null, t.user_spoiled ? badge(`${t.user_spoiled} spoiled by the user`, "muted") : null));
  return [
    h("h1", {text: `eval: ${view.name}`}),
    h("p", {class: "muted"}, view.path, src !== null ? [" · ", link(`#/${src}/trajectories`, "all episodes", "episodes-link")] : null),
    reportTable("headline", ["what", "value"], view.summary.map(([a, b]) => h("tr", {}, h("td", {text: a}), h("td", {text: b})))),
    section("pass@k", "pass-k", reportTable("pass-k-table", ["k", "pass@k", "pass^k", "tasks"],
      Object.entries(view.pass).map(([kk, v]) => h("tr", {}, h("td", {text: kk}), h("td", {text: pct(v["pass@k"])}), h("td", {text: pct(v["pass^k"])}), h("td", {text: String(v.tasks)}))))),
    section("failures by criterion", "failures", Object.keys(fails).length ? reportTable("failures-table", ["criterion", "failed episodes", "episodes"],
      Object.entries(fails).map(([c, n]) => h("tr", {"data-criterion": c}, h("td", {class: "criterion", text: c}), h("td", {text: String(n)}),
        h("td", {}, src !== null ? (byCriterion[c] || []).slice(0, 30).map((e) => episodeChip(src, e)) : null))))
      : h("p", {class: "muted"}, "no failed episode")),
    section(`tasks (${view.tasks.length})`, "tasks", reportTable("tasks-table", ["task", "solved", "pass@1", `pass@${k}`, `pass^${k}`, "reward", "failures", "episodes"],
      view.tasks.map(taskRow)),
      view.episodes_cut ? h("p", {class: "muted"}, `episodes listed for the first ${view.episodes_listed} only`) : null),
    plotsSection(view.index, view.plots),
  ];
}

function improveReport(view) {
  const rep = view.report, cmp = rep.comparison || {}, before = rep.before || {}, after = rep.after || {};
  const where = (path) => (path && view.links[path]) || {};
  const evalLink = (path, text) => {
    const w = where(path);
    return w.report !== undefined ? link(`#/report/${w.report}`, text, "eval-link") : w.source !== undefined ? link(`#/${w.source}/trajectories`, text, "eval-link") : h("span", {text: `${text} (${path || "?"})`});
  };
  const srcA = where(before.output).source, srcB = where(after.output).source;
  const taskEpisodes = (source, task, text) => source !== undefined ? link(listHref(source, {task}), text, "task-link") : null;
  const metrics = ["pass@1", "reward_mean", "steps_mean", "unusable_answers", "episodes", "wall_s"];
  const value = (key, v) => key === "pass@1" ? pct(v) : fmtNum(v);
  const rounds = Array.isArray(rep.rounds) ? rep.rounds : [];
  const roundRow = (x) => h("tr", {"data-round": x.round},
    h("td", {class: "col-round", text: String(x.round)}), h("td", {class: "col-pass1", text: pct(x["pass@1"])}),
    h("td", {class: "col-vs-baseline", text: interval(x.vs_baseline)}), h("td", {class: "col-vs-previous", text: x.vs_previous ? interval(x.vs_previous) : "–"}),
    h("td", {text: x.train_pass_at_k ? `pass@${x.train_pass_at_k.k} ${pct(x.train_pass_at_k.value)}` : "–"}),
    h("td", {text: Object.entries(x.rows || {}).map(([m, n]) => `${m}: ${n}`).join(", ") || "–"}),
    h("td", {text: x.trains_from || "–"}),
    h("td", {text: x.stage_seconds ? fmtNum(Object.values(x.stage_seconds).reduce((a, b) => a + (Number(b) || 0), 0)) + " s" : "–"}),
    h("td", {}, x.eval ? evalLink(x.eval, "eval") : "–"));
  const d = cmp.delta;
  return [
    h("h1", {text: `improve: ${view.name}`}),
    h("p", {class: "muted"}, view.path),
    reportTable("headline", ["what", "value"], [
      h("tr", {}, h("td", {text: "before"}), h("td", {}, `${pct(before["pass@1"])} · ${before.model || ""} · `, evalLink(before.output, "baseline eval"))),
      h("tr", {}, h("td", {text: "after"}), h("td", {}, `${pct(after["pass@1"])} · ${after.model || ""} · `, evalLink(after.output, "trained eval"))),
      h("tr", {class: "delta"}, h("td", {text: `difference after − before${d ? ` (${Math.round(100 * d.level)}% paired bootstrap interval)` : ""}`}), h("td", {class: "interval", text: interval(d)})),
      h("tr", {}, h("td", {text: "tasks in common"}), h("td", {text: String(cmp.tasks_in_common ?? "n/a")})),
      h("tr", {}, h("td", {text: "wall time"}), h("td", {text: `${fmtNum(rep.seconds)} s`})),
    ]),
    (cmp.warnings || []).map((w) => errorBox(`warning: ${w}`)),
    rounds.length ? section(`rounds (${rounds.length})`, "rounds", reportTable("rounds-table",
      ["round", "pass@1", "vs baseline", "vs previous round", "train pass@k", "training rows", "trains from", "time", "eval"], rounds.map(roundRow))) : null,
    section("before and after", "before-after", reportTable("before-after-table", ["", "before", "after"],
      metrics.map((m) => h("tr", {"data-metric": m}, h("td", {text: m}), h("td", {text: value(m, before[m])}), h("td", {text: value(m, after[m])}))))),
    section("per task group", "groups", reportTable("groups-table", ["group", "tasks", "before", "after", "difference"],
      (cmp.groups || []).map((g) => h("tr", {}, h("td", {text: g.group}), h("td", {text: String(g.tasks)}), h("td", {text: pct(g.a)}), h("td", {text: pct(g.b)}), h("td", {text: points(g.delta)}))))),
    section("per task", "per-task", reportTable("per-task-table", ["task", "before", "after", "difference", "episodes"],
      (cmp.per_task || []).map((t) => h("tr", {"data-task": t.task}, h("td", {text: t.task}), h("td", {text: pct(t.a)}), h("td", {text: pct(t.b)}),
        h("td", {text: points(t.delta)}), h("td", {}, taskEpisodes(srcA, t.task, "before"), " ", taskEpisodes(srcB, t.task, "after")))))),
    cmp.failures && Object.keys(cmp.failures).length ? section("failures by criterion", "failures", reportTable("failures-table", ["criterion", "before", "after"],
      Object.entries(cmp.failures).map(([c, v]) => h("tr", {"data-criterion": c}, h("td", {class: "criterion", text: c}), h("td", {text: String(v.a)}), h("td", {text: String(v.b)}))))) : null,
    plotsSection(view.index, view.plots),
    rep.stage_seconds ? collapsed("time per stage", "stage-seconds", pre(pretty(rep.stage_seconds))) : null,
    rep.lineage ? collapsed("lineage", "lineage", pre(pretty(rep.lineage))) : null,
    rep.warm_start ? collapsed("warm start", "warm-start", pre(pretty(rep.warm_start))) : null,
  ];
}

async function reportPage(r) {
  const view = await api(`/api/report/${r}`);
  fill(main, h("article", {class: `report ${view.kind}-report`, "data-report": r}, view.kind === "eval" ? evalReport(view) : improveReport(view)));
}

// ---- start ----------------------------------------------------------------------------------------

async function start() {
  try {
    [SOURCES, REPORTS] = await Promise.all([api("/api/sources"), api("/api/reports")]);
  } catch (err) { fill(main, errorBox(err.message)); return; }
  fill(sourceSelect, ...SOURCES.map((s) => h("option", {value: s.index}, `${s.name} (${s.kind === "export" ? s.format || "export" : `${s.counts.trajectories} trajectories`})`)));
  sourceSelect.addEventListener("change", () => { const s = SOURCES[Number(sourceSelect.value)]; location.hash = `#/${s.index}/${s.kind === "export" ? "rows" : "trajectories"}`; });
  window.addEventListener("hashchange", route);
  route();
}

start();
