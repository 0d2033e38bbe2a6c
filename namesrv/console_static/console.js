// dledger console: vanilla JS, no build step, nothing fetched but this NameServer's /console API.
// Text from the cluster is only ever set as textContent (never parsed as HTML).
"use strict";

const READ_ONLY = document.body.dataset.readOnly === "true";
const TOPICS_REFRESH_MS = 3000;
const $ = (sel, root = document) => root.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

const num = (v) => el("td", { class: "num" }, v === undefined || v === null ? "–" : v);
const time = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC") : "–");

// A viewer's sign-in (access control): kept in this tab's sessionStorage, sent only with actions.
function signedIn() {
  const key = sessionStorage.getItem("dledger-access-key");
  const secret = sessionStorage.getItem("dledger-secret-key");
  return key && secret ? { key, secret } : null;
}

function showSignIn() {
  const who = signedIn();
  const form = $("#sign-in");
  if (!form) return;
  for (const input of form.querySelectorAll("input")) input.hidden = Boolean(who);
  form.querySelector("button").textContent = who ? "sign out" : "sign in";
  $("#signed-in").hidden = !who;
  $("#signed-in").textContent = who ? `acting as ${who.key}` : "";
}

function setupSignIn() {
  const form = $("#sign-in");
  if (!form) return;
  form.hidden = READ_ONLY;
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (signedIn()) {
      sessionStorage.removeItem("dledger-access-key");
      sessionStorage.removeItem("dledger-secret-key");
    } else {
      const key = form.elements.access_key.value.trim();
      const secret = form.elements.secret_key.value;
      if (key && secret) {
        sessionStorage.setItem("dledger-access-key", key);
        sessionStorage.setItem("dledger-secret-key", secret);
      }
      form.elements.secret_key.value = "";
    }
    showSignIn();
  });
  showSignIn();
}

async function api(path, body) {
  const headers = { "Content-Type": "application/json" };
  const who = signedIn();
  if (who) {
    headers["X-Dledger-Access-Key"] = who.key;
    headers["X-Dledger-Secret-Key"] = who.secret;
  }
  const init = body === undefined ? {} : { method: "POST", headers, body: JSON.stringify(body) };
  const resp = await fetch("/console/api/" + path, init);
  let data;
  try { data = await resp.json(); } catch (e) { data = { error: `HTTP ${resp.status}` }; }
  if (!resp.ok) throw new Error(data.error || `HTTP ${resp.status}`);
  return data;
}

function confirmAction(text) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
}

async function act(resultEl, question, path, body, done) {
  resultEl.className = "result";
  if (!(await confirmAction(question))) { resultEl.textContent = "cancelled"; return; }
  resultEl.textContent = "working…";
  try {
    const answer = await api(path, body);
    resultEl.className = "result ok";
    resultEl.textContent = done(answer);
  } catch (e) {
    resultEl.className = "result error";
    resultEl.textContent = e.message;
  }
}

// -- tabs --------------------------------------------------------------------------------------

let topicsTimer = null;

function showTab() {
  const name = (location.hash || "#cluster").slice(1);
  for (const s of document.querySelectorAll("section.tab")) s.hidden = s.id !== name;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.tab === name);
  clearInterval(topicsTimer);
  topicsTimer = null;
  if (name === "topics") { loadTopics(); topicsTimer = setInterval(loadTopics, TOPICS_REFRESH_MS); }
  if (name === "consumers") loadConsumerNames();
}

// -- cluster (live) ----------------------------------------------------------------------------

function contact(follower) {  // a follower's last contact: ms when its tick is known
  if (follower.last_contact_ticks === undefined) return undefined;
  if (follower.last_contact_ticks === -1) {  // not in the leader's term: what the group knew
    if (typeof follower.last_heard_by !== "string") return "never";
    const when = new Date(follower.last_heard_ms).toLocaleTimeString();
    const ago = `${Math.floor(follower.last_heard_ago_ms / 1000)} s ago`;
    return follower.reachable === false
      ? `unreachable since ${when}, ${ago} (as last seen by ${follower.last_heard_by})`
      : `not heard this term (last seen ${when}, ${ago}, by ${follower.last_heard_by})`;
  }
  const ms = follower.last_contact_ms;
  return ms === null || ms === undefined ? `${follower.last_contact_ticks} ticks` : `${ms} ms`;
}

