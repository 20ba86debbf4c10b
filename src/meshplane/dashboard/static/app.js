// The meshplane dashboard: one live stream per page (server-sent events read with fetch, so that
// the token travels in a header), pages routed by URL under /ui, charts drawn with uPlot.
import uPlot from "/ui/static/vendor/uPlot.esm.js";
import { groupActions, retentionActions, roomRetention, topicActions, topicCreator } from "/ui/static/actions.js";
import { meshActions, meshHtml, meshViewHtml } from "/ui/static/mesh.js";

const TOKEN_KEY = "meshplane.token";
const VPN_KEY = "meshplane.vpn"; // the VPN picker's choice (the server refuses it to a tenant's token)
const SPAN = 300; // points kept per series: the last five minutes at one a second
const MAX_TAIL_ROWS = 500;

const view = document.getElementById("view");
const statusBadge = document.getElementById("status");
let state = null; // the newest state from the server
const series = new Map(); // name -> {t: [], v: []}
let page = null; // the mounted page: {update(state), tail?(events), destroy?()}
let stream = null; // AbortController of the live stream
let streamTail = null; // the tail the live stream was opened with

// --- helpers ---------------------------------------------------------------------------------------

const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const fmt = (n, digits = 0) => (n == null ? "–" : Number(n).toLocaleString("en-US", { maximumFractionDigits: digits }));
function bytes(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function duration(ms) {
  if (ms == null) return "–";
  const s = ms / 1000;
  if (s < 1) return `${Math.round(ms)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}
const time = (ms) => new Date(ms).toISOString().replace("T", " ").replace("Z", "");
const link = (href, text) => `<a href="${esc(href)}" data-link>${esc(text)}</a>`;
const enc = encodeURIComponent;

function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const vpn = sessionStorage.getItem(VPN_KEY);
  return { ...(token ? { Authorization: `Bearer ${token}` } : {}), ...(vpn ? { "X-Meshplane-Vpn": vpn } : {}) };
}

// The VPN picker: shown when the token may see more than one Message VPN (the operator's); every
// page, action and live stream then works in the VPN picked.
async function vpnPicker() {
  const picker = document.getElementById("vpn");
  let answer;
  try {
    answer = await api("/ui/api/vpns");
  } catch (error) {
    sessionStorage.removeItem(VPN_KEY);
    picker.hidden = true;
    return;
  }
  picker.innerHTML = answer.vpns.map((name) => `<option value="${esc(name)}">VPN ${esc(name)}</option>`).join("");
  picker.value = answer.vpn;
  picker.hidden = answer.vpns.length < 2;
}
document.getElementById("vpn").addEventListener("change", (event) => {
  sessionStorage.setItem(VPN_KEY, event.target.value);
  state = null;
  series.clear();
  if (stream) stream.abort();
  stream = null;
  route();
});

class Unauthorized extends Error {}

async function api(path) {
  const response = await fetch(path, { headers: headers() });
  if (response.status === 401) throw new Unauthorized();
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function sparkline(name, width = 120, height = 24) {
  const s = series.get(name);
  if (!s || s.v.length < 2) return `<svg class="spark" width="${width}" height="${height}"></svg>`;
  const values = s.v.slice(-60);
  const top = Math.max(...values, 1e-9);
  const step = width / (values.length - 1);
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - (v / top) * (height - 4)).toFixed(1)}`);
  return `<svg class="spark" width="${width}" height="${height}"><polyline fill="none" stroke="#2563eb" stroke-width="1.5" points="${points.join(" ")}"/></svg>`;
}

function chart(element, names, labels, colors, { log = false } = {}) {
  // log: a steady 600/s stays readable next to a consumer's burst of 100 000/s
  const opts = {
    width: Math.max(element.clientWidth - 20, 300),
    height: 220,
    series: [{}, ...labels.map((label, i) => ({ label, stroke: colors[i], width: 2 }))],
    axes: [{ space: 90 }, { size: 70 }],  // labels 90 px apart: they never overlap
    scales: { x: { time: true }, y: log ? { distr: 3, log: 10 } : {} },
  };
  const plot = new uPlot(opts, chartData(names, log), element);
  const resize = () => plot.setSize({ width: Math.max(element.clientWidth - 20, 300), height: 220 });
  window.addEventListener("resize", resize);
  return {
    update() {
      const data = chartData(names, log);
      plot.setData(data);
      element.dataset.points = String(data[0].length);
      element.dataset.last = String(data[1].at(-1) ?? "");
    },
    destroy() { window.removeEventListener("resize", resize); plot.destroy(); },
  };
}

