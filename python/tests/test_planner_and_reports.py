"""plan_replicas, plan and replay_balance: results as the C++ computes them, bad arguments named."""

import json
import shutil
import subprocess

import numpy as np
import pytest

import epmoe


def test_plan_replicas_quotas_sum_to_counts_and_balance():
    counts = np.array([400, 10, 10, 10, 10, 10, 10, 10], dtype=np.int64)
    copies = epmoe.plan_replicas(counts, ranks=4, slots=2)
    per_expert = np.zeros(8, dtype=np.int64)
    rank_loads = np.zeros(4, dtype=np.int64)
    for expert, rank, quota in copies:
        per_expert[expert] += quota
        rank_loads[rank] += quota
    np.testing.assert_array_equal(per_expert, counts)
    assert copies[0][:2] == (0, 0)  # home first
    assert rank_loads.max() == -(-counts.sum() // 4)  # the ideal, ceil(total / R)


def test_plan_replicas_without_slots_keeps_homes():
    copies = epmoe.plan_replicas([5, 6, 7, 8], 2, 0)
    assert copies == [(0, 0, 5), (1, 0, 6), (2, 1, 7), (3, 1, 8)]


@pytest.mark.parametrize("threshold", [4.0, 1e18, 1e300, float("inf")])
def test_plan_replicas_threshold_of_ranks_or_more_never_rebalances(threshold):
    # max/mean <= ranks always, so the homes meet any threshold from ranks up;
    # such thresholds once made the planner loop for ever.
    copies = epmoe.plan_replicas([1000, 1, 1, 1], 4, 2, threshold)
    assert copies == [(0, 0, 1000), (1, 1, 1), (2, 2, 1), (3, 3, 1)]


@pytest.mark.parametrize(
    "args, error, name",
    [
        (([1, 2, 3], 2, 1), ValueError, "counts"),  # 3 experts on 2 ranks
        (([1, -2], 2, 1), ValueError, "counts"),
        (([1, 2], 0, 1), ValueError, "ranks"),
        (([1, 2], 2, -1), ValueError, "slots"),
        (([1.5, 2], 2, 1), ValueError, "counts"),
        (([1, 2], 2.5, 1), TypeError, "ranks"),
        (([1, 2], 2, 1, float("nan")), ValueError, "rebalance_threshold"),
        ((None, 2, 1), TypeError, "counts"),
    ],
)
def test_plan_replicas_bad_arguments(args, error, name):
    with pytest.raises(error, match=name):
        epmoe.plan_replicas(*args)


def test_plan_returns_the_report_dict():
    report = epmoe.plan(ep=8, fsdp=8, per_device_batch_size=1, dispatch="alltoall", dedup=True)
    assert {"memory", "model", "hardware", "dispatchers"} <= set(report)


def test_plan_sweep_returns_one_row_per_value():
    rows = epmoe.plan(sweep="ep:8,16")
    assert [row["ep"] for row in rows] == ["8", "16"]
    assert all("plan" in row for row in rows)


def test_plan_equals_the_command_line():
    binary = shutil.which("epmoe")
    if binary is None:
        pytest.skip("no epmoe executable on PATH to compare with")
    printed = json.loads(subprocess.check_output([binary, "plan", "--json", "ep=16", "fsdp=16"]))
    assert epmoe.plan(ep=16, fsdp=16) == printed


@pytest.mark.parametrize(
    "keys, error, name",
    [
        ({"ep": 0}, ValueError, "ep"),
        ({"no_such_key": 1}, ValueError, "no_such_key"),
        ({"dispatch": "carrier-pigeon"}, ValueError, "dispatch"),
        ({"model": "/nonexistent/model.yaml"}, ValueError, "model"),
        ({"ep": [8]}, TypeError, "ep"),
    ],
)
def test_plan_bad_keys(keys, error, name):
    with pytest.raises(error, match=name):
        epmoe.plan(**keys)


def test_replay_balance_summary_and_plans():
    rng = np.random.default_rng(0)
    loads = rng.integers(0, 1000, size=(6, 16))
    loads[:, 0] = 20000  # one hot expert
    report = epmoe.replay_balance(loads, ranks=4, slots=2, window=2, period=2)
    assert report["num_steps"] == 6 and report["num_experts"] == 16
    policies = {p["policy"]: p for p in report["policies"]}
    assert set(policies) == {"none", "eplb", "dynamic", "hybrid"}
    assert policies["dynamic"]["mean_max_over_mean"] < policies["none"]["mean_max_over_mean"]
    for policy in policies.values():
        assert len(policy["steps"]) == 6
        for step, row in zip(policy["steps"], loads):
            per_expert = np.zeros(16, dtype=np.int64)
            for expert, _rank, quota in step["copies"]:
                per_expert[expert] += quota
            np.testing.assert_array_equal(per_expert, row)


def test_replay_balance_one_policy_without_plans():
    report = epmoe.replay_balance(np.ones((3, 8), dtype=np.int64), ranks=2, slots=1, policy="dynamic", plans=False)
    assert [p["policy"] for p in report["policies"]] == ["dynamic"]
    assert "steps" not in report["policies"][0]
    assert report["config"]["ranks"] == 2


@pytest.mark.parametrize(
    "loads, keys, error, name",
    [
        (np.ones((3, 8)), {"ranks": 3}, ValueError, "ranks"),  # 8 experts on 3 ranks
        (np.ones((3, 8)), {"policy": "magic"}, ValueError, "policy"),
        (np.ones((3, 8)), {"window": 0}, ValueError, "window"),
        (-np.ones((3, 8)), {}, ValueError, "loads"),
        (np.ones(8), {}, ValueError, "loads"),
        (np.ones((0, 8)), {}, ValueError, "loads"),
        ("loads.npy", {}, TypeError, "loads"),
    ],
)
def test_replay_balance_bad_arguments(loads, keys, error, name):
    with pytest.raises(error, match=name):
        epmoe.replay_balance(loads, **keys)
