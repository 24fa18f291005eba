// Keeps what a visitor typed when their session expired before a form was sent.
//
// Every form post is remembered (plain fields only: never passwords, secrets, keys,
// tokens or hidden fields) in sessionStorage as "pending", keyed by the page and the
// form's action. When the answer is the login page (an HTMX post gets a
// `loginRequired` event before its redirect; a plain post lands on /login), the
// pending entry is marked as interrupted. After logging in, the login page sends the
// visitor back to the page the form was on; there the fields are put back and a note
// asks to submit again. Any other outcome drops the entry. A form opts out with
// data-restore="off" (the login, register and logout forms).
(function () {
  "use strict";
  var KEY = "arona:pending-form";
  var MAX_AGE_MS = 60 * 60 * 1000;
  var SKIPPED_TYPES = ["password", "hidden", "file", "submit", "button", "reset", "image"];
  var SECRET_NAME = /pass|secret|token|key|credential/i;

  function here() { return location.pathname + location.search; }

  function read() {
    try { return JSON.parse(sessionStorage.getItem(KEY) || "null"); } catch (ignored) { return null; }
  }
  function write(entry) {
    try { sessionStorage.setItem(KEY, JSON.stringify(entry)); } catch (ignored) { /* full or off */ }
  }
  function drop() {
    try { sessionStorage.removeItem(KEY); } catch (ignored) { /* storage off */ }
  }

  function plain(field) {
    if (!field.name || field.disabled || field.name === "csrf_token") { return false; }
    if (SKIPPED_TYPES.indexOf(field.type) !== -1 || SECRET_NAME.test(field.name)) { return false; }
    var complete = field.getAttribute("autocomplete") || "";
    return complete.indexOf("password") === -1 && complete !== "one-time-code";
  }

  function remember(form) {
    // The login form itself must leave the entry it is about to bring back alone.
    if (form.getAttribute("data-restore") === "off") { return; }
    var fields = [];
    Array.prototype.forEach.call(form.elements, function (field) {
      if (!plain(field)) { return; }
      if (field.type === "checkbox" || field.type === "radio") {
        fields.push([field.name, field.value, field.checked]);
      } else if (field.tagName !== "BUTTON") {
        fields.push([field.name, field.value, null]);
      }
    });
    if (!fields.length) { drop(); return; }
    write({ page: here(), form: form.getAttribute("action") || "", fields: fields,
            at: Date.now(), interrupted: false });
  }

  function interrupted() {
    var entry = read();
    if (entry) { entry.interrupted = true; write(entry); }
  }

  function formFor(entry) {
    for (var i = 0; i < document.forms.length; i++) {
      if ((document.forms[i].getAttribute("action") || "") === entry.form) { return document.forms[i]; }
    }
    return null;
  }

  function restore(form, entry) {
    entry.fields.forEach(function (saved) {
      Array.prototype.forEach.call(form.elements, function (field) {
        if (field.name !== saved[0] || !plain(field)) { return; }
        if (field.type === "checkbox" || field.type === "radio") {
          if (field.value === saved[1]) { field.checked = saved[2]; }
        } else {
          field.value = saved[1];
        }
      });
    });
    var note = document.createElement("p");
    note.className = "notice";
    note.setAttribute("role", "status");
    note.setAttribute("data-restored-note", "");
    note.textContent = "Your session had expired, so this form was not sent. What you typed is "
      + "back (secret fields stay empty): check it and submit again.";
    form.insertBefore(note, form.firstChild);
  }

  function onPageLoad() {
    var entry = read();
    if (!entry) { return; }
    if (location.pathname === "/login") {
      interrupted();  // a plain post answered with the login page
      return;
    }
    drop();  // whatever happens next, an entry is put back once at most
    var fresh = Date.now() - entry.at < MAX_AGE_MS;
    if (!entry.interrupted || !fresh || entry.page !== here()) { return; }
    var form = formFor(entry);
    if (form) { restore(form, entry); }
  }

  // Capture: the entry must be written before HTMX (or the browser) sends the form.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form && form.tagName === "FORM" && (form.method || "").toLowerCase() === "post") {
      remember(form);
    }
  }, true);
  document.addEventListener("loginRequired", interrupted);
  // An HTMX post that was answered (saved, or refused with its errors) needs no entry.
  document.addEventListener("htmx:afterRequest", function (event) {
    var xhr = event.detail && event.detail.xhr;
    var redirect = xhr && xhr.getResponseHeader("HX-Redirect");
    if (xhr && !(redirect && redirect.indexOf("/login") === 0)) {
      var entry = read();
      if (entry && !entry.interrupted) { drop(); }
    }
  });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", onPageLoad);
  } else {
    onPageLoad();
  }
})();
