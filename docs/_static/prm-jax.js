// prm-jax's one script over furo (issue 57.10): long dotted names wrap after a dot (page titles) or after a dot
// or an underscore (names in table cells), never inside a word. A <wbr> is offered there (it is not copied
// with the text); the stylesheet breaks these elements nowhere else.
document.addEventListener("DOMContentLoaded", function () {
  function offerBreaks(selector, after) {
    Array.prototype.forEach.call(document.querySelectorAll(selector), function (element) {
      var walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT, null);
      var texts = [];
      while (walker.nextNode()) { texts.push(walker.currentNode); }
      texts.forEach(function (node) {
        var parts = node.nodeValue.split(after);
        if (parts.length < 2) { return; }
        var fragment = document.createDocumentFragment();
        parts.forEach(function (part, i) {
          if (i > 0) { fragment.appendChild(document.createElement("wbr")); }
          fragment.appendChild(document.createTextNode(part));
        });
        node.parentNode.replaceChild(fragment, node);
      });
    });
  }
  offerBreaks("article h1", /(?<=\.)(?=[A-Za-z0-9])/);
  offerBreaks("article table code, article table .pre", /(?<=[._])(?=[A-Za-z0-9])/);
});
