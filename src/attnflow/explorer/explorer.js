// The attnflow explorer: one ES module in anywidget's convention, render({model, el}), used
// by the Jupyter widget (attnflow.explorer.widget) and by the exported page
// (attnflow.explorer.page, whose small shim plays `model`). No network, no dependencies.
//
// model keys: "data" (attnflow.explorer.pack's dict: uint16 frames in base64 and the series,
// or binned densities for large n;
// or attnflow.explorer.tracepack's, kind "trace": layers as time, mean cosine and sink rate
// per layer, uint8 attention patterns per layer and head),
// "frame" (int, the time index shown), "color" ("index" or "cluster"), "camera"
// ([elevation, azimuth] in degrees: the sphere's orthographic view); in live mode "live"
// ({beta, mask, n, seed}: set by the inputs, the kernel simulates again and sends new data).

const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf"];
const RED = "#d62728";
const BINS = 48; // colour bins of the index colouring: one fill per bin
const SPEEDS = [2, 5, 10, 20, 30, 60];
const INK = 3600; // px^2: the area of a marker holding every token (a share f of them: f INK)
const LOG_SPAN = 100; // the time axis is logarithmic when the times span more than this many first steps

function viridis(v) {
  const x = Math.min(1, Math.max(0, v)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const f = x - i;
  return VIRIDIS[i].map((c, j) => Math.round(c + f * (VIRIDIS[i + 1][j] - c)));
}

function rgb(c) {
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function decodeBytes(b64) {
  return Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
}

function decodeFrames(b64) {
  const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
  return new Uint16Array(bytes.buffer); // little-endian, as packed (every browser in use)
}

// A packed density (attnflow.explorer.pack: uint32 counts per arc of the circle, or per
// equal-area cell of the sphere, bands of z times sectors of the azimuth), decoded.
function decodeDensity(dens) {
  return { ...dens, counts: new Uint32Array(decodeBytes(dens.counts).buffer) };
}

// The time axis: t itself, or log10(t - t0 + tau) (tau the first step between saved times),
// which gives the early times of a long run their share of the axis.
function timeAxis(times, log) {
  const T = times.length, t0 = times[0];
  let tau = 0;
  for (let k = 1; k < T && !tau; k++) if (times[k] > times[k - 1]) tau = times[k] - times[k - 1];
  const u = log && tau > 0 ? (t) => Math.log10(t - t0 + tau) : (t) => t;
  const u0 = u(t0), u1 = u(times[T - 1]) > u0 ? u(times[T - 1]) : u0 + 1;
  return { u, u0, u1, tau, t0, frac: (t) => (u(t) - u0) / (u1 - u0) };
}

// Points of frame i: (n, 3) as x, y, z (z = 0 on the circle), unit vectors for d <= 3.
function framePoints(data, q, i) {
  const n = data.n, k = data.k, out = new Float64Array(3 * n);
  const base = i * n * k;
  if (k === 1) {
    const step = (2 * Math.PI) / 65536;
    for (let j = 0; j < n; j++) {
      const th = q[base + j] * step - Math.PI;
      out[3 * j] = Math.cos(th);
      out[3 * j + 1] = Math.sin(th);
    }
  } else {
    for (let j = 0; j < 3 * n; j++) out[j] = (2 * q[base + j]) / 65535 - 1;
  }
  return out;
}

// Single-linkage cluster labels at geodesic tolerance tol, numbered by first token (as
// attnflow.analysis.clusters): on the circle from the sorted angles, else Prim's tree.
function clusterLabels(P, n, tol, circle) {
  const parent = new Int32Array(n).fill(-1);
  const find = (a) => { while (parent[a] >= 0) a = parent[a]; return a; };
  const join = (a, b) => { a = find(a); b = find(b); if (a !== b) parent[Math.max(a, b)] = Math.min(a, b); };
  if (circle) {
    const ang = Array.from({ length: n }, (_, j) => Math.atan2(P[3 * j + 1], P[3 * j]));
    const order = ang.map((_, j) => j).sort((a, b) => ang[a] - ang[b]);
    for (let s = 0; s < n; s++) {
      const a = order[s], b = order[(s + 1) % n];
      let gap = ang[b] - ang[a];
      if (gap < 0) gap += 2 * Math.PI;
      if (n > 1 && gap <= tol) join(a, b);
    }
  } else {
    const best = new Float64Array(n).fill(-2), from = new Int32Array(n), done = new Uint8Array(n);
    let cur = 0;
    done[0] = 1;
    const cosTol = Math.cos(tol);
    for (let step = 1; step < n; step++) {
      let next = -1, nextCos = -3;
      for (let j = 0; j < n; j++) {
        if (done[j]) continue;
        const c = P[3 * cur] * P[3 * j] + P[3 * cur + 1] * P[3 * j + 1] + P[3 * cur + 2] * P[3 * j + 2];
        if (c > best[j]) { best[j] = c; from[j] = cur; }
        if (best[j] > nextCos) { nextCos = best[j]; next = j; }
      }
      done[next] = 1;
      if (nextCos >= cosTol) join(next, from[next]);
      cur = next;
    }
  }
  const labels = new Int32Array(n), number = new Map();
  for (let j = 0; j < n; j++) {
    const r = find(j);
    if (!number.has(r)) number.set(r, number.size);
    labels[j] = number.get(r);
  }
  return labels;
}

// The attention matrix softmax_j(beta x_i^T M x_j) (masked for causal runs), row-major (n, n).
function attentionMatrix(P, n, d, M, beta, causal) {
  const A = new Float64Array(n * n), Mx = new Float64Array(3 * n);
  for (let j = 0; j < n; j++) {
    for (let a = 0; a < d; a++) {
      let s = 0;
      for (let b = 0; b < d; b++) s += M[a][b] * P[3 * j + b];
      Mx[3 * j + a] = s;
    }
  }
  for (let i = 0; i < n; i++) {
    const last = causal ? i + 1 : n;
    let top = -Infinity;
    for (let j = 0; j < last; j++) {
      let s = 0;
      for (let a = 0; a < d; a++) s += P[3 * i + a] * Mx[3 * j + a];
      A[i * n + j] = beta * s;
      if (beta * s > top) top = beta * s;
    }
    let sum = 0;
    for (let j = 0; j < last; j++) { const e = Math.exp(A[i * n + j] - top); A[i * n + j] = e; sum += e; }
    for (let j = 0; j < last; j++) A[i * n + j] /= sum;
  }
  return A;
}

function element(tag, attrs = {}, text = "") {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text) e.textContent = text;
  return e;
}

function sizedCanvas(canvas, w, h) {
  const r = window.devicePixelRatio || 1;
  canvas.style.width = `${w}px`;
  canvas.style.height = `${h}px`;
  canvas.width = Math.round(w * r);
  canvas.height = Math.round(h * r);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(r, 0, 0, r, 0, 0);
  return ctx;
}

const STYLE = `
.af-root{font:13px/1.4 system-ui,sans-serif;color:#222;max-width:1100px;box-sizing:border-box}
.af-bar{display:flex;flex-wrap:wrap;gap:6px 12px;align-items:center;margin:4px 0 8px}
.af-bar input[type=range]{flex:1 1 160px;min-width:120px}
.af-bar button{min-width:64px}
.af-panels{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.af-side{display:flex;flex-direction:column;gap:8px;flex:1 1 260px;min-width:0}
.af-main{touch-action:none;cursor:grab}
.af-note{color:#666;font-size:12px}
.af-readout b{font-variant-numeric:tabular-nums}
`;

export function render({ model, el }) {
  let unmount = mount(model, el);
  const remount = () => { unmount(); el.replaceChildren(); unmount = mount(model, el); };
  model.on("change:data", remount); // a new run (live mode: each piece streamed)
  return () => { model.off("change:data", remount); unmount(); };
}

// Live mode (the widget's `live` = {beta, mask, n, seed}): inputs that set it; the kernel
// simulates again and sends new data.
function liveControls(model) {
  const live = model.get("live");
  if (!live || !Object.keys(live).length) return null;
  const row = element("div", { class: "af-bar", id: "af-live" });
  const inputs = {
    beta: element("input", { type: "number", step: "0.5", value: String(live.beta) }),
    n: element("input", { type: "number", min: "1", max: "20000", step: "1", value: String(live.n) }),
    seed: element("input", { type: "number", min: "0", step: "1", value: String(live.seed) }),
  };
  const mask = element("select", {});
  for (const m of ["causal", "full"]) mask.appendChild(element("option", { value: m }, m));
  mask.value = live.mask;
  const send = () => {
    model.set("live", { beta: Number(inputs.beta.value), mask: mask.value,
                        n: Math.round(Number(inputs.n.value)), seed: Math.round(Number(inputs.seed.value)) });
    model.save_changes();
  };
  for (const [name, input] of Object.entries(inputs)) {
    input.style.width = "5em";
    input.addEventListener("change", send);
    const label = element("label", {}, `${name === "beta" ? "β" : name} `);
    label.appendChild(input);
    row.appendChild(label);
  }
  mask.addEventListener("change", send);
  row.append(mask, element("span", { class: "af-note" }, "live: changing these simulates again"));
  return row;
}

function mount(model, el) {
  const data = model.get("data");
  const n = data.n, T = data.times.length, circle = data.view === "circle";
  const dens = data.density ? decodeDensity(data.density) : null;
  const q = dens ? null : decodeFrames(data.frames);
  const trace = data.kind === "trace";
  const timeLabel = data.time_label || "t";
  const att = data.attention && n <= 400 ? data.attention : null;
  const pat = trace && data.patterns ? data.patterns : null;
  const patBytes = pat ? decodeBytes(pat.data) : null;
  const canCluster = !trace && !dens && data.projection === "" && !!data.clusters;
  const binOf = new Int32Array(n);
  for (let j = 0; j < n; j++) binOf[j] = Math.min(BINS - 1, Math.floor((j * BINS) / n));
  const binColor = Array.from({ length: BINS }, (_, b) => rgb(viridis((0.85 * b) / (BINS - 1))));
  const centers = data.causal && data.renyi ? { renyi: data.renyi, strong: data.strong || [] } : null;

  // ----- the page
  const root = element("div", { class: "af-root" });
  root.appendChild(element("style", {}, STYLE));
  const bar = element("div", { class: "af-bar" });
  const play = element("button", { id: "af-play", type: "button" }, "Play");
  const SL = Math.max(1000, T); // slider positions: the time axis in SL steps
  const slider = element("input", { id: "af-slider", type: "range", min: "0", max: String(SL),
                                    step: "1", "aria-label": trace ? "layer" : "time" });
  let axis = timeAxis(data.times, false);
  const span = axis.tau > 0 ? (data.times[T - 1] - axis.t0) / axis.tau : 0;
  const logBox = element("input", { id: "af-log", type: "checkbox" });
  logBox.checked = !trace && span > LOG_SPAN;
  axis = timeAxis(data.times, logBox.checked);
  const logLabel = element("label", { class: "af-note" });
  logLabel.append(logBox, " log time");
  const speed = element("select", { id: "af-speed", "aria-label": "frames per second" });
  for (const s of SPEEDS) speed.appendChild(element("option", { value: String(s) }, `${s} fps`));
  speed.appendChild(element("option", { value: "max" }, "every screen frame"));
  speed.value = "10";
  const color = element("select", { id: "af-color", "aria-label": "colour tokens by" });
  color.appendChild(element("option", { value: "index" }, dens ? "colour: tokens per bin" :
    data.causal ? "colour: arrival order" : "colour: index"));
  if (canCluster) color.appendChild(element("option", { value: "cluster" }, "colour: cluster"));
  const readout = element("span", { class: "af-readout" });
  const timeText = element("b", { id: "af-time" });
  const clusterText = element("b", { id: "af-clusters" });
  const cosText = element("b", { id: "af-cosine" }), sinkText = element("b", { id: "af-sink" });
  const tokenText = element("span", { id: "af-token", class: "af-note" });
  if (trace) readout.append(`${timeLabel} = `, timeText, " · mean cos: ", cosText, " · sink rate: ", sinkText, " ", tokenText);
  else readout.append("t = ", timeText, " · clusters: ", clusterText);
  bar.append(play, slider, speed, color);
  if (!trace && span > 1) bar.append(logLabel);
  bar.append(readout);
  const panels = element("div", { class: "af-panels" });
  const main = element("canvas", { id: "af-main", class: "af-main", role: "img",
                                   "aria-label": `tokens on the ${data.view}` });
  const side = element("div", { class: "af-side" });
  const series = element("canvas", { id: "af-series", role: "img",
                                     "aria-label": trace ? "mean cosine and sink rate against layer" :
                                       "cluster count and order parameter against time" });
  side.appendChild(series);
  let attn = null, sortBox = null;
  if (att) {
    attn = element("canvas", { id: "af-attn", role: "img", "aria-label": "attention matrix" });
    const label = element("label", { class: "af-note" });
    sortBox = element("input", { id: "af-sort", type: "checkbox" });
    label.append(sortBox, " sort tokens by cluster");
    side.append(element("div", { class: "af-note" }, `attention matrix at this time (${data.causal ? "causal" : "full"} mask; rows: queries, each scaled to its largest weight)`), attn, label);
  }
  let patCanvas = null, headSelect = null, patCaption = null;
  if (pat) {
    headSelect = element("select", { id: "af-head", "aria-label": "attention head" });
    for (let h = 0; h < pat.H; h++) headSelect.appendChild(element("option", { value: String(h) }, `head ${h}`));
    patCaption = element("div", { class: "af-note", id: "af-pattern-caption" });
    patCanvas = element("canvas", { id: "af-pattern", role: "img", "aria-label": "attention pattern" });
    const row = element("div", { class: "af-bar" });
    row.append(headSelect, patCaption);
    side.append(row, patCanvas);
  }
  if (!att && !pat) {
    side.appendChild(element("div", { class: "af-note", id: "af-no-attn" }, trace ?
      `no attention patterns: ${data.no_patterns}` :
      "no attention matrix: the page computes it for n ≤ 400 tokens of one layer with one " +
      "head and no memory, drawn unprojected (d ≤ 3)"));
  }
  const note = element("div", { class: "af-note" });
  note.textContent = `${data.model} · n = ${n}, d = ${data.d}` +
    (data.projection ? ` · ${data.projection}` : "") +
    (trace ? ` · ${T - 1} layers; frame l: the residual stream entering layer l (the last: leaving the model)` : "") +
    (centers ? ` · Rényi centers of the first frame (δ = ${data.delta.toFixed(3)}): black rings; strong: red` : "") +
    (dens ? (circle ? ` · density: tokens per arc of 2π/${dens.bins} (bar length), colour on a log scale` :
      ` · density: tokens per cell of ${dens.bands} × ${dens.sectors} equal-area cells (bands of z, sectors of the azimuth; for d > 3 the directions of the projections), colour on a log scale`) +
      "; no cluster counts above this size" :
      " · markers: tokens within a marker's width merged, area ∝ tokens");
  side.appendChild(note);
  panels.append(main, side);
  const liveRow = liveControls(model);
  if (liveRow) root.appendChild(liveRow);
  root.append(bar, panels);
  el.appendChild(root);

  // ----- state
  let size = 400, sideWidth = 300;
  let labelsCache = { frame: -1, labels: null };
  let drawn = 0;
  const frameIndex = () => Math.min(T - 1, Math.max(0, model.get("frame") | 0));
  const camera = () => model.get("camera") || [20, -60];

  function labelsAt(i, P) {
    if (labelsCache.frame !== i) labelsCache = { frame: i, labels: clusterLabels(P, n, data.tol[i], circle) };
    return labelsCache.labels;
  }

  function layout() {
    const width = Math.max(240, el.clientWidth || root.clientWidth || 600);
    size = Math.min(width - 4, 460);
    sideWidth = width - size - 16 >= 260 ? Math.min(width - size - 16, 600) : width - 4;
    side.style.width = `${sideWidth}px`;
    side.style.flex = "0 0 auto";
    draw();
  }

  function projectPoints(P, count) { // screen coordinates (x right, y down, unit radius), depth
    const S = new Float64Array(3 * count);
    if (circle) {
      for (let j = 0; j < count; j++) { S[3 * j] = P[3 * j]; S[3 * j + 1] = -P[3 * j + 1]; S[3 * j + 2] = 1; }
      return S;
    }
    const [el_, az_] = camera().map((v) => (v * Math.PI) / 180);
    const ca = Math.cos(az_), sa = Math.sin(az_), ce = Math.cos(el_), se = Math.sin(el_);
    for (let j = 0; j < count; j++) {
      const x = P[3 * j], y = P[3 * j + 1], z = P[3 * j + 2];
      const x1 = ca * x - sa * y, y1 = sa * x + ca * y; // turn about z (azimuth)
      S[3 * j] = x1;
      S[3 * j + 1] = -(ce * z - se * y1); // tilt about the screen's x axis (elevation)
      S[3 * j + 2] = ce * y1 + se * z; // depth: >= 0 on the near hemisphere
    }
    return S;
  }

  // The equator and the meridian through x1 (great circles; dashed behind the sphere), so
  // that a turn of the sphere shows.
  function drawGuides(ctx, c, R) {
    const m = 96, circles = [[], []];
    for (let s = 0; s <= m; s++) {
      const a = (2 * Math.PI * s) / m;
      circles[0].push(Math.cos(a), Math.sin(a), 0);
      circles[1].push(Math.cos(a), 0, Math.sin(a));
    }
    ctx.lineWidth = 0.8;
    ctx.strokeStyle = "#b5b9c8";
    for (const pts of circles) {
      const S = projectPoints(Float64Array.from(pts), m + 1);
      for (let s = 0; s < m; s++) {
        ctx.setLineDash(S[3 * s + 2] >= 0 ? [] : [2, 3]);
        ctx.beginPath();
        ctx.moveTo(c + R * S[3 * s], c + R * S[3 * s + 1]);
        ctx.lineTo(c + R * S[3 * s + 3], c + R * S[3 * s + 4]);
        ctx.stroke();
      }
    }
    ctx.setLineDash([]);
  }

  function drawMain(i, P) {
    const ctx = sizedCanvas(main, size, size);
    const c = size / 2, R = size * (circle ? 0.38 : 0.44);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, size, size);
    ctx.beginPath();
    ctx.arc(c, c, R, 0, 2 * Math.PI);
    if (!circle) { ctx.fillStyle = "#f3f4f8"; ctx.fill(); }
    ctx.strokeStyle = "#999";
    ctx.lineWidth = 1;
    ctx.stroke();
    if (dens) drawDensity(ctx, i, c, R);
    if (!circle) drawGuides(ctx, c, R);
    if (dens) return;
    const S = projectPoints(P, n);
    const labels = model.get("color") === "cluster" && canCluster ? labelsAt(i, P) : null;
    const dot = Math.max(1.5, Math.min(5, 60 / Math.sqrt(n)));
    const groups = labels ? 10 : BINS;
    const fill = labels ? TAB10 : binColor;
    const mk = markers(S, c, R, dot, labels);
    const unit = Math.min(dot * dot, INK / n); // px^2 per token of a merged marker
    for (const front of circle ? [true] : [false, true]) {
      const paths = Array.from({ length: groups }, () => new Path2D());
      for (let m = mk.count - 1; m >= 0; m--) { // the earliest tokens on top
        if (mk.front[m] !== (front ? 1 : 0)) continue;
        const x = mk.x[m] / mk.n[m], y = mk.y[m] / mk.n[m], path = paths[mk.group[m]];
        const area = mk.n[m] * unit;
        if (area <= dot * dot) path.rect(x - dot / 2, y - dot / 2, dot, dot);
        else { const r = Math.sqrt(area / Math.PI); path.moveTo(x + r, y); path.arc(x, y, r, 0, 2 * Math.PI); }
      }
      ctx.globalAlpha = front ? 1 : 0.25;
      for (let g = groups - 1; g >= 0; g--) { ctx.fillStyle = fill[g]; ctx.fill(paths[g]); }
    }
    ctx.globalAlpha = 1;
    if (centers) {
      const ring = (j, r) => {
        let x = S[3 * j], y = S[3 * j + 1];
        if (circle) { const m = Math.hypot(x, y) || 1; x *= r / m; y *= r / m; }
        return [c + R * x, c + R * y];
      };
      const seen = (j) => (circle || S[3 * j + 2] >= 0 ? 1 : 0.3); // faint behind the sphere
      ctx.strokeStyle = "#000";
      ctx.lineWidth = 1.2;
      for (const j of centers.renyi) {
        const [x, y] = ring(j, 1.12);
        ctx.globalAlpha = seen(j);
        ctx.beginPath(); ctx.arc(x, y, 4.5, 0, 2 * Math.PI); ctx.stroke();
      }
      ctx.fillStyle = RED;
      for (const j of centers.strong) {
        const [x, y] = ring(j, 1.22);
        ctx.globalAlpha = seen(j);
        ctx.beginPath(); ctx.arc(x, y, 3, 0, 2 * Math.PI); ctx.fill();
      }
      ctx.globalAlpha = 1;
    }
  }

  // Tokens whose screen positions share a cell of the marker's width (and a hemisphere) as
  // one marker at their mean position: its size, number of tokens, colour group (of its
  // earliest token). Markers are numbered by their earliest token.
  function markers(S, c, R, dot, labels) {
    const cell = Math.max(2, dot), W = Math.ceil(size / cell) + 4;
    const slot = new Map();
    const x = new Float64Array(n), y = new Float64Array(n), count = new Int32Array(n);
    const group = new Int32Array(n), front = new Uint8Array(n);
    let m = 0;
    for (let j = 0; j < n; j++) {
      const px = c + R * S[3 * j], py = c + R * S[3 * j + 1];
      const f = circle || S[3 * j + 2] >= 0 ? 1 : 0;
      const key = ((Math.floor(py / cell) + 2) * W + Math.floor(px / cell) + 2) * 2 + f;
      let k = slot.get(key);
      if (k === undefined) {
        k = m++;
        slot.set(key, k);
        group[k] = labels ? labels[j] % 10 : binOf[j];
        front[k] = f;
      }
      x[k] += px; y[k] += py; count[k] += 1;
    }
    return { count: m, x, y, n: count, group, front };
  }

  // The binned density of frame i: on the circle a bar outward from each arc, its length
  // the arc's tokens over the fullest arc's; on the sphere each cell filled (faint behind
  // the sphere). Colour: the tokens on a log scale.
  function drawDensity(ctx, i, c, R) {
    const cells = circle ? dens.bins : dens.bands * dens.sectors, lo = i * cells;
    let top = 1;
    for (let m = lo; m < lo + cells; m++) top = Math.max(top, dens.counts[m]);
    const shade = (v) => rgb(viridis((0.9 * Math.log1p(v)) / Math.log1p(top)));
    if (circle) {
      const B = dens.bins, H = 0.1 * size;
      ctx.lineWidth = Math.max(1, (2 * Math.PI * R) / B);
      for (let b = 0; b < B; b++) {
        const v = dens.counts[lo + b];
        if (!v) continue;
        const th = -Math.PI + ((b + 0.5) * 2 * Math.PI) / B, ux = Math.cos(th), uy = -Math.sin(th);
        const len = 3 + (H * v) / top;
        ctx.strokeStyle = shade(v);
        ctx.beginPath(); ctx.moveTo(c + R * ux, c + R * uy); ctx.lineTo(c + (R + len) * ux, c + (R + len) * uy); ctx.stroke();
      }
      return;
    }
    const nb = dens.bands, ns = dens.sectors, P = new Float64Array(3 * (nb + 1) * (ns + 1));
    for (let b = 0; b <= nb; b++) { // the cells' corners
      const z = -1 + (2 * b) / nb, r = Math.sqrt(Math.max(0, 1 - z * z));
      for (let k = 0; k <= ns; k++) {
        const ph = -Math.PI + (2 * Math.PI * k) / ns, o = 3 * (b * (ns + 1) + k);
        P[o] = r * Math.cos(ph); P[o + 1] = r * Math.sin(ph); P[o + 2] = z;
      }
    }
    const S = projectPoints(P, (nb + 1) * (ns + 1));
    const level = (v) => Math.min(BINS - 1, Math.floor((BINS * Math.log1p(v)) / Math.log1p(top)));
    for (const front of [false, true]) { // one path per colour level: few fills, no seams within
      const paths = Array.from({ length: BINS }, () => new Path2D());
      for (let b = 0; b < nb; b++) {
        for (let k = 0; k < ns; k++) {
          const v = dens.counts[lo + b * ns + k];
          if (!v) continue;
          const m0 = b * (ns + 1) + k, m1 = m0 + 1, m2 = m0 + ns + 2, m3 = m0 + ns + 1;
          if ((S[3 * m0 + 2] + S[3 * m1 + 2] + S[3 * m2 + 2] + S[3 * m3 + 2] >= 0) !== front) continue;
          const path = paths[level(v)], quad = [m0, m1, m2, m3];
          const cx = quad.reduce((a, m) => a + S[3 * m], 0) / 4, cy = quad.reduce((a, m) => a + S[3 * m + 1], 0) / 4;
          quad.forEach((m, e) => { // each corner 0.5 px outward: neighbours overlap, no seams
            const dx = S[3 * m] - cx, dy = S[3 * m + 1] - cy, grow = 0.5 / (R * Math.hypot(dx, dy) || 1);
            const x = c + R * (S[3 * m] + grow * dx), y = c + R * (S[3 * m + 1] + grow * dy);
            if (e) path.lineTo(x, y); else path.moveTo(x, y);
          });
          path.closePath();
        }
      }
      ctx.globalAlpha = front ? 1 : 0.2;
      for (let g = 0; g < BINS; g++) {
        ctx.fillStyle = rgb(viridis((0.9 * (g + 0.5)) / BINS));
        ctx.fill(paths[g]);
      }
    }
    ctx.globalAlpha = 1;
  }

  function drawAttention(i, P) {
    const w = Math.min(sideWidth, 320);
    const ctx = sizedCanvas(attn, w, w);
    const A = attentionMatrix(P, n, Math.min(data.d, 3), att.M, data.beta[i], att.causal);
    let order = Array.from({ length: n }, (_, j) => j);
    if (sortBox.checked && canCluster) {
      const lab = labelsAt(i, P);
      order = order.sort((a, b) => lab[a] - lab[b] || a - b);
    }
    const img = new ImageData(n, n);
    for (let r = 0; r < n; r++) {
      let top = 0; // each row on its own scale: a weight over the row's largest
      for (let s = 0; s < n; s++) top = Math.max(top, A[order[r] * n + s]);
      for (let s = 0; s < n; s++) {
        const v = viridis(A[order[r] * n + order[s]] / top);
        const o = 4 * (r * n + s);
        img.data[o] = v[0]; img.data[o + 1] = v[1]; img.data[o + 2] = v[2]; img.data[o + 3] = 255;
      }
    }
    const off = document.createElement("canvas");
    off.width = n; off.height = n;
    off.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, w, w);
  }

  function drawPattern(i) { // layer i's pattern (the last layer's at the output), one head
    const L = pat.L, li = Math.min(i, L - 1), h = Number(headSelect.value) | 0;
    const w = Math.min(sideWidth, 320);
    const ctx = sizedCanvas(patCanvas, w, w);
    const base = (li * pat.H + h) * n * n;
    const img = new ImageData(n, n);
    for (let r = 0; r < n; r++) {
      let top = 1; // each row on its own scale: a weight over the row's largest
      for (let s = 0; s < n; s++) top = Math.max(top, patBytes[base + r * n + s]);
      for (let s = 0; s < n; s++) {
        const v = viridis(patBytes[base + r * n + s] / top);
        const o = 4 * (r * n + s);
        img.data[o] = v[0]; img.data[o + 1] = v[1]; img.data[o + 2] = v[2]; img.data[o + 3] = 255;
      }
    }
    const off = document.createElement("canvas");
    off.width = n; off.height = n;
    off.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, w, w);
    patCaption.textContent = `attention pattern of layer ${li}${i > li ? " (the last)" : ""}, ` +
      "rows: queries, each scaled to its largest weight";
  }

  function drawTraceSeries(i) { // mean cosine (left axis) and sink rate (right) per layer
    const w = sideWidth, h = 160, left = 34, right = 34, top = 20, bottom = 22;
    const ctx = sizedCanvas(series, w, h);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, w, h);
    const t1 = Math.max(1, T - 1), lo = Math.min(0, ...data.cosine);
    const X = (v) => left + (v / t1) * (w - left - right);
    const Y = (v, a, b) => top + (1 - (v - a) / (b - a)) * (h - top - bottom);
    ctx.strokeStyle = "#ccc";
    ctx.strokeRect(left, top, w - left - right, h - top - bottom);
    const line = (values, a, style) => {
      ctx.beginPath();
      let on = false;
      values.forEach((v, k) => {
        if (v === null || v === undefined) { on = false; return; }
        if (on) ctx.lineTo(X(k), Y(v, a, 1)); else ctx.moveTo(X(k), Y(v, a, 1));
        on = true;
      });
      ctx.strokeStyle = style;
      ctx.lineWidth = 1.5;
      ctx.stroke();
    };
    line(data.cosine, lo, "#1f4e99");
    const hasSink = data.sink.some((v) => v !== null);
    if (hasSink) line(data.sink, 0, "#e07b00");
    ctx.font = "11px system-ui,sans-serif";
    ctx.fillStyle = "#1f4e99";
    ctx.fillText("1", 4, top + 8);
    ctx.fillText(lo.toFixed(2).replace(/\.?0+$/, "") || "0", 4, h - bottom);
    ctx.fillText("— mean cosine (left axis)", left, 12);
    if (hasSink) {
      ctx.fillStyle = "#e07b00";
      ctx.fillText("1", w - right + 6, top + 8);
      ctx.fillText("0", w - right + 6, h - bottom);
      const sinkLabel = "— sink rate (right axis)";
      ctx.fillText(sinkLabel, w - right - ctx.measureText(sinkLabel).width, 12);
    }
    ctx.fillStyle = "#444";
    ctx.fillText(`${timeLabel} = 0`, left, h - 6);
    const endLabel = String(T - 1);
    ctx.fillText(endLabel, w - right - ctx.measureText(endLabel).width, h - 6);
    ctx.strokeStyle = "#c00";
    ctx.beginPath();
    ctx.moveTo(X(i), top);
    ctx.lineTo(X(i), h - bottom);
    ctx.stroke();
    return { X: (v) => X(v), left, right, w };
  }

  function drawSeries(i) {
    if (trace) return drawTraceSeries(i);
    const w = sideWidth, h = 160, left = 34, right = 34, top = 20, bottom = 22;
    const ctx = sizedCanvas(series, w, h);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, w, h);
    const t = data.times, t0 = t[0], t1 = t[T - 1] > t0 ? t[T - 1] : t0 + 1;
    const kMax = data.clusters ? Math.max(1, ...data.clusters) : 1;
    const X = (v) => left + axis.frac(v) * (w - left - right);
    const Y = (v, max) => top + (1 - v / max) * (h - top - bottom);
    ctx.strokeStyle = "#ccc";
    ctx.strokeRect(left, top, w - left - right, h - top - bottom);
    const line = (values, max, style, step) => {
      ctx.beginPath();
      values.forEach((v, k) => {
        const x = X(t[k]), y = Y(v, max);
        if (k === 0) ctx.moveTo(x, y);
        else { if (step) ctx.lineTo(x, Y(values[k - 1], max)); ctx.lineTo(x, y); }
      });
      ctx.strokeStyle = style;
      ctx.lineWidth = 1.5;
      ctx.stroke();
    };
    if (data.clusters) line(data.clusters, kMax, "#1f4e99", true);
    line(data.order, 1, "#e07b00", false);
    ctx.font = "11px system-ui,sans-serif";
    ctx.fillStyle = "#1f4e99";
    if (data.clusters) {
      ctx.fillText(String(kMax), 4, top + 8);
      ctx.fillText("0", 4, h - bottom);
      ctx.fillText("— cluster count (left axis)", left, 12);
    }
    ctx.fillStyle = "#e07b00";
    ctx.fillText("1", w - right + 6, top + 8);
    ctx.fillText("0", w - right + 6, h - bottom);
    const orderLabel = "— |mean x| (right axis)";
    ctx.fillText(orderLabel, w - right - ctx.measureText(orderLabel).width, 12);
    ctx.fillStyle = "#444";
    const startLabel = `t = ${t0.toPrecision(3)}${logBox.checked ? " (log)" : ""}`;
    ctx.fillText(startLabel, left, h - 6);
    const endLabel = `${t1.toPrecision(3)}`;
    const endAt = w - right - ctx.measureText(endLabel).width;
    ctx.fillText(endLabel, endAt, h - 6);
    if (logBox.checked) { // decades of t - t0, where their labels fit between the ends
      ctx.strokeStyle = "#bbb";
      let free = left + ctx.measureText(startLabel).width + 6;
      for (let k = Math.ceil(Math.log10(axis.tau)); t0 + 10 ** k < t1; k++) {
        const x = X(t0 + 10 ** k), text = Number((t0 + 10 ** k).toPrecision(3)).toString();
        ctx.beginPath(); ctx.moveTo(x, h - bottom); ctx.lineTo(x, h - bottom + 4); ctx.stroke();
        const tw = ctx.measureText(text).width;
        if (x - tw / 2 > free && x + tw / 2 < endAt - 6) { ctx.fillText(text, x - tw / 2, h - 6); free = x + tw / 2 + 6; }
      }
    }
    ctx.strokeStyle = "#c00";
    ctx.beginPath();
    ctx.moveTo(X(t[i]), top);
    ctx.lineTo(X(t[i]), h - bottom);
    ctx.stroke();
    return { X, left, right, w };
  }

  let seriesAxis = null;
  function draw() {
    const i = frameIndex();
    const P = dens ? null : framePoints(data, q, i);
    drawMain(i, P);
    if (attn) drawAttention(i, P);
    if (patCanvas) drawPattern(i);
    seriesAxis = drawSeries(i);
    slider.value = String(sliderAt(i));
    timeText.textContent = Number(data.times[i].toPrecision(4)).toString();
    timeText.dataset.frame = String(i);
    if (trace) {
      cosText.textContent = data.cosine[i].toFixed(3);
      sinkText.textContent = data.sink[i] === null ? "–" : data.sink[i].toFixed(2);
    } else clusterText.textContent = data.clusters ? String(data.clusters[i]) : "–";
    color.value = model.get("color") === "cluster" && canCluster ? "cluster" : "index";
    drawn += 1;
    el.dataset.drawn = String(drawn);
  }

  // The slider's position of frame i (its time on the axis), and the frame nearest a position.
  function sliderAt(i) {
    return trace ? Math.round((SL * i) / Math.max(1, T - 1)) : Math.round(SL * axis.frac(data.times[i]));
  }
  function frameAt(v) {
    let best = 0;
    for (let k = 1; k < T; k++) if (Math.abs(sliderAt(k) - v) < Math.abs(sliderAt(best) - v)) best = k;
    return best;
  }

  function setFrame(i) {
    model.set("frame", Math.min(T - 1, Math.max(0, i)));
    model.save_changes();
  }

  // ----- playback
  let raf = 0, last = 0, carry = 0;
  function tick(now) {
    const fps = speed.value === "max" ? Infinity : Number(speed.value);
    carry += last ? (now - last) / 1000 : 0;
    last = now;
    const steps = fps === Infinity ? 1 : Math.floor(carry * fps);
    if (steps > 0) {
      carry = fps === Infinity ? 0 : carry - steps / fps;
      const i = frameIndex() + steps;
      setFrame(i);
      if (i >= T - 1) { stop(); return; }
    }
    raf = requestAnimationFrame(tick);
  }
  function start() {
    if (frameIndex() >= T - 1) setFrame(0);
    play.textContent = "Pause";
    last = 0; carry = 0;
    raf = requestAnimationFrame(tick);
  }
  function stop() {
    cancelAnimationFrame(raf);
    raf = 0;
    play.textContent = "Play";
  }
  play.addEventListener("click", () => (raf ? stop() : start()));
  slider.addEventListener("input", () => setFrame(frameAt(Number(slider.value))));
  const keySteps = { ArrowRight: 1, ArrowUp: 1, ArrowLeft: -1, ArrowDown: -1, PageUp: 10, PageDown: -10 };
  slider.addEventListener("keydown", (ev) => { // the keys step by saved frame
    const i = frameIndex();
    const to = ev.key in keySteps ? i + keySteps[ev.key] : ev.key === "Home" ? 0 : ev.key === "End" ? T - 1 : null;
    if (to === null) return;
    ev.preventDefault();
    setFrame(to);
  });
  logBox.addEventListener("change", () => { axis = timeAxis(data.times, logBox.checked); draw(); });
  color.addEventListener("change", () => { model.set("color", color.value); model.save_changes(); });
  if (sortBox) sortBox.addEventListener("change", draw);
  if (headSelect) headSelect.addEventListener("change", draw);
  series.addEventListener("click", (ev) => {
    if (!seriesAxis) return;
    const rect = series.getBoundingClientRect();
    const x = ev.clientX - rect.left;
    let best = 0;
    for (let k = 1; k < T; k++) if (Math.abs(seriesAxis.X(data.times[k]) - x) < Math.abs(seriesAxis.X(data.times[best]) - x)) best = k;
    setFrame(best);
  });

  // ----- the token under the pointer (traces: its text)
  function showToken(ev) {
    if (!trace) return;
    const rect = main.getBoundingClientRect();
    const c = size / 2, R = size * (circle ? 0.38 : 0.44);
    const S = projectPoints(framePoints(data, q, frameIndex()), n);
    let best = -1, bestD = 64; // within 8 px
    for (let j = 0; j < n; j++) {
      if (!circle && S[3 * j + 2] < 0) continue;
      const dx = c + R * S[3 * j] - (ev.clientX - rect.left), dy = c + R * S[3 * j + 1] - (ev.clientY - rect.top);
      if (dx * dx + dy * dy < bestD) { bestD = dx * dx + dy * dy; best = j; }
    }
    tokenText.textContent = best < 0 ? "" :
      `· token ${best}${data.labels ? `: ${JSON.stringify(data.labels[best])}` : ""}`;
  }
  if (circle) main.addEventListener("pointermove", showToken);

  // ----- turning the sphere
  let dragFrom = null;
  if (!circle) {
    main.addEventListener("pointerdown", (ev) => { dragFrom = [ev.clientX, ev.clientY, ...camera()]; main.setPointerCapture(ev.pointerId); });
    main.addEventListener("pointermove", (ev) => {
      if (!dragFrom) { showToken(ev); return; }
      const elev = Math.max(-90, Math.min(90, dragFrom[2] + 0.5 * (ev.clientY - dragFrom[1])));
      const azim = dragFrom[3] + 0.5 * (ev.clientX - dragFrom[0]);
      model.set("camera", [elev, azim]);
      model.save_changes();
    });
    const end = () => { dragFrom = null; };
    main.addEventListener("pointerup", end);
    main.addEventListener("pointercancel", end);
  }

  const redraw = () => draw();
  model.on("change:frame", redraw);
  model.on("change:color", redraw);
  model.on("change:camera", redraw);
  const observer = new ResizeObserver(() => layout());
  observer.observe(el);
  layout();
  return () => {
    stop();
    observer.disconnect();
    model.off("change:frame", redraw);
    model.off("change:color", redraw);
    model.off("change:camera", redraw);
  };
}
