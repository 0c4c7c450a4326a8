// Tessel plan report: draws each chart as inline SVG from the JSON in #report-data.
// Every drawn data element has class "mark"; each chart's <figure> records how many it
// drew in data-drawn, and <body> lists the charts drawn in data-charts (the tests read
// both from the rendered page).
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const WIDTH = 1100;
  const LEFT = 88;
  const RIGHT = 24;
  const TIMELINE_COLORS = {
    forward: "#4c78a8", backward: "#54a24b", recompute: "#f2a93b",
    communication: "#e45756", bubble: "#e9e9ee",
    "data-parallel communication": "#b279a2", optimizer: "#8c6d31", offload: "#9d755d",
  };
  const MEMORY_COLORS = {
    weights: "#4c78a8", gradients: "#72b7b2", optimizer: "#b279a2",
    activations: "#f2a93b", working: "#e45756", reserve: "#bab0ac",
  };
  const BREAKDOWN_COLORS = ["#4c78a8", "#e45756", "#ff9d98", "#e9e9ee", "#b279a2", "#8c6d31",
    "#9d755d"];

  function el(tag, attrs, parent) {
    const node = document.createElementNS(NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, attrs) {
    const node = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    node.textContent = content;
    return node;
  }

  function svgIn(figure, height) {
    return el("svg", { viewBox: `0 0 ${WIDTH} ${height}`, role: "img" },
      figure.querySelector(".plot"));
  }

  // Round tick steps (1, 2 or 5 x a power of ten) covering [lo, hi].
  function ticks(lo, hi, count) {
    const raw = (hi - lo) / Math.max(count, 1);
    const power = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    const step = [1, 2, 5, 10].map((k) => k * power).find((s) => s >= raw) || raw;
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(t);
    return out;
  }

  function scale(d0, d1, r0, r1) {
    return (v) => r0 + ((v - d0) / ((d1 - d0) || 1)) * (r1 - r0);
  }

  function number(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 100) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1).replace(/\.0$/, "");
    if (a >= 1) return v.toFixed(2).replace(/\.?0+$/, "");
    return v.toPrecision(2);
  }

  function seconds(v) {
    return v >= 1 ? `${v.toFixed(3)} s` : `${(v * 1000).toFixed(v >= 0.01 ? 1 : 2)} ms`;
  }

  // A horizontal line across the plot at height y.
  function across(svg, y, cls) {
    el("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: y, y2: y, class: cls }, svg);
  }

  function xAxis(svg, x, lo, hi, y, unit) {
    el("line", { x1: x(lo), x2: x(hi), y1: y, y2: y, class: "axis" }, svg);
    for (const t of ticks(lo, hi, 8)) {
      el("line", { x1: x(t), x2: x(t), y1: y, y2: y + 4, class: "axis" }, svg);
      text(svg, x(t), y + 16, number(t), { class: "tick", "text-anchor": "middle" });
    }
    text(svg, x(hi), y + 32, unit, { class: "unit", "text-anchor": "end" });
  }

  function yAxis(svg, y, lo, hi, x0, x1, unit) {
    for (const t of ticks(lo, hi, 6)) {
      el("line", { x1: x0, x2: x1, y1: y(t), y2: y(t), class: "grid" }, svg);
      text(svg, x0 - 6, y(t) + 4, number(t), { class: "tick", "text-anchor": "end" });
    }
    text(svg, 14, y(hi) - 8, unit, { class: "unit" });
  }

  function legend(figure, entries) {
    const box = figure.querySelector(".legend");
    for (const [name, color] of entries) {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = color;
      item.append(swatch, name);
      box.appendChild(item);
    }
  }

  // One floating tooltip, filled on hover from each mark's data-tip (or a lookup).
  const tip = document.createElement("div");
  tip.className = "tip";
  document.body.appendChild(tip);
  function hover(svg, describe) {
    svg.addEventListener("mousemove", (event) => {
      const words = event.target.classList.contains("mark") ? describe(event.target) : "";
      tip.style.display = words ? "block" : "none";
      if (!words) return;
      tip.textContent = words;
      tip.style.left = `${event.pageX + 12}px`;
      tip.style.top = `${event.pageY + 12}px`;
    });
    svg.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  }

  // Stages x time, over [lo, hi] of the step.
  function drawTimeline(figure, t, lo, hi) {
    const rows = t.stages;
    const row = Math.max(6, Math.min(26, 360 / rows));
    const top = 10;
    const svg = svgIn(figure, top + rows * row + 44);
    const x = scale(lo, hi, LEFT, WIDTH - RIGHT);
    const every = Math.ceil(rows / 24);
    for (let s = 0; s < rows; s += every) {
      text(svg, LEFT - 8, top + s * row + row / 2 + 4, `stage ${s}`,
        { class: "tick", "text-anchor": "end" });
    }
    const labels = t.virtual > 1 ? (b) => `${b[4]}.${b[5]}` : (b) => `${b[4]}`;
    let drawn = 0;
    t.bars.forEach((b, i) => {
      if (b[2] < lo || b[1] > hi) return;
      const x0 = x(Math.max(b[1], lo));
      const width = Math.max(x(Math.min(b[2], hi)) - x0, 0.4);
      el("rect", {
        x: x0, y: top + b[0] * row + 1, width: width, height: row - 2,
        fill: TIMELINE_COLORS[t.kinds[b[3]]], class: "mark", "data-i": i,
      }, svg);
      drawn += 1;
      // Micro-batch numbers where a forward or backward is wide enough to read.
      if (width > 22 && row >= 14 && b[3] <= 1) {
        text(svg, x0 + width / 2, top + b[0] * row + row / 2 + 4, labels(b),
          { class: "bar-label", "text-anchor": "middle" });
      }
    });
    xAxis(svg, x, lo, hi, top + rows * row + 4, "seconds");
    hover(svg, (node) => {
      const b = t.bars[Number(node.dataset.i)];
      const what = t.kinds[b[3]];
      const chunk = t.virtual > 1 ? `, chunk ${b[5]}` : "";
      const micro = b[4] >= 0 ? `, micro-batch ${b[4]}${chunk}` : "";
      return `stage ${b[0]}: ${what}${micro}, ${seconds(b[2] - b[1])} from ${b[1].toFixed(4)} s`;
    });
    return drawn;
  }

  function timeline(figure) {
    const t = data.timeline;
    let drawn = drawTimeline(figure, t, 0, t.step_s);
    if (t.stages > 1) {
      // The fill and the first steady micro-batches, close up.
      const lastStage = t.bars.filter((b) => b[0] === t.stages - 1 && b[3] === 0);
      const fill = lastStage.length ? Math.min(...lastStage.map((b) => b[1])) : 0;
      const end = Math.min(t.pipeline_s, 2 * fill + 2 * Math.max(...t.stage_seconds));
      const caption = document.createElement("p");
      caption.className = "note";
      caption.textContent = `Close up, the first ${seconds(end)}: the pipeline filling, ` +
        "micro-batch numbers on the bars" + (t.virtual > 1 ? " (micro-batch.chunk)." : ".");
      figure.querySelector(".plot").appendChild(caption);
      drawn += drawTimeline(figure, t, 0, end);
    }
    legend(figure, t.kinds.filter((k) => t.bars.some((b) => t.kinds[b[3]] === k))
      .map((k) => [k, TIMELINE_COLORS[k]]));
    return drawn;
  }

  function memory(figure) {
    const m = data.memory;
    const height = 320;
    const svg = svgIn(figure, height);
    const totals = m.stages.map((parts) => parts.reduce((a, b) => a + b, 0));
    const hi = Math.max(m.capacity_gib, ...totals, ...m.reserved_gib) * 1.08;
    const y = scale(0, hi, height - 36, 16);
    yAxis(svg, y, 0, hi, LEFT, WIDTH - RIGHT, "GiB per GPU");
    const band = (WIDTH - RIGHT - LEFT) / m.stages.length;
    const barWidth = Math.max(2, Math.min(56, band * 0.7));
    const every = Math.ceil(m.stages.length / 32);
    let drawn = 0;
    m.stages.forEach((parts, s) => {
      const cx = LEFT + band * (s + 0.5);
      let base = 0;
      parts.forEach((gib, k) => {
        if (gib <= 0) return;
        el("rect", {
          x: cx - barWidth / 2, y: y(base + gib), width: barWidth, height: y(base) - y(base + gib),
          fill: MEMORY_COLORS[m.kinds[k]], class: "mark",
          "data-tip": `stage ${s}: ${m.kinds[k]} ${gib.toFixed(2)} GiB ` +
            `(total ${totals[s].toFixed(1)} GiB)`,
        }, svg);
        base += gib;
        drawn += 1;
      });
      // What the caching allocator reserves at that peak: a tick above the bar.
      el("line", {
        x1: cx - barWidth / 2, x2: cx + barWidth / 2, y1: y(m.reserved_gib[s]),
        y2: y(m.reserved_gib[s]), stroke: "#333", "stroke-width": 2, class: "mark",
        "data-tip": `stage ${s}: reserved ${m.reserved_gib[s].toFixed(1)} GiB`,
      }, svg);
      drawn += 1;
      if (s % every === 0) {
        text(svg, cx, height - 20, `${s}`, { class: "tick", "text-anchor": "middle" });
      }
    });
    text(svg, (LEFT + WIDTH - RIGHT) / 2, height - 4, "stage",
      { class: "unit", "text-anchor": "middle" });
    across(svg, y(m.capacity_gib), "limit");
    text(svg, WIDTH - RIGHT, y(m.capacity_gib) - 6, `${m.device}: ${number(m.capacity_gib)} GiB`,
      { class: "limit-label", "text-anchor": "end" });
    across(svg, y(m.predicted_peak_gib), "peak");
    // Below its line when the capacity's line is just above it.
    const below = Math.abs(y(m.predicted_peak_gib) - y(m.capacity_gib)) < 18;
    text(svg, LEFT + 6, y(m.predicted_peak_gib) + (below ? 14 : -6),
      `plan's predicted peak ${m.predicted_peak_gib.toFixed(1)} GiB`, { class: "peak-label" });
    hover(svg, (node) => node.dataset.tip);
    legend(figure, m.kinds.map((k) => [k, MEMORY_COLORS[k]]));
    return drawn;
  }

  function breakdown(figure) {
    const parts = data.breakdown;
    const total = parts.reduce((a, p) => a + p[1], 0);
    const svg = svgIn(figure, 96);
    const x = scale(0, total, LEFT, WIDTH - RIGHT);
    let base = 0;
    let drawn = 0;
    parts.forEach(([name, value], k) => {
      if (value <= 0) return;
      const width = Math.max(x(base + value) - x(base), 0.5);
      el("rect", {
        x: x(base), y: 12, width: width, height: 36, fill: BREAKDOWN_COLORS[k], class: "mark",
        "data-tip": `${name}: ${seconds(value)} (${(100 * value / total).toFixed(1)}% of the step)`,
      }, svg);
      if (width > 70) {
        text(svg, x(base) + width / 2, 35, `${(100 * value / total).toFixed(0)}%`,
          { class: k === 3 ? "bar-label dark" : "bar-label", "text-anchor": "middle" });
      }
      base += value;
      drawn += 1;
    });
    xAxis(svg, x, 0, total, 56, "seconds");
    hover(svg, (node) => node.dataset.tip);
    legend(figure, parts.map(([name, value], k) =>
      [`${name} ${seconds(value)}`, BREAKDOWN_COLORS[k]]));
    return drawn;
  }

  // Pads [lo, hi] by a twentieth each side (a little more when they coincide).
  function padded(lo, hi) {
    const pad = (hi - lo) * 0.08 || Math.abs(hi) * 0.05 || 1;
    return [lo - pad, hi + pad];
  }

  function plans(figure) {
    const ps = data.plans;
    const height = 340;
    const svg = svgIn(figure, height);
    const steps = ps.map((p) => p.step_s);
    const [x0, x1] = padded(Math.min(...steps), Math.max(...steps));
    const capacity = data.memory.capacity_gib;
    const [y0, y1] = padded(Math.min(...ps.map((p) => p.memory_gib)),
      Math.max(capacity, ...ps.map((p) => p.memory_gib)));
    const x = scale(x0, x1, LEFT, WIDTH - RIGHT);
    const y = scale(y0, y1, height - 44, 16);
    yAxis(svg, y, y0, y1, LEFT, WIDTH - RIGHT, "GiB per GPU");
    xAxis(svg, x, x0, x1, height - 40, "step time, seconds");
    across(svg, y(capacity), "limit");
    text(svg, WIDTH - RIGHT, y(capacity) - 6, `${data.memory.device}: ${number(capacity)} GiB`,
      { class: "limit-label", "text-anchor": "end" });
    let drawn = 0;
    // Worst first, so the best plan's point is drawn on top.
    ps.slice().reverse().forEach((p) => {
      const color = !p.fits ? "#d62728" : p.rank === 1 ? "#f58518" : "#4c78a8";
      el("circle", {
        cx: x(p.step_s), cy: y(p.memory_gib), r: p.rank === 1 ? 8 : 6, fill: color, class: "mark",
        "data-tip": `#${p.rank} ${p.label} (${p.gpus} GPUs): ${p.step_s.toFixed(3)} s, ` +
          `${p.memory_gib.toFixed(1)} GiB per GPU, MFU ${(100 * p.mfu).toFixed(1)}%`,
      }, svg);
      text(svg, x(p.step_s) + 10, y(p.memory_gib) - 8, `#${p.rank}`, { class: "point-label" });
      drawn += 1;
    });
    hover(svg, (node) => node.dataset.tip);
    legend(figure,
      [["best plan", "#f58518"], ["other plans", "#4c78a8"], ["does not fit", "#d62728"]]);
    return drawn;
  }

  function totals(figure) {
    const rows = data.totals;
    const row = 44;
    const svg = svgIn(figure, 20 + rows.length * row + 40);
    const hi = Math.max(...rows.map((r) => Math.max(r.days, r.expected_days))) * 1.05;
    const labelEnd = 230;
    const x = scale(0, hi, labelEnd + 8, WIDTH - RIGHT);
    let drawn = 0;
    rows.forEach((r, i) => {
      const top = 14 + i * row;
      text(svg, labelEnd, top + 20, `#${r.rank} ${r.label}`.slice(0, 36),
        { class: "tick", "text-anchor": "end" });
      [["days", r.days, "#4c78a8", "without failures"],
        ["expected_days", r.expected_days, "#e45756", "with failures, checkpoints and restarts"]]
        .forEach(([, days, color, words], k) => {
          el("rect", {
            x: x(0), y: top + k * 16, width: Math.max(x(days) - x(0), 0.5), height: 14, fill: color,
            class: "mark", "data-tip": `#${r.rank}: ${days.toFixed(2)} days ${words}`,
          }, svg);
          drawn += 1;
        });
      // Inside the expected bar's end: the days, the expected cost and ETTR.
      text(svg, x(r.expected_days) - 6, top + 27,
        `${r.expected_days.toFixed(1)} days, ` +
        `$${Math.round(r.expected_cost_usd).toLocaleString("en-US")}` +
        `, ETTR ${(100 * r.ettr).toFixed(1)}%`, { class: "bar-label", "text-anchor": "end" });
    });
    xAxis(svg, x, 0, hi, 18 + rows.length * row, "days");
    hover(svg, (node) => node.dataset.tip);
    legend(figure,
      [["days without failures", "#4c78a8"], ["expected days with failures", "#e45756"]]);
    return drawn;
  }

  // Each tier's step against its bandwidth as a multiple of the cluster's (log scale).
  function network(figure) {
    const sweeps = data.network;
    const height = 320;
    const svg = svgIn(figure, height);
    const colors = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#9d755d"];
    const steps = sweeps.flatMap((s) => s.points.map((p) => p.step_s));
    const [y0, y1] = padded(Math.min(...steps), Math.max(...steps));
    const factors = sweeps[0].points.map((p) => Math.log2(p.factor));
    const x = scale(Math.min(...factors), Math.max(...factors), LEFT, WIDTH - RIGHT);
    const y = scale(y0, y1, height - 44, 16);
    yAxis(svg, y, y0, y1, LEFT, WIDTH - RIGHT, "step, seconds");
    xAxis(svg, x, Math.min(...factors), Math.max(...factors), height - 40,
      "log2 of the bandwidth over the cluster's");
    let drawn = 0;
    sweeps.forEach((s, k) => {
      const color = colors[k % colors.length];
      el("polyline", {
        points: s.points.map((p) => `${x(Math.log2(p.factor))},${y(p.step_s)}`).join(" "),
        fill: "none", stroke: color, "stroke-width": 2,
      }, svg);
      s.points.forEach((p) => {
        el("circle", {
          cx: x(Math.log2(p.factor)), cy: y(p.step_s), r: 4, fill: color, class: "mark",
          "data-tip": `${s.name} at ${number(p.bandwidth_gbs)} GB/s per GPU (${p.factor}x): ` +
            `step ${seconds(p.step_s)}, exposed ${seconds(p.exposed_s)}`,
        }, svg);
        drawn += 1;
      });
      const hides = s.hides_at_gbs === null ? null : Math.log2(s.hides_at_gbs / s.cluster_gbs);
      if (hides !== null && hides >= Math.min(...factors) && hides <= Math.max(...factors)) {
        el("circle", {
          cx: x(hides), cy: y(s.unbounded_step_s), r: 8, fill: "none", stroke: color,
          "stroke-width": 2, class: "mark",
          "data-tip": `${s.name}: communication hides at ${number(s.hides_at_gbs)} GB/s per GPU`,
        }, svg);
        drawn += 1;
      }
    });
    hover(svg, (node) => node.dataset.tip);
    legend(figure, sweeps.map((s, k) => [s.name, colors[k % colors.length]]));
    return drawn;
  }

  const charts = { timeline, memory, breakdown, plans, totals, network };
  const done = [];
  for (const [name, draw] of Object.entries(charts)) {
    const figure = document.getElementById(name);
    if (!figure) continue; // e.g. no whole-run totals were asked for
    figure.dataset.drawn = String(draw(figure));
    done.push(name);
  }
  document.body.dataset.charts = done.join(" ");
})();