function chartData(names, log = false) {
  const first = series.get(names[0]) || { t: [], v: [] };
  const values = (n) => (series.get(n) || { v: first.t.map(() => null) }).v.map((v) => (log && !(v > 0) ? null : v));
  return [first.t.slice(), ...names.map(values)];
}

// --- the live stream -------------------------------------------------------------------------------

function takeState(next) {
  if (next.history) {
    series.clear();
    for (const [name, points] of Object.entries(next.history)) {
      series.set(name, { t: points.map((p) => p[0]), v: points.map((p) => p[1]) });
    }
  } else {
    for (const [name, value] of Object.entries(next.points || {})) {
      let s = series.get(name);
      if (!s) series.set(name, (s = { t: [], v: [] }));
      s.t.push(next.t);
      s.v.push(value);
      if (s.t.length > SPAN) { s.t.shift(); s.v.shift(); }
    }
  }
  state = next;
  if (page) page.update(state);
}

function connect(tail = null) {
  if (stream) stream.abort();
  stream = new AbortController();
  streamTail = tail;
  const { signal } = stream;
  const query = tail ? `?tail=${enc(tail.target)}&from_offset=${tail.from}` : "";
  (async () => {
    let wait = 500;
    while (!signal.aborted) {
      try {
        const response = await fetch(`/ui/api/live${query}`, { headers: headers(), signal });
        if (response.status === 401) {
          if (stream && stream.signal === signal) stream = null; // signing in opens a new one
          showLogin();
          return;
        }
        if (!response.ok) throw new Error((await response.json()).error || response.statusText);
        setStatus("live", "live");
        wait = 500;
        await readEvents(response.body, signal);
      } catch (error) {
        if (signal.aborted) return;
        setStatus("down", `reconnecting (${error.message || error})`);
      }
      await new Promise((resolve) => setTimeout(resolve, wait));
      wait = Math.min(wait * 2, 10000);
    }
  })();
}

async function readEvents(body, signal) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  while (!signal.aborted) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the server closed the stream");
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (!data.length) continue; // a keep-alive comment
      const parsed = JSON.parse(data.join("\n"));
      if (event === "state") takeState(parsed);
      else if (event === "tail" && page && page.tail) page.tail(parsed);
      else if (event === "tail-error" && page && page.tailError) page.tailError(parsed.error);
    }
  }
}

function setStatus(kind, text) {
  statusBadge.className = `status ${kind}`;
  statusBadge.textContent = text;
}

// --- sign-in ---------------------------------------------------------------------------------------

const dialog = document.getElementById("login");
function showLogin(message) {
  setStatus("down", "signed out");
  const error = document.getElementById("login-error");
  error.hidden = !message;
  error.textContent = message || "";
  if (!dialog.open) dialog.showModal();
}
document.getElementById("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = document.getElementById("token").value.trim();
  const response = await fetch("/ui/api/snapshot", { headers: { Authorization: `Bearer ${token}` } });
  if (!response.ok) { showLogin(response.status === 401 ? "That token is not accepted." : response.statusText); return; }
  sessionStorage.setItem(TOKEN_KEY, token);
  document.getElementById("token").value = "";
  dialog.close();
  document.getElementById("logout").hidden = false;
  sessionStorage.removeItem(VPN_KEY);
  vpnPicker();
  route();
});
document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(VPN_KEY);
  if (stream) stream.abort();
  showLogin();
});
document.getElementById("logout").hidden = !sessionStorage.getItem(TOKEN_KEY);

// --- pages -----------------------------------------------------------------------------------------

