"""The report's inline style and script (no network, no CDN: the file opens offline)."""

CSS = """
:root { --red: #c0392b; --amber: #d68910; --green: #1e8449; --ink: #1b1f24; --dim: #5f6b76; --line: #d8dde3; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); margin: 0;
       background: #f6f7f9; }
header, section { background: #fff; margin: 12px 16px; padding: 12px 18px;
  border: 1px solid var(--line); border-radius: 6px; }
h1 { font-size: 20px; margin: 0 0 6px; }
h2 { font-size: 17px; margin: 4px 0 8px; }
h3 { font-size: 14px; margin: 14px 0 6px; }
.sub, .dim { color: var(--dim); font-size: 12px; }
.verdict { display: inline-block; padding: 2px 10px; border-radius: 4px; font-weight: 700; letter-spacing: .04em;
           text-transform: uppercase; color: #fff; background: var(--dim); }
.verdict.bad { background: var(--red); }
.verdict.warn { background: var(--amber); }
.verdict.good { background: var(--green); }
.headline { font-size: 15px; margin: 8px 0 0; }
table { border-collapse: collapse; margin: 4px 0; }
th, td { border: 1px solid var(--line); padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #eef1f4; font-weight: 600; }
tr.culprit td.rank { font-weight: 700; color: var(--red); background: #fdecea; }
table.divergence tr.culprit td { background: #fdecea; }
td.site, code, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12px; }
pre { background: #f3f5f7; padding: 8px; overflow: auto; max-height: 420px; margin: 4px 0; }
.lanes { overflow-x: auto; }
.lanes td { min-width: 96px; font-size: 12px; }
.lanes td.at { outline: 2px solid var(--red); outline-offset: -2px; }
.lanes td.mismatch { background: #fdecea; }
.lanes td.open { font-style: italic; }
.lanes td.none { color: var(--dim); background: #fafafa; }
.lanes th.at { background: #f9d6d2; }
.cell-op { font-weight: 600; } .cell-site { display: block; color: var(--dim); font-family: ui-monospace, monospace; }
svg.timeline { background: #fff; border: 1px solid var(--line); display: block; margin: 6px 0;
  max-width: 100%; height: auto; }
svg text { font: 11px system-ui, sans-serif; fill: var(--ink); }
svg text.rank { font-weight: 700; } svg text.row { fill: var(--dim); }
svg text.tick { fill: var(--dim); font-size: 10px; } svg line.tick { stroke: #eceff2; }
svg rect.call { stroke: none; opacity: .9; cursor: pointer; }
svg rect.call.open { stroke: var(--amber); stroke-width: 1.5; }
svg rect.call.div { stroke: var(--red); stroke-width: 2; }
svg rect.call.sel { stroke: #000; stroke-width: 2; opacity: 1; }
svg rect.mark { fill: #f5b7b1; opacity: .55; } svg rect.mark.controller { fill: #aed6f1; }
svg path.mark { fill: var(--amber); }
svg text.marklabel { font-size: 10px; fill: #78281f; pointer-events: none; }
svg text.more { font-size: 10px; fill: #fff; font-weight: 600; }
svg line.pair { stroke: #9aa5b1; stroke-width: 1; } svg line.pair.bad { stroke: var(--red); stroke-width: 1.5; }
svg g.divmark line { stroke: var(--red); stroke-width: 2; }
svg g.divmark text { fill: var(--red); font-weight: 700; font-size: 10px; }
#detail { position: fixed; right: 16px; bottom: 16px; max-width: 460px; background: #1b1f24; color: #fff;
          padding: 8px 12px; border-radius: 6px; white-space: pre-wrap; font: 12px ui-monospace, monospace;
          display: none; box-shadow: 0 2px 10px rgba(0,0,0,.3); }
details summary { cursor: pointer; font-weight: 600; }
nav a { margin-right: 12px; }
"""

# Clicking a call shows its details and outlines the calls it paired with on the
# other ranks (same data-k: channel|seq); Escape or a click elsewhere clears it.
JS = """
(function () {
  "use strict";
  var panel = document.getElementById("detail");
  function clear() {
    document.querySelectorAll("rect.call.sel").forEach(function (r) { r.classList.remove("sel"); });
    if (panel) { panel.style.display = "none"; }
  }
  document.addEventListener("click", function (ev) {
    var t = ev.target;
    if (!(t instanceof Element) || !t.matches("rect.call")) { clear(); return; }
    clear();
    var key = t.getAttribute("data-k");
    var text = [];
    t.ownerSVGElement.querySelectorAll("rect.call").forEach(function (r) {
      if (r.getAttribute("data-k") === key) {
        r.classList.add("sel");
        var title = r.querySelector("title");
        if (title) { text.push(title.textContent); }
      }
    });
    if (panel) { panel.textContent = text.join("\\n\\n"); panel.style.display = "block"; }
  });
  document.addEventListener("keydown", function (ev) { if (ev.key === "Escape") { clear(); } });
  document.body.setAttribute("data-ready", "1");
})();
"""