function nodeRow(group, n, leaderLag) {
  const follower = leaderLag[n.node] || {};
  const reg = n.registration || {};
  const state = n.role === "unreachable" ? `unreachable: ${n.error}` : "answering";
  const row = el("tr", { class: "role-" + n.role, dataset: { node: n.node, role: n.role } },
    el("td", {}, n.node), el("td", { class: "role" }, n.role), num(n.term),
    num(n.last_index), num(n.commit_index), num(n.applied_index),
    num(follower.lag), num(contact(follower)),
    el("td", {}, reg.last_seen_s_ago === undefined ? "not registered" : `${reg.last_seen_s_ago} s ago`),
    el("td", { class: "node-state" }, state));
  const cell = el("td");
  if (!READ_ONLY && group.leader && n.role === "follower") {
    cell.append(el("button", { class: "transfer", onclick: () => act(
      $(".result", row.closest(".group")), `Hand the leadership of group ${group.group} from ` +
      `${group.leader} to ${n.node}?`, "leader-transfer", { group: group.group, to: n.node },
      (a) => `leadership of ${a.group} moved from ${a.from} to ${a.to}`) }, "make leader"));
  }
  row.append(cell);
  return row;
}

function groupCard(g) {
  const leader = g.nodes.find((n) => n.node === g.leader);
  const lag = (leader && leader.followers) || {};
  const health = el("span", { class: "health " + g.health.replace(" ", "-") }, g.health);
  const head = el("tr", {}, ...["node", "role", "term", "last index", "commit", "applied",
    "lag", "last contact", "registration", "state", ""].map((h) => el("th", {}, h)));
  return el("div", { class: "group", dataset: { group: g.group } },
    el("h2", {}, `group ${g.group} · leader `, el("span", { class: "leader" }, g.leader || "none"),
      ` · term ${g.term} · `, health,
      g.change_in_progress ? " · membership change in progress" : ""),
    el("table", { class: "nodes" }, el("thead", {}, head),
      el("tbody", {}, g.nodes.map((n) => nodeRow(g, n, lag)))),
    el("p", { class: "meta" }, `voters ${g.voters.join(", ") || "–"}`,
      g.learners.length ? ` · learners ${g.learners.join(", ")}` : "",
      ` · NameServer routes to ${g.registered_leader || "no leader"}`, " ",
      el("span", { class: "result" })));
}

function renderSnapshot(snap) {
  if (snap.error) { $("#cluster-updated").textContent = snap.error; return; }
  const results = {};  // an action's answer survives the redraw
  for (const r of document.querySelectorAll("#groups .group")) {
    results[r.dataset.group] = $(".result", r).cloneNode(true);
  }
  const cards = snap.groups.map(groupCard);
  for (const c of cards) if (results[c.dataset.group]) $(".result", c).replaceWith(results[c.dataset.group]);
  $("#groups").replaceChildren(...(cards.length ? cards
    : [el("p", {}, "No broker group is registered at this NameServer.")]));
  $("#cluster-updated").textContent =
    `snapshot ${snap.seq} at ${new Date(snap.at_ms).toLocaleTimeString()}, nodes asked in ${snap.took_ms} ms`;
}

function connectEvents() {
  const state = $("#live-state");
  const source = new EventSource("/console/events");
  source.addEventListener("open", () => { state.textContent = "live"; state.className = "state live"; });
  source.addEventListener("error", () => {
    state.textContent = "reconnecting"; state.className = "state off";
  });
  source.addEventListener("snapshot", (e) => renderSnapshot(JSON.parse(e.data)));
}

// -- topics ------------------------------------------------------------------------------------

async function loadTopics() {
  let data;
  try { data = await api("topics"); } catch (e) { $("#topics-updated").textContent = e.message; return; }
  const showSystem = $("#show-system").checked;
  const rate = (r) => (r === null || r === undefined ? "–" : r.toFixed(1));
  const rows = data.topics.filter((t) => showSystem || !t.system).map((t) => el("tr",
    { dataset: { topic: t.topic } }, el("td", {}, t.topic),
    el("td", {}, Object.entries(t.groups).map(([g, c]) => `${g} (r${c.read_queues}/w${c.write_queues}, perm ${c.perm})`).join(", ")),
    num(t.queues.length), num(t.messages), num(rate(t.rate)),
    el("td", {}, t.queues.map((q) => (q.error ? `${q.queue}: ${q.error}`
      : `${q.queue}: ${q.min} … ${q.max} (${rate(q.rate)})`)).join(" · "))));
  $("#topics-table tbody").replaceChildren(...rows);
  $("#topics-updated").textContent = `${data.topics_total} topic(s), at ${new Date().toLocaleTimeString()}`;
}

