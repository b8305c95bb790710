// The mathematics of the site, rendered in the reader's browser by KaTeX 0.16.47, shipped with the site
// (docs/assets/katex: the minified script, its auto-render extension, its CSS and woff2 fonts; MIT licence),
// so the pages need no network. pymdownx.arithmatex (generic mode) wraps every formula in an element of
// class "arithmatex" holding \( ... \) or \[ ... \]; only those are rendered (a dollar sign in code stays),
// and the navigation's links, where a heading with mathematics keeps its \( ... \) as text.
document$.subscribe(({ body }) => {
  for (const element of body.querySelectorAll(".arithmatex, .md-nav__link")) {
    renderMathInElement(element, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
});