function overviewPage() {
  view.innerHTML = `<h1>Overview</h1>
    <div class="cards" id="cards"></div>
    <div class="panel"><h2>Events per second (log scale)</h2><div id="rate-chart"></div></div>
    <p class="muted">The same numbers as <a href="/metrics">/metrics</a> (Prometheus).</p>`;
  const rates = chart(document.getElementById("rate-chart"), ["in", "out"], ["in", "out"], ["#2563eb", "#16a34a"], { log: true });
  return {
    update(s) {
      const o = s.overview;
      const c = o.connections;
      const cards = [
        ["events in/s", fmt(o.events_in_per_sec, 1), "in-rate"],
        ["events out/s", fmt(o.events_out_per_sec, 1), "out-rate"],
        ["bytes in/s", bytes(o.bytes_in_per_sec), "bytes-rate"],
        ["bulk reads/s (Spark)", bytes(o.bulk_bytes_out_per_sec), "bulk-rate"],
        ["events published", fmt(o.counters.events_published), "published"],
        ["bytes stored", bytes(o.bytes_stored), "stored"],
        ["connections", fmt(c.room_subscribers + c.pubsub_listeners + c.dashboards), "connections"],
        ["uptime", duration(o.uptime_secs * 1000), "uptime"],
        ["fsync p50 / p99 (ms)", o.fsync_ms.p50 == null ? "–" : `${fmt(o.fsync_ms.p50, 2)} / ${fmt(o.fsync_ms.p99, 2)}`, "fsync"],
        ["commits", fmt(o.counters.commits), "commits"],
        ["storage problems", fmt(o.storage_problems), "problems"],
      ];
      document.getElementById("cards").innerHTML = cards
        .map(([label, value, id]) => `<div class="card"><div class="label">${label}</div><div class="value" data-test="${id}">${value}</div></div>`)
        .join("");
      rates.update();
    },
    destroy: () => rates.destroy(),
  };
}

function groupsOf(topic) {
  return (topic.groups || []).map((g) => `${link(`/ui/groups/${enc(g.group)}`, g.group)} <span class="${g.lag > 0 ? "lag-high" : "muted"}">${fmt(g.lag)}</span>`).join("<br>") || '<span class="muted">none</span>';
}

function retention(r) {
  const parts = [];
  if (r.retention_secs != null) parts.push(duration(r.retention_secs * 1000));
  if (r.max_bytes != null) parts.push(bytes(r.max_bytes));
  if (r.max_messages != null) parts.push(`${fmt(r.max_messages)} events`);
  return parts.join(", ") || r.type || "infinite";
}

function topicsPage() {
  view.innerHTML = `<h1>Topics and rooms</h1><h2>Partitioned topics</h2><div id="topics"></div><div id="new-topic"></div><h2>Rooms</h2><div id="rooms"></div><div id="room-retention"></div>`;
  topicCreator(document.getElementById("new-topic"), headers);
  roomRetention(document.getElementById("room-retention"), headers);
  return {
    update(s) {
      document.getElementById("topics").innerHTML = s.topics.length
        ? `<table><tr><th>topic</th><th class="num">partitions</th><th class="num">events</th><th class="num">size</th><th>retention</th><th class="num">events/s</th><th></th><th>consumer groups (lag)</th></tr>
          ${s.topics.map((t) => `<tr data-topic="${esc(t.name)}"><td>${link(`/ui/topics/${enc(t.name)}`, t.name)}</td><td class="num">${t.partitions.length}</td><td class="num" data-test="events">${fmt(t.events)}</td><td class="num">${bytes(t.bytes)}</td><td>${esc(retention(t.retention))}</td><td class="num">${fmt(t.rate, 1)}</td><td>${sparkline(`topic:${t.name}`)}</td><td>${groupsOf(t)}</td></tr>`).join("")}</table>${more(s.more.topics, "topics")}`
        : '<p class="muted">No topics yet.</p>';
      document.getElementById("rooms").innerHTML = s.rooms.length
        ? `<table><tr><th>room</th><th class="num">first</th><th class="num">next</th><th class="num">size</th><th>retention</th><th class="num">live subscribers</th><th class="num">events/s</th><th></th></tr>
          ${s.rooms.map((r) => `<tr data-room="${esc(r.name)}"><td>${link(`/ui/browse?target=${enc(`room:${r.name}`)}`, r.name)}</td><td class="num">${fmt(r.first)}</td><td class="num" data-test="next">${fmt(r.next)}</td><td class="num">${bytes(r.bytes)}</td><td>${fmt(r.max_events)} events${r.retention_secs ? `, ${duration(r.retention_secs * 1000)}` : ""}</td><td class="num">${r.live_subscribers}</td><td class="num">${fmt(r.rate, 1)}</td><td>${sparkline(`room:${r.name}`)}</td></tr>`).join("")}</table>${more(s.more.rooms, "rooms")}`
        : '<p class="muted">No rooms yet.</p>';
    },
  };
}

