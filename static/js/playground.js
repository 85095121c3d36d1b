// The playground: start a run, stream it, decide inline, resume and stream again.
// Everything the model, a tool or a person wrote is set with textContent, never as HTML.
(function () {
  "use strict";

  var root = document.getElementById("playground");
  if (!root) return;
  var stream = window.agentfastStream;
  var form = document.getElementById("pg-form");
  var csrf = form.querySelector("[name=csrfmiddlewaretoken]").value;
  var output = document.getElementById("pg-stream");
  var rawLog = document.getElementById("pg-raw-log");
  var rawCount = document.getElementById("pg-raw-count");
  var statusBadge = document.getElementById("pg-status");
  var historyList = document.getElementById("pg-history");
  var cardTemplate = document.getElementById("pg-approval-template");

  var view = null; // the run on screen: see showRun()

  // -- small DOM helpers --------------------------------------------------------------

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function pretty(value) {
    return JSON.stringify(value, null, 2);
  }

  function add(node) {
    output.appendChild(node);
    node.scrollIntoView({ block: "nearest" });
    return node;
  }

  function bubble(role, text, label) {
    var node = el("div", "pg-msg pg-" + role);
    node.appendChild(el("span", "pg-role", label || role));
    node.appendChild(el("div", "pg-text", text));
    return node;
  }

  function problem(text) {
    return add(el("p", "pg-problem error", text));
  }

  // -- the run on screen ----------------------------------------------------------------

  function showRun(run) {
    if (view) view.stop();
    var controllers = [];
    view = {
      run: run,
      lastSeq: 0,
      status: run.status,
      replayed: false, // the current stream's replay is over (": live")
      driving: false,
      approvals: {}, // approval id -> {mode, status, card}
      cards: {}, // call id -> the element showing that call
      deferred: {}, // call id -> true: an approved deferred call whose result has not arrived
      held: {}, // call id -> when (ms) a decided call its tool put off may run; gone once it ran
      heldTimer: null, // the resume set for the earliest held call's time
      heldDriven: 0, // when (ms) this page last resumed the run for a held call whose time had come
      streaming: null, // the assistant bubble tokens go to
      controller: function () {
        var controller = new AbortController();
        controllers.push(controller);
        return controller;
      },
      stop: function () {
        controllers.forEach(function (c) { c.abort(); });
        clearTimeout(this.heldTimer);
      },
    };
    output.replaceChildren();
    rawLog.replaceChildren();
    rawCount.textContent = "0";
    document.getElementById("pg-title").textContent = "Run";
    document.getElementById("pg-run-id").textContent = run.id;
    var link = document.getElementById("pg-run-link");
    link.href = "/runs/" + encodeURIComponent(run.id);
    link.hidden = false;
    setStatus(run.status);
    add(bubble("user", run.input, "you"));
    window.history.replaceState(null, "", "?run=" + encodeURIComponent(run.id));
    historyList.querySelectorAll("li").forEach(function (li) {
      li.classList.toggle("current", li.dataset.runId === run.id);
    });
  }

  function setStatus(status) {
    view.status = status;
    statusBadge.hidden = false;
    statusBadge.textContent = status;
    statusBadge.className = "badge status-" + status;
    var entry = historyList.querySelector('li[data-run-id="' + CSS.escape(view.run.id) + '"] .badge');
    if (entry) {
      entry.textContent = status;
      entry.className = "badge status-" + status;
    }
  }

  function pendingSuspends() {
    return Object.values(view.approvals).filter(function (a) { return a.mode === "suspend" && a.status === "pending"; });
  }

  // Resume once the run waits on nobody: after our own decision, or one taken elsewhere.
  function maybeResume() {
    if (!view.replayed || view.driving || view.status !== "suspended" || pendingSuspends().length !== 0) return;
    var wait = heldFor();
    if (wait === null) return drive();
    // A decided call waits for the time its tool asked for: resuming before it only suspends
    // the run again, so the page resumes it then (and, if this clock runs ahead of the
    // server's, again every two seconds until the server agrees).
    var now = Date.now();
    if (wait <= 0 && now - view.heldDriven >= 2000) {
      view.heldDriven = now;
      return drive();
    }
    var current = view;
    clearTimeout(current.heldTimer);
    current.heldTimer = setTimeout(function () {
      if (current === view) maybeResume();
    }, Math.max(wait, 2000 - (now - view.heldDriven)) + 50);
  }

  // Milliseconds until the earliest held call may run (0 or less: now); null when none is held.
  function heldFor() {
    var times = Object.values(view.held);
    return times.length ? Math.min.apply(null, times) - Date.now() : null;
  }

  // -- streams --------------------------------------------------------------------------

  function api(path) {
    return "/api/runs/" + encodeURIComponent(view.run.id) + path;
  }

  // POST …/resume with Accept: text/event-stream: this request drives the run.
  function drive() {
    var current = view;
    current.driving = true;
    current.replayed = false;
    if (current.watching) current.watching.abort();
    setStatus("running");
    var controller = current.controller();
    stream(api("/resume?after=" + current.lastSeq), { method: "POST", headers: { "X-CSRFToken": csrf }, signal: controller.signal }, frames(current))
      .catch(function (failure) {
        if (controller.signal.aborted || current !== view) return;
        current.driving = false;
        if (failure.status === 403 || failure.status === 409 || failure.status === 422) {
          // Its creator drives it, someone else does now, or it has nothing to do: follow it instead.
          watch(current);
        } else {
          problem("Could not resume: " + describe(failure));
        }
      });
  }

  // GET …/events: follow a run this page does not drive; reconnect from the last seq.
  function watch(current) {
    if (current.watching) current.watching.abort(); // one follower at a time
    current.replayed = false;
    var controller = current.controller();
    current.watching = controller;
    stream(api("/events?after=" + current.lastSeq), { signal: controller.signal }, frames(current))
      .catch(function (failure) {
        if (controller.signal.aborted || current !== view) return;
        if (failure.status) return problem("Could not follow the run: " + describe(failure));
        setTimeout(function () { if (current === view && !current.driving) watch(current); }, 2000);
      });
  }

  function describe(failure) {
    return failure.body ? failure.body.message : String(failure);
  }

  function frames(current) {
    return function (frame) {
      if (current !== view) return;
      if (frame.event === null) {
        if (frame.comment === "live") {
          view.replayed = true;
          maybeResume();
        }
        return;
      }
      logRaw(frame);
      if (frame.id !== null) {
        if (frame.id <= view.lastSeq) return; // seen already (a replay overlapping a stream)
        view.lastSeq = frame.id;
      }
      var handle = handlers[frame.event];
      var stored = frame.event !== "end" && frame.event !== "error";
      if (handle) handle(stored ? frame.data.data : frame.data);
    };
  }

  function logRaw(frame) {
    var line = el("li", "pg-raw-" + frame.event);
    line.appendChild(el("span", "pg-raw-id", frame.id === null ? "–" : "#" + frame.id));
    line.appendChild(el("span", "pg-raw-event", frame.event));
    var data = frame.data && frame.data.data !== undefined && frame.event !== "end" ? frame.data.data : frame.data;
    line.appendChild(el("code", "pg-raw-data", JSON.stringify(data)));
    rawLog.appendChild(line);
    rawCount.textContent = String(rawLog.childElementCount);
    rawLog.scrollTop = rawLog.scrollHeight;
  }

  // -- what each event looks like -------------------------------------------------------

  var handlers = {
    delta: function (data) {
      if (!view.streaming) view.streaming = add(bubble("assistant streaming", "", "agent"));
      view.streaming.querySelector(".pg-text").append(data.text);
    },
    message: function (data) {
      if (data.role === "assistant") {
        var node = view.streaming || add(bubble("assistant", "", "agent"));
        node.classList.remove("streaming");
        node.querySelector(".pg-text").textContent = data.content;
        view.streaming = null;
      } else if (data.role === "user") {
        add(bubble("user", data.content, "feedback"));
      } else {
        add(el("p", "pg-note", data.content));
      }
    },
    tool_call: function (data) {
      view.streaming = null;
      if (data.waits_until) return held(data);
      view.cards[data.call_id] = add(toolCard(data));
    },
    tool_result: function (data) {
      var card = view.cards[data.call_id] || add(toolCard({ tool: data.tool, call_id: data.call_id }));
      showResult(card, data.output);
      if (data.deferred) delete view.deferred[data.call_id];
      delete view.held[data.call_id];
    },
    approval_required: function (data) {
      view.streaming = null;
      var card = add(approvalCard(data));
      view.cards[data.call_id] = card;
      view.approvals[data.approval_id] = { mode: data.mode, status: "pending", card: card, callId: data.call_id };
      if (data.run_status) setStatus(data.run_status);
    },
    approval_decided: function (data) {
      var approval = view.approvals[data.approval_id];
      // Decided elsewhere while the developer was typing: the card closes, so what they typed is shown back.
      // A decision of theirs on its way is left to its answer, which says whether it was the one recorded.
      var typed = approval && approval.status === "pending" && !approval.sending ? typedOn(approval.card) : [];
      if (approval) decided(approval, data.decision, data.decided_by, data.note);
      if (approval) unrecorded(approval.card, typed);
      if (approval && data.edited) showEdits(approval.card, data.approval_id);
      if (approval && approval.mode === "defer" && data.decision === "approved") view.deferred[approval.callId] = true;
      maybeResume();
    },
    run_status: function (data) {
      setStatus(data.status);
      if (data.status === "completed") {
        var answers = output.querySelectorAll(".pg-assistant");
        if (answers.length) answers[answers.length - 1].classList.add("final");
      } else if (data.status === "failed") {
        problem("The run failed: " + data.error);
      }
    },
    end: function (data) {
      view.driving = false;
      setStatus(data.status);
      maybeResume();
      // Still waiting on a decision: follow the run, so that one taken elsewhere shows (and resumes it) here.
      if (!view.driving && view.status === "suspended") watch(view);
      followDeferred(view);
    },
    error: function (data) {
      problem(data.message);
    },
  };

  // A decided call whose tool asked to run later: its card (the approval's, or a new one) says until when.
  function held(data) {
    var when = Date.parse(data.waits_until);
    view.held[data.call_id] = when;
    var card = view.cards[data.call_id];
    if (!card) {
      card = view.cards[data.call_id] = add(toolCard(data));
      var badge = card.querySelector(".pg-call-status");
      badge.textContent = "waits";
      badge.className = "badge pg-call-status status-suspended";
    }
    card.appendChild(el("p", "pg-held meta", "Waits until " + new Date(when).toLocaleString() + ", then runs."));
  }

  function toolCard(data) {
    var card = el("article", "pg-call card");
    var head = el("div", "card-head");
    head.appendChild(el("span", "pg-kind", "tool call"));
    head.appendChild(el("code", "pg-tool", data.tool));
    head.appendChild(el("span", "badge pg-call-status status-running", "running"));
    card.appendChild(head);
    if (data.arguments !== undefined) card.appendChild(el("pre", "pg-args args", pretty(data.arguments)));
    return card;
  }

  function showResult(card, result) {
    var label = "ok";
    var tone = "completed";
    if (result.status === "APPROVAL_PENDING") {
      label = "queued for approval";
      tone = "pending";
    } else if (result.ok === false) {
      label = result.error_code === "APPROVAL_REJECTED" ? "rejected" : result.error_code || "error";
      tone = "failed";
    }
    var badge = card.querySelector(".pg-call-status"); // an approval card says it in its result line
    if (badge) {
      badge.textContent = label;
      badge.className = "badge pg-call-status status-" + tone;
    }
    card.appendChild(el("div", "pg-result-label muted", badge ? "result" : "result · " + label));
    card.appendChild(el("pre", "pg-result args", pretty(result)));
  }

  // -- the inline approval card ---------------------------------------------------------

  function approvalCard(data) {
    var card = cardTemplate.content.firstElementChild.cloneNode(true);
    card.dataset.approvalId = data.approval_id;
    card.querySelector(".pg-tool").textContent = data.tool;
    var mode = card.querySelector(".pg-mode");
    mode.textContent = data.mode;
    mode.classList.add("mode-" + data.mode);
    card.querySelector(".pg-args").textContent = pretty(data.arguments);
    card.querySelector(".pg-edit-args").value = pretty(data.arguments);
    if (data.request && data.request.question) {
      var question = card.querySelector(".pg-question");
      question.textContent = data.request.question;
      question.hidden = false;
      card.querySelector(".pg-answer-label").hidden = false;
      card.querySelector(".pg-edit").hidden = true;
    }
    if (data.mode === "defer") {
      card.querySelector(".pg-decide").prepend(el("p", "hint", "The run goes on meanwhile; once approved, the call runs once in a worker."));
    }
    card.querySelector(".pg-approve").addEventListener("click", function () { decide(card, data, "approved"); });
    card.querySelector(".pg-reject").addEventListener("click", function () { decide(card, data, "rejected"); });
    return card;
  }

  function decision(card, data, verdict) {
    // Feedback goes whatever the decision: the server refuses an approval with it, saying so, rather than drop it.
    var body = { decision: verdict, note: card.querySelector(".pg-note").value, auto_resume: false };
    // Bound to the arguments this card shows: a quorum vote that edited them meanwhile makes it a 409.
    if (data.arguments_digest) body.expect_digest = data.arguments_digest;
    var feedback = card.querySelector(".pg-feedback").value;
    if (verdict === "rejected" || feedback.trim()) body.feedback = feedback;
    if (verdict === "rejected") return body;
    if (!card.querySelector(".pg-answer-label").hidden) body.payload = { answer: card.querySelector(".pg-answer").value };
    var edited = card.querySelector(".pg-edit-args");
    if (edited.value.trim() !== pretty(data.arguments)) body.arguments = window.agentfastParseJson(edited.value); // SyntaxError: shown
    return body;
  }

  async function decide(card, data, verdict) {
    var error = card.querySelector(".pg-card-error");
    error.hidden = true;
    card.querySelector(".pg-edit-args").classList.remove("invalid");
    var body;
    try {
      body = decision(card, data, verdict);
    } catch (syntax) {
      return fail(card, "The edited arguments are not valid JSON: " + syntax.message, "arguments");
    }
    card.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    var approval = view.approvals[data.approval_id];
    var response;
    approval.sending = true;
    try {
      response = await fetch("/api/approvals/" + encodeURIComponent(data.approval_id) + "/decide", {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
        credentials: "same-origin",
        body: JSON.stringify(body),
      });
    } catch (unreachable) {  // offline, or the server went away: nothing was decided
      approval.sending = false;
      card.querySelectorAll("button").forEach(function (b) { b.disabled = false; });
      return fail(card, "Your decision was not recorded: could not reach the server. Nothing changed; try again.");
    }
    var answer = await response.json().catch(function () { return { message: response.statusText }; });
    approval.sending = false;
    card.querySelectorAll("button").forEach(function (b) { b.disabled = false; });
    if (response.ok) {
      decided(approval, answer.status, answer.decided_by, answer.note);
      if (body.arguments && approval) showEdits(approval.card, data.approval_id);
      if (approval && approval.mode === "defer" && answer.status === "approved") {
        view.deferred[approval.callId] = true;
        followDeferred(view);
      }
      return maybeResume();
    }
    if (answer.approval && answer.approval.status !== "pending") {
      var typed = typedOn(card);
      decided(approval, answer.approval.status, answer.approval.decided_by, answer.approval.note); // it stands
      unrecorded(card, typed);
      return maybeResume();
    }
    fail(card, answer.message, answer.field);
  }

  // What the developer has typed on a card, as [label, text]: the arguments only where they were changed.
  function typedOn(card) {
    var typed = [["Your note", card.querySelector(".pg-note").value], ["Your feedback", card.querySelector(".pg-feedback").value]];
    if (!card.querySelector(".pg-answer-label").hidden) typed.push(["Your answer", card.querySelector(".pg-answer").value]);
    var edited = card.querySelector(".pg-edit-args").value.trim();
    if (edited !== card.querySelector(".pg-args").textContent) typed.push(["Your arguments", edited]);
    return typed;
  }

  // What the developer typed on a card another decision closed: kept nowhere, so shown once, to copy.
  function unrecorded(card, typed) {
    var lines = typed.filter(function (item) { return item[1].trim(); });
    if (!lines.length || card.querySelector(".pg-unrecorded")) return;
    var box = el("div", "pg-unrecorded");
    lines.forEach(function (item) { box.appendChild(el("p", "meta", item[0] + " (not recorded): " + item[1])); });
    card.querySelector(".pg-decided").after(box);
  }

  function fail(card, message, field) {
    var error = card.querySelector(".pg-card-error");
    error.textContent = message;
    error.hidden = false;
    if (field && field.indexOf("arguments") === 0) {
      card.querySelector(".pg-edit").open = true;
      card.querySelector(".pg-edit-args").classList.add("invalid");
    }
  }

  // An approved deferred call runs in a worker after the stream ended: follow the run until its result arrives.
  function followDeferred(current) {
    if (!Object.keys(current.deferred).length) return;
    setTimeout(function () {
      if (current === view && !current.driving && Object.keys(current.deferred).length) watch(current);
    }, 1500);
  }

  // Show what a reviewer changed: each edited argument as old → new.
  function showEdits(card, approvalId) {
    fetch("/api/approvals/" + encodeURIComponent(approvalId), { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (approval) {
        if (!approval || !approval.edited_arguments) return;
        var before = approval.arguments || {};
        var after = approval.edited_arguments;
        var list = el("ul", "pg-edits");
        Object.keys(Object.assign({}, before, after)).forEach(function (key) {
          var old = JSON.stringify(before[key]);
          var now = JSON.stringify(after[key]);
          if (old === now) return;
          var item = el("li");
          item.append(el("code", null, key), ": ", el("del", null, old === undefined ? "(none)" : old), " → ", el("ins", null, now === undefined ? "(removed)" : now));
          list.appendChild(item);
        });
        var old = card.querySelector(".pg-edits-box");
        if (old) old.remove();
        var box = el("div", "pg-edits-box");
        box.append(el("p", "pg-edits-title", "Approved with edits:"), list);
        card.querySelector(".pg-args").after(box);
      });
  }

  function decided(approval, status, by, note) {
    if (!approval) return;
    approval.status = status;
    var card = approval.card;
    card.classList.add("decided");
    card.querySelector(".pg-approval-title").textContent = "Approval:";
    var badge = card.querySelector(".pg-approval-status");
    badge.textContent = status;
    badge.className = "badge pg-approval-status status-" + status;
    card.querySelector(".pg-decide").hidden = true;
    var line = card.querySelector(".pg-decided");
    line.textContent = status.charAt(0).toUpperCase() + status.slice(1) + " by " + (by || "the system") + (note ? ": " + note : "");
    line.hidden = false;
  }

  // -- starting a run -------------------------------------------------------------------

  function remember(run, agentLabel) {
    var empty = historyList.querySelector(".pg-none");
    if (empty) empty.remove();
    var item = el("li");
    item.dataset.runId = run.id;
    var link = el("a", null, run.input.length > 60 ? run.input.slice(0, 59) + "…" : run.input);
    link.href = "?run=" + encodeURIComponent(run.id);
    item.append(link, " ", el("span", "badge status-" + run.status, run.status), " ", el("span", "muted", agentLabel || run.agent));
    historyList.prepend(item);
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    var error = document.getElementById("pg-form-error");
    var button = document.getElementById("pg-run");
    error.hidden = true;
    button.disabled = true;
    try {
      var response = await fetch(root.dataset.createUrl, { method: "POST", body: new FormData(form), credentials: "same-origin" });
      var answer = await response.json().catch(function () { return { message: response.statusText }; });
      if (!response.ok) {
        error.textContent = answer.message;
        error.hidden = false;
        return;
      }
      remember(answer.run, answer.agent_label);
      showRun(answer.run);
      drive();
    } finally {
      button.disabled = false;
    }
  });

  var prompt = document.getElementById("pg-input");
  prompt.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  document.querySelectorAll(".pg-chip").forEach(function (chip) {
    chip.addEventListener("click", function () {
      prompt.value = chip.dataset.prompt;
      prompt.focus();
    });
  });

  var agent = document.getElementById("pg-agent");
  var compose = document.getElementById("pg-compose");
  function describeAgent() {
    var option = agent.selectedOptions[0];
    var info = document.getElementById("pg-agent-info");
    if (!option) return;
    var composing = "compose" in option.dataset;
    compose.hidden = !composing;
    info.hidden = composing;
    info.textContent = [option.dataset.description, "model " + option.dataset.model, "tools: " + (option.dataset.tools || "none")]
      .filter(Boolean).join(" · ");
  }
  agent.addEventListener("change", describeAgent);
  describeAgent();

  // A low-risk tool just runs: how it would wait for approval does not apply.
  compose.querySelectorAll("select[name^=risk_]").forEach(function (risk) {
    var mode = compose.querySelector('select[name="mode_' + risk.name.slice(5) + '"]');
    function sync() { mode.disabled = risk.value === "low"; }
    risk.addEventListener("change", sync);
    sync();
  });

  var model = document.getElementById("pg-model");
  model.addEventListener("change", function () {
    var openai = model.value === "openai";
    document.getElementById("pg-model-name").hidden = !openai;
    document.getElementById("pg-endpoint").hidden = !openai;
  });

  // A run named in the URL (a reload, a history link): show it, and follow or drive it.
  if (root.dataset.runId) {
    fetch("/api/runs/" + encodeURIComponent(root.dataset.runId), { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("could not load the run (HTTP " + response.status + ")");
        return response.json();
      })
      .then(function (run) {
        showRun(run);
        if (run.status === "queued") drive(); else watch(view);
      })
      .catch(function (failure) { output.replaceChildren(el("p", "error", failure.message)); });
  }
})();
