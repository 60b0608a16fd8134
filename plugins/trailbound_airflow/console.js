// The trailbound console: a React app of Airflow's UI (the plugin's `react_apps`), shown
// under Browse -> Trailbound. No build step and no package of its own: plain JavaScript
// on the React and Chakra UI that Airflow's UI puts on globalThis for its plugins, so the
// page has the UI's look, fonts and light/dark theme. It polls the plugin's JSON
// (GET trailbound/api/console, console.py) and redraws; the charts are SVG drawn here.
//
// Links are relative to the UI's base URL (the page's <base href>), so the console works
// under a proxy's base path. Times are UTC and say so.

const React = globalThis.React;
const { Badge, Box, Code, Flex, Heading, HStack, Link, SimpleGrid, Table, Text } = globalThis.ChakraUI;
const h = React.createElement;

const REFRESH_SECONDS = 10;
const DATA_URL = new URL("../api/console", import.meta.url);
// What each group is a hop of: capture reads the source's log, pump ships trails, replicat applies.
const HOPS = { extract: "source log → trail", pump: "trail → remote trail", replicat: "trail → target" };
const STATUS_PALETTE = { ABENDED: "failed", RUNNING: "running", STOPPED: "gray" };

// ---------------------------------------------------------------- formats

const utc = (iso) => (iso ? `${iso.slice(0, 19).replace("T", " ")} UTC` : "");

function hms(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const s = Math.max(0, Math.round(seconds));
  const pad = (n) => String(n).padStart(2, "0");
  return `${pad(Math.floor(s / 3600))}:${pad(Math.floor((s % 3600) / 60))}:${pad(s % 60)}`;
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
  let value = n, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return unit === 0 ? `${n} bytes` : `${value.toFixed(1)} ${units[unit]}`;
}

// A round duration, as an axis tick says it: 0, 30 s, 5 min, 1 h 30 min, 7 d.
function shortDuration(seconds) {
  if (!seconds) return "0";
  const parts = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]].reduce((out, [unit, name]) => {
    const n = Math.floor((seconds - out.used) / unit);
    if (n && out.list.length < 2) { out.list.push(`${n} ${name}`); out.used += n * unit; }
    return out;
  }, { list: [], used: 0 }).list;
  return parts.join(" ") || `${seconds} s`;
}

const count = (n) => (n === null || n === undefined ? "" : Number(n).toLocaleString("en-US"));
const rate = (n) => (n === null || n === undefined ? "" : `${n >= 100 ? Math.round(n).toLocaleString("en-US") : n.toPrecision(3)}/s`);

// ---------------------------------------------------------------- data

function useConsoleData() {
  const [state, setState] = React.useState({ data: null, error: null, fetchedAt: null });
  React.useEffect(() => {
    let alive = true;
    const load = async () => {
      try {
        const response = await fetch(DATA_URL, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!response.ok) {
          throw new Error(response.status === 401 ? "signed out: sign in to Airflow again" : `HTTP ${response.status}`);
        }
        const data = await response.json();
        if (alive) setState({ data, error: null, fetchedAt: new Date() });
      } catch (error) {
        // Keep what was shown; say that it is getting old.
        if (alive) setState((old) => ({ ...old, error: String(error.message || error) }));
      }
    };
    load();
    // A hidden tab does not poll: the reads cost the metadata store, not the browser.
    const timer = setInterval(() => { if (!document.hidden) load(); }, REFRESH_SECONDS * 1000);
    return () => { alive = false; clearInterval(timer); };
  }, []);
  return state;
}

// ---------------------------------------------------------------- charts

// 0, step, 2*step, ... up to at least `top`: a step of 1, 2 or 5 times a power of ten,
// or for durations a round number of seconds, minutes or hours.
const DURATION_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

function ticks(top, durations, wanted = 4) {
  const raw = Math.max(top, 1e-9) / wanted;
  let step;
  if (durations) {
    step = DURATION_STEPS.find((s) => s >= raw) || Math.ceil(raw / 86400) * 86400;
  } else {
    const power = 10 ** Math.floor(Math.log10(raw));
    step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  }
  const found = [];
  for (let v = 0; v < top + step * 0.999; v += step) found.push(v);
  return found.length > 1 ? found : [0, step];
}

