"""The work per API call (issue 36): pages rendered once per fleet, fleets judged once per scans, no waits on the loop.

The answers must stay byte for byte what FastAPI rendered from the response model before (a reference app here does
it the old way, from the same snapshot), with the per-answer fields (`checkpoint_age_seconds`, `shard_stalled`) as of
each answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Annotated, Any

import httpx
import pytest
from fastapi import FastAPI, Query
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from bench import api_calls
from shardherd.services.api import create_app
from shardherd.services.api import metrics as api_metrics
from shardherd.services.api.assignments import decode_cursor, encode_cursor
from shardherd.services.api.auth import Access, ApiTokens
from shardherd.services.api.fleet import Fleet
from shardherd.services.api.leader import last_success_at
from shardherd.services.api.models import AssignmentsPage, LeaseState
from shardherd.services.api.rendered import FLEETS, PerFleet
from shardherd.services.api.server import ApiServer
from shardherd.services.api.snapshot import ApiSnapshot
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.services.leader_status import explain
from shardherd.services.peer_client import PeerClient
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import FailingBatch, LeaseProgress
from tests.services.harness import TOKEN, Replica
from tests.support.faulty_proxy import Fault, FaultyProxy
from tests.support.postgres import PostgresServer
from tests.support.stores import make_store

SEQUENCE = "49590338271490256608559692538361571095921575989136588"


@pytest.fixture
def postgres_store(postgres_server: PostgresServer) -> Iterator[LeaseStore]:
    store = make_store("postgres", postgres_url=postgres_server.url)
    yield store
    store.close()


def _reference(replica: Replica) -> TestClient:
    """The old handler: every lease of the page copied with its per-answer fields, rendered by FastAPI from the
    response model; on the same replica's snapshot."""
    app = FastAPI()

    @app.get("/v1/assignments", response_model=AssignmentsPage)
    def old(worker: str | None = None, stream: str | None = None, state: LeaseState | None = None,
            limit: int = 100, cursor: str | None = None,
            explain_: Annotated[bool, Query(alias="explain")] = False) -> AssignmentsPage:
        ctx = replica.context
        after = decode_cursor(cursor) if cursor is not None else None
        snapshot = ctx.snapshot(Access.ADMIN, fresh=True)
        matching = [lease for lease in snapshot.fleet.leases
                    if (worker is None or worker in (lease.owner, lease.checkpoint_owner))
                    and (stream is None or lease.stream == stream) and (state is None or lease.state == state)]
        remaining = [lease for lease in matching if after is None or lease.lease_key > after]
        now = ctx.clock.time()
        stalls = ctx.loop.feed.shard_stalls if ctx.lock.is_leader() else None
        page = [lease.model_copy(update={
            "checkpoint_age_seconds": None if lease.checkpoint_moved_at is None
            else round(max(0.0, now - lease.checkpoint_moved_at), 3),
            "shard_stalled": None if stalls is None else lease.lease_key in stalls}) for lease in remaining[:limit]]
        if explain_ and page:
            reasons = explain(snapshot.status, (lease.lease_key for lease in page))
            page = [lease.model_copy(update={"explanation": reasons.get(lease.lease_key, [])}) for lease in page]
        return AssignmentsPage(items=page, total=len(matching),
                               next_cursor=encode_cursor(page[-1].lease_key) if len(remaining) > limit else None,
                               malformed=snapshot.fleet.malformed_leases, repaired=snapshot.fleet.repaired_leases)

    return TestClient(app)


def _fleet(store: LeaseStore, shards: int = 8, cache_millis: int = 5_000) -> Replica:
    """A leader replica (cache 5 s: one snapshot for the test's calls) whose leases carry every kind of field."""
    replica = Replica(store, shards=shards, api_token=TOKEN, api_cache_millis=cache_millis)
    replica.client.headers.update(replica.auth())
    replica.join("w1", cpu=30.0)
    replica.join("w2", cpu=60.0)
    replica.step(2)
    for index, (key, owner) in enumerate(sorted(replica.owners().items())):
        assert owner is not None
        stamped = LeaseProgress(millis_behind_latest=index * 250, records=1_000 + index, bytes=99_000 + index,
                                checkpointed_at_millis=int((replica.clock.time() - index * 1.7) * 1000))
        if index % 3:  # some checkpoints stamped by their owner, the others seen moving by this replica
            assert store.checkpoint(key, owner, Checkpoint(f"{SEQUENCE}{index:03d}", index % 2), stamped).applied
        replica.lease_throughput.setdefault(owner, {})[key] = 0.25 + index
    key, owner = sorted(replica.owners().items())[1]
    assert owner is not None
    replica.lease_progress[owner] = {key: LeaseProgress(failing=FailingBatch(1.7e9, 3, 'ValueError: "quoted" é'))}
    replica.step()
    return replica


PAGES: list[dict[str, Any]] = [{}, {"limit": 3}, {"worker": "w1"}, {"worker": "w2", "limit": 2}, {"state": "owned"},
                               {"stream": "none"}, {"state": "unassigned"}, {"explain": "true", "limit": 3},
                               {"explain": "true"}]


