// The dashboard's live pages, watched: htmx's SSE extension opens each stream through
// htmx.createEventSource, which this replaces with a LiveSource. It reconnects by itself
// (exponential backoff, capped, with jitter) instead of the browser's fixed delay, and
// it knows when the page stops being live: the stream broke and the retry failed too,
// or no event came for two heartbeats (the server sends `ping` every heartbeat, its
// interval in ms as data). Then the page's clock says "Disconnected", how long ago it
// was last updated, and the page is marked `stale` (arona.css greys what it shows),
// until events flow again.
(function () {
  "use strict";
  var BASE_MS = 1000;
  var CAP_MS = 30000;
  var HEARTBEAT_MS = 15000;  // until the first ping says otherwise

  function LiveSource(url) {
    this.url = url;
    this.readyState = EventSource.CONNECTING;  // never CLOSED while retrying: the
    this.onopen = null;                        // extension then leaves retries to us
    this.onerror = null;
    this.listeners = [];
    this.failures = 0;
    this.heartbeatMs = HEARTBEAT_MS;
    this.lastEvent = Date.now();
    this.down = false;
    this.connect();
  }

  LiveSource.prototype.connect = function () {
    var self = this;
    var source = new EventSource(this.url, { withCredentials: true });
    this.source = source;
    this.listeners.forEach(function (l) { source.addEventListener(l.name, l.wrapped); });
    source.addEventListener("ping", function (event) {
      var ms = parseInt(event.data, 10);
      if (ms > 0) { self.heartbeatMs = ms; }
      self.alive();
    });
    source.onopen = function (event) {
      self.readyState = EventSource.OPEN;
      self.failures = 0;
      self.alive();
      if (self.onopen) { self.onopen(event); }
    };
    source.onerror = function (event) { self.fail(event, false); };
    this.alive(true);
  };

  // An event came (or a connection attempt started: `starting`): restart the watchdog.
  LiveSource.prototype.alive = function (starting) {
    var self = this;
    if (!starting) {
      this.lastEvent = Date.now();
      if (this.down) { showState(this, false); }
    }
    clearTimeout(this.watchdog);
    this.watchdog = setTimeout(function () {
      self.fail({ type: "timeout" }, true);
    }, 2 * this.heartbeatMs + 1000);
  };

  LiveSource.prototype.fail = function (event, silent) {
    if (this.readyState === EventSource.CLOSED) { return; }
    var self = this;
    this.source.close();
    clearTimeout(this.watchdog);
    this.readyState = EventSource.CONNECTING;
    this.failures += 1;
    // A stream that ends (they do, every minute) is retried once before anyone is told.
    if (silent || this.failures > 1) { showState(this, true); }
    if (this.onerror) { this.onerror(event); }
    if (this.readyState === EventSource.CLOSED) { return; }  // its page part is gone
    var delay = Math.min(CAP_MS, BASE_MS * Math.pow(2, this.failures - 1));
    delay = delay / 2 + Math.random() * delay / 2;
    this.retry = setTimeout(function () { self.connect(); }, delay);
  };

  LiveSource.prototype.close = function () {
    this.readyState = EventSource.CLOSED;
    clearTimeout(this.watchdog);
    clearTimeout(this.retry);
    clearInterval(this.ticker);
    this.source.close();
  };

  LiveSource.prototype.addEventListener = function (name, listener) {
    var self = this;
    var entry = { name: name, listener: listener, wrapped: function (event) {
      self.alive();
      listener(event);
    } };
    this.listeners.push(entry);
    this.source.addEventListener(name, entry.wrapped);
  };

  LiveSource.prototype.removeEventListener = function (name, listener) {
    var source = this.source;
    this.listeners = this.listeners.filter(function (entry) {
      if (entry.name !== name || entry.listener !== listener) { return true; }
      source.removeEventListener(name, entry.wrapped);
      return false;
    });
  };

  function ago(ms) {
    var s = Math.round(ms / 1000);
    if (s < 60) { return s + " s"; }
    return Math.floor(s / 60) + " min " + (s % 60) + " s";
  }

  // The page's look: its clocks (or a line made for the purpose) and the stale mark.
  function showState(live, down) {
    var roots = Array.prototype.filter.call(document.querySelectorAll("[sse-connect]"),
      function (el) { return el.getAttribute("sse-connect") === live.url; });
    live.down = down;
    clearInterval(live.ticker);
    roots.forEach(function (root) {
      root.classList.toggle("stale", down);
      var clocks = root.querySelectorAll(".live");
      if (!clocks.length && down) {
        var line = document.createElement("p");
        line.className = "muted small live";
        line.innerHTML = "<span class=\"live-dot\" aria-hidden=\"true\"></span> " +
          "<span class=\"live-state\"></span><span class=\"live-age\"></span>";
        root.prepend(line);
        clocks = [line];
      }
      Array.prototype.forEach.call(clocks, function (clock) {
        var state = clock.querySelector(".live-state");
        var age = clock.querySelector(".live-age");
        if (state) { state.textContent = down ? "Disconnected" : "Live"; }
        if (age) { age.textContent = ""; }
      });
    });
    if (!down) { return; }
    function tick() {
      roots.forEach(function (root) {
        root.querySelectorAll(".live-age").forEach(function (age) {
          age.textContent = " · last updated " + ago(Date.now() - live.lastEvent) + " ago";
        });
      });
    }
    tick();
    live.ticker = setInterval(tick, 1000);
  }

  htmx.createEventSource = function (url) { return new LiveSource(url); };
})();