function timeTicks(t0, t1, wanted) {
  if (t1 <= t0) return [t0];
  return Array.from({ length: wanted }, (_, i) => t0 + ((t1 - t0) * i) / (wanted - 1));
}

function timeLabel(ms, spanMs) {
  const iso = new Date(ms).toISOString();
  return spanMs >= 86400000 ? `${iso.slice(5, 10)} ${iso.slice(11, 16)}` : iso.slice(11, spanMs < 600000 ? 19 : 16);
}

// The width an element is drawn at, followed as it changes. A callback ref: the element
// changes when a chart that had no runs gets its first.
function useWidth(fallback) {
  const [width, setWidth] = React.useState(fallback);
  const observer = React.useRef(null);
  const ref = React.useCallback((element) => {
    if (observer.current) observer.current.disconnect();
    observer.current = element && new ResizeObserver(([entry]) => setWidth(Math.max(160, Math.floor(entry.contentRect.width))));
    if (element) observer.current.observe(element);
  }, []);
  return [ref, width];
}

const INK = {
  line: "var(--chakra-colors-fg-info, #1f6feb)",   // the links' colour: a filled point is one
  axis: "var(--chakra-colors-border-emphasized, #999)",
  grid: "var(--chakra-colors-border-muted, #e4e4e7)",
  label: "var(--chakra-colors-fg-muted, #52525b)",
};

// One group's runs over time: y = value(run) (lag seconds or records per second); each
// point says when, what and which DAG run committed it (tooltip), and links to that run.
function RunChart({ runs, value, durations, yTitle, describe }) {
  const [ref, width] = useWidth(360);
  const [hover, setHover] = React.useState(null);
  const points = runs.filter((r) => value(r) !== null && value(r) !== undefined);
  if (!points.length) return h(Text, { color: "fg.muted", fontSize: "sm", ref }, "no committed run yet");
  const height = 170;
  const pad = { left: 64, right: 14, top: 22, bottom: 40 };
  const times = points.map((p) => Date.parse(p.at));
  const t0 = Math.min(...times), t1 = Math.max(...times);
  const yTicks = ticks(Math.max(...points.map(value)), durations);
  const yTop = yTicks[yTicks.length - 1];
  const plotW = width - pad.left - pad.right, plotH = height - pad.top - pad.bottom;
  const x = (t) => pad.left + (t1 > t0 ? ((t - t0) / (t1 - t0)) * plotW : plotW / 2);
  const y = (v) => pad.top + plotH - (v / yTop) * plotH;
  const format = durations ? shortDuration : (v) => (v >= 1000 ? `${(v / 1000).toFixed(v % 1000 ? 1 : 0)}k` : String(+v.toPrecision(3)));
  const xTicks = timeTicks(t0, t1, t1 > t0 ? Math.max(2, Math.min(5, Math.floor(plotW / 110))) : 1);
  const anchor = (i, n) => (n === 1 ? "middle" : i === 0 ? "start" : i === n - 1 ? "end" : "middle");
  const text = { fontSize: "11px", fill: INK.label, fontVariantNumeric: "tabular-nums" };

  const svg = h("svg", { width, height, role: "img", className: "tb-chart", "aria-label": yTitle,
    style: { display: "block", overflow: "visible" } },
    // y axis: gridlines and tick labels left of the axis, the axis' title above it
    yTicks.map((v) => h("g", { key: `y${v}` },
      h("line", { x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v), style: { stroke: v ? INK.grid : INK.axis } }),
      h("text", { x: pad.left - 6, y: y(v) + 4, textAnchor: "end", style: text, className: "tb-y-tick" }, format(v)))),
    h("line", { x1: pad.left, x2: pad.left, y1: pad.top, y2: pad.top + plotH, style: { stroke: INK.axis } }),
    h("text", { x: pad.left, y: 11, style: text, className: "tb-axis-title" }, yTitle),
    // x axis: commit time, ticks below the axis, its title under them
    xTicks.map((t, i) => h("g", { key: `x${i}` },
      h("line", { x1: x(t), x2: x(t), y1: pad.top + plotH, y2: pad.top + plotH + 4, style: { stroke: INK.axis } }),
      h("text", { x: x(t), y: pad.top + plotH + 16, textAnchor: anchor(i, xTicks.length), style: text,
        className: "tb-x-tick" }, timeLabel(t, t1 - t0)))),
    h("text", { x: width - pad.right, y: height - 4, textAnchor: "end", style: text, className: "tb-axis-title" },
      `commit time (UTC${t1 - t0 < 86400000 ? `, ${new Date(t0).toISOString().slice(0, 10)}` : ""})`),
    points.length > 1 && h("polyline", { style: { fill: "none", stroke: INK.line, strokeWidth: 2 },
      points: points.map((p, i) => `${x(times[i])},${y(value(p))}`).join(" ") }),
    points.map((p, i) => {
      const dot = h("circle", { cx: x(times[i]), cy: y(value(p)), r: hover === i ? 6 : p.href ? 4.5 : 3.5,
        onMouseEnter: () => setHover(i), onMouseLeave: () => setHover(null),
        // CSS variables (the theme's colors) work in style, not in SVG's presentation attributes everywhere.
        style: { fill: p.href ? INK.line : "var(--chakra-colors-bg-panel, #fff)", stroke: INK.line, strokeWidth: 2,
          cursor: p.href ? "pointer" : "default" } },
        h("title", null, describe(p)));
      return p.href ? h("a", { key: i, href: p.href, className: "tb-run" }, dot) : h("g", { key: i }, dot);
    }));

  const tip = hover !== null && points[hover] && h(Box, {
    className: "tb-tooltip", role: "tooltip", position: "absolute", pointerEvents: "none", zIndex: 1,
    top: `${Math.max(0, y(value(points[hover])) - 58)}px`,
    ...(x(times[hover]) > width / 2 ? { right: `${width - x(times[hover]) + 10}px` } : { left: `${x(times[hover]) + 10}px` }),
    bg: "bg.panel", borderWidth: "1px", borderColor: "border.emphasized", borderRadius: "md", boxShadow: "md",
    px: 2, py: 1, fontSize: "xs", maxW: "260px" }, describe(points[hover]));
  return h(Box, { ref, position: "relative", width: "100%", minW: 0 }, svg, tip);
}

