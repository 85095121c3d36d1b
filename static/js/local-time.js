// Show <time datetime data-local> in the viewer's own time zone (the server renders UTC).
(function () {
  "use strict";
  var format = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });
  var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;

  function localize(root) {
    root.querySelectorAll("time[data-local]").forEach(function (node) {
      var at = new Date(node.getAttribute("datetime"));
      if (isNaN(at)) return;
      node.textContent = format.format(at);
      node.title = at.toISOString() + " (shown in " + zone + ")";
    });
  }

  localize(document);
  document.body.addEventListener("htmx:afterSwap", function (event) { localize(event.target); });
})();