const more = (n, what) => (n ? `<p class="muted">and ${fmt(n)} more ${what}</p>` : "");

function topicPage(name) {
  view.innerHTML = `<h1>Topic ${esc(name)}</h1><div id="topic"></div><div id="retention-action"></div><div id="topic-actions"></div>`;
  retentionActions(document.getElementById("retention-action"), name, headers);
  topicActions(document.getElementById("topic-actions"), name, headers, () => {
    history.pushState(null, "", "/ui/topics");
    route();
  });
  return {
    update(s) {
      const t = s.topics.find((x) => x.name === name);
      const box = document.getElementById("topic");
      if (!t) { box.innerHTML = '<p class="error">No such topic (deleted, or not visible to this token).</p>'; return; }
      box.innerHTML = `<p>${fmt(t.events)} events, ${bytes(t.bytes)}, retention ${esc(retention(t.retention))}, ${fmt(t.rate, 1)} events/s ${sparkline(`topic:${name}`, 200, 28)}</p>
        <table><tr><th class="num">partition</th><th class="num">first offset</th><th class="num">next offset</th><th class="num">size</th><th class="num">published here</th><th></th></tr>
        ${t.partitions.map((p) => `<tr><td class="num">${p.partition}</td><td class="num">${fmt(p.first)}</td><td class="num" data-test="next-${p.partition}">${fmt(p.next)}</td><td class="num">${bytes(p.bytes)}</td><td class="num">${fmt(p.published)}</td><td>${link(`/ui/browse?target=${enc(`topic:${name}:${p.partition}`)}`, "browse")}</td></tr>`).join("")}</table>
        <h2>Consumer groups</h2><p>${groupsOf(t)}</p>`;
    },
  };
}

function readersTable(readers) {
  if (!readers || !readers.length) return "";
  return `<h2>Readers that keep their own position (Spark queries)</h2><p class="muted">Where each said it was after its last committed batch: a read-only view, nothing moves for it.</p>
    <table><tr><th>reader</th><th>named by</th><th>topic</th><th class="num">lag (events)</th><th class="num">lag (time)</th><th class="num">last said</th></tr>
    ${readers.map((r) => `<tr data-reader="${esc(r.reader)}"><td>${esc(r.reader)}${r.owner ? ` <span class="muted">(${esc(r.owner)})</span>` : ""}</td><td data-test="reader-identity">${esc(r.identity || "")}</td><td>${link(`/ui/topics/${enc(r.topic)}`, r.topic)}</td><td class="num" data-test="reader-lag">${fmt(r.lag)}</td><td class="num" data-test="reader-lag-time">${duration(r.lag_ms)}</td><td class="num">${duration(r.updated_secs_ago * 1000)} ago</td></tr>`).join("")}</table>`;
}

