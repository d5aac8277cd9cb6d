// Side-by-side comparison of any two runs. Run data comes from data/run-*.js files (plain script
// files, so this works from a local folder with no server). Everything from the store is inserted
// with textContent, never as markup.
"use strict";
(function () {
  var index = window.GRACE_RUN_INDEX || [];
  var byUid = {};
  index.forEach(function (run) { byUid[run.uid] = run; });
  window.GRACE_RUNS = window.GRACE_RUNS || {};
  var form = document.getElementById("compare-form");
  var selA = document.getElementById("run-a");
  var selB = document.getElementById("run-b");
  var onlyChanges = document.getElementById("only-changes");
  var statusLine = document.getElementById("compare-status");
  var table = document.getElementById("compare-table");
  var band = parseFloat(form.getAttribute("data-band")) || 0.05;

  index.slice().reverse().forEach(function (run) {
    [selA, selB].forEach(function (sel) {
      var option = document.createElement("option");
      option.value = run.uid;
      option.textContent = run.started + "  " + run.cell + "  " + (run.sha ? "code " + run.sha + "  " : "") +
        (run.label || "") + "  (" + run.uid.slice(0, 8) + ")";
      sel.appendChild(option);
    });
  });

  function load(uid) {
    return new Promise(function (resolve, reject) {
      if (!uid) { resolve(null); return; }
      if (window.GRACE_RUNS[uid]) { resolve(window.GRACE_RUNS[uid]); return; }
      var run = byUid[uid];
      if (!run) { reject(new Error("no run " + uid + " in this site")); return; }
      var script = document.createElement("script");
      script.src = "data/" + run.file;
      script.onload = function () { resolve(window.GRACE_RUNS[uid] || null); };
      script.onerror = function () { reject(new Error("could not load the data of run " + uid)); };
      document.head.appendChild(script);
    });
  }

  function cell(row, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) { td.className = cls; }
    row.appendChild(td);
  }

  function passing(status) { return status === "pass" || status === "ok"; }

  function fmt(value) { return value === null || value === undefined ? "-" : Number(value).toPrecision(4); }

  function render(a, b) {
    var rows = {};
    [[a, 0], [b, 1]].forEach(function (pair) {
      if (!pair[0]) { return; }
      pair[0].rows.forEach(function (r) {
        var key = r[0] + "\u0000" + r[1] + "\u0000" + r[2];
        rows[key] = rows[key] || { suite: r[0], workload: r[1], mode: r[2], s: [null, null], m: [null, null] };
        rows[key].s[pair[1]] = r[3];
        rows[key].m[pair[1]] = r[4];
      });
    });
    var tbody = table.querySelector("tbody");
    while (tbody.firstChild) { tbody.removeChild(tbody.firstChild); }
    var shown = 0, changed = 0;
    Object.keys(rows).sort().forEach(function (key) {
      var r = rows[key];
      var ratio = r.m[0] && r.m[1] ? r.m[1] / r.m[0] : null;
      var absent = r.s[0] === null || r.s[1] === null;
      var slower = ratio !== null && ratio > 1 + band, faster = ratio !== null && ratio < 1 / (1 + band);
      var statusChanged = !absent && r.s[0] !== r.s[1];
      var differs = absent || statusChanged || slower || faster;
      if (differs) { changed += 1; }
      if (onlyChanges.checked && !differs) { return; }
      var tr = document.createElement("tr");
      // Colour says which way a real difference goes; a result only one run has is grey, not a change.
      if (statusChanged) { tr.className = passing(r.s[1]) ? "better" : "worse"; }
      else if (slower) { tr.className = "worse"; }
      else if (faster) { tr.className = "better"; }
      else if (absent) { tr.className = "absent"; }
      cell(tr, r.suite); cell(tr, r.workload); cell(tr, r.mode);
      cell(tr, r.s[0] === null ? "absent" : r.s[0]); cell(tr, r.s[1] === null ? "absent" : r.s[1]);
      cell(tr, fmt(r.m[0]), "num"); cell(tr, fmt(r.m[1]), "num");
      cell(tr, ratio === null ? "-" : ratio.toFixed(3), "num");
      tbody.appendChild(tr);
      shown += 1;
    });
    table.hidden = shown === 0;
    statusLine.textContent = Object.keys(rows).length + " results, " + changed + " differ (band " + (band * 100).toFixed(1) + "%)";
  }

  function update(push) {
    var a = selA.value, b = selB.value;
    if (push && window.history && window.history.replaceState) {
      window.history.replaceState(null, "", "?a=" + encodeURIComponent(a) + "&b=" + encodeURIComponent(b));
    }
    if (!a || !b) { table.hidden = true; statusLine.textContent = "Choose two runs."; return; }
    statusLine.textContent = "Loading...";
    Promise.all([load(a), load(b)]).then(function (data) { render(data[0], data[1]); }, function (err) {
      table.hidden = true;
      statusLine.textContent = err.message;
    });
  }

  // The default pair: the newest run and the run before it of the same cell that shares a suite with it.
  function defaultPair() {
    for (var i = index.length - 1; i >= 0; i -= 1) {
      var b = index[i];
      for (var j = i - 1; j >= 0; j -= 1) {
        var a = index[j];
        if (a.cell_key === b.cell_key && a.suites.some(function (s) { return b.suites.indexOf(s) >= 0; })) {
          return [a.uid, b.uid];
        }
      }
    }
    return ["", ""];
  }

  var params = new URLSearchParams(window.location.search);
  if (!params.get("a") && !params.get("b")) {
    var pair = defaultPair();
    selA.value = pair[0];
    selB.value = pair[1];
  }
  [["a", selA], ["b", selB]].forEach(function (pair) {
    var uid = params.get(pair[0]);
    if (uid && byUid[uid]) { pair[1].value = uid; }
    else if (uid) { statusLine.textContent = "no run " + uid + " in this site"; }
  });
  selA.addEventListener("change", function () { update(true); });
  selB.addEventListener("change", function () { update(true); });
  onlyChanges.addEventListener("change", function () { update(false); });
  if (selA.value || selB.value) { update(false); }
}());
