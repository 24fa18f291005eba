// Arona's only script besides htmx: toasts. Handlers answer with an
// `HX-Trigger: {"toast": {"level", "message"}}` header; errors that HTMX does not
// swap (4xx/5xx) carry one too, so a failure never passes silently.
(function () {
  "use strict";
  function show(detail) {
    var box = document.getElementById("toasts");
    if (!box || !detail || !detail.message) { return; }
    var item = document.createElement("p");
    item.className = "toast toast-" + (detail.level || "info");
    item.textContent = detail.message;
    box.appendChild(item);
    setTimeout(function () { item.remove(); }, 6000);
  }
  // An error answer without its own toast must not pass silently.
  function showUnexplained(xhr) {
    show({ level: "error", message: "The server answered " + xhr.status + "." });
  }
  document.addEventListener("toast", function (event) { show(event.detail); });
  // htmx fires the answer's HX-Trigger events on the element that asked. When a live
  // refresh has already replaced that element (an SSE update of the same table landed
  // first), they no longer bubble to the document and the toast would be lost: show it
  // here. readyState 4 comes before htmx's own onload, so a swap made by the answer
  // itself is not mistaken for a refresh.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var asker = event.detail.elt;
    var xhr = event.detail.xhr;
    if (!asker || !xhr) { return; }
    xhr.addEventListener("readystatechange", function () {
      if (xhr.readyState !== 4 || asker.isConnected) { return; }
      var header = xhr.getResponseHeader("HX-Trigger");
      if (header && header.charAt(0) === "{") {
        try { show(JSON.parse(header).toast); } catch (ignored) { /* not a JSON trigger */ }
      } else if (!header && xhr.status >= 400) {
        showUnexplained(xhr);
      }
    });
  });
  document.addEventListener("htmx:responseError", function (event) {
    var xhr = event.detail.xhr;
    if (xhr && !xhr.getResponseHeader("HX-Trigger")) {
      showUnexplained(xhr);
    }
  });
  // A refused form (422) comes back re-rendered with its errors: swap it like a 200.
  document.addEventListener("htmx:beforeSwap", function (event) {
    if (event.detail.xhr && event.detail.xhr.status === 422) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
  document.addEventListener("htmx:sendError", function () {
    show({ level: "error", message: "The server cannot be reached; retrying when it is back." });
  });
  // A field refused by the server carries aria-invalid and names its message (a
  // .field-error) in aria-describedby. Once the person edits it, both go.
  function errorNote(id) {
    var note = id && document.getElementById(id);
    return note && note.classList.contains("field-error") ? note : null;
  }
  function describedBy(field) {
    return (field.getAttribute("aria-describedby") || "").split(/\s+/).filter(Boolean);
  }
  function clearError(field) {
    field.removeAttribute("aria-invalid");
    var kept = describedBy(field).filter(function (id) {
      var note = errorNote(id);
      if (note) { note.remove(); }
      return !note && document.getElementById(id);
    });
    if (kept.length) {
      field.setAttribute("aria-describedby", kept.join(" "));
    } else {
      field.removeAttribute("aria-describedby");
    }
  }
  function onEdit(event) {
    var field = event.target.closest && event.target.closest('[aria-invalid="true"]');
    if (field) { clearError(field); }
  }
  document.addEventListener("input", onEdit);
  document.addEventListener("change", onEdit);
  // A field the re-rendered form no longer marks (one kept by hx-preserve keeps its old
  // attributes) loses its error state: it is in error only while its message is shown.
  document.addEventListener("htmx:afterSettle", function () {
    document.querySelectorAll('[aria-invalid="true"]').forEach(function (field) {
      if (!describedBy(field).some(errorNote)) { clearError(field); }
    });
  });
  // Copy buttons: <button data-copy="#id">; no inline handlers under the CSP. The
  // clipboard API exists only in secure contexts (HTTPS, localhost): elsewhere, or
  // when it refuses, the text is selected and the person is told to press the keys.
  function selectText(source) {
    if (typeof source.select === "function") {
      source.focus();
      source.select();
      return;
    }
    var range = document.createRange();
    range.selectNodeContents(source);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  function copyHint(button, text) {
    var hint = button.nextElementSibling;
    if (!hint || !hint.classList.contains("copy-hint")) {
      hint = document.createElement("span");
      hint.className = "copy-hint";
      hint.setAttribute("role", "status");
      button.after(hint);
    }
    hint.textContent = text;
  }
  function copyByHand(button, source) {
    selectText(source);
    var mac = /Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent);
    copyHint(button, "Selected: press " + (mac ? "⌘C" : "Ctrl+C") + " to copy.");
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) { return; }
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) { return; }
    var text = (source.value || source.textContent).trim();
    if (!navigator.clipboard || !window.isSecureContext) {
      copyByHand(button, source);
      return;
    }
    navigator.clipboard.writeText(text).then(function () {
      copyHint(button, "Copied.");
    }, function () { copyByHand(button, source); });
  });
})();