function groupsPage() {
  view.innerHTML = `<h1>Consumer groups</h1><div id="groups"></div><div id="readers"></div>`;
  return {
    update(s) {
      document.getElementById("readers").innerHTML = readersTable(s.readers);
      document.getElementById("groups").innerHTML = s.groups.length
        ? `<table><tr><th>group</th><th>topic</th><th>state</th><th class="num">generation</th><th class="num">members</th><th class="num">lag (events)</th><th class="num">lag (time)</th><th></th></tr>
          ${s.groups.map((g) => `<tr data-group="${esc(g.group)}"><td>${link(`/ui/groups/${enc(g.group)}`, g.group)}</td><td>${link(`/ui/topics/${enc(g.topic)}`, g.topic)}</td><td><span class="pill ${esc(g.state)}">${esc(g.state)}</span></td><td class="num">${g.generation}</td><td class="num">${g.members.length}</td><td class="num" data-test="lag">${fmt(g.lag)}</td><td class="num">${duration(g.lag_ms)}</td><td>${sparkline(`lag:${g.group}`)}</td></tr>`).join("")}</table>${more(s.more.groups, "groups")}`
        : '<p class="muted">No consumer groups yet.</p>';
    },
  };
}

function groupPage(name) {
  view.innerHTML = `<h1>Consumer group ${esc(name)}</h1><div id="group"></div>
    <div class="panel"><h2>Lag (events)</h2><div id="lag-chart"></div></div><div id="group-actions"></div>`;
  const lag = chart(document.getElementById("lag-chart"), [`lag:${name}`], ["lag"], ["#d97706"]);
  let actions = false;
  return {
    update(s) {
      const g = s.groups.find((x) => x.group === name);
      const box = document.getElementById("group");
      if (!g) { box.innerHTML = '<p class="error">No such group (deleted, or not visible to this token).</p>'; return; }
      if (!actions) {  // once the group's partitions are known
        actions = true;
        groupActions(document.getElementById("group-actions"), name, headers, () => state && state.groups.find((x) => x.group === name));
      }
      box.innerHTML = `<p>Reads ${link(`/ui/topics/${enc(g.topic)}`, g.topic)} · <span class="pill ${esc(g.state)}">${esc(g.state)}</span> · generation ${g.generation} · ${esc(g.strategy)} ·
          total lag <b data-test="lag">${fmt(g.lag)}</b> events, oldest unconsumed event waiting <b data-test="lag-time">${duration(g.lag_ms)}</b></p>
        <h2>Members</h2>${g.members.length ? `<table><tr><th>member</th><th>partitions</th></tr>${g.members.map((m) => `<tr><td>${esc(m.id)}</td><td>${m.partitions.join(", ") || '<span class="muted">none</span>'}</td></tr>`).join("")}</table>` : '<p class="muted">No members.</p>'}
        <h2>Partitions</h2><table><tr><th class="num">partition</th><th>member</th><th class="num">committed</th><th class="num">end</th><th class="num">lag</th><th class="num">lag (time)</th></tr>
        ${g.partitions.map((p) => `<tr><td class="num">${p.partition}</td><td>${esc(p.member || "–")}</td><td class="num" data-test="committed-${p.partition}">${p.committed == null ? '<span class="muted">none</span>' : fmt(p.committed)}</td><td class="num">${fmt(p.end)}</td><td class="num ${p.lag > 0 ? "lag-high" : ""}" data-test="lag-${p.partition}">${fmt(p.lag)}</td><td class="num">${duration(p.lag_ms)}</td></tr>`).join("")}</table>`;
      lag.update();
    },
    destroy: () => lag.destroy(),
  };
}

function payload(p) {
  const label = p.format === "json" ? "" : `<span class="pill">${esc(p.format)}${p.size != null ? `, ${bytes(p.size)}` : ""}${p.truncated ? ", start only" : ""}</span> `;
  const body = typeof p.value === "string" ? p.value : JSON.stringify(p.value, null, 2);
  return `${label}<pre class="payload">${esc(body)}</pre>`;
}

function eventRow(e, fresh) {
  return `<tr class="${fresh ? "row-new" : ""}" data-offset="${e.offset}"><td class="num">${e.offset}</td><td>${time(e.timestamp_ms)}</td><td>${esc(e.event_type)}</td><td>${esc(e.key ?? (e.key_base64 ? `base64:${e.key_base64}` : ""))}</td><td>${payload(e.payload)}</td></tr>`;
}

