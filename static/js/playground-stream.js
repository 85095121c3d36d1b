// Server-sent events over fetch(): EventSource cannot POST (a resume that streams) nor be
// told when to stop reconnecting, so the playground reads the stream itself.
(function () {
  "use strict";

  function parse(block) {
    var frame = { id: null, event: null, data: null, comment: null };
    var data = [];
    block.split("\n").forEach(function (line) {
      var colon = line.indexOf(":");
      var name = colon < 0 ? line : line.slice(0, colon);
      var value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (name === "") frame.comment = value;
      else if (name === "id") frame.id = Number(value);
      else if (name === "event") frame.event = value;
      else if (name === "data") data.push(value);
    });
    if (data.length) frame.data = window.agentfastParseJson(data.join("\n"));  // big integers as written
    return frame;
  }

  // Resolves when the server ends the stream; rejects with {status, body} on an HTTP error
  // (body: the API's {"error_code", "message"}) and with an AbortError when aborted.
  async function stream(url, options, onFrame) {
    var headers = Object.assign({ Accept: "text/event-stream" }, options.headers || {});
    var response = await fetch(url, {
      method: options.method || "GET",
      headers: headers,
      credentials: "same-origin",
      signal: options.signal,
    });
    if (!response.ok) {
      var body = await response.json().catch(function () { return { message: response.statusText }; });
      throw { status: response.status, body: body };
    }
    var reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    var buffer = "";
    for (;;) {
      var chunk = await reader.read();
      if (chunk.done) return;
      buffer += chunk.value.replace(/\r\n?/g, "\n");
      var end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        var block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (block) onFrame(parse(block));
      }
    }
  }

  window.agentfastStream = stream;
})();