// ---------------------------------------------------------------- layout

function Section({ id, title, children, note }) {
  return h(Box, { as: "section", id, mt: 6, minW: 0 },
    h(Heading, { as: "h2", size: "md", mb: 2 }, title),
    children,
    note && h(Text, { color: "fg.muted", fontSize: "xs", mt: 1 }, note));
}

// A table that scrolls inside its box rather than widening the page on a narrow screen.
function DataTable({ id, columns, rows, empty, numeric }) {
  if (!rows.length) return h(Text, { color: "fg.muted", fontSize: "sm" }, empty || "none");
  return h(Box, { overflowX: "auto", maxW: "100%", borderWidth: "1px", borderRadius: "md" },
    h(Table.Root, { id, size: "sm", variant: "line", striped: true },
      h(Table.Header, null, h(Table.Row, null, columns.map((c) => h(Table.ColumnHeader,
        { key: c, whiteSpace: "nowrap", textAlign: (numeric || []).includes(c) ? "end" : undefined }, c)))),
      h(Table.Body, null, rows)));
}

const cell = (content, props) => h(Table.Cell, props || null, content);
const groupName = (g) => `${g.program.toUpperCase()} ${g.group}`;

function runDescription(p, what) {
  return `${utc(p.at)}: ${what(p)}${p.run_id ? `, DAG run ${p.dag_id} ${p.run_id}` : ", a run from the command line"}`;
}

