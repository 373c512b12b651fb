// The Sluice console: auto-refresh that can be paused, and relative times kept fresh.
// Served by Sluice itself; the page's CSP allows only same-origin scripts.
(function () {
  "use strict";
  var KEY = "sluice-console-autorefresh";

  function duration(seconds) {
    var s = Math.round(Math.abs(seconds));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min" + (s % 60 ? " " + (s % 60) + " s" : "");
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }

  function refreshTimes() {
    var now = Date.now();
    document.querySelectorAll("time[datetime] .rel").forEach(function (el) {
      var at = Date.parse(el.parentNode.getAttribute("datetime"));
      if (isNaN(at)) return;
      var delta = (now - at) / 1000;
      el.textContent = Math.abs(delta) < 1 ? "just now"
        : (delta > 0 ? duration(delta) + " ago" : "in " + duration(delta));
    });
  }

  function busy() {
    // Never reload under an operator who is choosing or typing.
    var active = document.activeElement;
    if (active && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName) && active.id !== "autorefresh") return true;
    return document.querySelector("input[name=ids]:checked") !== null;
  }

  document.addEventListener("DOMContentLoaded", function () {
    refreshTimes();
    setInterval(refreshTimes, 5000);
    var period = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
    var box = document.getElementById("autorefresh");
    var status = document.getElementById("refresh-status");
    if (!period || !box) return;
    box.checked = localStorage.getItem(KEY) !== "paused";
    var left = period;
    function show() {
      status.textContent = box.checked ? (busy() ? "waiting (selection in progress)" : "in " + left + " s") : "paused";
    }
    box.addEventListener("change", function () {
      localStorage.setItem(KEY, box.checked ? "on" : "paused");
      left = period;
      show();
    });
    show();
    setInterval(function () {
      if (!box.checked) return;
      if (busy()) { show(); return; }
      left -= 1;
      if (left <= 0) { window.location.reload(); return; }
      show();
    }, 1000);
  });
})();
