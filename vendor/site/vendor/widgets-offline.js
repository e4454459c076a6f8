/* The GPU Memory Book (not from npm): loaded after require.js and before @jupyter-widgets/html-manager's
   embed-amd.js, see nb_ipywidgets_js in _config.yml. */
(function () {
  // 1. The AMD modules bundled in embed-amd.js locate their fonts from their RequireJS module URL, which by
  //    default is relative to the page (chapters/@jupyter-widgets/...). Map those module ids to the folder
  //    that holds embed-amd.js and its fonts.
  var assets = new URL('html-manager/', document.currentScript.src).href;
  window.__jupyter_widgets_assets_path__ = assets;
  if (window.require && window.require.config) {
    window.require.config({paths: {
      '@jupyter-widgets/html-manager/dist': assets.slice(0, -1),
      '@jupyter-widgets': assets.slice(0, -1)
    }});
  }
  // 2. ipywidgets 8 typesets labels with MathJax 2's API, MathJax.Hub.Queue(['Typeset', MathJax.Hub, el]),
  //    and throws on a page with MathJax 3 (no Hub). Give whatever window.MathJax becomes (Sphinx's config
  //    object, then MathJax 3 itself) a Hub whose Queue runs a MathJax 3 typeset of that element.
  function addHub(mj) {
    if (mj && typeof mj === 'object' && !mj.Hub) {
      mj.Hub = {Queue: function (job) {
        var el = job && job[2], M = window.MathJax;
        if (el && M && M.typesetPromise && M.startup && M.startup.promise) {
          M.startup.promise.then(function () { return M.typesetPromise([el]); });
        }
      }};
    }
    return mj;
  }
  var current = addHub(window.MathJax);
  Object.defineProperty(window, 'MathJax', {
    configurable: true, enumerable: true,
    get: function () { return current; },
    set: function (value) { current = addHub(value); }
  });
})();
