// The inbox's keys: j/k move, a approves, r opens the rejection note, o (or Enter) opens.
(function () {
  "use strict";

  var selectedId = null;
  var selectedIndex = 0;

  function cards() {
    return Array.prototype.slice.call(document.querySelectorAll("#inbox-cards > .card:not(.decided):not(.deciding)"));
  }

  function current() {
    var list = cards();
    return list.find(function (card) { return card.id === selectedId; }) || null;
  }

  function select(card) {
    cards().forEach(function (other) { other.classList.toggle("selected", other === card); });
    selectedId = card ? card.id : null;
    if (card) {
      selectedIndex = cards().indexOf(card);
      card.scrollIntoView({ block: "nearest" });
    }
  }

  function move(step) {
    var list = cards();
    if (!list.length) return;
    var index = list.indexOf(current());
    select(list[index < 0 ? 0 : Math.min(list.length - 1, Math.max(0, index + step))]);
  }

  function act(card, action) {
    var control = card && card.querySelector('[data-action="' + action + '"]');
    if (!control) return;
    var answer = card.querySelector("input[name=answer]");
    if (action === "approve" && answer && !answer.value.trim()) {
      answer.focus();  // a question is approved with an answer, never without one
    } else if (action === "reject") {
      control.parentElement.open = true;
      control.parentElement.querySelector("textarea").focus();
    } else {
      control.click();
    }
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.target.closest("input, textarea, select, [contenteditable]")) return;
    var card = current();
    var actions = { a: "approve", r: "reject", o: "open", Enter: "open" };
    if (event.key === "j") move(1);
    else if (event.key === "k") move(-1);
    else if (actions[event.key] && card) act(card, actions[event.key]);
    else return;
    event.preventDefault();
  });

  // A selected card that was decided (here or elsewhere) hands the selection to its neighbour.
  function reselect() {
    var list = cards();
    if (selectedId && !current()) select(list[Math.min(selectedIndex, list.length - 1)] || null);
  }
  document.addEventListener("htmx:wsAfterMessage", reselect);
  document.addEventListener("htmx:afterSettle", reselect);
})();
