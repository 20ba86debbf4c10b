// The mesh node on the event plane page: its links, queues, spools, gateways and mate, and what an
// admin may do there: pause or resume a queue, forget a departed node (as `meshplane mesh forget`).
// The section is drawn again each second; its buttons are handled by one listener on the section.
import { confirmAction, esc, say, send } from "/ui/static/actions.js";

const fmt = (n) => (n == null ? "–" : Number(n).toLocaleString("en-US"));
const enc = encodeURIComponent;
const forgetButton = (peer) => `<button type="button" class="secondary" data-forget="${esc(peer)}">Forget ${esc(peer)}…</button>`;

function details(entry) {
  return Object.entries(entry)
    .filter(([k, v]) => !["peer", "state"].includes(k) && typeof v !== "object")
    .map(([k, v]) => `${k} ${v}`)
    .join(" · ");
}

// The MQTT door's clients (serve --mqtt-port), when the node has one.
function mqttHtml(door) {
  if (!door) return "";
  const rows = door.clients
    .map((c) => `<tr data-mqtt-client="${esc(c.client_id)}"><td>${esc(c.client_id)}</td><td>${esc(c.protocol)}</td><td>${esc(c.vpn)}${c.user ? ` · ${esc(c.user)}` : ""}</td><td class="num">${fmt(c.subscriptions)}</td><td class="num">${fmt(c.messages_in)}</td><td class="num">${fmt(c.messages_out)}</td><td class="num">${fmt(c.inflight)}</td><td>${c.persistent ? "persistent" : "clean"}</td></tr>`)
    .join("");
  const table = rows
    ? `<table data-test="mqtt-clients"><tr><th>MQTT client</th><th>protocol</th><th>VPN · user</th><th class="num">subscriptions</th><th class="num">in</th><th class="num">out</th><th class="num">in flight</th><th>session</th></tr>${rows}</table>`
    : '<p class="muted">No MQTT client connected.</p>';
  return `<h3>MQTT door (port ${door.port})</h3>${table}<p class="muted">${fmt(door.sessions)} persistent sessions · ${fmt(door.retained)} retained</p>`;
}

// The NATS door's clients (serve --nats-port), when the node has one.
function natsHtml(door) {
  if (!door) return "";
  const rows = door.clients
    .map((c) => `<tr data-nats-client="${esc(c.cid)}"><td>${esc(c.cid)}${c.name ? ` · ${esc(c.name)}` : ""}</td><td>${esc(c.address)}</td><td>${esc(c.vpn)}${c.user ? ` · ${esc(c.user)}` : ""}</td><td class="num">${fmt(c.subscriptions)}</td><td class="num">${fmt(c.msgs_in)}</td><td class="num">${fmt(c.msgs_out)}</td><td class="num">${fmt(c.pending_bytes)}</td></tr>`)
    .join("");
  const table = rows
    ? `<table data-test="nats-clients"><tr><th>NATS client</th><th>address</th><th>VPN · user</th><th class="num">subscriptions</th><th class="num">in</th><th class="num">out</th><th class="num">pending bytes</th></tr>${rows}</table>`
    : '<p class="muted">No NATS client connected.</p>';
  return `<h3>NATS door (port ${door.port}, auth ${esc(door.auth)})</h3>${table}`;
}

export function meshHtml(m) {
  if (!m) return '<p class="muted">This server is not a mesh node (start it with --node-id).</p>';
  const up = new Set(m.links.filter((l) => l.state === "up").map((l) => l.peer));
  const g = m.guaranteed;
  const links = `<table data-test="links"><tr><th>link</th><th>state</th><th>details</th><th></th></tr>${m.links
    .map((l) => `<tr data-link="${esc(l.peer)}"><td>${esc(l.peer)}</td><td>${esc(l.state)}</td><td class="muted">${esc(details(l))}</td><td>${l.state === "up" ? "" : forgetButton(l.peer)}</td></tr>`)
    .join("")}</table>`;
  const queues = g.queues.length
    ? `<table data-test="queues"><tr><th>queue</th><th>patterns</th><th class="num">stored</th><th class="num">duplicates</th><th>state</th><th></th></tr>${g.queues
      .map((q) => `<tr data-queue="${esc(q.name)}"><td>${esc(q.name)}</td><td>${esc(q.patterns.join(", "))}</td><td class="num">${fmt(q.stored)}</td><td class="num">${fmt(q.duplicates)}</td><td data-test="queue-state">${q.paused ? "paused" : "delivering"}</td><td><button type="button" class="secondary" data-queue-op="${q.paused ? "resume" : "pause"}" data-name="${esc(q.name)}">${q.paused ? "Resume" : "Pause"}</button></td></tr>`)
      .join("")}</table>`
    : '<p class="muted">No queue on this node.</p>';
  const spools = g.spools.length
    ? `<table data-test="spools"><tr><th>spool for</th><th class="num">pending</th><th class="num">sent</th><th class="num">refused</th><th></th></tr>${g.spools
      .map((s) => `<tr data-spool="${esc(s.peer)}"><td>${esc(s.peer)}</td><td class="num">${fmt(s.pending)}</td><td class="num">${fmt(s.sent)}</td><td class="num">${fmt(s.refused)}</td><td>${up.has(s.peer) ? "" : forgetButton(s.peer)}</td></tr>`)
      .join("")}</table>`
    : '<p class="muted">No spool: every node that wants guaranteed events from here has them.</p>';
  const gateways = m.gateways.length
    ? `<table data-test="gateways"><tr><th>gateway to cluster</th><th>state</th><th class="num">events out</th><th class="num">events in</th><th class="num">spooled</th></tr>${m.gateways
      .map((w) => `<tr><td>${esc(w.cluster)}</td><td>${esc(w.state)}</td><td class="num">${fmt(w.events_out)}</td><td class="num">${fmt(w.events_in)}</td><td class="num">${fmt((w.spool || {}).pending)}</td></tr>`)
      .join("")}</table>`
    : "";
  const mate = m.mate ? `<p>HA mate: <span class="muted">${esc(details(m.mate))}</span></p>` : "";
  return `<p>Node <b>${esc(m.node)}</b> of cluster ${esc(m.cluster)} · ${fmt(m.counters.messages_routed)} routed, ${fmt(m.counters.messages_forwarded)} forwarded · ${m.interest.patterns_local} local patterns</p>
    ${links}<h3>Queues</h3>${queues}<h3>Spools</h3>${spools}${gateways ? `<h3>Gateways</h3>${gateways}` : ""}${mate}${natsHtml(m.nats)}${mqttHtml(m.mqtt)}`;
}

