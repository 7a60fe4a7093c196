// prm-jax's one script over furo (issue 57.10): long dotted names (page titles, names in table cells) may wrap
// after a dot or an underscore, never inside a word. A <wbr> is offered there (it is not copied with the
// text); the stylesheet breaks these elements nowhere else.
document.addEventListener("DOMContentLoaded", function () {
  var targets = document.querySelectorAll("article h1, article table code, article table .pre");
  Array.prototype.forEach.call(targets, function (element) {
    var walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT, null);
    var texts = [];
    while (walker.nextNode()) { texts.push(walker.currentNode); }
    texts.forEach(function (node) {
      var parts = node.nodeValue.split(/(?<=[._])(?=[A-Za-z0-9])/);
      if (parts.length < 2) { return; }
      var fragment = document.createDocumentFragment();
      parts.forEach(function (part, i) {
        if (i > 0) { fragment.appendChild(document.createElement("wbr")); }
        fragment.appendChild(document.createTextNode(part));
      });
      node.parentNode.replaceChild(fragment, node);
    });
  });
});
