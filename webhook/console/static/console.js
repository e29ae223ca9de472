// fairgate console: live updates over Server-Sent Events (/api/events). On a decision
// the current page's content is fetched again (?partial=1) and swapped in, at most
// once per 500 ms; keyboard focus inside the content is kept when possible.
(function () {
  "use strict";
  var main = document.getElementById("content");
  var live = document.getElementById("live");
  var last = document.getElementById("last-event");
  if (!main || !main.dataset.page || typeof EventSource === "undefined") { return; }
  var pending = null;

  function refresh() {
    pending = null;
    var url = new URL(window.location.href);
    url.searchParams.set("partial", "1");
    fetch(url.toString(), { credentials: "same-origin" }).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (html === null) { return; }
      var focused = document.activeElement && document.activeElement.id;
      main.innerHTML = html;
      main.dataset.updated = String(Date.now());
      if (focused) {
        var again = document.getElementById(focused);
        if (again) { again.focus(); }
      }
    }).catch(function () { /* the next event retries */ });
  }

  function schedule() { if (pending === null) { pending = setTimeout(refresh, 500); } }

  var source = new EventSource("/api/events");
  source.onopen = function () { live.textContent = "live updates: on"; live.className = "live on"; };
  source.onerror = function () { live.textContent = "live updates: reconnecting"; live.className = "live"; };
  source.addEventListener("decision", function (e) {
    var d = JSON.parse(e.data);
    last.textContent = "latest decision: " + d.decision + " " + (d.pod || "") +
      (d.tenant ? " (" + d.tenant + ")" : "") + " at " + d.time;
    schedule();
  });
  source.addEventListener("resync", schedule);
}());
