"""The placement plan (vime.placement): which trainer rank and engine go on which node, bundle and GPU, for 1, 2 and 16 nodes, colocated and not, and the layouts it refuses."""

from __future__ import annotations

import pytest

from vime.config.options import ClusterConfig
from vime.errors import ConfigError
from vime.placement import COLOCATED_ACTOR_GPU, COLOCATED_ENGINE_GPU, plan_placement


def _args(nodes: int, per_node: int, colocate: bool, rollout: int | None, per_engine: int) -> ClusterConfig:
    return ClusterConfig(actor_num_nodes=nodes, actor_num_gpus_per_node=per_node, colocate=colocate,
                           rollout_num_gpus=rollout, rollout_num_gpus_per_engine=per_engine)


# (nodes, GPUs per node, colocate, rollout GPUs, GPUs per engine) ->
#   plan nodes, [(engine node, its GPUs on that node, its bundles, trainer ranks on them)], trainer rank nodes
CASES = {
    "1 node, seed: 4 engines x TP 2 on the trainer's 8 GPUs": (
        (1, 8, True, None, 2), 1,
        [(0, (0, 1), (0, 1), (0, 1)), (0, (2, 3), (2, 3), (2, 3)), (0, (4, 5), (4, 5), (4, 5)),
         (0, (6, 7), (6, 7), (6, 7))],
        [0] * 8),
    "1 node, disaggregated: engines on a rollout node after the trainer's": (
        (1, 4, False, 4, 2), 2,
        [(1, (0, 1), (4, 5), ()), (1, (2, 3), (6, 7), ())],
        [0] * 4),
    "2 nodes x 1 GPU, colocated (the CPU test's layout)": (
        (2, 1, True, None, 1), 2,
        [(0, (0,), (0,), (0,)), (1, (0,), (1,), (1,))],
        [0, 1]),
    "2 nodes x 8, colocated, TP 4: two engines per node": (
        (2, 8, True, None, 4), 2,
        [(0, (0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3)), (0, (4, 5, 6, 7), (4, 5, 6, 7), (4, 5, 6, 7)),
         (1, (0, 1, 2, 3), (8, 9, 10, 11), (8, 9, 10, 11)), (1, (4, 5, 6, 7), (12, 13, 14, 15), (12, 13, 14, 15))],
        [0] * 8 + [1] * 8),
    "2 nodes x 4, disaggregated, one TP-8 engine: a rollout node as wide as the engine": (
        (2, 4, False, 8, 8), 3,
        [(2, tuple(range(8)), tuple(range(8, 16)), ())],
        [0] * 4 + [1] * 4),
    "2 nodes x 2, disaggregated, 3 engines of 1 GPU: two rollout nodes, the last half full": (
        (2, 2, False, 3, 1), 4,
        [(2, (0,), (4,), ()), (2, (1,), (5,), ()), (3, (0,), (6,), ())],
        [0, 0, 1, 1]),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_plan_puts_each_engine_and_rank_where_the_table_says(case: str) -> None:
    flags, num_nodes, engines, rank_nodes = CASES[case]
    plan = plan_placement(_args(*flags), use_gpus=True)
    assert plan.num_nodes == num_nodes
    assert [(e.node, e.gpus, e.bundles, e.ranks) for e in plan.engines] == engines
    assert [plan.rank_node(r) for r in range(plan.num_actors)] == rank_nodes
    # every bundle is one GPU of one node, no GPU of a node is used twice
    seen = {(s.node, s.gpu) for s in plan.slots}
    assert len(seen) == len(plan.slots) == len(plan.bundles)
    for e in plan.engines:
        assert {plan.slots[b].node for b in e.bundles} == {e.node}
        assert tuple(plan.slots[b].gpu for b in e.bundles) == e.gpus


def test_sixteen_nodes_colocated_seed_layout() -> None:
    plan = plan_placement(_args(16, 8, True, None, 2), use_gpus=True)
    assert plan.num_nodes == 16 and plan.num_actors == 128 and len(plan.engines) == 64
    for e in plan.engines:
        assert e.node == e.index // 4
        assert e.gpus == ((e.index % 4) * 2, (e.index % 4) * 2 + 1)
        assert e.ranks == e.bundles == (2 * e.index, 2 * e.index + 1)
    assert [plan.rank_node(r) for r in (0, 7, 8, 127)] == [0, 0, 1, 15]
    assert plan.node_demand(15) == {"GPU": 8.0, "CPU": 8.0}
    assert plan.actor_options["num_gpus"] == COLOCATED_ACTOR_GPU
    assert plan.engine_gpu_share == COLOCATED_ENGINE_GPU
    assert COLOCATED_ACTOR_GPU + COLOCATED_ENGINE_GPU <= 1.0


def test_sixteen_nodes_disaggregated_adds_rollout_nodes() -> None:
    plan = plan_placement(_args(16, 8, False, 32, 4), use_gpus=True)
    assert plan.num_nodes == 20 and len(plan.slots) == 160
    assert [e.node for e in plan.engines] == [16 + e // 2 for e in range(8)]
    assert plan.engines[3].gpus == (4, 5, 6, 7) and plan.engines[3].bundles == (140, 141, 142, 143)
    assert all(e.ranks == () for e in plan.engines)
    assert plan.actor_options == {"num_cpus": 1.0, "num_gpus": 1.0}


def test_cpu_bundles_split_a_cpu_share_between_a_rank_and_its_engine() -> None:
    plan = plan_placement(_args(2, 1, True, None, 1), use_gpus=False, actor_num_cpus=1.0)
    assert plan.bundles == ({"CPU": 1.0}, {"CPU": 1.0})
    assert plan.actor_options == {"num_cpus": 0.5} and plan.engine_options == {"num_cpus": 0.5}
    alone = plan_placement(_args(1, 2, False, 0, 1), use_gpus=False, actor_num_cpus=0.5)
    assert alone.bundles == ({"CPU": 0.5}, {"CPU": 0.5}) and alone.engines == ()
    assert alone.actor_options == {"num_cpus": 0.5}


@pytest.mark.parametrize("flags, match", [
    ((2, 1, True, None, 2), "engine0 .* would span nodes 0 and 1"),
    ((2, 4, True, None, 8), "engine0 .* would span nodes 0 and 1"),
    ((2, 6, True, None, 4), "engine1 .* would span nodes 0 and 1"),
    ((1, 8, True, 4, 2), "must equal the trainer GPUs"),
    ((1, 4, False, 3, 2), "not a multiple"),
    ((1, 0, True, None, 1), "no trainer rank"),
    ((1, 4, True, None, 0), "must be >= 1"),
])
def test_layouts_the_real_backend_cannot_place_are_refused_naming_the_flags(flags, match) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_placement(_args(*flags), use_gpus=True)


def test_describe_and_json_say_what_goes_on_each_node() -> None:
    plan = plan_placement(_args(2, 8, True, None, 4), use_gpus=True)
    lines = plan.describe()
    assert lines[0].startswith("placement: 2 node(s), 16 GPU(s) (colocated")
    assert lines[2] == "  node 1: GPUs 0-7; trainer ranks 8-15; engines engine2@0-3, engine3@4-7"
    d = plan.to_dict()
    assert d["num_nodes"] == 2 and d["nodes"][1]["trainer_ranks"] == list(range(8, 16))
    assert d["nodes"][1]["engines"][0] == {"name": "engine2", "gpus": [0, 1, 2, 3], "bundles": [8, 9, 10, 11],
                                          "trainer_ranks": [8, 9, 10, 11]}


@pytest.mark.parametrize("argv", [
    [],
    ["--actor-num-nodes", "2", "--rollout-num-gpus-per-engine", "4"],
    ["--no-colocate", "--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "4"],
    ["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4", "--no-colocate", "--rollout-num-gpus", "8",
     "--rollout-num-gpus-per-engine", "8"],
])
def test_bundle_b_is_the_simulators_gpu_b(argv: list[str]) -> None:
    """`vime simulate` models the real layout: engine k's simulated GPUs are its bundles."""
    from vime.config import parse_args
    from vime.sim.backends import build_sim_backends

    args = parse_args([*argv, "--tensor-model-parallel-size", "1"], command="simulate")
    plan = plan_placement(args.cluster, use_gpus=True)
    sim = build_sim_backends(args, start=False)
    assert sim.engine_gpus == {e.name: list(e.bundles) for e in plan.engines}


def test_the_real_backend_checks_the_placement_at_parse_time() -> None:
    """An engine across two nodes is refused for --backend real, and only there (the simulator models it)."""
    from vime.config import parse_args

    cross = ["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "1", "--rollout-num-gpus-per-engine", "2",
             "--tensor-model-parallel-size", "1"]
    with pytest.raises(ConfigError, match=r"engine0 .* would span nodes 0 and 1.*--backend real"):
        parse_args(cross, command="train")
    assert parse_args(cross, command="simulate").rollout_num_engines == 1
    assert parse_args([*cross, "--backend", "sim"], command="train").rollout_num_engines == 1


def test_disaggregated_real_runs_publish_through_disk_and_refuse_explicit_cuda_ipc() -> None:
    """CUDA IPC needs an engine on its trainer ranks' GPUs (seed step 3): --no-colocate picks disk on the real
    backend, an explicit --update-weight-mode tensor is refused naming the alternatives, the simulator keeps it."""
    from vime.config import parse_args

    apart = ["--no-colocate", "--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "4",
             "--tensor-model-parallel-size", "1"]
    assert parse_args(apart, command="train").update_weight_mode == "disk"
    assert parse_args(["--actor-num-gpus-per-node", "4", "--tensor-model-parallel-size", "1"],
                      command="train").update_weight_mode == "tensor"  # colocated: CUDA IPC stays
    with pytest.raises(ConfigError, match="--update-weight-mode disk.*--colocate.*--backend sim"):
        parse_args([*apart, "--update-weight-mode", "tensor"], command="train")
    assert parse_args([*apart, "--update-weight-mode", "tensor"], command="simulate").update_weight_mode == "tensor"


def test_train_dry_run_prints_the_placement_of_two_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from vime import cli

    argv = ["train", "--backend", "real", "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4",
            "--rollout-num-gpus-per-engine", "2", "--tensor-model-parallel-size", "1", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("placement: 2 node(s), 8 GPU(s) (colocated: engines on their trainer ranks' GPUs)")
    assert out[at + 1:at + 3] == ["  node 0: GPUs 0-3; trainer ranks 0-3; engines engine0@0-1, engine1@2-3",
                                  "  node 1: GPUs 0-3; trainer ranks 4-7; engines engine2@0-1, engine3@2-3"]
    assert cli.main([*argv, "--json"]) == 0
    placement = json.loads(capsys.readouterr().out)["placement"]
    assert placement["num_nodes"] == 2
    assert [n["trainer_ranks"] for n in placement["nodes"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [e["trainer_ranks"] for e in placement["nodes"][1]["engines"]] == [[4, 5], [6, 7]]


def test_train_takes_a_ray_address() -> None:
    from vime.config import parse_args

    assert parse_args([], command="train").ray_address is None
    assert parse_args(["--ray-address", "10.0.0.1:6379"], command="train").ray_address == "10.0.0.1:6379"
