// The playground's saved agents: save the agent composed on the page under a name, and pick it again.
(function () {
  "use strict";
  var form = document.getElementById("pg-form");
  var save = document.getElementById("pg-save");
  var agent = document.getElementById("pg-agent");
  var result = document.getElementById("pg-save-result");
  if (!form || !save) return;

  function say(message, failed) {
    result.textContent = message;
    result.className = failed ? "error" : "hint";
    result.hidden = false;
  }

  function option(saved) {
    var group = agent.querySelector("optgroup[data-saved-group]") || agent.querySelector("optgroup");
    if (!group) {
      group = document.createElement("optgroup");
      group.label = "Your saved agents";
      group.dataset.savedGroup = "";
      agent.insertBefore(group, agent.querySelector("option[data-compose]"));
    }
    var existing = agent.querySelector('option[value="' + CSS.escape(saved.value) + '"]');
    var node = existing || document.createElement("option");
    node.value = saved.value;
    node.textContent = saved.name;
    node.dataset.saved = "";
    node.dataset.description = "saved agent";
    node.dataset.model = saved.model;
    node.dataset.tools = saved.tools;
    node.dataset.definition = saved.definition;
    if (!existing) group.appendChild(node);
    return node;
  }

  save.addEventListener("click", async function () {
    save.disabled = true;
    try {
      var response = await fetch(save.dataset.saveUrl, { method: "POST", body: new FormData(form), credentials: "same-origin" });
      var answer = await response.json().catch(function () { return { message: response.statusText }; });
      if (!response.ok) return say(answer.message, true);
      var node = option(answer.agent);
      agent.value = node.value;
      agent.dispatchEvent(new Event("change"));
      say("Saved as “" + answer.agent.name + "”: pick it in the list above.", false);
    } finally {
      save.disabled = false;
    }
  });
})();
