// Follows status/ without a reload: asks /api/version every second, and when it changed,
// fetches this same URL's content (the server renders it alone for this header) and puts it
// in place. It also says how old the data is. Same origin only; nothing is ever sent but GETs.
(function () {
  "use strict";
  var POLL_MS = 500;  // /api/version is a dictionary lookup: asking twice a second costs the server nothing
  var content = document.getElementById("content");
  var age = document.getElementById("age");
  var live = document.getElementById("live");
  var version = document.body.getAttribute("data-version");
  var updated = parseFloat(age.getAttribute("data-updated")) || null;
  var skew = 0;  // server clock minus ours, so the age is the server's
  var lastContact = Date.now();
  var shown = null;  // the content last put in place by this script

  function ago(seconds) {
    seconds = Math.max(0, Math.round(seconds));
    if (seconds < 90) return seconds + " s ago";
    if (seconds < 5400) return Math.round(seconds / 60) + " min ago";
    if (seconds < 172800) return Math.round(seconds / 3600) + " h ago";
    return Math.round(seconds / 86400) + " days ago";
  }

  function showAge() {
    if (!updated) { age.textContent = "no status written yet"; return; }
    var now = Date.now() / 1000 + skew;
    var when = new Date(updated * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
    age.textContent = "status last written " + when + ", " + ago(now - updated);
    age.setAttribute("data-updated", String(updated));
  }

  function setLive(state, text) {
    live.className = "live-" + state;
    live.textContent = text;
  }

  function refresh() {
    return fetch(window.location.pathname + window.location.search, {
      headers: { "X-Dashboard-Fragment": "1" }, cache: "no-store", credentials: "same-origin"
    }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      var v = r.headers.get("X-Dashboard-Version");
      return r.text().then(function (html) {
        // Another file changed, not what this page shows: no new layout for the same content.
        if (html !== shown) { content.innerHTML = html; shown = html; }
        if (v) { version = v; document.body.setAttribute("data-version", v); }
      });
    });
  }

  function poll() {
    fetch("/api/version", { cache: "no-store", credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (v) {
        lastContact = Date.now();
        skew = v.now - Date.now() / 1000;
        updated = v.updated;
        setLive("on", "live");
        if (v.version !== version) return refresh();
      })
      .catch(function () {
        setLive("lost", "no answer from the dashboard since " + ago((Date.now() - lastContact) / 1000));
      })
      .then(function () { showAge(); window.setTimeout(poll, POLL_MS); });
  }

  showAge();
  window.setInterval(showAge, 1000);
  poll();
})();
