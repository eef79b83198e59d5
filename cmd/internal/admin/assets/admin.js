// The live counters: GET /admin/counters.json every 2 seconds (the
// session's cookie goes with it), the table rebuilt from the answer.
(function () {
  const body = document.getElementById('counters');
  if (!body) return;
  const cell = (text, cls) => {
    const td = document.createElement('td');
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  };
  async function refresh() {
    try {
      const r = await fetch('/admin/counters.json', { credentials: 'same-origin', cache: 'no-store' });
      if (!r.ok) return;
      const counts = await r.json();
      const rows = counts.map((c) => {
        const tr = document.createElement('tr');
        tr.append(cell(c.Kind), cell(c.Route), cell(c.Op), cell(c.Outcome), cell(String(c.N), 'n'));
        return tr;
      });
      if (rows.length === 0) {
        const tr = document.createElement('tr');
        const td = cell('nothing counted yet', 'note');
        td.colSpan = 5;
        tr.append(td);
        rows.push(tr);
      }
      body.replaceChildren(...rows);
    } catch (e) {
      // The next tick tries again.
    }
  }
  setInterval(refresh, 2000);
})();
