// The inbox's keys: j/k move, a approves (twice for a high-risk call), r opens the rejection
// note, x selects for a bulk decision, o (or Enter) opens. New cards are announced.
(function () {
  "use strict";

  var selectedId = null;
  var selectedIndex = 0;
  var armedId = null;  // a high-risk card whose first "a" asked for a second one

  function cards() {
    return Array.prototype.slice.call(document.querySelectorAll("#inbox-cards > .card:not(.decided):not(.deciding)"));
  }

  function current() {
    var list = cards();
    return list.find(function (card) { return card.id === selectedId; }) || null;
  }

  function select(card) {
    cards().forEach(function (other) {
      other.classList.toggle("selected", other === card);
      other.removeAttribute("aria-current");
    });
    selectedId = card ? card.id : null;
    disarm();
    if (card) {
      selectedIndex = cards().indexOf(card);
      card.setAttribute("aria-current", "true");
      card.scrollIntoView({ block: "nearest" });
      var summary = card.querySelector(".summary");
      if (summary) summary.focus({ preventScroll: true });
    }
  }

  function move(step) {
    var list = cards();
    if (!list.length) return;
    var index = list.indexOf(current());
    select(list[index < 0 ? 0 : Math.min(list.length - 1, Math.max(0, index + step))]);
  }

  function status(card, text) {
    var line = card.querySelector(".card-status");
    if (line) line.textContent = text;
  }

  function disarm() {
    var armed = armedId && document.getElementById(armedId);
    if (armed) {
      armed.classList.remove("armed");
      status(armed, "");
    }
    armedId = null;
  }

  function approve(card, control) {
    if (card.dataset.risk === "high" && armedId !== card.id) {
      disarm();
      armedId = card.id;
      card.classList.add("armed");
      status(card, "High risk: press a again to approve, Esc to cancel.");
      return;
    }
    disarm();
    control.click();
  }

  function act(card, action) {
    var control = card && card.querySelector('[data-action="' + action + '"]');
    if (action === "pick") {
      var box = card.querySelector("input.pick");
      if (box && !box.disabled) {
        box.checked = !box.checked;
        updateBulk();
      }
      return;
    }
    if (!control) return;
    var answer = card.querySelector("input[name=answer]");
    if (action === "approve" && answer && !answer.value.trim()) {
      answer.focus();  // a question is approved with an answer, never without one
    } else if (action === "approve") {
      approve(card, control);
    } else if (action === "reject") {
      control.parentElement.open = true;
      control.parentElement.querySelector("textarea").focus();
    } else {
      control.click();
    }
  }

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && armedId) {
      disarm();
      event.preventDefault();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || event.target.closest("input, textarea, select, [contenteditable], dialog")) return;
    var card = current();
    var actions = { a: "approve", r: "reject", o: "open", Enter: "open", x: "pick" };
    if (event.key === "Enter" && event.target.closest("a, button, summary")) return;  // the focused control's own Enter
    if (event.key === "j") move(1);
    else if (event.key === "k") move(-1);
    else if (actions[event.key] && card) act(card, actions[event.key]);
    else return;
    event.preventDefault();
  });

  // Enter (Ctrl+Enter too) in the bulk note picks no decision: the form's first button would
  // approve every picked card, with a note mostly written for a rejection. Its buttons decide.
  document.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && event.target.matches && event.target.matches("#bulk-form input[name=note]")) {
      event.preventDefault();
      event.stopPropagation();
    }
  }, true);

  // A selected card that was decided (here or elsewhere) hands the selection to its neighbour;
  // a swap that replaced the selected card's element (a list refresh) keeps it selected.
  function reselect() {
    if (!selectedId) return;
    var card = current();
    if (!card) select(cards()[Math.min(selectedIndex, cards().length - 1)] || null);
    else if (!card.classList.contains("selected")) select(card);
  }
  document.addEventListener("htmx:wsAfterMessage", reselect);
  document.addEventListener("htmx:afterSettle", reselect);

  // Bulk: the buttons say how many cards they decide, and are off with none selected.
  function updateBulk() {
    var picked = document.querySelectorAll("#inbox-cards input.pick:checked:not(:disabled)").length;
    var count = document.querySelector("#bulk-form .bulk-count");
    if (count) count.textContent = picked + " selected";
    document.querySelectorAll("#bulk-form [data-bulk]").forEach(function (button) { button.disabled = picked === 0; });
  }
  document.addEventListener("change", function (event) {
    if (event.target.matches("input.pick")) updateBulk();
  });
  document.addEventListener("agentfast:selection", updateBulk);
  document.addEventListener("htmx:afterSettle", updateBulk);
  document.addEventListener("htmx:wsAfterMessage", updateBulk);

  // Screen readers hear each card that slides in live.
  document.addEventListener("htmx:oobAfterSwap", function (event) {
    var target = event.detail.target;
    if (!target || target.id !== "inbox-cards") return;
    var card = document.getElementById(target.dataset.lastArrival || "");
    var announcer = document.getElementById("announcer");
    if (!card || !announcer) return;
    var summary = card.querySelector(".summary");
    announcer.textContent = "New approval: " + (summary ? summary.textContent.trim() : "a call waits for a decision");
  });
})();
