// taskfence dashboard: small comforts only; every page works without it.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  // Instants in the reader's own time zone (the page prints UTC).
  for (const el of document.querySelectorAll("time[datetime]")) {
    const at = new Date(el.getAttribute("datetime"));
    if (!isNaN(at)) {
      el.textContent = at.toLocaleString(undefined, {
        year: "numeric", month: "2-digit", day: "2-digit",
        hour: "2-digit", minute: "2-digit", second: "2-digit",
      });
    }
  }
  // Copy buttons (the ids to publish again, a task id).
  for (const button of document.querySelectorAll("[data-copy]")) {
    button.hidden = false;
    button.addEventListener("click", () => {
      const source = document.getElementById(button.dataset.copy);
      if (source && navigator.clipboard) {
        navigator.clipboard.writeText(source.value ?? source.textContent);
        button.textContent = "Copied";
      }
    });
  }
  // Selecting a status or an order applies the filters at once.
  for (const select of document.querySelectorAll("form.filters select")) {
    select.addEventListener("change", () => select.form.requestSubmit());
  }
});
