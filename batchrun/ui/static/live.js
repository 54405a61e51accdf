// Served at /static/live.js: no inline script, so the Content-Security-Policy allows none.
// The live parts: every element with data-live="/api/...#key" is refreshed each second.
// Without JavaScript the page is complete as served; reload it to see newer numbers.
(function () {
  var live = document.querySelectorAll("[data-live]");
  var url = document.body.getAttribute("data-live-url");
  if (!live.length || !url || !window.fetch) return;
  function tick() {
    fetch(url, {credentials: "same-origin"}).then(function (r) { return r.json(); })
      .then(function (data) {
        live.forEach(function (el) {
          var value = data[el.getAttribute("data-live")];
          if (value === undefined) return;
          if (el.classList.contains("bar")) {
            el.value = value.percent;
            el.textContent = Math.round(value.percent) + "%";
            el.classList.toggle("paused", !!value.paused);
            el.title = value.done + " of " + value.total;
          } else { el.textContent = value; }
        });
      }).catch(function () {}).then(function () { setTimeout(tick, 1000); });
  }
  setTimeout(tick, 1000);
})();