def _every_page(client: TestClient, params: dict[str, Any]) -> list[bytes]:
    """Each page's body, following the cursors."""
    bodies, cursor = [], None
    while True:
        answer = client.get("/v1/assignments", params={**params, **({"cursor": cursor} if cursor else {})})
        assert answer.status_code == 200, answer.text
        bodies.append(answer.content)
        cursor = answer.json()["next_cursor"]
        if cursor is None:
            return bodies


def test_pages_are_byte_for_byte_the_old_handlers_and_their_live_fields_move_per_answer(
        postgres_store: LeaseStore) -> None:
    replica = _fleet(postgres_store)
    reference = _reference(replica)
    for params in PAGES:
        assert _every_page(replica.client, params) == _every_page(reference, params), params
    fleet = replica.context.snapshot(Access.ADMIN, fresh=True).fleet
    first = replica.client.get("/v1/assignments").json()["items"]
    replica.clock.advance(1.25)  # the same snapshot (cached for 5 s), its pages already rendered
    assert replica.context.snapshot(Access.ADMIN, fresh=True).fleet is fleet
    for params in PAGES:
        assert _every_page(replica.client, params) == _every_page(reference, params), params
    later = replica.client.get("/v1/assignments").json()["items"]
    moved = [item["checkpoint_age_seconds"] - was["checkpoint_age_seconds"]
             for item, was in zip(later, first, strict=True)]
    assert moved == pytest.approx([1.25] * len(first))
    hot = first[4]["lease_key"]
    assert not any(item["shard_stalled"] for item in later)
    replica.loop.feed.observe(replica.lock.epoch() or 0, postgres_store.scan_leases().leases,
                              shard_stalls=frozenset({hot}))  # the leader's verdict turns; the snapshot does not
    stalled = [item["lease_key"] for item in replica.client.get("/v1/assignments").json()["items"]
               if item["shard_stalled"]]
    assert stalled == [hot]
    assert _every_page(replica.client, {}) == _every_page(reference, {})


def test_an_anonymous_caller_past_max_age_reuses_the_fleet_judged_for_the_same_scans(
        postgres_store: LeaseStore) -> None:
    """Served the leader's view however old (never cached as fresh), it used to be judged again per call."""
    replica = _fleet(postgres_store, cache_millis=1_000)
    cache = replica.context.snapshots
    replica.clock.advance(1.5)  # past max_age: the leader's view, not the cache
    first = cache.get(may_read_store=False)
    replica.clock.advance(1.5)
    again = cache.get(may_read_store=False)
    assert again.fleet is first.fleet and again.age == pytest.approx(first.age + 1.5)
    replica.step()  # a new run, new scans: judged anew
    assert cache.get(may_read_store=False).fleet is not first.fleet


def test_metrics_are_the_fleets_families_then_the_live_ones_and_the_live_ones_move(
        postgres_store: LeaseStore) -> None:
    replica = _fleet(postgres_store)
    ctx = replica.context

    def whole() -> bytes:
        """Every family rendered at once, from the snapshot the scrape got (the old handler)."""
        snapshot = ctx.snapshot(Access.ANONYMOUS)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(api_metrics._Families([
            *api_metrics.fleet_families(snapshot.fleet), *api_metrics.stuck_families(snapshot.fleet),
            *api_metrics.leader_families(snapshot.status, snapshot.status_problem is None, ctx.clock.time(),
                                         last_success_at(snapshot.status, snapshot.lock)),
            *api_metrics.replica_families(ctx)]))
        return generate_latest(registry)

    first = replica.client.get("/metrics").content
    assert first == whole()
    replica.clock.advance(3.0)
    later = replica.client.get("/metrics").content
    assert later == whole() and later != first

    def age(text: bytes) -> float:
        return float(next(line for line in text.decode().splitlines()
                          if line.startswith("shardherd_leader_last_success_age_seconds ")).split()[1])

    assert age(later) == pytest.approx(age(first) + 3.0)


def test_per_fleet_values_are_made_once_and_never_cross_fleets(postgres_store: LeaseStore) -> None:
    replica = _fleet(postgres_store, shards=2)
    fleet = replica.context.snapshot(Access.ADMIN, fresh=True).fleet
    others = [Fleet([], [], [], [], [], []) for _ in range(FLEETS)]
    made: list[str] = []
    rendered = PerFleet()

    def make(tag: str) -> str:
        made.append(tag)
        return tag

    assert rendered.get(fleet, "page", lambda: make("a")) == "a"
    assert rendered.get(fleet, "page", lambda: make("b")) == "a" and made == ["a"]
    assert rendered.get(others[0], "page", lambda: make("c")) == "c"  # an equal-looking fleet is another fleet
    assert rendered.get(fleet, "page", lambda: make("d")) == "a"  # two fleets held
    for index, other in enumerate(others[1:]):
        rendered.get(other, "page", partial(make, f"e{index}"))
    assert rendered.get(fleet, "page", lambda: make("f")) == "f"  # the oldest was dropped: made again
    assert made[-1] == "f"


