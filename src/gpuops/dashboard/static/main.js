// gpuops dashboard: which page this is (the overview, a run, runs compared).
(function () {
  "use strict";
  const m = location.pathname.match(/^\/run\/([^/]+)$/);
  if (m) window.G.runPage(decodeURIComponent(m[1]));
  else if (location.pathname === "/compare") window.G.comparePage(new URLSearchParams(location.search).getAll("run"));
  else window.G.overviewPage();
})();
