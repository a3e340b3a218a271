// Joined between RequireJS and the ipywidgets HTML manager into _static/widgets/widgets.js by
// `make book`: the manager's AMD modules resolve (and so load their icon fonts) from the
// folder of widgets.js itself, not from the page's folder or a CDN.
(function () {
  var src = document.currentScript.src;
  require.config({ paths: { "@jupyter-widgets/html-manager/dist": src.slice(0, src.lastIndexOf("/")) } });
})();
