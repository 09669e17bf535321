// The shardherd dashboard: polls the JSON API every few seconds and redraws. No framework, no build step.
// History (sparklines) is kept in this page from its own polls: it starts when the page is opened. Records/s and
// checkpoint ages come from the API, computed from the checkpoints' own progress and times (services/api/fleet.py).
"use strict";

const REFRESH_MS = 3000;
const HOT_SHARDS = 8;
const RECENT_MOVES = 15;
const RECENT_RUNS = 8;
const HISTORY_POINTS = 100; // 5 minutes at REFRESH_MS
const MOVE_BUCKETS = 30;
const TOKEN_KEY = "shardherd-token";
const SVG = "http://www.w3.org/2000/svg";

const history = new Map(); // worker id -> [{kbps, lag}]
let pendingAction = null; // a drain/undrain waiting for the token

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

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
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

function num(value, digits) {
  return value === null || value === undefined ? "—" : Number(value).toFixed(digits || 0);
}

function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? {Authorization: "Bearer " + token} : {};
}

function askToken(why) {
  document.getElementById("token-why").textContent = why;
  document.getElementById("token-form").hidden = false;
}

async function getJson(path) {
  const response = await fetch(path, {headers: headers()});
  if (response.status === 401 || response.status === 403) {
    askToken("This API needs a token for reads.");
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
  const malformed = [];
  let cursor = null;
  for (let page = 0; page < 20; page++) {
    const query = "/v1/assignments?limit=1000" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
    const body = await getJson(query);
    leases.push(...body.items);
    malformed.push(...body.malformed);
    cursor = body.next_cursor;
    if (!cursor) break;
  }
  return {leases, malformed};
}

// ---------------------------------------------------------------- drain / undrain, pause / resume (need the token)
async function adminPost(path, what, again) {
  if (!sessionStorage.getItem(TOKEN_KEY)) {
    pendingAction = again;
    askToken(what + " needs the API token.");
    return;
  }
  const response = await fetch(path, {method: "POST", headers: headers()});
  const problem = document.getElementById("problem");
  if (response.status === 401 || response.status === 403) {
    sessionStorage.removeItem(TOKEN_KEY);
    pendingAction = again;
    askToken("The token was refused (" + response.status + "): enter the API token for: " + what + ".");
    return;
  }
  if (!response.ok) {
    problem.textContent = what + ": HTTP " + response.status;
    problem.hidden = false;
    return;
  }
  refresh();
}

function setDrain(worker, drain) {
  const action = drain ? "drain" : "undrain";
  return adminPost("/v1/workers/" + encodeURIComponent(worker) + "/" + action, action + " " + worker,
    () => setDrain(worker, drain));
}

function setPause(lease, pause) {  // shardherd pause / resume (decision 0031)
  const action = pause ? "pause" : "resume";
  return adminPost("/v1/" + action + "?shard=" + encodeURIComponent(lease), action + " " + lease,
    () => setPause(lease, pause));
}

// ---------------------------------------------------------------- drawing
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

function drawAlerts(leader, workersBody, leasesBody) {
  const alerts = [];
  const status = leader.status;
  if (leader.status_error) alerts.push(["bad", "leader status unreadable: " + leader.status_error]);
  if (status && status.totals.failed_runs) {
    const failed = status.runs.filter((run) => !run.ok);
    const last = failed.length ? failed[failed.length - 1] : null;
    alerts.push(["bad", status.totals.failed_runs + " failed leader runs" +
      (last ? "; latest " + new Date(last.started_at * 1000).toLocaleTimeString() + ": " + last.error : "")]);
  }
  const rejected = [...workersBody.malformed.map((row) => ["worker", row]), ...leasesBody.malformed.map((row) => ["lease", row])];
  if (rejected.length) {
    alerts.push(["bad", rejected.length + " rejected rows (left untouched): " +
      rejected.slice(0, 5).map(([kind, row]) => kind + " " + (row.key || "?") + ": " + row.reason).join("; ")]);
  }
  if (status && status.unplaced.length) {
    alerts.push(["warn", status.unplaced.length + " leases the newest run could not place: " +
      status.unplaced.slice(0, 5).map((item) => item.lease_key + " (" + item.reason + ")").join(", ")]);
  }
  for (const lease of leasesBody.leases.filter((item) => item.failing_attempts).slice(0, 5)) {
    const what = lease.poison_blocked_on ? "poison record " + lease.poison_blocked_on : "a failing batch";
    alerts.push(["bad", "shard " + lease.shard_id + " stuck on " + what + " since " +
      new Date(lease.failing_since * 1000).toLocaleTimeString() + ", " + lease.failing_attempts + " attempts, last error: " +
      lease.failing_error]);
  }
  replace("alerts", ...alerts.map(([level, text]) => el("div", {class: "alert " + level, "data-alert": level}, text)));
}

function cpuText(worker) {
  if (worker.cpu_ema !== null) return ["CPU " + worker.cpu_ema.toFixed(1) + " %", null];
  if (!("C" in worker.operating_range)) {
    return ["CPU n/a", "no CPU metric reported: worker metrics off (disable_worker_metrics) or no CPU source; " +
      "balanced by throughput"];
  }
  return ["CPU n/a", "CPU metrics on; the first report comes after worker_metrics_reporter_freq_millis"];
}

function sparkline(points, key, cls) {
  const width = 220, height = 28;
  const box = svg("svg", {class: "spark " + cls, viewBox: "0 0 " + width + " " + height, width, height,
    "data-points": points.length});
  if (points.length < 2) return box;
  const values = points.map((point) => point[key] || 0);
  const top = Math.max(...values) || 1;
  const step = width / (values.length - 1);
  const path = values.map((value, index) =>
    (index * step).toFixed(1) + "," + (height - 2 - (height - 4) * value / top).toFixed(1)).join(" ");
  box.append(svg("polyline", {points: path}));
  return box;
}

function drawWorkers(workers, leases) {
  document.getElementById("worker-count").textContent = workers.length + "";
  if (!workers.length) { replace("workers", el("div", {class: "empty"}, "no workers have reported")); return; }
  replace("workers", ...workers.map((w) => {
    const [cpu, why] = cpuText(w);
    const lags = leases.filter((l) => (l.checkpoint_owner || l.owner) === w.worker_id && l.millis_behind_latest !== null)
      .map((l) => l.millis_behind_latest);
    const lag = lags.length ? Math.max(...lags) : null;
    const points = history.get(w.worker_id) || [];
    const draining = w.drain_requested;
    const button = el("button", {class: "drain", "data-drain": w.worker_id, "data-undo": draining ? "1" : "0"},
      draining ? "undrain" : "drain");
    button.addEventListener("click", () => setDrain(w.worker_id, !draining));
    return el("div", {class: "worker", "data-worker": w.worker_id},
      el("div", {class: "row"}, el("span", {class: "name"}, w.worker_id),
        el("span", {}, badge(w.state), draining && w.state !== "draining" ? badge("drain requested", "draining") : null)),
      bar(w.cpu_ema === null ? 0 : w.cpu_ema),
      el("div", {class: "row"},
        el("span", why ? {class: "cpu-na", title: why, "data-cpu-na": "1"} : {"data-cpu": w.cpu_ema.toFixed(1)}, cpu),
        el("span", {}, w.lease_count + " leases")),
      why ? el("div", {class: "why"}, why) : null,
      el("div", {class: "row"},
        el("span", {}, w.throughput_kbps.toFixed(1) + " KiB/s"),
        el("span", {}, "max lag " + (lag === null ? "—" : lag + " ms"))),
      el("div", {class: "row"}, el("span", {}, "heartbeat " + age(w.heartbeat_age_seconds) + " ago"),
        el("span", {}, points.length + " samples")),
      sparkline(points, "kbps", "tp"), sparkline(points, "lag", "lag"),
      el("div", {class: "row"}, el("span", {}), button));
  }));
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

function drawShards(leases) {
  const open = leases.filter((lease) => lease.state !== "finished");
  const body = document.querySelector("#shards tbody");
  if (!open.length) { body.replaceChildren(el("tr", {}, el("td", {colspan: 10, class: "empty"}, "no open shards"))); return; }
  body.replaceChildren(...open.map((lease) => {
    const holder = lease.checkpoint_owner || lease.owner;
    const lagClass = lease.millis_behind_latest !== null && lease.millis_behind_latest > 60000 ? "num bad" : "num";
    return el("tr", {"data-shard": lease.lease_key},
      el("td", {class: "mono"}, lease.shard_id),
      el("td", {}, holder ? holder + (lease.checkpoint_owner ? " → " + lease.owner : "") : "—"),
      el("td", {}, badge(lease.state), pauseControl(lease)),
      el("td", {class: lagClass, "data-lag": lease.millis_behind_latest ?? ""}, num(lease.millis_behind_latest)),
      el("td", {class: "num", "data-behind": lease.records_behind ?? ""}, num(lease.records_behind)),
      el("td", {class: "num", "data-rate": lease.records_per_second ?? ""},
        lease.records_per_second === null ? "—" : lease.records_per_second.toFixed(1)),
      el("td", {class: "num", "data-kbps": lease.throughput_kbps ?? ""}, num(lease.throughput_kbps, 1)),
      el("td", {class: lease.read_throttled ? "num bad" : "num", "data-throttled": lease.read_throttled ?? ""},
        num(lease.read_throttled)),
      el("td", {class: "num", "data-checkpoint-age": lease.checkpoint_age_seconds ?? ""},
        lease.checkpoint_age_seconds === null ? "—" : age(lease.checkpoint_age_seconds)),
      el("td", {class: "num", "data-records": lease.records_processed ?? ""}, num(lease.records_processed)));
  }));
}

function drawPoison(leases) {  // decision 0031: what each owner reports of its poison records (block or quarantine)
  const poisoned = leases.filter((lease) => lease.poison_blocked_on || lease.quarantined_records);
  document.getElementById("poison-count").textContent = poisoned.length ? "(" + poisoned.length + ")" : "";
  const body = document.querySelector("#poison tbody");
  if (!poisoned.length) { body.replaceChildren(el("tr", {}, el("td", {colspan: 5, class: "empty"}, "none"))); return; }
  body.replaceChildren(...poisoned.map((lease) => el("tr", {"data-poison": lease.lease_key},
    el("td", {class: "mono"}, lease.shard_id),
    el("td", {}, lease.checkpoint_owner || lease.owner || "—"),
    el("td", {class: lease.poison_blocked_on ? "mono bad" : "mono", "data-blocked-on": lease.poison_blocked_on || "",
      title: lease.failing_error || ""}, lease.poison_blocked_on || "—"),
    el("td", {class: "num", "data-quarantined": lease.quarantined_records}, num(lease.quarantined_records)),
    el("td", {class: "mono", "data-last-quarantined": lease.last_quarantined || ""},
      lease.last_quarantined ? lease.last_quarantined + " → " + lease.last_quarantined_object : "—"))));
}

function pauseControl(lease) {  // a paused shard shows why; its lag grows as the checkpoint ages
  const button = el("button", {class: "pause", "data-pause": lease.lease_key}, lease.paused ? "resume" : "pause");
  button.addEventListener("click", () => setPause(lease.lease_key, !lease.paused));
  const said = lease.paused ? badge(lease.paused_by ? "paused" : "pausing", "draining") : null;
  if (said) said.title = lease.paused;
  return el("span", {}, said, button);
}

function drawReplicas(replicas, leader) {
  const body = document.querySelector("#replicas tbody");
  if (!replicas) { body.replaceChildren(el("tr", {}, el("td", {colspan: 4, class: "empty"}, "replica list unavailable"))); return; }
  const rows = replicas.items.map((replica) => {
    const said = replica.leading ? "leader · epoch " + replica.epoch : "follower";
    const role = replica.silent ? badge("last said: " + said, "finished") : badge(said, replica.leading ? "fresh" : "finished");
    const name = replica.api_url ? el("a", {href: replica.api_url + "/"}, replica.replica_id) : replica.replica_id;
    const error = replica.last_error ? el("span", {class: "bad", title: replica.last_error},
      age(Date.now() / 1000 - replica.last_error_at) + " ago: " + replica.last_error) : el("span", {class: "muted"}, "none");
    return el("tr", {"data-replica-row": replica.replica_id},
      el("td", {}, name, replica.replica_id === leader.replica_id ? el("span", {class: "muted"}, " (this page)") : null),
      el("td", {}, role),
      el("td", {}, replica.silent ? badge("silent " + age(replica.report_age_seconds), "stale") :
        age(replica.report_age_seconds) + " ago"),
      el("td", {}, error));
  });
  if (replicas.error) rows.push(el("tr", {}, el("td", {colspan: 4, class: "bad"}, replicas.error)));
  if (!rows.length) rows.push(el("tr", {}, el("td", {colspan: 4, class: "empty"}, "no replica has reported yet")));
  body.replaceChildren(...rows);
}

function drawCoordinator(leader) {
  const status = leader.status;
  const runs = status ? status.runs : [];
  const last = runs.length ? runs[runs.length - 1] : null;
  const lines = [
    el("div", {class: "row"}, el("span", {}, "this page's replica"),
      el("b", {"data-replica": leader.replica_id}, leader.replica_id), badge(leader.replica_is_leader ? "leader" : "follower",
        leader.replica_is_leader ? "fresh" : "finished")),
    el("div", {class: "row"}, el("span", {}, "leader"), el("b", {"data-leader": leader.lock.owner || ""},
      (leader.lock.owner || "none") + " · epoch " + (leader.lock.epoch ?? "—"))),
  ];
  // Every run shows through the lock's heartbeat (lastSuccessAt, every 1.5 s); the status item, with the runs below
  // and the counters, is published only when a run changed something (services/leader_status.py).
  lines.push(el("div", {class: "row"}, el("span", {}, "last good run"),
    el("span", {"data-last-good-run": leader.last_success_age_seconds ?? ""},
      leader.last_success_age_seconds === null ? "—" : age(leader.last_success_age_seconds) + " ago")));
  if (last) {
    lines.push(el("div", {class: "row"}, el("span", {}, "last change"),
      el("span", {"data-last-run": last.ok ? "ok" : "failed"},
        new Date(last.started_at * 1000).toLocaleTimeString() + " · " + last.duration_ms.toFixed(0) + " ms · ",
        last.ok ? badge("ok", "fresh") : badge("failed", "stale"))));
  }
  if (status) {
    lines.push(el("div", {class: "row"}, el("span", {}, "runs / failed, as of " +
      new Date(status.published_at * 1000).toLocaleTimeString()),
      el("span", {"data-failed-runs": status.totals.failed_runs}, status.totals.runs + " / " + status.totals.failed_runs)));
  }
  if (status && status.scale) {  // the desired-worker count autoscalers read (GET /v1/scale)
    const scale = status.scale;
    lines.push(el("div", {class: "row"}, el("span", {}, "desired workers"),
      el("span", {"data-desired-workers": scale.desired, title: scale.reasons.join("\n")},
        el("b", {}, String(scale.desired)), " for " + scale.current + " now" +
        (scale.remove_first ? " · remove first " + scale.remove_first : ""))));
  }
  replace("coordinator", ...lines);
  const body = document.querySelector("#runs tbody");
  const recent = runs.slice(-RECENT_RUNS).reverse();
  if (!recent.length) { body.replaceChildren(el("tr", {}, el("td", {colspan: 6, class: "empty"}, "no runs published yet"))); return; }
  body.replaceChildren(...recent.map((run) => el("tr", {},
    el("td", {}, new Date(run.started_at * 1000).toLocaleTimeString()),
    el("td", {class: "num"}, run.duration_ms.toFixed(0)),
    el("td", {}, run.ok ? badge("ok", "fresh") : el("span", {class: "bad", title: run.error || ""}, "failed: " + (run.error || ""))),
    el("td", {class: "num"}, run.leases),
    el("td", {class: "num"}, Object.values(run.moves_by_reason).reduce((a, b) => a + b, 0)),
    el("td", {class: "num"}, run.unplaced))));
}

function drawMoveChart(leader) {
  const moves = leader.status ? leader.status.recent_moves : [];
  const box = document.getElementById("move-chart");
  if (!moves.length) { box.replaceChildren(el("div", {class: "empty"}, "no moves yet")); return; }
  const first = moves[0].run_started_at, lastAt = moves[moves.length - 1].run_started_at;
  const span = Math.max(60, lastAt - first);
  const bucket = span / MOVE_BUCKETS;
  const counts = new Array(MOVE_BUCKETS).fill(0);
  for (const move of moves) counts[Math.min(MOVE_BUCKETS - 1, Math.floor((move.run_started_at - first) / bucket))]++;
  const width = 420, height = 90, top = Math.max(...counts);
  const chart = svg("svg", {viewBox: "0 0 " + width + " " + (height + 14), class: "moves-chart", "data-moves": moves.length});
  counts.forEach((count, index) => {
    const h = (height - 4) * count / top;
    const rect = svg("rect", {x: (index * width / MOVE_BUCKETS + 1).toFixed(1), y: (height - h).toFixed(1),
      width: (width / MOVE_BUCKETS - 2).toFixed(1), height: h.toFixed(1)});
    rect.append(svg("title", {}));
    rect.firstChild.textContent = count + " moves";
    chart.append(rect);
  });
  const label = (x, anchor, text) => { const t = svg("text", {x, y: height + 12, "text-anchor": anchor}); t.textContent = text; return t; };
  chart.append(label(0, "start", new Date(first * 1000).toLocaleTimeString()),
    label(width, "end", new Date(lastAt * 1000).toLocaleTimeString()));
  box.replaceChildren(chart, el("div", {class: "muted"}, moves.length + " moves, " + top + " at most per " +
    age(bucket) + " bucket (the last " + moves.length + " published, kept across leader changes)"));
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

function remember(workers, leases) {
  for (const w of workers) {
    const lags = leases.filter((l) => (l.checkpoint_owner || l.owner) === w.worker_id).map((l) => l.millis_behind_latest || 0);
    const points = history.get(w.worker_id) || [];
    points.push({kbps: w.throughput_kbps, lag: lags.length ? Math.max(...lags) : 0});
    history.set(w.worker_id, points.slice(-HISTORY_POINTS));
  }
  for (const id of [...history.keys()]) if (!workers.some((w) => w.worker_id === id)) history.delete(id);
}

async function refresh() {
  const problem = document.getElementById("problem");
  try {
    const [workers, leasesBody, leader, replicas] = await Promise.all([getJson("/v1/workers"), allLeases(),
      getJson("/v1/leader"), getJson("/v1/replicas").catch(() => null)]);
    const leases = leasesBody.leases;
    const hotLeases = leases.filter((l) => l.throughput_kbps && l.state !== "finished")
      .sort((a, b) => b.throughput_kbps - a.throughput_kbps).slice(0, HOT_SHARDS);
    remember(workers.items, leases);
    drawLeader(leader);
    drawAlerts(leader, workers, leasesBody);
    drawWorkers(workers.items, leases);
    drawPlacement(leases, new Set(hotLeases.slice(0, 3).map((l) => l.lease_key)));
    drawShards(leases);
    drawPoison(leases);
    drawCoordinator(leader);
    drawReplicas(replicas, leader);
    drawMoveChart(leader);
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
  const action = pendingAction;
  pendingAction = null;
  if (action) action(); else refresh();
});
// `shardherd up` prints this page's address with its read token after "#token=": reads then carry it, so the figures
// are fresh (an anonymous page gets the leader's view, up to a full-scan interval old). The address bar drops it.
const tokenInAddress = new URLSearchParams(location.hash.slice(1)).get("token");
if (tokenInAddress) {
  sessionStorage.setItem(TOKEN_KEY, tokenInAddress);
  history.replaceState(null, "", location.pathname + location.search);
}
refresh();
setInterval(refresh, REFRESH_MS);
