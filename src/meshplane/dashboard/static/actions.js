// Actions on the server from the dashboard: create and delete topics, change retention, produce a
// message, reset a group's offsets. Each goes through the streams API with the signed-in token (the
// server checks its scopes: creating, deleting and retention need admin, producing write) and asks
// for a confirmation first; deleting asks for the topic's name to be typed.

export const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const enc = encodeURIComponent;

// The answer of a request the user asked for: its body, or an Error saying what the server said.
export async function send(method, path, body, headers) {
  const response = await fetch(path, {
    method,
    headers: { ...headers(), ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  let answer = {};
  try { answer = text ? JSON.parse(text) : {}; } catch { answer = { error: text }; }
  if (!response.ok) {
    const why = response.status === 401 ? "sign in with a token that may do this" : answer.error || response.statusText;
    throw new Error(`${response.status}: ${why}`);
  }
  return answer;
}

// A modal confirmation; with `typed`, the user must type it (a name) before Confirm is enabled.
export function confirmAction(message, typed = null) {
  const dialog = document.getElementById("confirm");
  dialog.querySelector("[data-confirm-message]").textContent = message;
  const input = dialog.querySelector("[data-confirm-typed]");
  const ok = dialog.querySelector("[data-confirm-ok]");
  input.hidden = typed == null;
  input.value = "";
  input.placeholder = typed == null ? "" : `type ${typed} to confirm`;
  ok.disabled = typed != null;
  input.oninput = () => { ok.disabled = input.value !== typed; };
  return new Promise((resolve) => {
    dialog.onclose = () => resolve(dialog.returnValue === "confirm");
    dialog.returnValue = "";
    dialog.showModal();
  });
}

export function say(box, text, ok) {
  box.textContent = text;
  box.className = ok ? "ok" : "error";
  box.hidden = false;
}

// A form in `container` whose submit (default prevented) calls `submit(form, result box)`.
function formAction(container, html, submit) {
  container.innerHTML = html;
  const form = container.querySelector("form");
  const result = form.querySelector("[data-action-result]");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit(form, result);
  });
}

// The "new topic" form of the topics page.
export function topicCreator(container, headers) {
  formAction(container, `<form class="panel action" data-action="create-topic">
      <h2>New topic</h2>
      <label>name <input name="name" required></label>
      <label>partitions <input name="partitions" type="number" min="1" value="1" required></label>
      <label>retention <select name="retention"><option value="">infinite</option><option value="3600">1 hour</option><option value="86400">1 day</option><option value="604800">7 days</option></select></label>
      <button type="submit">Create topic</button>
      <p data-action-result hidden></p>
    </form>`, async (form, result) => {
    const name = form.name.value.trim();
    const partitions = Number(form.partitions.value);
    const body = { num_partitions: partitions };
    if (form.retention.value) body.retention_policy = { type: "Time", retention_secs: Number(form.retention.value) };
    if (!(await confirmAction(`Create topic ${name} with ${partitions} partition(s)?`))) return;
    try {
      await send("POST", `/topics/${enc(name)}`, body, headers);
      say(result, `Topic ${name} created.`, true);
      form.reset();
    } catch (error) {
      say(result, `Not created: ${error.message}`, false);
    }
  });
}

// The "produce a message" and "delete" controls of a topic's page.
export function topicActions(container, name, headers, onDeleted) {
  container.innerHTML = `<form class="panel action" data-action="produce">
      <h2>Produce a message</h2>
      <label>partition <input name="partition" type="number" min="0" placeholder="by key"></label>
      <label>key <input name="key" placeholder="none"></label>
      <label>value <textarea name="value" rows="2" required placeholder='{"id": 1} or text'></textarea></label>
      <button type="submit">Produce</button>
      <p data-action-result hidden></p>
    </form>
    <div class="panel action danger"><h2>Delete this topic</h2>
      <p class="muted">Its events and its consumer groups' positions go with it.</p>
      <button type="button" data-action="delete-topic">Delete topic ${esc(name)}…</button>
      <p data-delete-result hidden></p></div>`;
  const form = container.querySelector("form");
  const result = form.querySelector("[data-action-result]");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    let data = form.value.value;
    try { data = JSON.parse(data); } catch { /* sent as text */ }
    const body = { event_type: "message", data };
    if (form.key.value) body.key = form.key.value;
    if (form.partition.value !== "") body.partition = Number(form.partition.value);
    if (!(await confirmAction(`Produce this message to ${name}?`))) return;
    try {
      const answer = await send("POST", `/topics/${enc(name)}/publish`, body, headers);
      say(result, `Produced at partition ${answer.partition_id}, offset ${answer.offset}.`, true);
    } catch (error) {
      say(result, `Not produced: ${error.message}`, false);
    }
  });
  const deleted = container.querySelector("[data-delete-result]");
  container.querySelector('[data-action="delete-topic"]').addEventListener("click", async () => {
    if (!(await confirmAction(`Delete topic ${name} and all its events? This cannot be undone.`, name))) return;
    try {
      await send("DELETE", `/topics/${enc(name)}`, null, headers);
      onDeleted();
    } catch (error) {
      say(deleted, `Not deleted: ${error.message}`, false);
    }
  });
}

