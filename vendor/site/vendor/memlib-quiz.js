/* The GPU Memory Book's interview trainer on the static page: no kernel, no network.
 *
 * Reads window.MEMLIB_QUIZ_BANK (memlib-quiz-bank.js, written at build time by _ext/memlib_quiz.py from
 * memlib.drills.practice.export_bank: every concept question and numeric drills whose values memlib computed)
 * and fills each element of class "memlib-quiz": shuffled questions, filters, a language toggle, reveal and
 * self-grade buttons, Leitner boxes in localStorage, progress, weakest topics and a timed mock interview.
 * The rules are memlib.drills.practice's: again -> box 1, hard -> same box, good -> next box (at most 5).
 */
(function () {
  "use strict";
  var KEY = "memlib-quiz-v1";

  function load() {
    try {
      var s = JSON.parse(window.localStorage.getItem(KEY) || "null");
      if (s && typeof s.boxes === "object" && Array.isArray(s.history)) return s;
    } catch (e) { /* a private window or a corrupt entry: start afresh */ }
    return { boxes: {}, history: [] };
  }
  function save(s) {
    try { window.localStorage.setItem(KEY, JSON.stringify(s)); } catch (e) { /* storage off: keep in memory */ }
  }
  function esc(t) {
    return String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function md(t) {  // the bank's Markdown: **bold** and `code` only
    return esc(t).replace(/\*\*(.+?)\*\*/g, "<strong>$1</strong>").replace(/`([^`]+)`/g, "<code>$1</code>");
  }
  function el(tag, attrs, html) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (html !== undefined) e.innerHTML = html;
    return e;
  }
  function shuffle(a) {
    for (var i = a.length - 1; i > 0; i--) {
      var j = Math.floor(Math.random() * (i + 1)), t = a[i]; a[i] = a[j]; a[j] = t;
    }
    return a;
  }
  function select(name, label, options) {
    var wrap = el("label", {}, esc(label) + " ");
    var s = el("select", { name: name });
    options.forEach(function (o) { s.appendChild(el("option", { value: o[0] }, esc(o[1]))); });
    wrap.appendChild(s);
    return wrap;
  }

  function Quiz(root, bank) {
    this.root = root; this.bank = bank; this.state = load();
    this.queue = []; this.card = null; this.mock = null; this.timer = null;
    this.build();
    this.newSet();
  }

  Quiz.prototype.build = function () {
    var b = this.bank, self = this, r = this.root;
    r.innerHTML = "";
    var topics = [["", "all topics / 全部"]].concat(Object.keys(b.topics).map(function (t) {
      return [t, t + " / " + b.topics[t]];
    }));
    var bar = el("div", { "class": "memlib-quiz-controls" });
    bar.appendChild(select("topic", "Topic", topics));
    bar.appendChild(select("frequency", "Frequency", [["", "any"], ["high", "high"], ["medium", "medium"], ["low", "low"]]));
    bar.appendChild(select("difficulty", "Difficulty", [["", "any"], ["E", "E"], ["M", "M"], ["H", "H"]]));
    bar.appendChild(select("lang", "Language", [["en", "English"], ["zh", "中文"], ["both", "both / 双语"]]));
    bar.appendChild(el("button", { type: "button", "data-action": "new" }, "New set"));
    var mock = el("span", { "class": "memlib-quiz-mock-controls" });
    mock.appendChild(el("label", {}, "Mock interview: <input name=\"mock_n\" type=\"number\" min=\"1\" max=\"30\" value=\"5\"> questions × " +
      "<input name=\"mock_s\" type=\"number\" min=\"5\" max=\"600\" value=\"" + (r.dataset.seconds || 90) + "\"> s "));
    mock.appendChild(el("button", { type: "button", "data-action": "mock" }, "Start"));
    bar.appendChild(mock);
    r.appendChild(bar);
    this.cardBox = r.appendChild(el("div", { "class": "memlib-quiz-card", "aria-live": "polite" }));
    this.progress = r.appendChild(el("div", { "class": "memlib-quiz-progress" }));
    this.weakest = r.appendChild(el("div", { "class": "memlib-quiz-weakest" }));
    this.report = r.appendChild(el("div", { "class": "memlib-quiz-report", hidden: "" }));
    r.addEventListener("click", function (e) {
      var t = e.target.closest("button");
      if (!t || !r.contains(t)) return;
      if (t.dataset.grade) self.grade(t.dataset.grade);
      else if (t.dataset.action) self.act(t.dataset.action);
    });
    r.addEventListener("change", function (e) {
      if (e.target.name === "lang") self.show();
      else if (["topic", "frequency", "difficulty"].indexOf(e.target.name) >= 0) self.newSet();
    });
    r.addEventListener("keydown", function (e) {
      if (e.target.name === "answer" && e.key === "Enter") { e.preventDefault(); self.act("check"); }
    });
    this.showProgress();
  };

  Quiz.prototype.value = function (name) { return this.root.querySelector("[name=" + name + "]").value; };

  Quiz.prototype.pool = function () {
    var f = { topic: this.value("topic"), frequency: this.value("frequency"), difficulty: this.value("difficulty") };
    var seenKind = {}, st = this.state;
    var cards = shuffle(this.bank.cards.filter(function (c) {
      if (f.topic && c.topic !== f.topic) return false;
      if (f.frequency && c.frequency !== f.frequency) return false;
      if (f.difficulty && c.difficulty !== f.difficulty) return false;
      return true;
    })).filter(function (c) {  // one drill of each numeric kind per set
      if (c.kind !== "numeric") return true;
      var k = c.id.split(":")[1];
      if (seenKind[k]) return false;
      seenKind[k] = true; return true;
    });
    return cards.sort(function (a, b) { return (st.boxes[a.id] || 1) - (st.boxes[b.id] || 1); });
  };

  Quiz.prototype.newSet = function () {
    this.stopMock();
    this.queue = this.pool();
    this.next();
  };

  Quiz.prototype.next = function () {
    this.card = this.queue.shift() || null;
    this.revealed = false;
    this.show();
    if (this.mock) this.startTimer();
  };

  Quiz.prototype.text = function (en, zh) {
    var lang = this.value("lang");
    if (lang === "zh") return zh || en;
    if (lang === "both" && zh) return en + "<br>" + zh;
    return en;
  };

  Quiz.prototype.show = function () {
    var c = this.card, box = this.cardBox;
    if (!c) {
      box.innerHTML = "<p>No question matches these filters. Choose another topic, frequency or difficulty.</p>";
      return;
    }
    var pos = this.mock ? "Question " + (this.mock.asked.length + 1) + " of " + this.mock.n + " · " : "";
    var html = "<p class=\"memlib-quiz-meta\">" + esc(pos) + "[" + esc(c.difficulty) + "] [" + esc(c.topic) + "] · " +
      esc(c.frequency) + " frequency · box " + (this.state.boxes[c.id] || 1) +
      (this.mock ? " · <span class=\"memlib-quiz-timer\"></span>" : "") + "</p>" +
      "<p class=\"memlib-quiz-question\">" + this.text(md(c.text), md(c.text_zh)) + "</p>";
    if (c.kind === "numeric") {
      html += "<p><label>Your answer (" + esc(c.unit) + "): <input name=\"answer\" type=\"text\" autocomplete=\"off\"></label> " +
        "<button type=\"button\" data-action=\"check\">Check</button> " +
        "<button type=\"button\" data-action=\"hint\">Hint</button></p>" +
        "<p class=\"memlib-quiz-hint\" hidden>Hint: " + md(c.hint) + "</p><p class=\"memlib-quiz-check\"></p>";
    }
    html += "<p><button type=\"button\" data-action=\"reveal\">Reveal the answer</button></p>" +
      "<div class=\"memlib-quiz-answer\"" + (this.revealed ? "" : " hidden") + ">" +
      "<p><strong>Say first:</strong> " + this.text(md(c.say), md(c.say_zh)) + "</p>" +
      "<p><strong>Deep dive:</strong> " + md(c.answer) + "</p>" +
      "<p><em>Proved in <a href=\"../chapters/" + esc(c.page) + ".html\">Chapter " + c.chapter + "</a> (" +
      esc(c.chapter_title) + ").</em></p></div>" +
      "<p class=\"memlib-quiz-grades\">How did you do? " +
      "<button type=\"button\" data-grade=\"again\"" + (this.revealed ? "" : " disabled") + ">Again</button> " +
      "<button type=\"button\" data-grade=\"hard\"" + (this.revealed ? "" : " disabled") + ">Hard</button> " +
      "<button type=\"button\" data-grade=\"good\"" + (this.revealed ? "" : " disabled") + ">Good</button></p>";
    box.innerHTML = html;
    this.tick();
  };

  Quiz.prototype.act = function (action) {
    var c = this.card;
    if (action === "new") return this.newSet();
    if (action === "mock") return this.startMock();
    if (!c) return;
    if (action === "reveal") {
      this.revealed = true;
      this.cardBox.querySelector(".memlib-quiz-answer").hidden = false;
      this.cardBox.querySelectorAll("[data-grade]").forEach(function (b) { b.disabled = false; });
    } else if (action === "hint") {
      this.cardBox.querySelector(".memlib-quiz-hint").hidden = false;
    } else if (action === "check") {
      var got = parseFloat(String(this.value("answer")).replace(/,/g, "").replace(/[^0-9eE.+-].*$/, ""));
      var tol = Math.max(c.abs_tol, c.rel_tol * Math.abs(c.value));
      var msg = isNaN(got) ? "Type a number in " + c.unit + "." :
        Math.abs(got - c.value) <= tol ? "Right (within " + c.tolerance + ")." :
        "Not quite: " + (got > c.value ? "too high" : "too low") + ".";
      this.cardBox.querySelector(".memlib-quiz-check").textContent = msg;
    }
  };

  Quiz.prototype.grade = function (g) {
    var c = this.card;
    if (!c || !this.revealed) return;
    var st = this.state, box = st.boxes[c.id] || 1;
    st.boxes[c.id] = g === "again" ? 1 : g === "hard" ? box : Math.min(box + 1, this.bank.boxes);
    st.history.push({ id: c.id, topic: c.topic, grade: g });
    save(st);
    if (this.mock) {
      this.mock.asked.push({ topic: c.topic, grade: g, late: this.mock.left < 0 });
      if (this.mock.asked.length >= this.mock.n) { this.showProgress(); return this.endMock(); }
    }
    this.showProgress();
    this.next();
  };

  Quiz.prototype.byTopic = function () {
    var out = {};
    this.state.history.forEach(function (h) {
      var r = out[h.topic] = out[h.topic] || { again: 0, hard: 0, good: 0 };
      r[h.grade] += 1;
    });
    return out;
  };

  Quiz.prototype.showProgress = function () {
    var st = this.state, ids = Object.keys(st.boxes), counts = [0, 0, 0, 0, 0];
    ids.forEach(function (id) { counts[Math.min(st.boxes[id], 5) - 1] += 1; });
    var good = st.history.filter(function (h) { return h.grade === "good"; }).length;
    this.progress.dataset.practised = String(ids.length);
    this.progress.innerHTML = ids.length ?
      "<strong>Practised " + ids.length + " question" + (ids.length === 1 ? "" : "s") + "</strong> (" +
      st.history.length + " grades, " + good + " good) · Leitner boxes 1–5: " + counts.join(" / ") +
      "" :
      "Nothing practised yet: reveal an answer and grade yourself; your progress stays in this browser.";
    var by = this.byTopic(), rows = Object.keys(by).map(function (t) {
      var r = by[t], n = r.again + r.hard + r.good;
      return [t, r.good / n, n];
    }).sort(function (a, b) { return a[1] - b[1] || (a[0] < b[0] ? -1 : 1); }).slice(0, 3);
    this.weakest.innerHTML = rows.length ? "Weakest topics: " + rows.map(function (r) {
      return esc(r[0]) + " (" + Math.round(100 * r[1]) + " % good of " + r[2] + ")";
    }).join("; ") : "";
  };

  Quiz.prototype.startMock = function () {
    var n = Math.max(1, parseInt(this.value("mock_n"), 10) || 5);
    var s = Math.max(1, parseInt(this.value("mock_s"), 10) || 90);
    this.stopMock();
    this.queue = this.pool().slice(0, n);
    this.mock = { n: Math.min(n, this.queue.length), seconds: s, asked: [], left: s };
    this.report.hidden = true;
    this.next();
  };

  Quiz.prototype.startTimer = function () {
    var self = this;
    clearInterval(this.timer);
    this.mock.left = this.mock.seconds;
    this.tick();
    this.timer = setInterval(function () {
      self.mock.left -= 1; self.tick();
      if (self.mock.left === 0 && !self.revealed) self.act("reveal");
    }, 1000);
  };

  Quiz.prototype.tick = function () {
    var t = this.cardBox.querySelector(".memlib-quiz-timer");
    if (t && this.mock) t.textContent = this.mock.left >= 0 ? this.mock.left + " s left" : "time is up";
  };

  Quiz.prototype.stopMock = function () { clearInterval(this.timer); this.mock = null; };

  Quiz.prototype.endMock = function () {
    var m = this.mock, by = {};
    this.stopMock();
    m.asked.forEach(function (a) {
      var r = by[a.topic] = by[a.topic] || { asked: 0, good: 0, late: 0 };
      r.asked += 1; r.good += a.grade === "good" ? 1 : 0; r.late += a.late ? 1 : 0;
    });
    var good = m.asked.filter(function (a) { return a.grade === "good"; }).length;
    this.report.innerHTML = "<h3>Mock interview report: " + good + " of " + m.asked.length + " good</h3>" +
      "<table><thead><tr><th>topic</th><th>asked</th><th>good</th><th>over time</th></tr></thead><tbody>" +
      Object.keys(by).sort().map(function (t) {
        var r = by[t];
        return "<tr><th scope=\"row\">" + esc(t) + "</th><td>" + r.asked + "</td><td>" + r.good + "</td><td>" + r.late + "</td></tr>";
      }).join("") + "</tbody></table>";
    this.report.hidden = false;
    this.cardBox.innerHTML = "<p>The mock interview is over: its report is below. Start another, or press New set.</p>";
  };

  function init() {
    var bank = window.MEMLIB_QUIZ_BANK;
    document.querySelectorAll(".memlib-quiz").forEach(function (root) {
      if (!bank) { root.textContent = "The question bank did not load (memlib-quiz-bank.js)."; return; }
      root.memlibQuiz = new Quiz(root, bank);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