function browsePage() {
  const params = new URLSearchParams(location.search);
  let target = params.get("target") || "";
  view.innerHTML = `<h1>Messages</h1>
    <form class="browse" id="browse-form">
      <label>topic partition or room<select id="target"></select></label>
      <label>from offset<input id="offset" type="number" min="0" placeholder="latest"></label>
      <label>or from time (UTC)<input id="when" type="datetime-local" step="1"></label>
      <button type="submit">Show</button>
      <button type="button" class="secondary" id="older">Older</button>
      <button type="button" class="secondary" id="newer">Newer</button>
      <label style="flex-direction:row;align-items:center;gap:.3rem"><input type="checkbox" id="tail"> tail live</label>
    </form>
    <p id="range" class="muted"></p>
    <table id="events"><thead><tr><th class="num">offset</th><th>time (UTC)</th><th>event</th><th>key</th><th>payload</th></tr></thead><tbody></tbody></table>`;
  const select = document.getElementById("target");
  const rows = document.querySelector("#events tbody");
  const tailBox = document.getElementById("tail");
  let shown = null; // {from, count, start, end}
  let options = "";

  function fillTargets(s) {
    const targets = [
      ...s.topics.flatMap((t) => t.partitions.map((p) => [`topic:${t.name}:${p.partition}`, `${t.name} / partition ${p.partition}`])),
      ...s.rooms.map((r) => [`room:${r.name}`, `room ${r.name}`]),
    ];
    if (target && !targets.some(([v]) => v === target)) targets.unshift([target, target]);
    const html = targets.map(([v, label]) => `<option value="${esc(v)}">${esc(label)}</option>`).join("");
    if (html !== options) {
      options = html;
      select.innerHTML = html;
      select.value = target;
    }
    if (!target && targets.length) { target = targets[0][0]; select.value = target; load({}); }
  }

  async function load({ from = null, when = null }) {
    if (!target) return;
    let query = `/ui/api/browse?target=${enc(target)}&limit=50`;
    if (when != null) query += `&timestamp_ms=${when}`;
    else if (from != null) query += `&from_offset=${Math.max(0, from)}`;
    try {
      const answer = await api(query);
      shown = { from: answer.from_offset, count: answer.events.length, start: answer.start, end: answer.end };
      rows.innerHTML = answer.events.map((e) => eventRow(e, false)).join("") || '<tr><td colspan="5" class="muted">No events here.</td></tr>';
      document.getElementById("range").textContent = `offsets ${answer.start} to ${answer.end - 1} stored; showing from ${answer.from_offset}`;
      history.replaceState(null, "", `/ui/browse?target=${enc(target)}${from != null ? `&offset=${answer.from_offset}` : ""}`);
      if (tailBox.checked) connect({ target, from: shown.from + shown.count });
    } catch (error) {
      if (error instanceof Unauthorized) showLogin();
      else document.getElementById("range").innerHTML = `<span class="error">${esc(error.message)}</span>`;
    }
  }

  document.getElementById("browse-form").addEventListener("submit", (event) => {
    event.preventDefault();
    target = select.value;
    const when = document.getElementById("when").value;
    const offset = document.getElementById("offset").value;
    load(when ? { when: Date.parse(`${when}Z`) } : { from: offset === "" ? null : Number(offset) });
  });
  select.addEventListener("change", () => { target = select.value; load({}); });
  document.getElementById("older").addEventListener("click", () => shown && load({ from: Math.max(shown.start, shown.from - 50) }));
  document.getElementById("newer").addEventListener("click", () => shown && load({ from: shown.from + shown.count }));
  tailBox.addEventListener("change", () => {
    if (tailBox.checked && target) connect({ target, from: shown ? shown.from + shown.count : 0 });
    else connect(null);
  });
  const offset = params.get("offset");
  if (state) fillTargets(state);
  if (target) load(offset != null ? { from: Number(offset) } : {});

  return {
    update: fillTargets,
    tail(events) {
      if (rows.querySelector("td.muted")) rows.innerHTML = "";
      rows.insertAdjacentHTML("beforeend", events.map((e) => eventRow(e, true)).join(""));
      while (rows.children.length > MAX_TAIL_ROWS) rows.firstElementChild.remove();
      if (shown) shown.count += events.length;
    },
    tailError(message) { tailBox.checked = false; document.getElementById("range").innerHTML = `<span class="error">${esc(message)}</span>`; },
    destroy() { if (streamTail) connect(null); },
  };
}

