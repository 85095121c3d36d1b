// agentfast: the few behaviours htmx does not cover. Plain script, no build step.
(function () {
  "use strict";

  // "2 s", "3 min", "5 h", "2 d": the wording of the server's |elapsed filter.
  function elapsed(since) {
    var seconds = Math.max(0, Math.floor((Date.now() - since) / 1000));
    var units = [["d", 86400], ["h", 3600], ["min", 60]];
    for (var i = 0; i < units.length; i++) {
      if (seconds >= units[i][1]) return Math.floor(seconds / units[i][1]) + " " + units[i][0];
    }
    return seconds + " s";
  }

  function refreshTimes() {
    document.querySelectorAll("time[data-elapsed]").forEach(function (node) {
      var at = Date.parse(node.getAttribute("datetime"));
      if (!isNaN(at)) node.textContent = elapsed(at);
    });
  }

  // The inbox's title carries its count, so a background tab shows new approvals.
  function syncTitle() {
    var count = document.getElementById("pending-count");
    if (!count) return;
    var n = count.dataset.count || "0";  // "500+" past the count's cap
    document.title = (n !== "0" ? "(" + n + ") " : "") + "Inbox · agentfast";
  }

  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var target = event.detail.target;
    var incoming = event.detail.fragment && event.detail.fragment.firstElementChild;
    // A live push can race the list's re-fetch after a (re)connect: keep one copy.
    if (target.hasAttribute("data-live-list") && incoming && incoming.id) {
      if (document.getElementById(incoming.id)) {
        event.detail.shouldSwap = false;
      } else {
        incoming.classList.add("arriving");
        incoming.dataset.arrivedAt = String(Date.now());  // a list fetched before it may lack it (below)
        target.dataset.lastArrival = incoming.id;  // for the announcement and the desktop notification
      }
      return;
    }
    // Someone else decided (or voted on) a card this reviewer is working on: keep what they
    // typed; the status line above the buttons, swapped on its own, says who decided.
    if (target.matches(".card") && workedOn(target) && !target.matches(".deciding")) {
      event.detail.shouldSwap = false;
      if (incoming === null || incoming === undefined || !incoming.matches || !incoming.matches(".card")) {
        settleDecidedElsewhere(target);
      }
      return;
    }
    // A card picked for a bulk decision, drawn again (a vote's tally): still picked while its arguments are the same.
    var picked = target.matches(".card") && target.querySelector("input.pick:checked");
    var fresh = picked && incoming && incoming.querySelector && incoming.querySelector("input.pick");
    if (fresh && fresh.value === picked.value) fresh.setAttribute("checked", "");
    // The reviewer who decided reads the outcome on the card for a moment before it leaves.
    // The removal push often beats the decision's own HTTP answer, hence "deciding" too.
    if (target.matches(".card.decided, .card.deciding")) {
      event.detail.shouldSwap = false;
      leaveSoon(target.id);
    }
  });

  // A decision (or a deadline's extension) refused as not permitted answers 403 with the card or
  // panel that says why, marked by the server: shown like a 409. No other 403 is swapped (base.html).
  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr;
    if (xhr && xhr.status === 403 && xhr.getResponseHeader("X-Agentfast-Refusal")) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });

  // The inbox's list is fetched again whenever its socket (re)opens. A card the reviewer is
  // working on (typed in, focused, or with its decision on the way) goes into the new list
  // as it is: a fresh copy would drop what they typed, and the answer of a decision in
  // flight would land on a card no longer shown. It is taken out before htmx swaps the
  // list (so htmx leaves it whole) and put back in its fresh copy's place, or at the end.
  // A card pushed after the list was asked for may be missing from the answer, read before
  // it existed: it goes into the new list too (where it arrived), unless the answer has it.
  // Had it been decided meanwhile, its removal push takes it out, before or after the swap.
  var carried = null;
  var listAskedAt = 0;
  document.addEventListener("htmx:beforeRequest", function (event) {
    if (event.detail.target && event.detail.target.id === "inbox-list") listAskedAt = Date.now();
  });
  document.addEventListener("htmx:beforeSwap", function (event) {
    var list = event.detail.target;
    if (!list || list.id !== "inbox-list" || !event.detail.shouldSwap) return;
    var focused = document.activeElement;
    carried = { cards: [], arrivals: [], focused: null, caret: null, picked: [] };
    // Cards picked for a bulk decision stay picked in the fresh list while their arguments (the digest in the value) are the same.
    list.querySelectorAll("input.pick:checked").forEach(function (box) { carried.picked.push(box.value); });
    list.querySelectorAll("#inbox-cards > .card").forEach(function (card) {
      if (!workedOn(card) && !card.matches(".deciding")) {
        if (Number(card.dataset.arrivedAt || 0) >= listAskedAt) {
          carried.arrivals.push({ card: card, first: card.previousElementSibling === null });
          card.remove();
        }
        return;
      }
      if (card.contains(focused)) {
        carried.focused = focused;
        if (typeof focused.selectionStart === "number") carried.caret = [focused.selectionStart, focused.selectionEnd];
      }
      card.remove();
      carried.cards.push(card);
    });
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    if (!carried || !event.detail.target || event.detail.target.id !== "inbox-list") return;
    var list = document.getElementById("inbox-cards");
    carried.cards.forEach(function (card) {
      var fresh = document.getElementById(card.id);
      if (fresh) fresh.replaceWith(card);
      else if (list) list.appendChild(card);  // off the first page now, or decided meanwhile: the server says which
    });
    // Newest first, arrivals came in at the top (put back in reverse, so prepending keeps their
    // order); oldest first, at the end. A card the answer has keeps the answer's copy, as new.
    var missing = carried.arrivals.filter(function (a) { return list && !document.getElementById(a.card.id); });
    missing.filter(function (a) { return a.first; }).reverse().forEach(function (a) { list.prepend(a.card); });
    missing.filter(function (a) { return !a.first; }).forEach(function (a) { list.appendChild(a.card); });
    list && list.querySelectorAll("input.pick").forEach(function (box) {
      if (!box.disabled && carried.picked.indexOf(box.value) >= 0) box.checked = true;
    });
    var focused = carried.focused;
    if (focused && document.contains(focused)) {
      focused.focus({ preventScroll: true });
      if (carried.caret) focused.setSelectionRange(carried.caret[0], carried.caret[1]);
    }
    carried = null;
    document.dispatchEvent(new CustomEvent("agentfast:selection"));
  });

  // A card has the reviewer's attention when focus is in it, its Reject… is open (a click on
  // it need not leave the focus there) or it holds text they typed.
  function workedOn(card) {
    if (card.contains(document.activeElement) && document.activeElement !== document.body) return true;
    if (card.querySelector("details.reject[open]")) return true;
    return Array.prototype.some.call(card.querySelectorAll("textarea, input[type=text]"), function (field) {
      return field.value.trim() !== "";
    });
  }

  // Decided elsewhere: the card stays with its text, its buttons off, until its reviewer moves on.
  function settleDecidedElsewhere(card) {
    card.classList.add("decided", "decided-elsewhere");
    card.querySelectorAll("button, input[type=checkbox]").forEach(function (control) {
      control.disabled = true;
      if (control.type === "checkbox") control.checked = false;
    });
    card.querySelectorAll("textarea, input[type=text]").forEach(function (field) { field.readOnly = true; });
    document.dispatchEvent(new CustomEvent("agentfast:selection"));
  }

  function leaveSoon(id) {
    setTimeout(function () {
      var card = document.getElementById(id);
      // A decision that lost the race answers with a card saying so (and what was typed, to copy): it stays.
      if (!card || card.querySelector("[role=alert]")) return;
      card.classList.add("leaving");
      setTimeout(function () { card.remove(); }, 600);
    }, 1500);
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    if (event.detail.requestConfig.verb !== "post") return;
    var box = decisionBox(event.detail.elt);
    if (!box) return;
    var earlier = box.querySelector(".decide-error");
    if (earlier) earlier.remove();
    // Only a decision's answer replaces the card: Extend and Run now answer with the deadline's
    // part, and a card left "deciding" would leave the keys' reach and go at its next push.
    if (box.matches(".card") && event.detail.target === box) box.classList.add("deciding");
  });

  // A decision lives on an inbox card or in the approval page's decision panel.
  function decisionBox(elt) {
    return elt && elt.closest ? elt.closest(".card, #decision") : null;
  }

  // A decision that did not arrive leaves its card in place, with what was typed, to try again.
  // `signIn`: the session ended, so the message links to the sign-in page in a new tab.
  function decisionFailed(event, reason, signIn) {
    var config = event.detail.requestConfig;
    var box = decisionBox(event.detail.elt);
    if (!box || (config && config.verb !== "post")) return;
    box.classList.remove("deciding");
    var message = box.querySelector(".decide-error");
    if (!message) {
      message = document.createElement("p");
      message.className = "error decide-error";
      message.setAttribute("role", "alert");
      var actions = box.querySelector(".actions");
      actions ? actions.parentNode.insertBefore(message, actions) : box.appendChild(message);
    }
    if (!signIn) {
      message.textContent = "Your decision was not recorded: " + reason + ". Nothing changed; try again.";
      return;
    }
    var link = document.createElement("a");
    link.href = "/accounts/login/?next=" + encodeURIComponent(location.pathname);
    link.target = "_blank";
    link.rel = "noopener";
    link.textContent = "Sign in again";
    message.textContent = "Your decision was not recorded: " + reason + ". ";
    message.append(link, " (in a new tab: what you typed stays here), then try again.");
  }

  document.addEventListener("htmx:responseError", function (event) {
    var xhr = event.detail.xhr;
    if (xhr.status === 401) {  // signed out meanwhile (dashboard.auth.signin_required)
      decisionFailed(event, "you are signed out", true);
      return;
    }
    decisionFailed(event, "the server answered " + xhr.status + (xhr.statusText ? " " + xhr.statusText : ""));
  });

  // Signing in again gives the browser a new CSRF token: send the cookie's current one rather than
  // the page's, so a page left open across a new sign-in (in another tab) still decides. Django
  // reads a form's own csrfmiddlewaretoken before the header, so that one is replaced too.
  document.addEventListener("htmx:configRequest", function (event) {
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    if (!match) return;
    var token = decodeURIComponent(match[1]);
    event.detail.headers["X-CSRFToken"] = token;
    var data = event.detail.formData;
    if (data && data.has("csrfmiddlewaretoken")) data.set("csrfmiddlewaretoken", token);
  });
  document.addEventListener("htmx:sendError", function (event) {
    decisionFailed(event, "could not reach the server");
  });
  document.addEventListener("htmx:timeout", function (event) {
    decisionFailed(event, "the server did not answer in time");
  });

  // The decision buttons say what they send: an answer, edited arguments, a note, feedback.
  // Arguments nested deeper than the server takes (32 levels) are not compared: recursing
  // thousands deep would overflow the stack in every handler that calls this, and the
  // server refuses them with its own message.
  var MAX_DEPTH = 64;
  function TooDeep() {}

  // JSON.parse reads every number as a double: an account number past 2^53 edited by one digit
  // would read as unchanged (approved with no preview), and a playground edit would send it rounded.
  // Where the browser hands the reviver each number's source, such an integer is kept as written
  // (JSON.rawJSON, which JSON.stringify writes back as it was).
  function exactIntegers(key, value, context) {
    if (typeof value !== "number" || Number.isSafeInteger(value) || !context || !JSON.rawJSON) return value;
    return /^-?[0-9]+$/.test(context.source) ? JSON.rawJSON(context.source) : value;
  }

  function parseExact(text) {
    return JSON.parse(text, exactIntegers);
  }
  window.agentfastParseJson = parseExact;

  function canonical(value, depth) {
    depth = depth || 0;
    if (depth > MAX_DEPTH) throw new TooDeep();
    if (JSON.isRawJSON && JSON.isRawJSON(value)) return value.rawJSON;
    if (Array.isArray(value)) {
      return "[" + value.map(function (item) { return canonical(item, depth + 1); }).join(",") + "]";
    }
    if (value && typeof value === "object") {
      return "{" + Object.keys(value).sort().map(function (key) {
        return JSON.stringify(key) + ":" + canonical(value[key], depth + 1);
      }).join(",") + "}";
    }
    return JSON.stringify(value);
  }

  // Blank is not an edit to preview: it is sent as it is, and the server refuses to approve it.
  function edited(editor) {
    var text = editor.value.trim();
    if (!text || editor.dataset.proposed === undefined) return false;
    try {
      return canonical(parseExact(text)) !== canonical(parseExact(editor.dataset.proposed));
    } catch (error) {
      return true;  // not JSON, or too deep to compare: an edit the server explains
    }
  }

  function tooDeep(text) {
    try {
      canonical(parseExact(text));
    } catch (error) {
      return error instanceof TooDeep || error instanceof RangeError;  // RangeError: too deep for JSON.parse
    }
    return false;
  }

  function typed(form, name) {
    var input = form.elements[name];
    return Boolean(input && input.value && input.value.trim());
  }

  function relabel(form) {
    var reject = form.querySelector("[data-label-reject]");
    if (reject) {
      reject.textContent = typed(form, "feedback") ? "Reject and ask to revise" : typed(form, "note") ? "Reject with note" : "Reject";
    }
    var approve = form.querySelector("[data-label-approve]");
    if (!approve) return;
    var changed = form.elements.arguments ? edited(form.elements.arguments) : false;
    var asks = Boolean(form.elements.answer);
    approve.textContent = "Approve" + (changed ? " with edits" : "") + (asks ? (changed ? " and answer" : " with answer") : "");
    // Feedback only travels with a rejection: approving would drop the reviewer's words.
    var feedback = typed(form, "feedback");
    approve.disabled = feedback;
    var hint = document.getElementById(approve.getAttribute("aria-describedby") || "");
    if (hint) hint.hidden = !feedback;
  }

  document.addEventListener("input", function (event) {
    var form = event.target.form;
    if (!form) return;
    relabel(form);
    // The preview shows the edit as it was when Approve was pressed: a later one closes it, so
    // that "Send approval" never sends arguments the reviewer was not shown.
    var preview = form.querySelector(".diff-preview:not([hidden])");
    if (preview && event.target === form.elements.arguments) preview.hidden = true;
  });
  htmx.onLoad(function (root) {
    root.querySelectorAll("form").forEach(function (form) {
      if (form.querySelector("[data-label-approve], [data-label-reject]")) relabel(form);
    });
  });

  function setLive(root, state, text) {
    var live = root.querySelector(".live");
    if (!live) return;
    live.dataset.state = state;
    live.querySelector(".live-text").textContent = text;
  }

  document.addEventListener("htmx:wsOpen", function (event) { setLive(event.target, "open", "Live"); });
  document.addEventListener("htmx:wsClose", function (event) {
    var refused = event.detail.event.code === 4403;
    setLive(event.target, "closed", refused ? "Not allowed: sign in again" : "Reconnecting…");
  });
  document.addEventListener("htmx:wsAfterMessage", function () { syncTitle(); refreshTimes(); });
  document.addEventListener("htmx:afterSettle", syncTitle);

  document.addEventListener("change", function (event) {
    if (event.target.matches("select[data-autosubmit]")) event.target.form.requestSubmit();
  });

  // Keys every page shares: ? lists them, Esc closes what is open, Ctrl+Enter sends the form being typed in.
  function typing(target) {
    return Boolean(target.closest && target.closest("input, textarea, select, [contenteditable]"));
  }

  function closeOpen() {
    var preview = document.querySelector(".diff-preview:not([hidden])");
    if (preview) { preview.querySelector("[data-preview-back]").click(); return true; }
    var open = document.querySelector("details.reject[open]");
    if (open) {
      open.open = false;
      var summary = open.querySelector("summary");
      if (summary) summary.focus();
      return true;
    }
    return false;
  }

  function submitButtons(form) {
    // form.elements: a card's answer is sent by a button outside its form (form="answer-…").
    return Array.prototype.filter.call(form.elements, function (b) {
      return b.matches("button[type=submit], button:not([type])") && !b.disabled;
    });
  }

  // With more than one decision on offer, only the one chosen is sent: by the field typed in
  // (an answer or edited arguments are only ever approved) or by approval.js's r / e. The first
  // button, Approve, would send a note written for a rejection.
  function submitterOf(form, field) {
    var buttons = submitButtons(form);
    if (buttons.length < 2) return buttons[0] || null;
    var intent = (field && field.dataset && field.dataset.intent) || form.dataset.intent;
    return buttons.find(function (b) { return intent && b.value === intent; }) || null;
  }

  document.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && typing(event.target)) {
      var form = event.target.form || event.target.closest("form");
      var button = form && submitterOf(form, event.target);
      if (button) {
        event.preventDefault();
        button.click();  // a click, not requestSubmit: htmx sends the value of the button last clicked
      } else if (form && submitButtons(form).length > 1) {
        event.preventDefault();
        form.dispatchEvent(new CustomEvent("keys:undecided", { bubbles: true }));  // the page says how to choose
      }
      return;
    }
    if (event.key === "Escape") {
      if (document.querySelector("dialog[open]")) return;  // the dialog closes itself
      if (closeOpen() || (typing(event.target) && (event.target.blur(), true))) event.preventDefault();
      return;
    }
    if (event.key === "?" && !typing(event.target) && !event.ctrlKey && !event.metaKey && !event.altKey) {
      var help = document.getElementById("keys-help");
      if (help && !help.open) {
        event.preventDefault();
        help.showModal();
      }
    }
  });

  // Approving with edits shows old → new first; the reviewer sends it or goes back to editing.
  function parsed(text) {
    try { return parseExact(text); } catch (error) { return undefined; }
  }

  function argumentChanges(before, after) {
    if (!before || !after || typeof before !== "object" || typeof after !== "object" || Array.isArray(after)) {
      return [["arguments", JSON.stringify(before), after === undefined ? "(not JSON)" : JSON.stringify(after)]];
    }
    var keys = Object.keys(before).concat(Object.keys(after).filter(function (key) { return !(key in before); }));
    return keys.filter(function (key) { return canonical(before[key]) !== canonical(after[key]); }).map(function (key) {
      return [key, key in before ? JSON.stringify(before[key]) : "(none)", key in after ? JSON.stringify(after[key]) : "(removed)"];
    });
  }

  function showPreview(form, changes, send) {
    var preview = form.querySelector(".diff-preview");
    var list = preview.querySelector("ul");
    list.textContent = "";
    changes.forEach(function (change) {
      var item = document.createElement("li");
      var key = document.createElement("code");
      key.textContent = change[0];
      var old = document.createElement("del");
      old.textContent = change[1];
      var now = document.createElement("ins");
      now.textContent = change[2];
      item.append(key, ": ", old, " → ", now);
      list.appendChild(item);
    });
    preview.hidden = false;
    var confirm = preview.querySelector("[data-preview-send]");
    var back = preview.querySelector("[data-preview-back]");
    confirm.onclick = function () { preview.hidden = true; send(); };
    back.onclick = function () { preview.hidden = true; form.elements.arguments.focus(); };
    confirm.focus();
  }

  document.addEventListener("htmx:confirm", function (event) {
    var form = event.detail.elt;
    if (!form.matches || !form.matches("#decision form") || !form.elements.arguments) return;
    var trigger = event.detail.triggeringEvent;
    var submitter = trigger && trigger.submitter;
    if (!submitter || submitter.value !== "approved" || !edited(form.elements.arguments)) return;
    if (!form.querySelector(".diff-preview")) return;
    var editor = form.elements.arguments;
    if (tooDeep(editor.value) || tooDeep(editor.dataset.proposed)) return;  // no preview: the server answers
    event.preventDefault();
    var changes = argumentChanges(parsed(editor.dataset.proposed), parsed(editor.value));
    showPreview(form, changes, function () {
      // The button that was pressed lost focus to the preview, so htmx no longer sends its value.
      var decision = document.createElement("input");
      decision.type = "hidden";
      decision.name = "decision";
      decision.value = "approved";
      decision.setAttribute("data-preview-decision", "");
      form.appendChild(decision);
      event.detail.issueRequest(true);
    });
  });

  // "Reset to the proposal", by an arguments error: the editor gets the model's arguments back.
  document.addEventListener("click", function (event) {
    var reset = event.target.closest && event.target.closest("[data-reset-arguments]");
    var editor = reset && reset.form && reset.form.elements.arguments;
    if (!editor || editor.dataset.proposed === undefined) return;
    var proposal = parsed(editor.dataset.proposed);
    editor.value = proposal === undefined ? editor.dataset.proposed : JSON.stringify(proposal, null, 2);
    relabel(reset.form);
    editor.focus();
  });

  document.addEventListener("htmx:afterRequest", function (event) {
    var form = event.detail.elt;
    if (form && form.querySelectorAll) {
      form.querySelectorAll("[data-preview-decision]").forEach(function (input) { input.remove(); });
    }
  });

  setInterval(refreshTimes, 5000);
})();
