// The console's few behaviours (same-origin script; the pages read without it).
// * A submit button with data-confirm asks first, with the number of rows it touches.
// * "select all" checks every row of its form on this page and says how many.
(function () {
  "use strict";
  function selected(form) {
    return form.querySelectorAll("input[type=checkbox][name=ids]:checked").length;
  }
  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    if (!button || !button.dataset) { return; }
    var text = button.dataset.confirm;
    if (button.dataset.confirmSelected !== undefined) {
      var n = selected(event.target);
      if (!n) { window.alert("Select at least one row first."); event.preventDefault(); return; }
      text = button.dataset.confirmSelected.replace("{n}", String(n));
    }
    if (text && !window.confirm(text)) { event.preventDefault(); }
  });
  function count(form) {
    var out = form.querySelector(".selected-count");
    if (out) { out.textContent = selected(form) + " selected on this page"; }
  }
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!(box instanceof HTMLInputElement) || box.type !== "checkbox" || !box.form) { return; }
    if (box.classList.contains("select-all")) {
      box.form.querySelectorAll("input[type=checkbox][name=ids]").forEach(function (b) {
        b.checked = box.checked;
      });
    }
    count(box.form);
  });
})();