// The "retention" form of a topic's page: forever, for a time, up to a size or a number of events.
export function retentionActions(container, name, headers) {
  formAction(container, `<form class="panel action" data-action="retention">
      <h2>Retention</h2>
      <label>keep <select name="type"><option value="Infinite">forever</option><option value="Time">for a time (seconds)</option><option value="Size">up to a size (bytes)</option><option value="Messages">up to a number of events</option></select></label>
      <label>limit <input name="limit" type="number" min="1"></label>
      <button type="submit">Change retention</button>
      <p class="muted">Whole segments go: a shorter retention deletes the older ones at the next pass.</p>
      <p data-action-result hidden></p>
    </form>`, async (form, result) => {
    const field = { Time: "retention_secs", Size: "max_bytes", Messages: "max_messages" };
    const type = form.type.value;
    const policy = { type };
    if (field[type] && form.limit.value === "") { say(result, "Not changed: give a limit.", false); return; }
    if (field[type]) policy[field[type]] = Number(form.limit.value);
    const what = field[type] ? `${type.toLowerCase()} ${form.limit.value}` : "forever";
    if (!(await confirmAction(`Change the retention of ${name} to ${what}?`))) return;
    try {
      const answer = await send("PUT", `/topics/${enc(name)}/retention`, { retention_policy: policy }, headers);
      say(result, `Retention changed: ${JSON.stringify(answer.retention_policy)}.`, true);
    } catch (error) {
      say(result, `Not changed: ${error.message}`, false);
    }
  });
}

// The "room retention" form of the topics page: a room's event count and age limits.
export function roomRetention(container, headers) {
  formAction(container, `<form class="panel action" data-action="room-retention">
      <h2>Room retention</h2>
      <label>room <input name="room" required></label>
      <label>max events <input name="max_events" type="number" min="1" placeholder="unchanged"></label>
      <label>max age (seconds) <input name="retention_secs" type="number" min="1" placeholder="unchanged"></label>
      <label style="flex-direction:row;align-items:center;gap:.3rem"><input type="checkbox" name="no_age"> no age limit</label>
      <button type="submit">Change</button>
      <p data-action-result hidden></p>
    </form>`, async (form, result) => {
    const room = form.room.value.trim();
    const body = {};
    if (form.max_events.value !== "") body.max_events = Number(form.max_events.value);
    if (form.no_age.checked) body.retention_secs = null;
    else if (form.retention_secs.value !== "") body.retention_secs = Number(form.retention_secs.value);
    if (!(await confirmAction(`Change the limits of room ${room}? Events past them are removed.`))) return;
    try {
      const answer = await send("PUT", `/stream/${enc(room)}/retention`, body, headers);
      say(result, `Room ${room}: at most ${answer.max_events} events${answer.retention_secs ? `, ${answer.retention_secs} s` : ", no age limit"}.`, true);
    } catch (error) {
      say(result, `Not changed: ${error.message}`, false);
    }
  });
}

// The "reset offsets" form of a group's page: every partition (or one) to the earliest or latest
// offset, an offset, or the first event at or after a time (UTC). Commits without a member, which
// the server refuses while the group has live members, as Kafka does.
export function groupActions(container, name, headers, current) {
  container.innerHTML = `<form class="panel action" data-action="reset-offsets">
      <h2>Reset offsets</h2>
      <label>partition <select name="partition"><option value="">all</option></select></label>
      <label>to <select name="to"><option value="earliest">earliest</option><option value="latest">latest</option><option value="offset">an offset</option><option value="time">a time (UTC)</option></select></label>
      <label>offset <input name="offset" type="number" min="0"></label>
      <label>time <input name="time" type="datetime-local" step="1"></label>
      <button type="submit">Reset</button>
      <p class="muted">Refused while the group has live members: stop them first.</p>
      <p data-action-result hidden></p>
    </form>`;
  const form = container.querySelector("form");
  const result = form.querySelector("[data-action-result]");
  const group = current();
  if (group) {
    form.partition.innerHTML += group.partitions.map((p) => `<option value="${p.partition}">${p.partition}</option>`).join("");
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const g = current();
    if (!g) return;
    const partitions = form.partition.value === "" ? g.partitions.map((p) => p.partition) : [Number(form.partition.value)];
    const to = form.to.value;
    const what = to === "offset" ? `offset ${form.offset.value}` : to === "time" ? `${form.time.value} UTC` : `the ${to} offset`;
    if (!(await confirmAction(`Reset group ${name} on partition(s) ${partitions.join(", ")} to ${what}?`))) return;
    try {
      const targets = await offsetsFor(g.topic, partitions, to, form, headers);
      for (const p of partitions) {
        await send("POST", `/consumer-groups/${enc(name)}/offsets/commit`, { partition_id: p, offset: targets[p] }, headers);
      }
      say(result, `Reset: ${partitions.map((p) => `partition ${p} at ${targets[p]}`).join(", ")}.`, true);
    } catch (error) {
      say(result, `Not reset: ${error.message}`, false);
    }
  });
}

async function offsetsFor(topic, partitions, to, form, headers) {
  const targets = {};
  if (to === "offset") {
    if (form.offset.value === "") throw new Error("give an offset");
    for (const p of partitions) targets[p] = Number(form.offset.value);
    return targets;
  }
  if (to === "time") {
    const ms = Date.parse(`${form.time.value}Z`);
    if (Number.isNaN(ms)) throw new Error("give a time");
    const found = await send("GET", `/topics/${enc(topic)}/offsets?timestamp_ms=${ms}`, null, headers);
    for (const p of partitions) targets[p] = Number(found.offsets[String(p)]);
    return targets;
  }
  const stats = await send("GET", `/topics/${enc(topic)}/stats`, null, headers);
  for (const info of stats.partitions) {
    const p = Number(info.partition_id);
    if (partitions.includes(p)) targets[p] = Number(to === "earliest" ? info.min_offset : info.next_offset);
  }
  return targets;
}
