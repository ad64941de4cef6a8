/* The admin's job page: each entry's live log, read from the REST API (GET /api/v1/jobs/ID/log) with
   the admin's own session, from the byte offset the last read ended at, every second until the
   master says nothing more is coming. Text goes in with textContent, so a job's output is never HTML. */
(function () {
  "use strict";

  var POLL_MS = 1000;
  // A page shows at most the last this many bytes at first: `fleetshard job log` prints them all.
  var FIRST_BYTES = 256 * 1024;

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

  function follow(box) {
    var url = box.dataset.url, hqe = box.dataset.hqe;
    var note = box.querySelector(".fs-log-note");
    var pre = document.createElement("pre");
    pre.className = "fs-log fs-live";
    pre.style.cssText = "margin:0;max-width:60em;max-height:30em;overflow:auto;white-space:pre-wrap;font-size:11px";
    var offset = 0, shown = false;

    function show(slice) {
      if (!shown && (slice.text || slice.size > 0)) {
        // The live log replaces the tail the page was rendered with.
        Array.prototype.forEach.call(box.querySelectorAll("pre:not(.fs-live)"), function (old) { old.remove(); });
        box.appendChild(pre);
        shown = true;
      }
      if (slice.text) {
        var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.appendChild(document.createTextNode(slice.text));
        if (atBottom) pre.scrollTop = pre.scrollHeight;
      }
      var parts = [];
      if (slice.truncated) parts.push("[fleetshard] the master keeps the first " + slice.size + " bytes of this log");
      if (box.dataset.skipped) parts.push("(the first " + box.dataset.skipped + " bytes are not shown: `fleetshard job log` prints them)");
      if (!slice.ended) parts.push("live: " + slice.hqe_status);
      note.textContent = parts.join(" ");
      box.dataset.state = slice.ended ? "ended" : "live";
      box.dataset.offset = slice.next_offset;
    }

    function poll() {
      get(url, { hqe: hqe, offset: offset }).then(function (slice) {
        offset = slice.next_offset;
        show(slice);
        var more = slice.text && slice.next_offset < slice.size;
        if (more) poll();
        else if (!slice.ended) setTimeout(poll, POLL_MS);
      }).catch(function (err) {
        note.textContent = "log: " + err.message + "; retrying";
        setTimeout(poll, POLL_MS * 5);
      });
    }

    get(url, { hqe: hqe, limit: 0 }).then(function (first) {
      offset = Math.max(0, first.size - FIRST_BYTES);
      if (offset > 0) box.dataset.skipped = String(offset);
      poll();
    }).catch(function (err) {
      note.textContent = "log: " + err.message;
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll(".fs-live-log"), follow);
  });
})();
