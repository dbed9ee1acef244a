// Click a header to sort its table by that column (numbers by their raw data-value).
document.querySelectorAll("table.sortable thead th").forEach((th) => {
  th.addEventListener("click", () => {
    const table = th.closest("table");
    const col = Array.from(th.parentNode.children).indexOf(th);
    const asc = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("thead th").forEach((h) => h.removeAttribute("aria-sort"));
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    const key = (row) => {
      const cell = row.cells[col];
      const raw = cell ? cell.dataset.value : "";
      const num = raw === undefined || raw === "" ? NaN : Number(raw);
      return Number.isNaN(num) ? (cell ? cell.textContent.trim().toLowerCase() : "") : num;
    };
    const rows = Array.from(table.tBodies[0].rows);
    rows.sort((a, b) => {
      const x = key(a), y = key(b);
      const cmp = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : typeof x === "number" ? -1 : 1;
      return asc ? cmp : -cmp;
    });
    rows.forEach((r) => table.tBodies[0].appendChild(r));
  });
});
// Filter a long table: keep the rows whose text contains the query (case-insensitive).
document.querySelectorAll("input.filter").forEach((input) => {
  const table = document.getElementById(input.dataset.filter);
  input.addEventListener("input", () => {
    const q = input.value.trim().toLowerCase();
    Array.from(table.tBodies[0].rows).forEach((r) => {
      r.hidden = q !== "" && !r.textContent.toLowerCase().includes(q);
    });
  });
});
