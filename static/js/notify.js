// Desktop notifications, opt-in: a card that arrives while the tab is hidden pops up a notification.
(function () {
  "use strict";

  var KEY = "agentfast.notifications";
  var toggle = document.getElementById("notify-toggle");
  if (!toggle) return;

  function supported() { return "Notification" in window; }
  function enabled() { return supported() && localStorage.getItem(KEY) === "on" && Notification.permission === "granted"; }

  function render() {
    if (!supported()) {
      toggle.disabled = true;
      toggle.textContent = "Desktop notifications unavailable";
      return;
    }
    var on = enabled();
    toggle.setAttribute("aria-pressed", on ? "true" : "false");
    toggle.textContent = on ? "Desktop notifications: on" : "Desktop notifications: off";
    if (Notification.permission === "denied") toggle.title = "Notifications are blocked for this site in the browser's settings.";
  }

  toggle.addEventListener("click", function () {
    if (enabled()) {
      localStorage.setItem(KEY, "off");
      render();
      return;
    }
    Notification.requestPermission().then(function (permission) {
      localStorage.setItem(KEY, permission === "granted" ? "on" : "off");
      render();
    });
  });

  // A live push adds a card to #inbox-cards: tell a reviewer who is looking elsewhere.
  document.addEventListener("htmx:oobAfterSwap", function (event) {
    if (!enabled() || document.visibilityState === "visible") return;
    var target = event.detail.target;
    if (!target || target.id !== "inbox-cards") return;
    var card = document.getElementById(target.dataset.lastArrival || "");  // app.js names the card that arrived
    if (!card) return;
    var summary = card.querySelector(".summary");
    var tool = card.querySelector(".card-line code");
    var what = (summary ? summary.textContent.trim() : "") + (tool ? " (" + tool.textContent + ")" : "");
    var shown = new Notification("agentfast: a call needs your decision", {
      body: (what ? what + " · " : "") + document.title,
      tag: card.id,
    });
    shown.onclick = function () { window.focus(); shown.close(); };
  });

  render();
})();
