// The side-by-side view (_ext/sidebyside.py): show the two chosen frameworks in every row.
// All side-by-side blocks of a page follow the same choice.
(function () {
  function apply(left, right) {
    document.querySelectorAll(".sbs").forEach(function (box) {
      box.querySelector(".sbs-left").value = left;
      box.querySelector(".sbs-right").value = right;
      box.querySelectorAll(".sbs-cell").forEach(function (cell) {
        var fw = [].find.call(cell.classList, function (c) {
          return c.indexOf("sbs-") === 0 && ["sbs-cell", "sbs-shown"].indexOf(c) < 0;
        }).slice(4);
        var shown = fw === left || fw === right;
        cell.classList.toggle("sbs-shown", shown);
        cell.style.order = fw === left ? 0 : 1;
      });
      box.classList.toggle("sbs-single", left === right);
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll(".sbs select").forEach(function (sel) {
      sel.addEventListener("change", function () {
        var box = sel.closest(".sbs");
        apply(box.querySelector(".sbs-left").value, box.querySelector(".sbs-right").value);
      });
    });
  });
})();