function InfoAll({ groups }) {
  return h(DataTable, {
    id: "info-all-table",
    columns: ["Program", "Status", "Group", "Lag at Chkpt", "Time Since Chkpt", "Last checkpoint", "Last error", "DAG runs"],
    rows: groups.map((g) => h(Table.Row, { key: `${g.program} ${g.group}`, className: `group ${g.status}`, "data-group": g.group },
      cell(g.program.toUpperCase()),
      cell(h(Badge, { colorPalette: STATUS_PALETTE[g.status] || "gray", variant: g.status === "ABENDED" ? "solid" : "subtle" }, g.status),
        { className: "status" }),
      cell([g.group, !g.configured && h(Text, { as: "span", key: "n", color: "fg.muted" }, " (not in this configuration)")]),
      cell(hms(g.lag), { className: "lag", fontVariantNumeric: "tabular-nums" }),
      cell(hms(g.since_checkpoint), { fontVariantNumeric: "tabular-nums" }),
      cell(utc(g.checkpoint_time) || "not added yet", { className: "checkpoint", whiteSpace: "nowrap" }),
      cell(g.error ? `${utc(g.error_time)}: ${g.error}` : "", { className: "error", minW: "16rem", maxW: "28rem", wordBreak: "break-word" }),
      cell(h(HStack, { gap: 2, wrap: "wrap" }, g.dags.map((d) => h(Link, { key: d.dag_id, href: d.href, color: "fg.info" }, d.dag_id))),
        { className: "dags" }))),
  });
}

function Charts({ id, groups, value, durations, yTitle, what, extra }) {
  return h(SimpleGrid, { id, minChildWidth: "min(100%, 340px)", gap: 4 },
    groups.map((g) => h(Box, { key: `${g.program} ${g.group}`, className: "tb-chart-card", "data-group": g.group,
      borderWidth: "1px", borderRadius: "md", p: 3, minW: 0, bg: "bg.panel" },
      h(Flex, { justify: "space-between", gap: 2, wrap: "wrap", mb: 1 },
        h(Text, { fontWeight: "semibold", className: "tb-chart-title" }, groupName(g)),
        h(Text, { color: "fg.muted", fontSize: "xs" }, extra ? extra(g) : HOPS[g.program])),
      h(RunChart, { runs: g.runs, value, durations, yTitle, describe: (p) => runDescription(p, what) }))));
}

function Transactions({ transactions }) {
  return h(DataTable, {
    id: "transactions-table", empty: "none open",
    columns: ["Group", "XID", "Thread", "Start position", "Start SCN", "Started (log time)", "Age", "Records", "BR state", "Alert"],
    rows: transactions.map((t) => h(Table.Row, { key: `${t.group} ${t.thread} ${t.xid}`, className: `txn${t.long_running ? " alert" : ""}`,
      bg: t.long_running ? "warning.subtle" : undefined },
      cell(t.group), cell(t.xid), cell(t.thread), cell(t.start_position), cell(t.start_scn),
      cell(utc(t.start_time), { whiteSpace: "nowrap" }), cell(hms(t.age)), cell(count(t.records)), cell(t.br_state),
      cell(t.long_running ? `open longer than WARNLONGTRANS ${hms(t.warnlongtrans)}: control DAG skiptrans or forcetrans ${t.xid}` : ""))),
  });
}

function Sources({ sources }) {
  return h(DataTable, {
    id: "sources-table", empty: "no live PostgreSQL source",
    columns: ["Source", "Slot", "Confirmed LSN", "Server WAL", "Not yet archived", "WAL held", "Archive behind", "Open streamed"],
    rows: sources.map((s) => h(Table.Row, { key: s.source, className: "source" },
      cell(s.source),
      ...(s.error ? [cell(`not available: ${s.error}`, { colSpan: 7 })]
        : !s.exists ? [cell(s.slot), cell(`slot missing: trailbound add source ${s.source}`, { colSpan: 6 })]
          : [cell(s.slot), cell(s.confirmed), cell(s.current),
            cell(bytes(s.lag_bytes), { className: "lag", title: `${count(s.lag_bytes)} bytes` }),
            cell(bytes(s.held_bytes), { title: `${count(s.held_bytes)} bytes` }),
            cell(s.behind_seconds === null ? "no segment yet" : hms(s.behind_seconds)), cell(s.open_streamed)]))),
  });
}

