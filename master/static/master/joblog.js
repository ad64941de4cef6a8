/* The admin's job page: each entry's live log, read from the REST API (GET /api/v1/jobs/ID/log) with
   the admin's own session, from the byte offset the last read ended at, until the master says nothing
   more is coming. One request at a time for the whole page, a round every second: a job of hundreds
   of entries costs the master no more than one of a few. Text goes in with textContent (never HTML). */
(function () {
  "use strict";

  var POLL_MS = 1000;
  // A page shows at most the last this many bytes of a log at first: `fleetshard job log` prints all.
  var FIRST_BYTES = 256 * 1024;
  // And keeps at most this many characters of it, dropping the oldest lines: a page left open on a
  // chatty job must not hold the master's whole 100 MiB.
  var KEEP_CHARS = 2 * FIRST_BYTES;

  function get(url, params) {
    var query = Object.keys(params).map(function (k) {
      return encodeURIComponent(k) + "=" + encodeURIComponent(params[k]);
    }).join("&");
    return fetch(url + "?" + query, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (resp) {
        if (!resp.ok) throw new Error("the master answered " + resp.status);
        return resp.json();
      });
  }

  function Log(box) {
    this.box = box;
    this.note = box.querySelector(".fs-log-note");
    this.pre = document.createElement("pre");
    this.pre.className = "fs-log fs-live";
    this.pre.style.cssText = "margin:0;max-width:60em;max-height:30em;overflow:auto;white-space:pre-wrap;font-size:11px";
    this.offset = null;  // unknown until the first read says how long the log is
    this.skipped = 0;
    this.chars = 0;
    this.dropped = false;
    this.shown = false;
    this.ended = false;
  }

  Log.prototype.show = function (slice) {
    var pre = this.pre;
    if (!this.shown && (slice.text || slice.size > 0)) {
      // The live log replaces the stored tail the page was rendered with.
      Array.prototype.forEach.call(this.box.querySelectorAll("pre:not(.fs-live)"), function (old) { old.remove(); });
      this.box.appendChild(pre);
      this.shown = true;
    }
    var text = slice.text || "";
    if (this.midLine && text) {
      // A read from the middle of the log starts inside a line: that partial line is not shown.
      var nl = text.indexOf("\n");
      text = nl >= 0 ? text.slice(nl + 1) : "";
      if (nl >= 0) this.midLine = false;
    }
    if (text) {
      var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.appendChild(document.createTextNode(text));
      this.chars += text.length;
      this.trim();
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
    var parts = [];
    if (slice.truncated) parts.push("[fleetshard] the master keeps the first " + slice.size + " bytes of this log.");
    if (this.dropped) parts.push("(Earlier output is not shown: `fleetshard job log` prints it.)");
    else if (this.skipped) parts.push("(The first " + this.skipped + " bytes are not shown: `fleetshard job log` prints them.)");
    if (!slice.ended) parts.push("live: " + slice.hqe_status);
    this.note.textContent = parts.join(" ");
    // Ended once the last of the log is shown: an ended job's log may still come in several reads.
    this.box.dataset.state = slice.ended && !this.more(slice) ? "ended" : "live";
  };

  // Drops the oldest text past KEEP_CHARS, up to the end of a line. A read ends anywhere in a line, so
  // that end may lie in a later text node than the one the cut falls in.
  Log.prototype.trim = function () {
    var pre = this.pre, over = this.chars - KEEP_CHARS, atLineStart = false, first;
    if (over <= 0) return;
    while ((first = pre.firstChild) && !(over <= 0 && atLineStart)) {
      var from = Math.max(over, 0), line = first.data.indexOf("\n", from);
      if (line >= 0 || !first.nextSibling) {
        var cut = line >= 0 ? line + 1 : from;  // past the line's end, or one line longer than all kept
        first.deleteData(0, cut);
        this.chars -= cut;
        break;
      }
      atLineStart = first.data.charAt(first.data.length - 1) === "\n";
      over -= first.data.length;
      this.chars -= first.data.length;
      pre.removeChild(first);
    }
    this.dropped = true;
  };

  Log.prototype.more = function (slice) {
    return Boolean(slice.text) && slice.next_offset < slice.size;
  };

  // Reads what is new (all of it, 1 MiB at a time); resolves once this log is caught up for now.
  Log.prototype.step = function () {
    var self = this, url = this.box.dataset.url, hqe = this.box.dataset.hqe;
    if (this.offset === null) {
      return get(url, { hqe: hqe, limit: 0 }).then(function (first) {
        self.offset = Math.max(0, first.size - FIRST_BYTES);
        self.skipped = self.offset;
        self.midLine = self.offset > 0;
        return self.step();
      });
    }
    return get(url, { hqe: hqe, offset: this.offset }).then(function (slice) {
      self.offset = slice.next_offset;
      self.show(slice);
      if (self.more(slice)) return self.step();
      self.ended = slice.ended;
    });
  };

  function round(logs) {
    var live = logs.filter(function (log) { return !log.ended; });
    if (!live.length) return;
    live.reduce(function (done, log) {
      return done.then(function () {
        return log.step().catch(function (err) { log.note.textContent = "log: " + err.message + "; retrying"; });
      });
    }, Promise.resolve()).then(function () { setTimeout(function () { round(logs); }, POLL_MS); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    round(Array.prototype.map.call(document.querySelectorAll(".fs-live-log"), function (box) { return new Log(box); }));
  });
})();