function topicSubmit(e) {
  e.preventDefault();
  const f = e.target;
  const body = { mode: f.mode.value, name: f.topic_name.value.trim(), perm: Number(f.perm.value) };
  if (f.queues.value !== "") body.queues = Number(f.queues.value);
  const groups = f.groups.value.split(",").map((s) => s.trim()).filter(Boolean);
  if (groups.length) body.groups = groups;
  const where = groups.length ? `broker group(s) ${groups.join(", ")}` : "every broker group";
  act($("#topic-result"), `${body.mode === "create" ? "Create" : "Update"} topic ${body.name} ` +
    `(${body.queues ?? "same"} queues, perm ${body.perm}) on ${where}?`, "topics", body,
    (a) => { loadTopics(); return `topic ${a.topic}: ${a.mode}d on ${a.groups.map((g) => g.group).join(", ")}`; });
}

// -- consumer groups ---------------------------------------------------------------------------

async function loadConsumerNames() {
  try {
    const { consumer_groups: names } = await api("consumer-groups");
    $("#consumer-names").replaceChildren(...names.map((n) => el("option", { value: n })));
    $("#consumer-list").replaceChildren(names.length ? "known: " : "no consumer group seen yet",
      ...names.map((n) => el("a", { href: "#consumers", onclick: () => showConsumer(n) }, n, " ")));
  } catch (e) { $("#consumer-list").textContent = e.message; }
}

async function showConsumer(name) {
  const box = $("#consumer-detail");
  box.replaceChildren(el("p", { class: "meta" }, `loading ${name}…`));
  let r;
  try { r = await api("consumer-groups/" + encodeURIComponent(name)); } catch (e) {
    box.replaceChildren(el("p", { class: "result error" }, e.message)); return;
  }
  const held = (h, what) => (h ? `${what}: ${h.messages} held, ${h.pending} not consumed yet (${h.topic})` : `${what}: none`);
  box.replaceChildren(
    el("h2", {}, `consumer group ${r.group} · total lag ${r.total_lag}`),
    el("p", { class: "meta" }, held(r.retry, "retries"), " · ", held(r.dlq, "dead letters")),
    ...(r.subscription_conflict ? [el("p", { class: "result error" }, "The members subscribe differently: " +
      "each is given queues of topics or tags it does not read, and their messages are not consumed (" +
      r.subscription_conflict + ")")] : []),
    el("table", {}, el("thead", {}, el("tr", {}, ["member", "model", "subscriptions", "seen by"].map((h) => el("th", {}, h)))),
      el("tbody", {}, r.members.length ? r.members.map((m) => el("tr", {}, el("td", {}, m.client_id), el("td", {}, m.model),
        el("td", {}, Object.entries(m.subscriptions).map(([t, x]) => `${t}: ${x}`).join("; ")),
        el("td", {}, m.seen_by.join(" ")))) : el("tr", {}, el("td", { colspan: 4 }, "no live member")))),
    el("table", {}, el("thead", {}, el("tr", {}, ["topic", "queue", "committed", "max", "lag"].map((h) => el("th", {}, h)))),
      el("tbody", {}, r.queues.map((q) => el("tr", {}, el("td", {}, q.topic), el("td", {}, q.queue),
        num(q.committed < 0 ? "none" : q.committed), num(q.max), num(q.lag))))),
    ...r.unreachable.map((u) => el("p", { class: "result error" }, `${u.node}: no answer (${u.error})`)));
  const form = $("#reset-form");
  form.hidden = READ_ONLY;
  form.dataset.group = r.group;
  if (!form.topic.value && r.queues.length) form.topic.value = r.queues[0].topic;
  const direct = $("#direct-form");
  direct.hidden = READ_ONLY;
  direct.dataset.group = r.group;
  $("#member-ids").replaceChildren(...r.members.map((m) => el("option", { value: m.client_id })));
  if (!direct.client_id.value && r.members.length) direct.client_id.value = r.members[0].client_id;
}

function directSubmit(e) {
  e.preventDefault();
  const f = e.target;
  const body = { consumer_group: f.dataset.group, client_id: f.client_id.value.trim(),
    offset_msg_id: f.offset_msg_id.value.trim() };
  act($("#direct-result"), `Have consumer ${body.client_id} of ${body.consumer_group} consume ` +
    `${body.offset_msg_id} once more (its offsets stay as they are)?`, "consume-directly", body,
    (a) => `${a.result.consumeResult || "?"} in ${a.result.spentTimeMills ?? "?"} ms via ` +
      `${a.result.node}${a.result.remark ? ": " + a.result.remark : ""}`);
}

