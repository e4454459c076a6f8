/* The book's live calculators: run memlib (Python) in the reader's browser with Pyodide, no kernel, no network.
 *
 * Every element with class "memlib-live" was drawn by memlib.viz.live.render(kind, params) when the notebook ran.
 * This script only enables its controls, loads Pyodide (self-hosted under vendor/pyodide/, about 13 MB, fetched
 * on first use and then cached by the browser) and the memlib zip the book build wrote (live/memlib.zip, with
 * its content hash as ?v= in window.MEMLIB_LIVE), and calls render() again with the controls' values whenever one changes. No
 * number is computed here: the HTML comes back from Python. The book's Sphinx extension _ext/memlib_live.py adds
 * this script (and window.MEMLIB_LIVE) to the pages that hold a calculator, and to no other.
 * Without WebAssembly the static copy stays and the status line says why.
 */
(function () {
  "use strict";
  const script = document.currentScript;
  const siteRoot = new URL("..", script ? script.src : document.baseURI);  // this file is <root>/vendor/
  let python = null;  // Promise of the Pyodide render function, made on first use
  let loadStarted = 0;  // performance.now() at first use
  let firstDone = false;
  const phases = {};  // ms since first use at which each loading phase ended (the benchmark reads them)

  function status(root, text) {
    const line = root.querySelector(".memlib-live-status");
    if (line) line.textContent = text;
  }

  function setEnabled(root, enabled) {
    root.querySelectorAll(".memlib-live-controls [name]").forEach((el) => { el.disabled = !enabled; });
  }

  function loadScript(src) {
    return new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = src;
      s.onload = resolve;
      s.onerror = () => reject(new Error("could not load " + src));
      document.head.appendChild(s);
    });
  }

  function loadPython(report) {
    if (python) return python;
    loadStarted = performance.now();
    python = (async () => {
      const info = window.MEMLIB_LIVE || {};
      const indexURL = new URL("vendor/pyodide/", siteRoot).href;
      report("Loading Python (Pyodide, about 13 MB once, then cached): runtime…");
      await loadScript(indexURL + "pyodide.js");
      const pyodide = await window.loadPyodide({ indexURL, packages: [] });
      phases.runtime = performance.now() - loadStarted;
      report("Loading Python: memlib…");
      const response = await fetch(new URL(info.zip || "live/memlib.zip", siteRoot).href);
      if (!response.ok) throw new Error("memlib package: HTTP " + response.status);
      pyodide.unpackArchive(await response.arrayBuffer(), "zip", { extractDir: "/home/pyodide/memlib-live" });
      pyodide.runPython("import sys; sys.path.insert(0, '/home/pyodide/memlib-live')");
      const render = pyodide.pyimport("memlib.viz.live").render;
      phases.memlib = performance.now() - loadStarted;
      return render;
    })();
    return python;
  }

  function values(root, action) {
    const out = {};
    root.querySelectorAll(".memlib-live-controls [name]").forEach((el) => {
      if (el.tagName === "BUTTON") return;
      out[el.name] = el.value;
    });
    if (action) out.action = action;
    return out;
  }

  // Swap in the new render: only the parts whose HTML changed, so that a control being used keeps its focus.
  function apply(root, markup) {
    const tmp = document.createElement("div");
    tmp.innerHTML = markup;
    const fresh = tmp.firstElementChild;
    const last = root._memlibLast || {};
    for (const part of ["memlib-live-controls", "memlib-live-result"]) {
      const now = fresh.querySelector("." + part);
      const old = root.querySelector("." + part);
      if (now && old && last[part] !== now.outerHTML) {
        const focused = document.activeElement && old.contains(document.activeElement)
          ? document.activeElement.name : null;
        last[part] = now.outerHTML;
        old.replaceWith(now);
        if (focused) { const f = now.querySelector(`[name="${focused}"]`); if (f) f.focus(); }
      }
    }
    root._memlibLast = last;
  }

  async function update(root, action) {
    const kind = root.dataset.kind;
    try {
      const render = await loadPython((text) => status(root, text));
      const t0 = performance.now();
      const markup = render.callKwargs(kind, JSON.stringify(values(root, action)), { live: true });
      apply(root, markup);
      const now = performance.now();
      root.dataset.lastMs = (now - t0).toFixed(1);  // this update: Python's render + the DOM swap
      root.dataset.updates = String(Number(root.dataset.updates || 0) + 1);
      if (!firstDone) {
        firstDone = true;
        root.dataset.startupMs = (now - loadStarted).toFixed(0);  // first use -> first result
        root.dataset.phases = JSON.stringify({ runtime: Math.round(phases.runtime), memlib: Math.round(phases.memlib) });
        status(root, `Live: memlib ran in your browser (first result ${((now - loadStarted) / 1000).toFixed(1)} s `
          + "after first use, Python included).");
      } else {
        status(root, "Live: memlib ran in your browser.");
      }
    } catch (err) {
      status(root, "The live calculator failed (" + (err && err.message ? err.message.split("\n").slice(-2).join(" ")
        : err) + "); the figure above is the static version.");
      root.dataset.error = "1";
    }
  }

  function wire(root) {
    if (typeof WebAssembly !== "object" || typeof WebAssembly.instantiate !== "function") {
      status(root, "This browser has no WebAssembly, so the calculator cannot run here: the figure above is "
        + "the static version; in Jupyter or Colab the widget below computes it.");
      return;
    }
    setEnabled(root, true);
    status(root, "Live: change a control to recompute it with memlib in your browser "
      + "(the first change loads Python, about 13 MB once).");
    // A pointer pressed on (or focus moved into) a calculator starts loading Python before the value changes.
    const warm = () => loadPython((text) => status(root, text)).catch(() => {});
    root.addEventListener("pointerdown", warm, { once: true });
    root.addEventListener("focusin", warm, { once: true });
    root.addEventListener("change", (ev) => {  // a text field recomputes on change only if it asks to
      if (ev.target.name && (ev.target.type !== "text" || ev.target.dataset.recompute === "change")) update(root);
    });
    root.addEventListener("input", (ev) => {  // a range's label follows the thumb; the result on release
      if (ev.target.type === "range") {
        const out = ev.target.parentElement.querySelector("output");
        if (out) out.textContent = ev.target.value;
      }
    });
    root.addEventListener("click", (ev) => {
      const button = ev.target.closest("button[name=action]");
      if (button && root.contains(button)) update(root, button.value);
    });
    root.addEventListener("keydown", (ev) => {  // Enter in a text field: its data-enter action (the drill's Check)
      if (ev.key === "Enter" && ev.target.type === "text") { ev.preventDefault(); update(root, ev.target.dataset.enter); }
    });
  }

  function init() { document.querySelectorAll(".memlib-live").forEach(wire); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
