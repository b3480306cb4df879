"""Which Ray node each plan node goes to (`vime.real.cluster.assign_nodes`, pure) and which cluster a run joins (`ray_address_of`)."""

from __future__ import annotations

import pytest

from vime.config.options import ClusterConfig
from vime.errors import ConfigError
from vime.placement import plan_placement
from vime.real.cluster import NodeInfo, assign_nodes, ray_address_of


def _plan(nodes: int, per_node: int, colocate: bool = True, rollout: int | None = None, per_engine: int = 1):
    return plan_placement(ClusterConfig(actor_num_nodes=nodes, actor_num_gpus_per_node=per_node, colocate=colocate,
                                        rollout_num_gpus=rollout, rollout_num_gpus_per_engine=per_engine),
                          use_gpus=True)


def _node(node_id: str, ip: str, gpus: float, cpus: float | None = None) -> NodeInfo:
    return NodeInfo(node_id, ip, {"GPU": gpus, "CPU": gpus if cpus is None else cpus})


def test_the_drivers_node_comes_first_then_the_others_by_ip() -> None:
    nodes = [_node("c", "10.0.0.3", 8), _node("a", "10.0.0.1", 8), _node("b", "10.0.0.2", 8)]
    assert [n.node_id for n in assign_nodes(_plan(3, 8), nodes, prefer="c")] == ["c", "a", "b"]
    assert [n.node_id for n in assign_nodes(_plan(3, 8), nodes)] == ["a", "b", "c"]


def test_plan_nodes_share_a_machine_that_has_room_for_both() -> None:
    """Two plan nodes of 2 GPUs fit one 8-GPU machine (a test cluster, or a big node)."""
    chosen = assign_nodes(_plan(2, 2), [_node("big", "10.0.0.1", 8), _node("small", "10.0.0.2", 2)], prefer="big")
    assert [n.node_id for n in chosen] == ["big", "big"]


def test_the_largest_plan_node_is_placed_first() -> None:
    """Disaggregated: trainer nodes of 2 GPUs, one rollout node of 8 — the 8-GPU machine is kept for it even when
    the driver sits there."""
    plan = _plan(2, 2, colocate=False, rollout=8, per_engine=8)
    nodes = [_node("eight", "10.0.0.1", 8), _node("four", "10.0.0.2", 4)]
    assert [n.node_id for n in assign_nodes(plan, nodes, prefer="eight")] == ["four", "four", "eight"]


def test_a_plan_that_fits_nowhere_names_the_node_and_what_the_cluster_has() -> None:
    with pytest.raises(ConfigError, match=r"plan node 1 \(CPU 8, GPU 8\) fits on no Ray node.*10\.0\.0\.1.*GPU 8"):
        assign_nodes(_plan(2, 8), [_node("a", "10.0.0.1", 8)])
    with pytest.raises(ConfigError, match="no alive node"):
        assign_nodes(_plan(1, 1), [])


@pytest.mark.parametrize("flag, env, joined", [
    (None, {}, None),  # nothing asked: a private Ray, whatever runs on the machine
    (None, {"RAY_ADDRESS": "10.0.0.1:6379"}, "10.0.0.1:6379"),  # the user's own RAY_ADDRESS
    ("10.0.0.2:6379", {"RAY_ADDRESS": "10.0.0.1:6379"}, "10.0.0.2:6379"),  # the flag wins
    (None, {"RAY_ADDRESS": ""}, None),
])
def test_a_run_joins_only_the_cluster_it_is_given(flag, env, joined) -> None:
    assert ray_address_of(flag, env) == joined


def test_a_lost_node_is_named_with_what_ran_there_whether_ray_saw_it_die_or_its_raylet_is_silent(monkeypatch) -> None:
    """Two plan nodes of one rank and one engine each: node 1 dead in Ray's table, then alive there but with its
    raylet's port closed (Ray has not noticed yet); a listening raylet is not lost."""
    import socket

    import ray

    from vime.real.cluster import ReservedPlacement, node_lost_error

    plan = _plan(2, 1)
    nodes = [_node("aaaaaaaaaa", "127.0.0.1", 1), _node("bbbbbbbbbb", "127.0.0.1", 1)]
    reserved = ReservedPlacement(plan, None, nodes)
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
        up, down = listening.getsockname()[1], closed.getsockname()[1]
        table = [{"NodeID": "aaaaaaaaaa", "Alive": True, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": up},
                 {"NodeID": "bbbbbbbbbb", "Alive": False, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": up}]
        monkeypatch.setattr(ray, "nodes", lambda: table)
        assert reserved.lost_nodes() == [(1, "Ray marks it dead")]
        table[1].update(Alive=True, NodeManagerPort=down)
        assert reserved.lost_nodes() == [(1, "its raylet does not answer")]
        table[1]["NodeManagerPort"] = up
        assert reserved.lost_nodes() == []
    assert reserved.on_node(0) == "trainer rank 0 and engine engine0"
    assert reserved.on_node(1) == "trainer rank 1 and engine engine1"
    err = node_lost_error(reserved, [(1, "Ray marks it dead")], RuntimeError("peer closed\nmore"))
    assert str(err).startswith("node 127.0.0.1 (bbbbbbbb) with trainer rank 1 and engine engine1 (Ray marks it dead) "
                               "left the cluster")
    assert "RuntimeError: peer closed)" in str(err) and "more" not in str(err) and "--load" in str(err)