function Retention({ retention }) {
  return h(DataTable, {
    id: "retention-table",
    columns: ["Source", "Required SCN", "Registrations", "Purgeable now", "Kept", "Warning"],
    rows: retention.map((r, i) => h(Table.Row, { key: i },
      ...(r.error ? [cell(`not available: ${r.error}`, { colSpan: 6 })]
        : [cell(r.source), cell(r.required_scn ?? "none"), cell(r.registrations.join("; ") || "none"),
          cell(`${r.purgeable} segment(s), ${bytes(r.purgeable_bytes)}: ${r.purgeable_ranges}`), cell(r.kept),
          cell(r.warning || "")]))),
  });
}

const STATS_COLUMNS = ["inserts", "updates", "deletes", "truncates", "discards", "collisions", "operations"];

function Stats({ groups }) {
  const rows = groups.flatMap((g) => g.tables.map((t) => h(Table.Row, { key: `${g.program} ${g.group} ${t.table}` },
    cell(groupName(g), { whiteSpace: "nowrap" }), cell(t.target && t.target !== t.table ? `${t.table} → ${t.target}` : t.table),
    ...STATS_COLUMNS.map((c) =>
      cell(count(t[c]), { key: c, textAlign: "end", fontVariantNumeric: "tabular-nums" })))));
  return h(DataTable, {
    id: "stats-table", empty: "no operations counted yet (each run records them as it commits)",
    columns: ["Group", "Table", ...STATS_COLUMNS.map((c) => c[0].toUpperCase() + c.slice(1))], rows,
    numeric: STATS_COLUMNS.map((c) => c[0].toUpperCase() + c.slice(1)),
  });
}

function Discards({ groups }) {
  const replicats = groups.filter((g) => g.program === "replicat");
  if (!replicats.length) return h(Text, { color: "fg.muted", fontSize: "sm" }, "no replicat");
  return h(HStack, { id: "discards", gap: 3, wrap: "wrap" }, replicats.map((g) => {
    const n = g.discards || 0;
    return h(Badge, { key: g.group, size: "lg", colorPalette: n ? "warning" : "gray", "data-group": g.group },
      `${groupName(g)}: ${n ? `${count(n)} discarded` : "none"}`);
  }));
}

function Heartbeat({ heartbeat }) {
  if (!heartbeat || !heartbeat.length) {
    return h(Text, { id: "heartbeat", color: "fg.muted", fontSize: "sm" },
      "no heartbeat yet: the end-to-end lag (source commit to target apply) shows here once the heartbeat table is in use; each hop's lag is above");
  }
  // Each hop's share of the end-to-end lag (archive, capture, pump, replicat); a hop
  // without its stamp (no pump) shows a dash.
  const hops = ["archive", "capture", "pump", "replicat"];
  const share = (value) => (value === null || value === undefined ? "-" : hms(value));
  return h(DataTable, {
    id: "heartbeat-table", columns: ["Path", "End-to-end lag", ...hops.map((hop) => `${hop} hop`), "Heartbeat at"],
    rows: heartbeat.map((b) => h(Table.Row, { key: b.path }, cell(b.path), cell(hms(b.lag_seconds)),
      ...hops.map((hop) => cell(share((b.hops || {})[hop]), { key: hop })), cell(utc(b.at)))),
  });
}

function Checkpoints({ groups }) {
  const reports = groups.filter((g) => g.checkpoint_report);
  if (!reports.length) return h(Text, { color: "fg.muted", fontSize: "sm" }, "no group added yet");
  return h(Box, null, reports.map((g) => h("details", { key: `${g.program} ${g.group}` },
    h("summary", { style: { cursor: "pointer" } }, `INFO ${groupName(g)} SHOWCH`),
    h(Code, { as: "pre", display: "block", whiteSpace: "pre", overflowX: "auto", maxW: "100%", p: 2, my: 2, fontSize: "xs" },
      g.checkpoint_report))));
}

