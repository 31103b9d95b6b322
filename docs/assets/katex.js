// Renders the math that pymdownx.arithmatex marks (class "arithmatex", \( \) inline, \[ \] display) with the KaTeX
// served from this site. Material's instant navigation swaps pages without a reload, so this runs on every page shown.
function renderMath() {
  for (const element of document.querySelectorAll(".arithmatex")) {
    renderMathInElement(element, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
}
if (typeof document$ !== "undefined") {
  document$.subscribe(renderMath);
} else {
  document.addEventListener("DOMContentLoaded", renderMath);
}