class HeldScans(FaultyProxy):
    """Holds every DynamoDB Scan until `release` is set (a caller's store read in flight); the rest pass."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.holding = False
        self.held = threading.Event()
        self.release = threading.Event()

    def _next(self, target: str) -> Fault | None:
        if self.holding and target.endswith(".Scan"):
            self.held.set()
            self.release.wait(30)
        return super()._next(target)


def test_a_cached_page_is_served_while_another_caller_reads_the_store(moto_server: MotoServer) -> None:
    """A caller with a token past the promise reads the store under the cache's guard; an anonymous caller whose
    cached snapshot will do is served meanwhile (it used to wait for that read)."""
    with HeldScans(moto_server.endpoint_url) as proxy:
        store = make_store("dynamodb", moto_url=proxy.endpoint_url)
        replica = Replica(store, shards=4, api_token=TOKEN, api_cache_millis=1_000)
        replica.join("w1")
        replica.step(2)
        replica.heartbeat()
        replica.lock.tick()
        replica.loop.run_once()  # a fresh view, its scans read now
        server = ApiServer(create_app(replica.context), "127.0.0.1", 0).start()
        try:
            with httpx.Client(base_url=server.url, timeout=30) as http:
                replica.clock.advance(0.9)
                assert http.get("/v1/assignments").json()["total"] == 4  # cached: taken now, tables 0.9 s old
                replica.clock.advance(0.3)  # tables 1.2 s old: a token caller reads them itself
                proxy.holding = True
                reader = threading.Thread(target=lambda: http.get("/v1/assignments", headers=replica.auth()))
                reader.start()
                assert proxy.held.wait(10), "the token caller did not read"
                started = time.monotonic()
                answer = http.get("/v1/assignments", timeout=5)
                waited = time.monotonic() - started
                assert answer.status_code == 200 and answer.json()["total"] == 4
                assert not proxy.release.is_set() and waited < 2.0
                proxy.release.set()
                reader.join(30)
        finally:
            proxy.release.set()
            server.stop()
            store.close()


def test_a_followers_refresher_asks_the_leader_again_only_after_a_while_when_it_had_nothing_newer(
        postgres_store: LeaseStore) -> None:
    """The leader's tables were no younger than the follower's (the leader between its own refreshes): the follower's
    refresher used to fetch the leader's whole snapshot again at every ask while its tables stayed ageing."""
    settings: dict[str, Any] = {"api_cache_millis": 1_000, "api_token": TOKEN}
    leader = Replica(postgres_store, shards=6, **settings)
    follower = Replica(postgres_store, shards=6, replica_id="coord-b", clock=leader.clock, **settings)
    server = ApiServer(create_app(leader.context), "127.0.0.1", 0).start()
    peers = PeerClient(ApiTokens.from_settings(follower.settings).for_peers())
    fetched: list[float] = []

    def from_leader(fresh: bool) -> ApiSnapshot | None:
        fetched.append(leader.clock.monotonic())
        return peers.snapshot(follower.lock.holder_url() or "", follower.lock.holder_id(), fresh)

    follower.context.from_leader = from_leader
    follower.client.headers.update(leader.auth())
    cache = follower.context.snapshots
    cache.threaded()
    try:
        leader.lock.set_api_url(server.url)
        leader.join("w1")
        leader.step(2)
        leader.heartbeat()
        leader.lock.tick()
        leader.loop.run_once()  # the leader's view read now
        follower.lock.tick()
        assert follower.client.get("/v1/assignments").status_code == 200 and len(fetched) == 1
        for _ in range(4):  # tables 0.6 s old, then older: each call asks the refresher
            leader.clock.advance(0.05 if fetched[1:] else 0.6)
            assert follower.client.get("/v1/assignments").status_code == 200
            cache.step()
        assert len(fetched) == 2, fetched  # the leader's were as old as its own: asked once
        leader.clock.advance(0.2)  # 0.35 s after its fetch, the tables 0.95 s old
        assert follower.client.get("/v1/assignments").status_code == 200
        cache.step()
        assert len(fetched) == 3  # after REFETCH_AFTER x max_age it asks again
    finally:
        server.stop()
        peers.close()


def test_the_bench_runs_as_documented_and_prints_each_calls_cpu_against_its_reference(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`python -u -m bench.api_calls` (decision 0003, session 29), small: every figure printed, none missing."""
    assert api_calls.main(["--shards", "8", "--workers", "3", "--rounds", "4"]) == 0
    printed = capsys.readouterr().out
    assert "8 leases, 3 workers, postgres; 4 rounds" in printed
    lines = [line for line in printed.splitlines() if "server CPU" in line]
    assert [line.split(":")[0] for line in lines] == ["/v1/assignments?limit=100 (token)", "/metrics (anonymous)"]
    assert all("x the reference" in line and "(n=" in line for line in lines)