export function meshActions(section, result, headers) {
  section.addEventListener("click", async (event) => {
    const queue = event.target.closest("button[data-queue-op]");
    const forget = event.target.closest("button[data-forget]");
    if (queue) {
      const { queueOp: op, name } = queue.dataset;
      const why = op === "pause" ? "It keeps storing; its readers get nothing until it is resumed." : "Its readers get what it stored meanwhile.";
      if (!(await confirmAction(`${op === "pause" ? "Pause" : "Resume"} queue ${name}? ${why}`))) return;
      try {
        await send("POST", `/mesh/queues/${enc(name)}/${op}`, null, headers);
        say(result, `Queue ${name} ${op === "pause" ? "paused" : "resumed"}.`, true);
      } catch (error) {
        say(result, `Not ${op === "pause" ? "paused" : "resumed"}: ${error.message}`, false);
      }
    } else if (forget) {
      const peer = forget.dataset.forget;
      const question = `Forget node ${peer}: its interest, its remembered queues and the guaranteed events spooled for it? They cannot be sent to it afterwards.`;
      if (!(await confirmAction(question, peer))) return;
      try {
        const answer = await send("DELETE", `/mesh/nodes/${enc(peer)}`, null, headers);
        say(result, `Forgot ${peer}: ${fmt(answer.spooled_events_dropped)} spooled events dropped.`, true);
      } catch (error) {
        say(result, `Not forgotten: ${error.message}`, false);
      }
    }
  });
}

// The mesh across nodes and clusters: every node registered in discovery, as its GET /mesh says.
export function meshViewHtml(nodes) {
  if (!nodes) return '<p class="muted">Reading the nodes registered in discovery…</p>';
  if (!nodes.length) return '<p class="muted">No mesh node is registered in discovery.</p>';
  const clusters = [...new Set(nodes.map((n) => n.cluster))];
  const list = (items, show) => items && items.length ? items.map(show).join("<br>") : '<span class="muted">none</span>';
  const state = (s) => `<span class="pill ${s === "up" ? "ok" : "down"}">${esc(s)}</span>`;
  return clusters.map((cluster) => `<div class="panel" data-cluster="${esc(cluster)}"><h3>Cluster ${esc(cluster)}</h3>
    <table><tr><th>node</th><th>links (peer, state, its patterns)</th><th>gateways (cluster, state, spooled)</th><th>queues (stored)</th><th>spools (pending)</th><th>mate</th></tr>
    ${nodes.filter((n) => n.cluster === cluster).map((n) => `<tr data-node="${esc(n.node)}"><td><a href="${esc(n.url)}/ui/plane">${esc(n.node)}</a>${n.self ? ' <span class="muted">(this one)</span>' : ""}</td>${n.error
      ? `<td colspan="5" class="error">${esc(n.error)}</td>`
      : `<td>${list(n.links, (l) => `${esc(l.peer)} ${state(l.state)} ${fmt(l.patterns_remote)}`)}</td>
        <td>${list(n.gateways, (g) => `${esc(g.cluster)} ${state(g.state)} ${fmt(g.spooled)}`)}</td>
        <td>${list(n.queues, (q) => `${esc(q.name)} ${fmt(q.stored)}${q.paused ? " (paused)" : ""}`)}</td>
        <td>${list(n.spools, (s) => `${esc(s.peer)} ${fmt(s.pending)}`)}</td>
        <td>${n.mate ? esc(`${n.mate.state}${n.mate.standby ? `, standby ${n.mate.standby}` : ""}`) : '<span class="muted">none</span>'}</td>`}</tr>`).join("")}
    </table></div>`).join("");
}