function resetSubmit(e) {
  e.preventDefault();
  const f = e.target;
  const body = { consumer_group: f.dataset.group, topic: f.topic.value.trim(), to: f.to.value,
    force: f.force.checked };
  if (body.to === "timestamp") body.timestamp_ms = new Date(f.when.value).getTime();
  act($("#reset-result"), `Reset the offsets of consumer group ${body.consumer_group} on ` +
    `${body.topic} to ${body.to === "timestamp" ? f.when.value : body.to}` +
    `${body.force ? ", even with live members" : ""}?`, "reset-offset", body, (a) => {
    showConsumer(a.consumer_group);
    return a.queues.map((q) => `${q.queue}: ${q.before < 0 ? "none" : q.before} → ${q.after}`).join(", ");
  });
}

// -- messages ----------------------------------------------------------------------------------

function searchFields() {
  const by = $("#search-form").by.value;
  for (const l of document.querySelectorAll("#search-form label[data-for]")) {
    l.hidden = !l.dataset.for.split(" ").includes(by);
  }
}

async function searchSubmit(e) {
  e.preventDefault();
  const f = e.target;
  const q = new URLSearchParams();
  const by = f.by.value;
  if (by === "msg_id") q.set("msg_id", f.ref.value.trim());
  if (by === "unique_key") q.set("unique_key", f.ref.value.trim());
  if (by !== "msg_id" && f.topic.value.trim()) q.set("topic", f.topic.value.trim());
  if (by === "key") q.set("key", f.key.value.trim());
  if (by === "queue") { q.set("queue", f.queue.value.trim()); q.set("offset", f.offset.value || "0"); }
  const out = $("#search-result");
  out.className = "result";
  out.textContent = "searching…";
  try {
    const { messages } = await api("messages?" + q);
    out.textContent = `${messages.length} message(s)`;
    $("#messages-table tbody").replaceChildren(...messages.map((m) => el("tr",
      { class: "clickable", onclick: () => showMessage(m.offset_msg_id) },
      el("td", {}, `${m.topic} ${m.group}/${m.queue_id}@${m.queue_offset}`), el("td", {}, time(m.store_ts_ms)),
      el("td", {}, m.tags || "–"), el("td", {}, m.keys.join(" ") || "–"),
      el("td", {}, m.body.length > 80 ? m.body.slice(0, 80) + "…" : m.body))));
  } catch (err) {
    out.className = "result error";
    out.textContent = err.message;
  }
}

async function showMessage(id) {
  const box = $("#message-detail");
  let m;
  try { m = await api("messages/" + encodeURIComponent(id)); } catch (e) {
    box.replaceChildren(el("p", { class: "result error" }, e.message)); return;
  }
  const lines = [
    ["offset msg id", m.offset_msg_id], ["msg id (unique key)", m.msg_id || "–"],
    ["topic", m.topic], ["queue", `${m.group}/${m.queue_id} offset ${m.queue_offset}`],
    ["stored", time(m.store_ts_ms)], ["born", time(m.born_ts_ms)], ["tags", m.tags || "–"],
    ["keys", m.keys.join(" ") || "–"],
    ["properties", Object.entries(m.properties).map(([k, v]) => `${k}=${v}`).join(", ") || "–"],
    ["consumed by", m.consumed_by === null ? "–" : m.consumed_by.join(", ") || "no group committed past it"],
    ["body", `${m.body_bytes} bytes, ${m.body_encoding}${m.body_cut ? ", shown in part" : ""}`]];
  box.replaceChildren(el("h2", {}, "Message"),
    el("table", { id: "message-fields" }, el("tbody", {}, lines.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))))),
    el("pre", {}, m.body));
}

// -- start -------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("#read-only-badge").hidden = !READ_ONLY;
  setupSignIn();
  for (const f of document.querySelectorAll("form.action")) if (READ_ONLY) f.hidden = true;
  $("#topic-form").addEventListener("submit", topicSubmit);
  $("#reset-form").addEventListener("submit", resetSubmit);
  $("#direct-form").addEventListener("submit", directSubmit);
  $("#consumer-pick").addEventListener("submit", (e) => { e.preventDefault(); showConsumer(e.target.group.value.trim()); });
  $("#search-form").addEventListener("submit", searchSubmit);
  $("#search-form").by.addEventListener("change", searchFields);
  $("#show-system").addEventListener("change", loadTopics);
  window.addEventListener("hashchange", showTab);
  searchFields();
  showTab();
  connectEvents();
});
