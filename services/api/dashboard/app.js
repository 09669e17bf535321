// The shardherd dashboard: polls the JSON API every few seconds and redraws. No framework, no build step.
"use strict";

const REFRESH_MS = 3000;
const HOT_SHARDS = 8;
const RECENT_MOVES = 15;
const TOKEN_KEY = "shardherd-token";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function badge(text, cls) { return el("span", {class: "badge " + (cls || text)}, text); }

function bar(percent) {
  const width = Math.max(0, Math.min(100, percent));
  const level = width >= 85 ? "hot" : width >= 60 ? "warm" : "";
  return el("div", {class: "bar"}, el("div", {class: level, style: "width:" + width.toFixed(1) + "%"}));
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  if (seconds < 60) return seconds.toFixed(1) + " s";
  if (seconds < 3600) return (seconds / 60).toFixed(1) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

async function getJson(path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(path, {headers});
  if (response.status === 401 || response.status === 403) {
    document.getElementById("token-form").hidden = false;
    throw new Error("the API needs a token for reads: enter it above");
  }
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail; } catch (ignored) { /* not JSON */ }
    throw new Error(path + ": " + response.status + " " + detail);
  }
  return response.json();
}

async function allLeases() {
  const leases = [];
  let cursor = null;
  for (let page = 0; page < 20; page++) {
    const query = "/v1/assignments?limit=1000" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
    const body = await getJson(query);
    leases.push(...body.items);
    cursor = body.next_cursor;
    if (!cursor) break;
  }
  return leases;
}

function replace(id, ...children) { document.getElementById(id).replaceChildren(...children); }

function drawLeader(leader) {
  const lock = leader.lock;
  const parts = [];
  if (!lock.owner || lock.released) {
    parts.push(badge("no leader", "stale"));
  } else {
    parts.push(el("span", {}, "leader ", el("b", {}, lock.owner), " · epoch " + lock.epoch));
    parts.push(badge(leader.stale ? "stale" : "fresh"));
    parts.push(el("span", {class: "muted"}, "last good run " + age(leader.last_success_age_seconds) + " ago"));
  }
  parts.push(el("span", {class: "muted"}, "served by " + leader.replica_id));
  replace("leader", ...parts);
}

function drawWorkers(workers) {
  document.getElementById("worker-count").textContent = workers.length + "";
  if (!workers.length) { replace("workers", el("div", {class: "empty"}, "no workers have reported")); return; }
  replace("workers", ...workers.map((w) => el("div", {class: "worker", "data-worker": w.worker_id},
    el("div", {class: "row"}, el("span", {class: "name"}, w.worker_id), badge(w.state)),
    bar(w.cpu_ema === null ? 0 : w.cpu_ema),
    el("div", {class: "row"},
      el("span", {}, "CPU " + (w.cpu_ema === null ? "n/a" : w.cpu_ema.toFixed(1) + " %")),
      el("span", {}, w.lease_count + " leases")),
    el("div", {class: "row"},
      el("span", {}, w.throughput_kbps.toFixed(1) + " KiB/s"),
      el("span", {}, "heartbeat " + age(w.heartbeat_age_seconds) + " ago")))));
}

function drawPlacement(leases, hot) {
  document.getElementById("lease-count").textContent = leases.length + "";
  const lanes = new Map();
  for (const lease of leases) {
    const owner = lease.state === "finished" ? "(finished)" : (lease.checkpoint_owner || lease.owner || "(unassigned)");
    if (!lanes.has(owner)) lanes.set(owner, []);
    lanes.get(owner).push(lease);
  }
  if (!lanes.size) { replace("placement", el("div", {class: "empty"}, "no leases yet")); return; }
  const names = [...lanes.keys()].sort((a, b) => (a.startsWith("(") - b.startsWith("(")) || a.localeCompare(b));
  replace("placement", ...names.map((owner) => el("div", {class: "lane"},
    el("div", {class: "owner"}, owner),
    el("div", {class: "chips"}, ...lanes.get(owner).map((lease) => {
      const classes = ["chip", lease.state];
      if (hot.has(lease.lease_key)) classes.push("hotshard");
      const tip = lease.lease_key + " · " + lease.state + " · checkpoint " + lease.checkpoint +
        (lease.checkpoint_owner ? " · handing off to " + lease.owner : "");
      return el("span", {class: classes.join(" "), title: tip, "data-lease": lease.lease_key}, lease.shard_id);
    })))));
}

function drawHot(hotLeases) {
  const body = document.querySelector("#hot tbody");
  if (!hotLeases.length) { body.replaceChildren(el("tr", {}, el("td", {colspan: 3, class: "empty"}, "no throughput reported"))); return; }
  const top = hotLeases[0].throughput_kbps || 1;
  body.replaceChildren(...hotLeases.map((lease) => el("tr", {},
    el("td", {class: "mono"}, lease.shard_id),
    el("td", {}, lease.checkpoint_owner || lease.owner || "—"),
    el("td", {}, lease.throughput_kbps.toFixed(1), bar(100 * lease.throughput_kbps / top)))));
}

function drawMoves(leader) {
  const body = document.querySelector("#moves tbody");
  const moves = leader.status ? leader.status.recent_moves.slice(-RECENT_MOVES).reverse() : [];
  const rows = moves.map((move) => el("tr", {},
    el("td", {}, new Date(move.run_started_at * 1000).toLocaleTimeString()),
    el("td", {class: "mono"}, move.lease_key),
    el("td", {}, (move.from_owner || "—") + " → " + move.to_worker),
    el("td", {}, badge(move.reason, "finished"), el("div", {class: "detail"}, move.detail))));
  if (leader.status_error) rows.push(el("tr", {}, el("td", {colspan: 4, class: "empty"}, leader.status_error)));
  if (!rows.length) rows.push(el("tr", {}, el("td", {colspan: 4, class: "empty"}, "no moves yet")));
  body.replaceChildren(...rows);
}

async function refresh() {
  const problem = document.getElementById("problem");
  try {
    const [workers, leases, leader] = await Promise.all([getJson("/v1/workers"), allLeases(), getJson("/v1/leader")]);
    const hotLeases = leases.filter((l) => l.throughput_kbps && l.state !== "finished")
      .sort((a, b) => b.throughput_kbps - a.throughput_kbps).slice(0, HOT_SHARDS);
    drawLeader(leader);
    drawWorkers(workers.items);
    drawPlacement(leases, new Set(hotLeases.slice(0, 3).map((l) => l.lease_key)));
    drawHot(hotLeases);
    drawMoves(leader);
    problem.hidden = true;
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    problem.textContent = String(error.message || error);
    problem.hidden = false;
  }
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
  document.getElementById("token-form").hidden = true;
  refresh();
});
refresh();
setInterval(refresh, REFRESH_MS);
