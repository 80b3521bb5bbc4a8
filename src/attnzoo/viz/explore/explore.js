// The attnzoo attention explorer. Reads the JSON of #explore-data (schema: attnzoo/viz/explore.py)
// and draws, for the chosen example, attention kind, layer and head (or the heads' mean): the
// current output step's weights over the inputs (the step view, drawn by the data's layout)
// beside the whole matrix. Weights are 8-bit levels; every value shown is levels / DATA.levels.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("explore-data").textContent);
  const LEVELS = DATA.levels;
  const state = { example: 0, kind: 0, layer: 0, head: 0, step: 0 };
  const decoded = new Map(); // "example/kind" -> Uint8Array of that kind's levels
  const $ = (id) => document.getElementById(id);

  // ----- data -----
  function example() { return DATA.examples[state.example]; }
  function kind() { return example().attention[state.kind] || null; }

  function levels(k) {
    const key = state.example + "/" + state.kind;
    if (!decoded.has(key)) {
      const text = atob(k.data);
      const bytes = new Uint8Array(text.length);
      for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
      decoded.set(key, bytes);
    }
    return decoded.get(key);
  }

  // The (rows x columns) levels of the chosen layer and head; head == heads: their mean.
  function matrix(k) {
    const [, heads, rows, cols] = k.shape;
    const size = rows * cols;
    const bytes = levels(k);
    const out = new Float64Array(size);
    const first = state.head < heads ? state.head : 0;
    const last = state.head < heads ? state.head + 1 : heads;
    for (let h = first; h < last; h++) {
      const offset = (state.layer * heads + h) * size;
      for (let i = 0; i < size; i++) out[i] += bytes[offset + i];
    }
    if (last - first > 1) for (let i = 0; i < size; i++) out[i] /= last - first;
    return out;
  }

  function value(level) { return (level / LEVELS).toFixed(3); }
  function label(token) { return token.trim() ? token : "\u2423"; } // a visible space
  function ink(level) { // weight 0: white, 1: black
    const g = Math.round(255 - (255 * level) / LEVELS);
    return "rgb(" + g + "," + g + "," + g + ")";
  }
  function signedInk(v, limit) { // a signal with values below 0: 0 white, +limit red, -limit blue
    const g = Math.round(255 * (1 - Math.min(1, Math.abs(v) / limit)));
    return v >= 0 ? "rgb(255," + g + "," + g + ")" : "rgb(" + g + "," + g + ",255)";
  }
  function argmax(row) {
    let best = 0;
    for (let j = 1; j < row.length; j++) if (row[j] > row[best]) best = j;
    return best;
  }
  function currentRow(k, m) {
    const cols = k.shape[3];
    return m.subarray(state.step * cols, (state.step + 1) * cols);
  }
  function say(text) { $("readout").textContent = text; }

  // ----- controls -----
  function fill(select, names, chosen) {
    select.replaceChildren(...names.map((name, i) => {
      const option = document.createElement("option");
      option.value = String(i);
      option.textContent = name;
      option.selected = i === chosen;
      return option;
    }));
  }

  function mark(correct) {
    return correct === true ? "\u2713" : correct === false ? "\u2717" : "\u00b7";
  }

  function setupExamples() {
    fill($("example"), DATA.examples.map((e, i) =>
      (i + 1) + ". " + mark(e.correct) + " " + (e.input.length > 60 ? e.input.slice(0, 59) + "\u2026" : e.input)
    ), state.example);
  }

  function setupKind() {
    const kinds = example().attention;
    state.kind = Math.min(state.kind, Math.max(0, kinds.length - 1));
    fill($("kind"), kinds.map((k) => k.name), state.kind);
    $("kind-box").hidden = kinds.length < 2;
    const k = kind();
    const [layers, heads] = k ? k.shape : [1, 1];
    state.layer = Math.min(state.layer, layers - 1);
    state.head = Math.min(state.head, heads > 1 ? heads : 0);
    fill($("layer"), Array.from({ length: layers }, (_, i) => "layer " + (i + 1)), state.layer);
    const headNames = Array.from({ length: heads }, (_, i) => "head " + (i + 1));
    if (heads > 1) headNames.push("mean of heads");
    fill($("head"), headNames, state.head);
    $("layer-box").hidden = layers < 2;
    $("head-box").hidden = heads < 2;
    const rows = k ? k.shape[2] : 1;
    state.step = Math.min(state.step, rows - 1);
    $("step").max = String(rows - 1);
  }

  // ----- drawing -----
  function drawInfo() {
    const e = example();
    $("input").textContent = e.input;
    $("reference").textContent = e.reference;
    $("prediction").textContent = e.prediction;
    const c = $("correct");
    c.textContent = e.correct === true ? "\u2713 correct" : e.correct === false ? "\u2717 wrong" : "";
    c.className = e.correct === true ? "right" : e.correct === false ? "wrong" : "";
  }

  function drawCells(k, row) {
    const best = argmax(row);
    const small = k.columns.length > 40;
    $("cells").replaceChildren(...k.columns.map((token, j) => {
      const cell = document.createElement("span");
      cell.className = "cell" + (small ? " small-cell" : "") + (j === best ? " argmax" : "");
      cell.dataset.col = String(j);
      cell.dataset.level = String(row[j]);
      cell.textContent = label(token);
      cell.style.background = ink(row[j]);
      cell.style.color = row[j] > LEVELS / 2 ? "#fff" : "#000";
      cell.title = label(token) + ": " + value(row[j]);
      cell.addEventListener("mouseenter", () =>
        say(k.rows[state.step] + " \u2192 " + label(token) + " (column " + (j + 1) + "): " + value(row[j])));
      return cell;
    }));
  }

  // Step views by layout: each draws what the columns are (points, memory signals) for the
  // current step; the cell strip above is common to all.
  const LAYOUTS = {
    tokens() { $("layout-view").replaceChildren(); },

    points(k, row) {
      const e = example();
      const ns = "http://www.w3.org/2000/svg";
      const size = 320, pad = 20;
      const flat = e.points[0].length === 1; // numbers: value across, input index down
      const n = e.points.length;
      const xy = e.points.map((p, i) => flat
        ? [pad + p[0] * (size - 2 * pad), pad + (n > 1 ? i / (n - 1) : 0.5) * (size - 2 * pad)]
        : [pad + p[0] * (size - 2 * pad), size - pad - p[1] * (size - 2 * pad)]);
      const svg = document.createElementNS(ns, "svg");
      svg.setAttribute("width", size);
      svg.setAttribute("height", size);
      svg.setAttribute("id", "points-view");
      const add = (name, attrs) => {
        const el = document.createElementNS(ns, name);
        for (const [a, v] of Object.entries(attrs)) el.setAttribute(a, v);
        svg.appendChild(el);
        return el;
      };
      const path = (indices, closed) => indices.map((i, s) => (s ? "L" : "M") + xy[i][0] + " " + xy[i][1]).join(" ") + (closed ? " Z" : "");
      if (e.truth && e.truth.length) add("path", { d: path(e.truth, e.closed), fill: "none", stroke: "#aaa", "stroke-dasharray": "4 3" });
      const chosen = e.output.slice(0, state.step + 1).map((c) => e.column_points[c]).filter((i) => i !== null);
      const done = state.step === e.output.length - 1;
      if (chosen.length) add("path", { d: path(chosen, e.closed && done), fill: "none", stroke: "#d62728", "stroke-width": 1.5, id: "tour-so-far" });
      const colOf = new Map(e.column_points.map((p, j) => [p, j]));
      xy.forEach(([x, y], i) => {
        const level = row[colOf.get(i)] || 0;
        const dot = add("circle", { cx: x, cy: y, r: 4 + (10 * level) / LEVELS, fill: ink(level), stroke: "#333" });
        dot.addEventListener("mouseenter", () => say("point " + i + ": " + value(level)));
        add("text", { x: x + 7, y: y - 6 }).textContent = String(i);
      });
      $("layout-view").replaceChildren(svg);
    },

    image(k, row) {
      // the image, the glimpse path so far, and this step's retina (one square per scale,
      // placed as the sensor places it: the centre rounded to the pixel grid)
      const e = example();
      const ns = "http://www.w3.org/2000/svg";
      const height = e.image.length, width = e.image[0].length;
      const px = Math.max(1, Math.floor(320 / Math.max(height, width)));
      const svg = document.createElementNS(ns, "svg");
      svg.setAttribute("width", width * px);
      svg.setAttribute("height", height * px);
      svg.setAttribute("id", "image-view");
      const add = (name, attrs) => {
        const el = document.createElementNS(ns, name);
        for (const [a, v] of Object.entries(attrs)) el.setAttribute(a, v);
        svg.appendChild(el);
        return el;
      };
      add("rect", { x: 0, y: 0, width: width * px, height: height * px, fill: "#000" });
      e.image.forEach((line, r) => line.forEach((v, c) => {
        if (v > 0) {
          const grey = Math.round(255 * Math.min(1, v));
          add("rect", { x: c * px, y: r * px, width: px, height: px, fill: "rgb(" + grey + "," + grey + "," + grey + ")" });
        }
      }));
      if (e.grid && row) {
        // attention over a grid of cells (e.g. a CNN's feature map), drawn over the image
        const [gh, gw] = e.grid, ch = (height * px) / gh, cw = (width * px) / gw;
        const top = Math.max(1, ...row);
        row.forEach((level, j) => {
          if (level > 0) add("rect", { x: (j % gw) * cw, y: Math.floor(j / gw) * ch, width: cw, height: ch, fill: "#ff7f0e", "fill-opacity": (0.7 * level) / top, class: "grid-cell" });
        });
      }
      // the path up to the step; without one (e.path false), the step's point alone
      const seen = e.glimpses.slice(e.path === false ? state.step : 0, state.step + 1);
      if (seen.length) {
        const [x, y] = seen[seen.length - 1];
        if (e.path === false) {
          add("circle", { cx: x * px, cy: y * px, r: 4, fill: "#2ca02c", id: "glimpse-point" });
        } else {
          const d = seen.map(([gx, gy], s) => (s ? "L" : "M") + gx * px + " " + gy * px).join(" ");
          add("path", { d: d, fill: "none", stroke: "#2ca02c", "stroke-width": 1.5, id: "glimpse-path" });
        }
        for (const side of e.sizes) {
          const left = Math.floor(x - side / 2 + 0.5), top = Math.floor(y - side / 2 + 0.5);
          add("rect", { x: left * px, y: top * px, width: side * px, height: side * px, fill: "none", stroke: "#d62728" });
        }
        say(k.rows[state.step] + " at (" + x.toFixed(1) + ", " + y.toFixed(1) + ") px");
      }
      $("layout-view").replaceChildren(svg);
    },

    memory(k, row) {
      const e = example();
      const table = document.createElement("table");
      table.className = "signals";
      for (const [name, values] of Object.entries(e.signals)) {
        const tr = table.insertRow();
        const th = document.createElement("th");
        th.textContent = name;
        tr.appendChild(th);
        // a signal with a value below 0 anywhere (repeat copy's normalised count) is drawn on a
        // signed scale: clamped to 0-1 it was white, as no input is
        const all = values.flat();
        const signed = all.some((v) => v < 0);
        const limit = Math.max(1, ...all.map(Math.abs));
        for (const v of values[state.step] || []) {
          const td = tr.insertCell();
          const level = Math.max(0, Math.min(1, v)) * LEVELS;
          td.style.background = signed ? signedInk(v, limit) : ink(level);
          if (signed) td.dataset.signed = "1";
          td.title = name + ": " + v;
          td.addEventListener("mouseenter", () => say(name + " at step " + (state.step + 1) + ": " + v));
        }
      }
      const caption = document.createElement("p");
      caption.className = "small";
      caption.textContent = "this step's signals (" + Object.keys(e.signals).join(", ") + ")";
      $("layout-view").replaceChildren(caption, table);
    },
  };

  // The matrix on a canvas, with row and column labels where cells are big enough to read.
  function drawMatrix(k, m) {
    const [, , rows, cols] = k.shape;
    const canvas = $("matrix");
    const cell = Math.max(2, Math.min(28, Math.floor(480 / Math.max(rows, cols))));
    const labelled = cell >= 10;
    const left = labelled ? 56 : 0, top = labelled ? 48 : 0;
    canvas.width = left + cols * cell;
    canvas.height = top + rows * cell;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        ctx.fillStyle = ink(m[i * cols + j]);
        ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
      }
    }
    if (labelled) {
      ctx.font = Math.min(12, cell - 1) + "px monospace";
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      for (let i = 0; i < rows; i++) {
        ctx.fillStyle = i === state.step ? "#d62728" : "#333";
        ctx.fillText(label(k.rows[i]).slice(0, 7), left - 4, top + (i + 0.5) * cell);
      }
      ctx.fillStyle = "#333";
      ctx.textAlign = "left";
      for (let j = 0; j < cols; j++) {
        ctx.save();
        ctx.translate(left + (j + 0.5) * cell, top - 4);
        ctx.rotate(-Math.PI / 2);
        ctx.fillText(label(k.columns[j]).slice(0, 7), 0, 0);
        ctx.restore();
      }
    }
    ctx.strokeStyle = "#d62728";
    ctx.lineWidth = 2;
    ctx.strokeRect(left + 1, top + state.step * cell + 1, cols * cell - 2, cell - 2);
    canvas.dataset.cell = String(cell);
    canvas.dataset.left = String(left);
    canvas.dataset.top = String(top);
  }

  function draw() {
    const k = kind();
    drawInfo();
    $("no-attention").hidden = k !== null;
    $("views").hidden = k === null;
    if (k === null) return;
    const m = matrix(k);
    const row = currentRow(k, m);
    $("step").value = String(state.step);
    $("step-label").textContent = "step " + (state.step + 1) + " / " + k.shape[2] + ": \u201c" + label(k.rows[state.step]) + "\u201d";
    drawCells(k, row);
    LAYOUTS[DATA.layout](k, row);
    drawMatrix(k, m);
  }

  function setStep(step) {
    const k = kind();
    if (!k) return;
    state.step = Math.max(0, Math.min(k.shape[2] - 1, step));
    draw();
  }

  // ----- events -----
  $("example").addEventListener("change", (ev) => { state.example = Number(ev.target.value); setupKind(); draw(); });
  $("kind").addEventListener("change", (ev) => { state.kind = Number(ev.target.value); state.step = 0; setupKind(); draw(); });
  $("layer").addEventListener("change", (ev) => { state.layer = Number(ev.target.value); draw(); });
  $("head").addEventListener("change", (ev) => { state.head = Number(ev.target.value); draw(); });
  $("step").addEventListener("input", (ev) => setStep(Number(ev.target.value)));
  window.addEventListener("keydown", (ev) => {
    if (ev.target.tagName === "SELECT") return; // arrows choose options there
    const moves = { ArrowRight: 1, ArrowLeft: -1 };
    if (ev.key in moves) { ev.preventDefault(); setStep(state.step + moves[ev.key]); }
    else if (ev.key === "Home") { ev.preventDefault(); setStep(0); }
    else if (ev.key === "End") { ev.preventDefault(); setStep(Infinity); }
  });
  const canvas = $("matrix");
  const cellAt = (ev) => {
    // from the canvas's content box, where the cells are drawn: its bounding box includes the
    // border, which put the last pixel row and column of every cell in the next cell
    const cell = Number(canvas.dataset.cell);
    const rect = canvas.getBoundingClientRect();
    const x = ev.clientX - rect.left - canvas.clientLeft - Number(canvas.dataset.left);
    const y = ev.clientY - rect.top - canvas.clientTop - Number(canvas.dataset.top);
    return [Math.floor(y / cell), Math.floor(x / cell)];
  };
  canvas.addEventListener("mousemove", (ev) => {
    const k = kind();
    if (!k) return;
    const [i, j] = cellAt(ev);
    if (i < 0 || j < 0 || i >= k.shape[2] || j >= k.shape[3]) return;
    say(label(k.rows[i]) + " \u2192 " + label(k.columns[j]) + ": " + value(matrix(k)[i * k.shape[3] + j]));
  });
  canvas.addEventListener("click", (ev) => {
    const k = kind();
    const [i] = cellAt(ev);
    if (k && i >= 0 && i < k.shape[2]) setStep(i);
  });

  // ----- start -----
  $("subtitle").textContent = DATA.title + (DATA.note ? ". " + DATA.note : "");
  $("quantised").textContent = "Weights shown to 1/" + LEVELS + " (stored as 8-bit integers); a mean of heads is the mean of their stored values.";
  setupExamples();
  setupKind();
  draw();
  document.body.dataset.ready = "true";
})();
