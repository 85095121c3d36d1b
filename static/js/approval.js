// The approval page's keys: a approves, r writes a rejection, e edits the arguments, n goes to
// the next pending call. A decision taken elsewhere turns the buttons off, keeping what was typed.
(function () {
  "use strict";

  var armed = false;

  function form() {
    return document.querySelector("#decision form");
  }

  function notice(text) {
    var line = document.querySelector("#decision .key-notice");
    if (!line) {
      var panel = document.getElementById("decision");
      if (!panel) return;
      line = document.createElement("p");
      line.className = "notice key-notice";
      line.setAttribute("role", "status");
      panel.insertBefore(line, panel.querySelector("form"));
    }
    line.textContent = text;
  }

  function approve() {
    var decision = form();
    var button = decision && decision.querySelector("button[value=approved]:not(:disabled)");
    if (!button) return;
    var head = document.querySelector(".approval-head");
    if (head && head.dataset.risk === "high" && !armed) {
      armed = true;
      notice("High risk: press a again to approve, Esc to cancel.");
      return;
    }
    armed = false;
    notice("");
    button.click();
  }

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && armed) {
      armed = false;
      notice("");
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || event.target.closest("input, textarea, select, [contenteditable], dialog")) return;
    var decision = form();
    if (event.key === "a") approve();
    else if (event.key === "r" && decision && decision.elements.note) {
      decision.dataset.intent = "rejected";
      notice("");
      decision.elements.note.focus();
    } else if (event.key === "e" && decision && decision.elements.arguments) {
      decision.dataset.intent = "approved";
      notice("");
      decision.elements.arguments.focus();
    } else if (event.key === "n") {
      var next = document.querySelector("[data-next]");
      if (next) next.click(); else return;
    } else return;
    event.preventDefault();
  });

  // Ctrl+Enter in a field before r or e chose a decision: nothing is sent, and the line says why.
  document.addEventListener("keys:undecided", function () {
    notice("Nothing sent: choose Approve or Reject (Esc, then a or r).");
  });

  // Someone else decided while this page was open: say so, and keep the reviewer's text.
  document.addEventListener("htmx:wsAfterMessage", function () {
    var badge = document.getElementById("approval-status");
    var decision = form();
    if (!badge || !decision || badge.textContent.trim() === "pending") return;
    decision.querySelectorAll("button").forEach(function (button) { button.disabled = true; });
    decision.querySelectorAll("textarea, input").forEach(function (field) { field.readOnly = true; });
    var live = document.querySelector("#approval-live .live-status");
    notice((live ? live.textContent.trim() : "Decided elsewhere") + ". Your text is kept; nothing was sent.");
  });
})();
