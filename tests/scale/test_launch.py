"""`sgl-blend launch`: the printed deployment commands for one node and for several."""

from __future__ import annotations

import shlex

import pytest

from sgl_blend.cli import main
from sgl_blend.launch.flags import flag_value
from sgl_blend.launch.deployment import plan_launch


def test_one_node_splits_its_gpus_into_dp_ranks_of_tp_groups() -> None:
    (title, argv), = plan_launch("llama-70b", gpus=8, tp=4, hardware="a100-80g").steps
    assert argv[:4] == ["sgl-blend", "serve", "--model", "llama-70b"]
    assert (flag_value(argv, "--tp-size"), flag_value(argv, "--dp-size"), flag_value(argv, "--hardware")) \
        == ("4", "2", "a100-80g")
    assert "2 DP rank(s) x TP 4" in title


def test_every_node_shares_the_store_and_names_the_others_as_workers() -> None:
    plan = plan_launch("m", gpus=4, tp=2, nodes=("n1", "n2", "n3"), batch_store="postgresql://db/x",
                       data_dir="/shared/d", extra=("--mem-fraction-static", "0.8"))
    *servers, (_, router) = plan.steps
    for node, (_title, argv) in zip(("n1", "n2", "n3"), servers):
        assert flag_value(argv, "--batch-store") == "postgresql://db/x" and flag_value(argv, "--data-dir") == "/shared/d"
        others = {f"http://{other}:30000" for other in ("n1", "n2", "n3") if other != node}
        assert set(flag_value(argv, "--batch-workers").split(",")) == others
        assert argv[-2:] == ["--mem-fraction-static", "0.8"] and flag_value(argv, "--dp-size") == "2"
    assert router[:3] == ["python", "-m", "sglang_router.launch_router"]
    assert router[router.index("--worker-urls") + 1:][:3] == ["http://n1:30000", "http://n2:30000", "http://n3:30000"]


@pytest.mark.parametrize("kwargs, message", [
    ({"gpus": 6, "tp": 4}, "not a multiple"),
    ({"gpus": 2, "nodes": ("a", "b"), "data_dir": "/d"}, "--batch-store"),
    ({"gpus": 2, "nodes": ("a", "b"), "batch_store": "postgresql://db/x"}, "--data-dir"),
])
def test_impossible_shapes_are_refused(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        plan_launch("m", **kwargs)


def test_the_command_prints_a_script_a_shell_can_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--model", "my model", "--gpus", "2", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    command = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert shlex.split(command[0])[3] == "my model"
    assert main(["launch", "--model", "m", "--gpus", "3", "--tp", "2"]) == 2
    assert "not a multiple" in capsys.readouterr().err