function treeHtml(nodes) {
  return `<ul class="tree">${nodes.map((n) => `<li><span class="kind">${esc(n.kind)}</span><b>${esc(n.name)}</b>${
    n.publishers ? ` <span class="muted">${n.publishers.map((p) => `${esc(p.instance_id)} (${esc(p.transport)} ${esc(p.address)})`).join(", ")}</span>` : ""
  }${n.children.length ? treeHtml(n.children) : ""}</li>`).join("")}</ul>`;
}

function planePage() {
  view.innerHTML = `<h1>Event plane</h1><div id="plane"></div><h2>Event mesh</h2><div id="mesh"></div><div id="mesh-result"></div><h2>The mesh across nodes and clusters</h2><div id="mesh-view"></div>`;
  meshActions(document.getElementById("mesh"), document.getElementById("mesh-result"), headers);
  return {
    update(s) {
      const p = s.plane;
      let html;
      if (p.hidden) html = '<p class="muted">This token sees only some names; the event plane is shown to tokens that read everything.</p>';
      else if (!p.discovery) html = '<p class="muted">This server was started without discovery.</p>';
      else if (!p.tree) html = `<p class="muted">${p.error ? esc(p.error) : "Reading discovery…"}</p>`;
      else {
        html = `<p>${fmt(p.publishers)} publishers registered (live while their registration lasts)${p.invalid_records ? `, <span class="error">${p.invalid_records} invalid records</span>` : ""}${p.error ? ` · <span class="error">${esc(p.error)}</span>` : ""}; checked ${duration(s.t * 1000 - p.checked_at * 1000)} ago.</p>
          <div class="panel" id="scope-tree">${p.tree.length ? treeHtml(p.tree) : '<span class="muted">No publisher is registered.</span>'}</div>
          <h2>Brokers</h2>${p.brokers.length ? `<table><tr><th>broker</th><th>xsub</th><th>xpub</th><th class="num">messages in</th><th class="num">messages out</th><th class="num">dropped</th></tr>${p.brokers.map((b) => `<tr><td>${esc(b.key.split("/").pop())}</td><td>${esc(b.xsub)}</td><td>${esc(b.xpub)}</td>${b.counters ? `<td class="num">${fmt(b.counters.messages_in ?? b.counters.frames_in)}</td><td class="num">${fmt(b.counters.messages_out ?? b.counters.frames_out)}</td><td class="num">${fmt(b.counters.dropped)}</td>` : `<td colspan="3" class="muted">${esc(b.error || "no stats endpoint registered")}</td>`}</tr>`).join("")}</table>` : '<p class="muted">No broker is registered (direct mode or NATS).</p>'}`;
      }
      document.getElementById("plane").innerHTML = html;
      document.getElementById("mesh").innerHTML = meshHtml(s.mesh);
      document.getElementById("mesh-view").innerHTML = p.discovery && !p.hidden ? meshViewHtml(p.mesh_nodes) : '<p class="muted">Needs discovery and a token that reads everything.</p>';
    },
  };
}

// --- routing ---------------------------------------------------------------------------------------

function route() {
  if (page && page.destroy) page.destroy();
  const parts = location.pathname.replace(/^\/ui\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  const [section, name] = parts;
  const pages = {
    topics: () => (name ? topicPage(name) : topicsPage()),
    groups: () => (name ? groupPage(name) : groupsPage()),
    browse: browsePage,
    plane: planePage,
  };
  page = (pages[section] || overviewPage)();
  const active = section in pages ? section : "overview";
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === active));
  document.title = `meshplane · ${document.querySelector(`header nav a[data-page="${active}"]`).textContent}`;
  if (state) page.update(state);
  if (!stream || stream.signal.aborted || (streamTail && section !== "browse")) connect(null);
}

document.addEventListener("click", (event) => {
  const a = event.target.closest("a[data-link]");
  if (!a || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
  event.preventDefault();
  history.pushState(null, "", a.getAttribute("href"));
  route();
});
window.addEventListener("popstate", route);
vpnPicker();
route();
