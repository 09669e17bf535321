"""`shardherd mark-removal`: make Kubernetes remove, on scale-in, the pod whose leases move cheapest (issue 36).

An autoscaler (KEDA, an HPA) only lowers a Deployment's replicas; the ReplicaSet controller then deletes the pods with
the lowest `controller.kubernetes.io/pod-deletion-cost` first. The leader names the worker to remove first in
`GET /v1/scale` (`remove_first`: never a draining worker; worker ids are pod names). Each round this command gives that
pod a deletion cost of -100 and clears the mark it left on any other pod, so the pod deleted on scale-in is the one
the leader chose, and its preStop drain hands its shards on.

Invariants:
1. At most one pod of the selector carries this command's mark after a round: `remove_first`, when it is one of them.
   Another value of the annotation (set by someone else) is left alone.
2. When the coordinator cannot say (no replica answers, nothing published yet), the marks stay as they are: a stale
   mark only changes which pod a scale-in removes, and every pod drains before it stops.
3. A failed round is one log line and the next round tries again (`--every`); with `--once` it is exit code 2.
   The API token and the service-account token are read afresh each round, so a rotated token is picked up.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from shardherd.services.kube_pods import KubePods
from shardherd.services.status_cli import _connection_args, client_for
from shardherd.shared.errors import ShardherdError

log = logging.getLogger(__name__)

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MARK = "-100"  # below the default (0) of every unmarked pod


def register(sub: Any) -> None:
    """Add the `mark-removal` subcommand."""
    parser = sub.add_parser("mark-removal", help="give the pod /v1/scale names remove_first the lowest deletion cost")
    parser.add_argument("--namespace", required=True, help="the namespace of the workers' pods")
    parser.add_argument("--selector", help="label selector of the workers' pods, e.g. app.kubernetes.io/name=orders")
    parser.add_argument("--every", type=float, default=None, metavar="SECONDS",
                        help="repeat every SECONDS (a Deployment); without it, one round (a CronJob)")
    parser.add_argument("--kube-api", help="Kubernetes API base URL (default: the pod's in-cluster API)")
    parser.add_argument("--kube-token-file", help="bearer token file (default: the pod's service account token)")
    parser.add_argument("--kube-ca", help="CA bundle of the API (default: the pod's service account CA)")
    _connection_args(parser)
    parser.set_defaults(run=run_mark_removal)


def run_mark_removal(args: argparse.Namespace) -> int:
    """One round, or a round every `--every` seconds until interrupted."""
    if args.every is not None and args.every <= 0:
        raise ShardherdError(f"--every must be a positive number of seconds, got {args.every:g}")
    pods = KubePods(args.namespace, args.kube_api, args.kube_token_file, args.kube_ca, args.timeout)
    try:
        if args.every is None:
            print(mark_round(args, pods), flush=True)
            return 0
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        said = ""
        while True:
            try:
                state = mark_round(args, pods)
            except ShardherdError as exc:
                state = f"mark-removal round failed (next in {args.every:g} s): {exc}"
                log.warning("%s", state)
            else:
                if state != said:
                    print(state, flush=True)
            said = state
            time.sleep(args.every)
    finally:
        pods.close()


def mark_round(args: argparse.Namespace, pods: KubePods) -> str:
    """Read remove_first from the coordinator, then move the mark onto that pod (printing each change).

    Returns the state after the round in one line (the loop prints it when it changes).
    """
    client = client_for(args)
    try:
        scale = client.call("GET", "/v1/scale")
    finally:
        client.close()
    target = scale.get("remove_first")
    listed = {pod.name: pod for pod in pods.pods(args.selector)}
    for name, pod in listed.items():
        if pod.annotations.get(DELETION_COST) == MARK and name != target:
            pods.annotate(name, DELETION_COST, None)
            print(f"unmarked pod {name}", flush=True)
    counts = f"desired {scale.get('desired_workers')} of {scale.get('current_workers')} workers"
    chosen = listed.get(target) if target is not None else None
    if chosen is None:
        return f"no pod to mark: remove_first is {target!r}, not a pod of the selector ({counts})"
    if chosen.annotations.get(DELETION_COST) != MARK:
        pods.annotate(chosen.name, DELETION_COST, MARK)
    return f"pod {target} removed first on scale-in: deletion cost {MARK} ({counts})"
