// A form's buttons disable themselves when it is submitted, so a double
// click sends one request. Without scripts the shop's submit token does the
// same job on the server: a second submission leads to the first's order.
document.addEventListener('submit', function (e) {
  var form = e.target;
  if (form.dataset.sent) {
    e.preventDefault();
    return;
  }
  form.dataset.sent = '1';
  form.querySelectorAll('button').forEach(function (b) { b.disabled = true; });
});
// A page restored by the back button gets its buttons back.
window.addEventListener('pageshow', function () {
  document.querySelectorAll('form').forEach(function (f) {
    delete f.dataset.sent;
    f.querySelectorAll('button').forEach(function (b) { b.disabled = false; });
  });
});