function TrailboundConsole() {
  const { data, error, fetchedAt } = useConsoleData();
  const links = data ? data.links : null;
  return h(Box, { id: "trailbound-console", p: { base: 2, md: 4 }, minW: 0, maxW: "100%" },
    h(Flex, { justify: "space-between", align: "baseline", gap: 3, wrap: "wrap" },
      h(Heading, { as: "h1", size: "xl" }, "Trailbound"),
      h(Text, { color: "fg.muted", fontSize: "sm", id: "as-of" },
        data ? `As of ${utc(data.as_of)}; refreshes every ${REFRESH_SECONDS} s` : "reading the metadata store ...")),
    error && h(Text, { color: "fg.error", fontSize: "sm", id: "refresh-error" },
      `Could not refresh${fetchedAt ? ` (showing ${fetchedAt.toISOString().slice(11, 19)} UTC)` : ""}: ${error}`),
    links && h(Text, { fontSize: "sm", mt: 1 },
      "Read-only: act through the ", h(Link, { href: links.control, color: "fg.info", id: "control-dag" }, "control DAG"),
      " (Trigger, then its form: skiptrans, forcetrans, alter ...). ",
      h(Link, { href: links.retention, color: "fg.info" }, "Retention DAG runs"), ", ",
      h(Link, { href: links.metrics, color: "fg.info" }, "Prometheus metrics"), "."),
    data && [
      h(Section, { key: "info", id: "info-all", title: "INFO ALL",
        note: "Lag at Chkpt: the checkpoint's wall time minus the log time of the last record it covers. Time Since Chkpt: now minus the checkpoint's wall time." },
        h(InfoAll, { groups: data.groups })),
      h(Section, { key: "lag", id: "lag", title: "Lag at checkpoint per hop",
        note: "One point per committed run; a filled point links to the DAG run that committed it, a hollow one was a command-line run." },
        h(Charts, { id: "lag-charts", groups: data.groups, value: (p) => p.lag, durations: true, yTitle: "lag at checkpoint",
          what: (p) => `lag ${hms(p.lag)}` })),
      h(Section, { key: "heartbeat", id: "end-to-end", title: "End-to-end lag (heartbeat)" }, h(Heartbeat, { heartbeat: data.heartbeat })),
      h(Section, { key: "throughput", id: "throughput", title: "Throughput per stage",
        note: "Records a run wrote (extract, pump) or operations it applied (replicat), per second of its wall time." },
        h(Charts, { id: "throughput-charts", groups: data.groups, value: (p) => p.records_per_second, durations: false,
          yTitle: "records per second", what: (p) => `${count(p.records)} records in ${hms(p.seconds)} (${rate(p.records_per_second)})`,
          extra: (g) => { const last = g.runs[g.runs.length - 1]; return last ? `last run ${rate(last.records_per_second)}` : HOPS[g.program]; } })),
      h(Section, { key: "txn", id: "transactions", title: "Open transactions (oldest first)",
        note: "Ages are log time, as WARNLONGTRANS measures them." }, h(Transactions, { transactions: data.transactions })),
      h(Section, { key: "sources", id: "sources", title: "Live sources: slot lag",
        note: "Not yet archived: WAL the slot has not confirmed (the next pull's work). WAL held: what the slot keeps on the source's disk." },
        h(Sources, { sources: data.sources })),
      h(Section, { key: "retention", id: "retention", title: "Archive-log retention" }, h(Retention, { retention: data.retention })),
      h(Section, { key: "stats", id: "stats", title: "STATS per table (since the first counted run)" }, h(Stats, { groups: data.groups })),
      h(Section, { key: "discards", id: "discards-section", title: "Discards" }, h(Discards, { groups: data.groups })),
      h(Section, { key: "checkpoints", id: "checkpoints", title: "Checkpoints" }, h(Checkpoints, { groups: data.groups })),
    ]);
}

// The UI's contract (Airflow 3.1+ react_apps): the module leaves its component on
// globalThis.AirflowPlugin, which the UI renders under the plugin's route.
globalThis.AirflowPlugin = TrailboundConsole;
export default TrailboundConsole;
