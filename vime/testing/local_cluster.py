"""A Ray cluster of several "nodes" on one machine, for trying and testing multi-node runs: ``python -m vime.testing.local_cluster``.

Node 0 is the head (this machine's address); node k > 0 is a separate raylet whose node IP is
``127.0.0.{k+1}`` (Linux routes all of 127.0.0.0/8 to loopback), so an engine placed there gets
an address of its own. Each node has ``--num-cpus`` logical CPUs (and ``--num-gpus``).

The process prints one JSON line — ``{"address": ..., "nodes": [{"node": k, "node_id", "ip"}]}``
— then reads commands from stdin, answering each with one JSON line:

- ``kill K``: kill node K's raylet and every process of that node at once, as a node failure;
- ``quit`` (or EOF, SIGTERM, SIGINT): stop the whole cluster and exit.

Point a run at it with ``vime train --backend real --ray-address <address> ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vime.testing.local_cluster", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2, help="nodes, the head included (default 2)")
    ap.add_argument("--num-cpus", type=int, default=1, help="logical CPUs per node (default 1)")
    ap.add_argument("--num-gpus", type=int, default=0, help="GPUs per node (default 0)")
    ap.add_argument("--object-store-mib", type=int, default=150, help="object store per node (default 150 MiB)")
    opts = ap.parse_args(argv)
    if not 1 <= opts.nodes <= 200:
        ap.error(f"--nodes {opts.nodes}: give 1 to 200")
    # Ray's cluster utilities record the head's address in <temp dir>/ray_current_cluster (where a bare
    # ray.init() would find and join it) and delete that file at shutdown: in a directory of its own,
    # this cluster neither captures nor removes another cluster's entry on the machine
    temp_dir = tempfile.mkdtemp(prefix="vime-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    os.environ["RAY_TMPDIR"] = temp_dir
    from ray.cluster_utils import Cluster

    common: dict[str, Any] = {"num_cpus": opts.num_cpus, "num_gpus": opts.num_gpus,
                              "object_store_memory": opts.object_store_mib * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**common, "include_dashboard": False})
    nodes: list[Any] = [cluster.head_node]
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        for k in range(1, opts.nodes):
            nodes.append(cluster.add_node(**common, node_ip_address=f"127.0.0.{k + 1}"))
        print(json.dumps({"address": cluster.address,
                          "nodes": [{"node": k, "node_id": n.node_id, "ip": n.node_ip_address}
                                    for k, n in enumerate(nodes)]}), flush=True)
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["quit"]:
                break
            if len(words) == 2 and words[0] == "kill" and words[1].isdigit() and 0 < int(words[1]) < len(nodes) \
                    and nodes[int(words[1])] is not None:
                k = int(words[1])
                cluster.remove_node(nodes[k], allow_graceful=False)
                nodes[k] = None
                print(json.dumps({"killed": k}), flush=True)
            else:
                print(json.dumps({"error": f"unknown command {line.strip()!r}: use 'kill K' (0 < K < "
                                           f"{len(nodes)}, alive) or 'quit'"}), flush=True)
    except KeyboardInterrupt:
        stopping = True
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    return 130 if stopping else 0


if __name__ == "__main__":
    sys.exit(main())
