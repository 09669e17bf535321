"""A real `CoordinatorService` on 127.0.0.1: uvicorn serves the API, the CLI talks to it, Chromium renders the page."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from shardherd.services.cli import main
from shardherd.services.coordinator_service import CoordinatorService
from shardherd.services.local_stack.state import ProcessEntry, StackState
from shardherd.services.local_stack.status import lease_table, read_snapshot, worker_line
from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.config import load_settings
from shardherd.shared.lease import new_lease
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_factory import open_store
from shardherd.shared.worker import CPU_METRIC, LeaseProgress, PoisonReport, WorkerRecord
from tests.services.harness import TOKEN
from tests.support.fast_settings import fast_settings
from tests.support.stores import unique_app, worker_record
from tests.support.waiting import wait_for

SHARDS = [f"shardId-{i:012d}" for i in range(6)]
WORKERS = {"worker-alpha": 35.0, "worker-beta": 80.0}
SEQUENCE = "49590338271490256608559692538361571095921575989136588898"
# Decision 0031: one shard blocked on a poison record, one whose owner quarantined two (the dashboard's panel).
POISON = {SHARDS[1]: PoisonReport(blocked_on=f"{SEQUENCE}/0"),
          SHARDS[2]: PoisonReport(None, 2, f"{SEQUENCE}/4", f"file:///dlq/s/{SHARDS[2]}/{SEQUENCE}-00004.json")}



@dataclass
class Running:
    service: CoordinatorService
    store: LeaseStore
    url: str
    token_file: Path


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    home = tmp_path_factory.mktemp("service")
    settings = load_settings(
        application_name=unique_app("svc"), store_backend="sql", sql_url=f"sqlite:///{home / 'leases.db'}",
        worker_id="coord-1", api_host="127.0.0.1", api_port=0, api_token=TOKEN,
        # Heartbeats come from the test itself, not an agent: a long failover keeps its worker alive between them.
        **fast_settings(failover_time_millis=120_000, lease_assignment_interval_millis=100),
    )
    seeder = open_store(settings)
    seeder.ensure_tables()
    for shard in SHARDS:
        seeder.create_lease(new_lease(shard, TRIM_HORIZON))
    beats = iter(range(1, 1_000_000))

    def heartbeat() -> bool:
        """Every seeded worker beats once (the leader must see a heartbeat change before it trusts a worker)."""
        beat = next(beats)
        for index, (worker, cpu) in enumerate(WORKERS.items()):
            throughput = {SHARDS[index]: 512.0 * (index + 1)}
            progress = {shard: LeaseProgress(250 * (number + 1) + index, 40 * (number + 1), 4000 * (number + 1),
                                             records_behind=7 * number + index, poison=POISON.get(shard))
                        for number, shard in enumerate(SHARDS)}  # only the owner's entry is shown
            seeder.upsert_worker(WorkerRecord(worker, int(time.time()), metric_stats={CPU_METRIC: (cpu, cpu, cpu)},
                                              operating_range={CPU_METRIC: (100.0,)}, heartbeat=beat,
                                              lease_throughput=throughput, lease_progress=progress))
        return True

    heartbeat()
    service = CoordinatorService.build(settings)
    service.start()
    assert service.api is not None and service.api.port > 0
    token_file = home / "token"
    token_file.write_text(TOKEN + "\n")
    running = Running(service, seeder, service.api.url, token_file)
    wait_for(lambda: heartbeat() and all(lease.lease_owner for lease in seeder.scan_leases().leases), 20,
              "all leases assigned")
    try:
        yield running
    finally:
        service.stop()
        seeder.close()


def test_real_server_serves_probes_and_api(running: Running) -> None:
    with httpx.Client(base_url=running.url, timeout=10) as client:
        assert client.get("/healthz").json()["status"] == "ok"
        wait_for(lambda: client.get("/v1/leader").json()["status"] is not None, 10, "a published status")
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["detail"] == "store reachable (leader)"
        leader = client.get("/v1/leader").json()
        assert leader["lock"]["owner"] == "coord-1" and leader["replica_is_leader"] is True
        page = client.get("/v1/assignments").json()
        assert {lease["lease_key"] for lease in page["items"]} == set(SHARDS)
        assert {lease["owner"] for lease in page["items"]} == set(WORKERS)
        assert "shardherd_total_leases 6.0" in client.get("/metrics").text
        assert client.get("/openapi.json").json()["info"]["title"] == "shardherd operator API"


def test_cli_status_drain_and_plan(running: Running, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["status", "--url", running.url]) == 0
    out = capsys.readouterr().out
    assert "leader: coord-1" in out
    assert all(worker in out for worker in WORKERS) and all(shard in out for shard in SHARDS)

    assert main(["drain", "worker-beta", "--url", running.url, "--token-file", str(running.token_file)]) == 0
    assert capsys.readouterr().out.strip() == "drain requested for worker-beta"
    record = worker_record(running.store, "worker-beta")
    assert record is not None and record.drain_requested
    assert main(["plan", "--url", running.url]) == 2  # a dry run scans the store: not for anonymous callers
    assert "HTTP 401" in capsys.readouterr().err
    assert main(["plan", "--url", running.url, "--token-file", str(running.token_file)]) == 0
    assert "nothing was written" in capsys.readouterr().out
    assert main(["drain", "worker-beta", "--undo", "--url", running.url, "--token-file",
                 str(running.token_file)]) == 0
    record = worker_record(running.store, "worker-beta")
    assert record is not None and not record.drain_requested

    assert main(["drain", "worker-beta", "--url", running.url]) == 2  # no token configured for the CLI
    assert "HTTP 401" in capsys.readouterr().err
    assert main(["drain", "nobody", "--url", running.url, "--token-file", str(running.token_file)]) == 2
    assert "HTTP 404" in capsys.readouterr().err
    assert main(["status", "--url", "http://127.0.0.1:1"]) == 2
    assert "cannot reach the coordinator" in capsys.readouterr().err


def test_cli_drain_restart_reserves_clears_and_refuses_bad_input_in_one_line(
        running: Running, capsys: pytest.CaptureFixture[str]) -> None:
    auth = ["--url", running.url, "--token-file", str(running.token_file)]
    assert main(["drain", "--restart", "worker-beta", "--within", "90s", *auth]) == 0
    assert capsys.readouterr().out.strip() == "leases of worker-beta reserved for a restart within 90 s"
    record = worker_record(running.store, "worker-beta")
    assert record is not None and record.restart_within_ms == 90_000 and not record.drain_requested
    assert main(["drain", "--restart", "worker-beta", "--undo", *auth]) == 0
    assert capsys.readouterr().out.strip() == "restart reservation cleared for worker-beta"
    record = worker_record(running.store, "worker-beta")
    assert record is not None and record.restart_within_ms is None

    for argv, says in ((["drain", "--restart", "worker-beta", "--within", "soon"], "is not a duration"),
                       (["drain", "--restart", "worker-beta", "--within", "2h"], "is not a duration"),
                       (["drain", "--restart", "worker-beta", "--within", "0s"], "between 1 s and 60 min"),
                       (["drain", "worker-beta", "--within", "60s"], "--within goes with --restart"),
                       (["drain", "--restart", "nobody"], "HTTP 404")):
        assert main([*argv, *auth]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    assert main(["drain", "--restart", "worker-beta", "--url", running.url]) == 2  # no admin token
    assert "HTTP 401" in capsys.readouterr().err
    record = worker_record(running.store, "worker-beta")
    assert record is not None and record.restart_within_ms is None and not record.drain_requested  # nothing written


def test_cli_finds_replicas_in_the_run_dir_fails_over_and_reads_its_token(
        running: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead replica listed first (as after `scenario kill-leader`) is skipped; drain --undo needs no token flag."""
    monkeypatch.setenv("COLUMNS", "200")
    dead = "http://127.0.0.1:1"
    StackState(os.getpid(), "app", "stream", "us-east-1", None, None, dead + "/", str(tmp_path / "control.sock"),
               str(running.token_file), [ProcessEntry("coordinator-1", "coordinator", 1, dead, 1),
                                         ProcessEntry("coordinator-2", "coordinator", 2, running.url, 2)]
               ).write(tmp_path)
    assert main(["status", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"replica: {running.url}" in out
    assert all(shard[-12:] in out for shard in SHARDS) and all(worker in out for worker in WORKERS)
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert main(["drain", "worker-alpha", "--run-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "drain requested for worker-alpha"
    assert main(["drain", "worker-alpha", "--undo", "--run-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "drain cleared for worker-alpha"
    record = worker_record(running.store, "worker-alpha")
    assert record is not None and not record.drain_requested
    assert main(["status", "--url", dead, "--url", running.url]) == 0  # a list of URLs works the same way
    assert main(["status", "--run-dir", str(tmp_path / "nothing")]) == 2
    assert "no running stack" in capsys.readouterr().err


def _row(out: str, key: str) -> list[str]:
    """The cells of the first printed line of the table row whose first cell is `key`."""
    return next(line.split() for line in out.splitlines() if _names(line.split()[:1], key))


def _names(cells: list[str], key: str) -> bool:
    """The first cell is `key`, or its end as `status` abbreviates it at 80 columns ("…d-000000000005")."""
    shown = cells[0].lstrip("…") if cells else ""
    return len(shown) >= 6 and key.endswith(shown) and (shown == key or cells[0].startswith("…"))


def test_status_and_the_stacks_live_table_show_lag_and_records_behind(
        running: Running, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`shardherd status` (80 columns) and `shardherd up`'s table and line show each lease's lag and records behind."""
    with httpx.Client(base_url=running.url, timeout=10) as client:
        wait_for(lambda: all(lease["records_behind"] is not None
                             for lease in client.get("/v1/assignments").json()["items"]), 10, "records behind listed")
        leases = client.get("/v1/assignments").json()["items"]
    assert len({lease["records_behind"] for lease in leases}) == len(SHARDS)  # distinct: a mixed-up column shows
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["status", "--url", running.url]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    for lease in leases:
        cells = _row(out, lease["lease_key"])
        assert cells[-3:] == [str(lease["millis_behind_latest"]), str(lease["records_behind"]),
                              str(lease["records_processed"])], out

    snapshot = read_snapshot([running.url])
    assert snapshot is not None
    console = Console(width=120, record=True)
    console.print(lease_table(snapshot, {}, "title", "caption"))
    table = console.export_text()
    for lease in leases:
        cells = _row(table.replace("│", " "), lease["shard_id"])
        assert cells[-3:-1] == [str(lease["millis_behind_latest"]), str(lease["records_behind"])], table
    line = worker_line(snapshot)
    for worker in WORKERS:
        owned = [lease for lease in leases if (lease["checkpoint_owner"] or lease["owner"]) == worker]
        lag = max(lease["millis_behind_latest"] for lease in owned)
        behind = sum(lease["records_behind"] for lease in owned)
        assert f"{worker}: {len(owned)} leases, lag {lag} ms, behind {behind}" in line, line


def test_openapi_declares_the_bearer_scheme_and_docs_need_no_internet(running: Running) -> None:
    with httpx.Client(base_url=running.url, timeout=10) as client:
        schema = client.get("/openapi.json").json()
        assert schema["components"]["securitySchemes"]["bearerToken"] == {
            "type": "http", "scheme": "bearer", "description": schema["components"]["securitySchemes"][
                "bearerToken"]["description"]}
        assert schema["paths"]["/v1/workers/{worker_id}/drain"]["post"]["security"] == [{"bearerToken": []}]
        page = client.get("/docs")
        assert page.status_code == 200
        assert "/docs-assets/swagger-ui-bundle.js" in page.text and "https://" not in page.text
        script = client.get("/docs-assets/swagger-ui-bundle.js")
        assert script.status_code == 200 and len(script.content) > 500_000
        assert client.get("/docs-assets/swagger-ui.css").status_code == 200


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Debian's chromium package is not installed (scripts/test.sh installs it)")
    return path


def _headless(binary: str, profile: Path, *args: str, budget: int = 4000) -> subprocess.CompletedProcess[str]:
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--virtual-time-budget={budget}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_dashboard_renders_in_headless_chromium(running: Running, tmp_path: Path) -> None:
    """Every panel is drawn with the API's values (the DOM Chromium renders), and the screenshot is taken."""
    binary = _chromium()
    dom = _headless(binary, tmp_path / "profile-dom", "--dump-dom", running.url + "/")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    with httpx.Client(base_url=running.url, timeout=10) as client:
        workers = client.get("/v1/workers").json()["items"]
        leases = client.get("/v1/assignments").json()["items"]
        leader = client.get("/v1/leader").json()
    for worker in workers:  # cards with CPU, a history sparkline and a drain button each
        assert f'data-worker="{worker["worker_id"]}"' in html, worker
        assert f'data-cpu="{worker["cpu_ema"]:.1f}"' in html, worker
        assert f'data-drain="{worker["worker_id"]}"' in html
    assert html.count('class="spark tp"') == len(workers) and html.count('class="spark lag"') == len(workers)
    for lease in leases:  # placement chips and per-shard rows: lag, records, KiB/s, checkpoint age
        assert f'data-lease="{lease["lease_key"]}"' in html, lease
        row = html[html.index(f'data-shard="{lease["lease_key"]}"'):]
        row = row[:row.index("</tr>")]
        assert f'data-lag="{lease["millis_behind_latest"]}"' in row, row
        assert f'data-records="{lease["records_processed"]}"' in row, row
        assert f'data-behind="{lease["records_behind"]}"' in row, row
        assert f'data-throttled="{lease["read_throttled"]}"' in row, row
        assert None not in (lease["millis_behind_latest"], lease["records_processed"], lease["records_behind"],
                            lease["read_throttled"])
        assert "data-checkpoint-age=" in row and 'data-checkpoint-age=""' not in row
    assert "leader <b>coord-1</b>" in html
    assert 'data-replica="coord-1"' in html and 'data-leader="coord-1"' in html
    assert f'data-failed-runs="{leader["status"]["totals"]["failed_runs"]}"' in html
    assert 'data-last-run="ok"' in html
    assert 'data-replica-row="coord-1"' in html  # the replica list (this fixture runs one replica)
    assert f'data-moves="{len(leader["status"]["recent_moves"])}"' in html  # moves over time
    reasons = {move["reason"] for move in leader["status"]["recent_moves"]}
    assert reasons and all(reason in html for reason in reasons)  # recent moves with their reasons
    shows_the_poison_records(html)
    assert 'id="problem" class="problem" hidden=""' in html  # no error banner
    assert "data-alert" not in html  # no failed runs, no rejected rows
    shot = tmp_path / "dashboard.png"
    taken = _headless(binary, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1400,1800",
                      "--hide-scrollbars", running.url + "/")
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert _png_size(shot) == (1400, 1800)
    assert shot.stat().st_size > 60_000  # a drawn page, not a blank one (a blank 1400x1800 PNG is a few KiB)
    keep = os.environ.get("SHARDHERD_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, Path(keep) / "dashboard.png")


def shows_the_poison_records(html: str) -> None:
    """The poison records panel (decision 0031): one row per shard with any, blocked on one or quarantined some."""
    poisoned = html[html.index('id="poison"'):]
    poisoned = poisoned[:poisoned.index("</table>")]
    assert poisoned.count("data-poison=") == len(POISON), poisoned
    blocked = poisoned[poisoned.index(f'data-poison="{SHARDS[1]}"'):]
    assert f'data-blocked-on="{SEQUENCE}/0"' in blocked[:blocked.index("</tr>")]
    quarantined = poisoned[poisoned.index(f'data-poison="{SHARDS[2]}"'):]
    quarantined = quarantined[:quarantined.index("</tr>")]
    assert 'data-quarantined="2"' in quarantined and str(POISON[SHARDS[2]].last_object) in quarantined, quarantined
    assert f"{SEQUENCE}/4 → " in quarantined


def test_docs_page_renders_offline_in_headless_chromium(running: Running, tmp_path: Path) -> None:
    dom = _headless(_chromium(), tmp_path / "profile-docs", "--dump-dom", running.url + "/docs", budget=15000)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "/v1/workers/{worker_id}/drain" in dom.stdout  # Swagger UI drew the operations from local assets
    assert "opblock" in dom.stdout and "Unable to render" not in dom.stdout


def _cell(html: str, lease_key: str, attribute: str) -> str:
    """The value of `attribute` in the dashboard's row of `lease_key`."""
    row = html[html.index(f'data-shard="{lease_key}"'):]
    row = row[:row.index("</tr>")]
    start = row.index(f'{attribute}="') + len(attribute) + 2
    return row[start:row.index('"', start)]


def test_dashboard_figures_stay_true_over_several_refreshes(running: Running, tmp_path: Path) -> None:
    """Records/s and checkpoint age as Chromium shows them, page after page while the checkpoint moves: the age
    within 2 s of the time since the checkpoint moved, the rate never 0.0 (nor blank) once 5 s of checkpoints exist,
    the coordinator panel's last good run seconds old although the runs change nothing."""
    binary = _chromium()
    lease = next(lease for lease in running.store.scan_leases().leases if lease.lease_owner)
    # The worker that may checkpoint: during a handoff (an earlier test's drain) the one still processing.
    key, owner = lease.lease_key, str(lease.checkpoint_owner or lease.lease_owner)
    base = 49590338271490256608559692538361571095921575989136588898
    readings: list[tuple[str, float, float]] = []
    for round_ in range(4):
        records = 500 * (round_ + 1)
        assert running.store.checkpoint(key, owner, Checkpoint(str(base + round_)),
                                        progress=LeaseProgress(0, records, records * 10)).applied
        moved = time.time()  # rounds 3 s apart: the rate needs 5 s of checkpoints, which readings[2:] then have
        dom = _headless(binary, tmp_path / f"profile-{round_}", "--dump-dom", running.url + "/", budget=7000)
        assert dom.returncode == 0, dom.stderr[-2000:]
        shown_by = time.time()
        readings.append((_cell(dom.stdout, key, "data-rate"), float(_cell(dom.stdout, key, "data-checkpoint-age")),
                         shown_by - moved))
        last_run = dom.stdout[dom.stdout.index('data-last-good-run="') + 20:]
        # The coordinator panel's last run comes from the lock's heartbeat (every run), not the status item.
        assert float(last_run[:last_run.index('"')]) < 3.0, last_run[:200]
        time.sleep(max(0.0, moved + 3.0 - time.time()))
    for _, shown_age, elapsed in readings:
        assert -0.5 <= shown_age <= elapsed + 2.0, readings  # the leader's view: at most its scan interval behind
    assert all(rate not in ("", "0.0", "0") and float(rate) > 0 for rate, _, _ in readings[2:]), readings
