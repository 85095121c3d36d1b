// agentfast: live countdowns to deadlines, <time data-deadline datetime="…">. Plain script, no build step.
(function () {
  "use strict";

  // "1 h 04 min", "3 min 09 s", "12 s"; "now" once the deadline has passed (the server acts on it).
  function left(until) {
    var seconds = Math.floor((until - Date.now()) / 1000);
    if (seconds <= 0) return "now";
    var hours = Math.floor(seconds / 3600);
    var minutes = Math.floor((seconds % 3600) / 60);
    var rest = seconds % 60;
    function two(n) { return (n < 10 ? "0" : "") + n; }
    if (hours >= 48) return Math.floor(hours / 24) + " d " + (hours % 24) + " h";
    if (hours) return hours + " h " + two(minutes) + " min";
    if (minutes) return minutes + " min " + two(rest) + " s";
    return rest + " s";
  }

  function tick() {
    document.querySelectorAll("time[data-deadline]").forEach(function (node) {
      var at = Date.parse(node.getAttribute("datetime"));
      if (isNaN(at)) return;
      node.textContent = left(at);
      node.classList.toggle("due", at <= Date.now());
      node.classList.toggle("soon", at > Date.now() && at - Date.now() < 5 * 60 * 1000);
    });
  }

  document.addEventListener("DOMContentLoaded", tick);
  document.addEventListener("htmx:afterSettle", tick);
  setInterval(tick, 1000);
})();
