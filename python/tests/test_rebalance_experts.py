"""epmoe.rebalance_experts: EPLB's contract on random, Zipf and adversarial loads, both policies."""

import numpy as np
import pytest
from conftest import check_placement, make_weight

import epmoe

# (experts, replicas, groups, nodes, gpus): hierarchical when groups % nodes == 0.
SHAPES = [
    (12, 16, 4, 2, 8),  # EPLB's README example, hierarchical
    (12, 16, 3, 2, 8),  # global
    (64, 80, 8, 2, 8),  # hierarchical
    (64, 72, 8, 3, 6),  # global (8 % 3)
    (256, 320, 8, 8, 64),  # DeepSeek-V3-like, hierarchical
    (256, 300, 8, 3, 30),  # global (8 % 3)
    (4, 16, 1, 1, 4),  # every GPU holds every expert
    (8, 32, 4, 2, 8),  # every GPU holds every expert of its node
]


@pytest.mark.parametrize("kind", ["random", "zipf", "adversarial"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "E%d-P%d-g%d-n%d-G%d" % s)
def test_valid_placement(kind, shape):
    experts, replicas, groups, nodes, gpus = shape
    weight = make_weight(kind, 4, experts, seed=experts + replicas)
    outputs = epmoe.rebalance_experts(weight, replicas, groups, nodes, gpus)
    assert all(isinstance(o, np.ndarray) for o in outputs)
    check_placement(weight, outputs, replicas, gpus)


def test_hierarchical_keeps_a_group_on_one_node():
    experts, replicas, groups, nodes, gpus = 64, 80, 8, 2, 8
    weight = make_weight("zipf", 3, experts, seed=3)
    phy2log, _, _ = epmoe.rebalance_experts(weight, replicas, groups, nodes, gpus)
    node_of_slot = np.arange(replicas) // (replicas // nodes)
    for layer in range(3):
        group_of_slot = phy2log[layer] // (experts // groups)
        for group in range(groups):
            assert len(set(node_of_slot[group_of_slot == group].tolist())) == 1


def test_eplbs_published_example():
    weight = np.array(
        [
            [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
            [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
        ]
    )
    phy2log, log2phy, logcnt = epmoe.rebalance_experts(weight, 16, 4, 2, 8)
    np.testing.assert_array_equal(
        phy2log,
        [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1], [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]],
    )
    assert log2phy.shape == (2, 12, 5)


def test_no_duplicate_where_eplb_duplicates():
    # EPLB gives the hot expert 3 copies for 2 GPUs and packs two on GPU 0.
    phy2log, _, logcnt = epmoe.rebalance_experts(np.array([[100, 1, 1, 1]]), 6, 1, 1, 2)
    np.testing.assert_array_equal(logcnt, [[2, 2, 1, 1]])
    ratios = check_placement(np.array([[100, 1, 1, 1]]), (phy2log, _, logcnt), 6, 2)
    assert ratios == [1.0]


def test_accepts_lists_and_floats():
    weight = [[1.5, 2.0, 0.0, 7.25]]
    outputs = epmoe.rebalance_experts(weight, 8, 1, 1, 2)
    check_placement(np.array(weight), outputs, 8, 2)


def test_torch_in_torch_out(torch_module):
    torch = torch_module
    weight = torch.tensor(make_weight("zipf", 3, 64, seed=1), dtype=torch.float32)
    outputs = epmoe.rebalance_experts(weight, 80, 8, 2, 8)
    assert all(isinstance(o, torch.Tensor) and o.dtype == torch.int64 for o in outputs)
    assert all(o.device == weight.device for o in outputs)
    check_placement(weight.numpy(), [o.numpy() for o in outputs], 80, 8)
    numpy_outputs = epmoe.rebalance_experts(weight.numpy(), 80, 8, 2, 8)
    for a, b in zip(outputs, numpy_outputs):
        np.testing.assert_array_equal(a.numpy(), b)


def test_torch_integer_weight(torch_module):
    torch = torch_module
    weight = torch.tensor([[10, 1, 1, 1]], dtype=torch.int64)
    phy2log, _, _ = epmoe.rebalance_experts(weight, 4, 1, 1, 2)
    assert isinstance(phy2log, torch.Tensor)


@pytest.mark.parametrize(
    "args, error, name",
    [
        ((np.ones((2, 12)), 10, 4, 2, 8), ValueError, "num_replicas"),  # fewer replicas than experts
        ((np.ones((2, 12)), 20, 4, 2, 8), ValueError, "num_replicas"),  # not a multiple of num_gpus
        ((np.ones((2, 12)), 18, 4, 4, 6), ValueError, "num_gpus"),  # hierarchical: 6 % 4 nodes
        ((np.ones((2, 12)), 16, 8, 2, 8), ValueError, "num_groups"),  # 12 % 8
        ((np.ones((2, 12)), 16, 4, 0, 8), ValueError, "num_nodes"),
        ((np.ones((2, 12)), 16, 4, 2, 0), ValueError, "num_gpus"),
        ((np.ones(12), 16, 4, 2, 8), ValueError, "weight"),  # 1-D
        ((-np.ones((2, 12)), 16, 4, 2, 8), ValueError, "weight"),
        ((np.full((2, 12), np.nan), 16, 4, 2, 8), ValueError, "weight"),
        ((np.ones((2, 0)), 16, 4, 2, 8), ValueError, "weight"),
        (("loads", 16, 4, 2, 8), TypeError, "weight"),
        ((np.array([["a"] * 12]), 16, 4, 2, 8), TypeError, "weight"),
        ((np.ones((2, 12)), 16.0, 4, 2, 8), TypeError, "num_replicas"),
        ((np.ones((2, 12)), 16, True, 2, 8), TypeError, "num_groups"),
        ((np.ones((2, 12)), 16, 4, "2", 8), TypeError, "num_nodes"),
        ((np.ones((2, 12)), 16, 4, 2, 2**40), ValueError, "num_gpus"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(args, error, name):
    with pytest.raises(error, match=name):
        epmoe.rebalance_experts(*args)


def test_accepts_every_call_eplbs_global_policy_accepts():
    # num_groups % num_nodes != 0: DeepSeek's EPLB runs the global policy and
    # never uses num_nodes, so 64 GPUs need not be a multiple of 3 nodes.
    weight = make_weight("zipf", 2, 256, seed=5)
    outputs = epmoe.rebalance_experts(weight, 384, 8, 3, 64)
    check_placement(weight, outputs, 384, 64)
    for ours, one_node in zip(outputs, epmoe.rebalance_experts(weight, 384, 1, 1, 64)):
        np.testing.assert_array_equal(ours, one_node)


def test_more_slots_per_gpu_than_experts_per_node_gives_eplbs_duplicates():
    # 12 slots per GPU, 6 experts per node: EPLB accepts it, and no placement
    # avoids holding some expert twice on a GPU.
    weight = make_weight("zipf", 1, 12, seed=2)
    phy2log, log2phy, logcnt = epmoe.rebalance_experts(weight, 96, 4, 2, 8)
    assert phy2log.shape == (1, 96) and log2phy.shape == (1, 12, 85)
    assert logcnt.sum() == 96 and (logcnt >= 1).all()
    np.testing.assert_array_equal(np.bincount(phy2log[0], minlength=12), logcnt[0])


@pytest.mark.parametrize(
    "args, name",
    [
        ((7, 2, 2, 4), "num_replicas=7"),  # vLLM's test: 7 not a multiple of 4 GPUs
        ((8, 1, 1, 4), "num_replicas=8"),  # fewer replicas than the 12 experts
        ((0, 1, 1, 4), "num_replicas=0"),
        ((16, 8, 2, 8), "num_groups=8"),  # hierarchical: 12 experts % 8 groups
        ((18, 4, 4, 6), "num_gpus=6"),  # hierarchical: 6 GPUs % 4 nodes
    ],
)
def test_what_eplb_asserts_on_raises_an_assertion_error_that_is_a_value_error(args, name):
    weight = np.ones((1, 12), dtype=np.float32)
    with pytest.raises(AssertionError, match=name) as raised:
        epmoe.rebalance_experts(weight, *args)
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, epmoe.EplbAssertionError)


def test_other_bad_arguments_are_no_assertion_errors():
    # EPLB divides by zero there; epmoe: a ValueError naming the argument.
    with pytest.raises(ValueError, match="num_nodes") as raised:
        epmoe.rebalance_experts(np.ones((1, 12)), 16, 4, 0, 8)
    assert not isinstance(raised.value, AssertionError)


def test_hotter_experts_get_at_least_as_many_copies_where_balance_allows():
    # One expert at 1000, the rest 0-2, 4 GPUs x 3 slots: the copies the hot
    # expert cannot take (one per GPU) go to the hotter of the cold experts,
    # at the same max load (250 + 4/3) as the search's 4 1 3 2 2.
    weight = np.array([[1000, 0, 1, 2, 2]])
    outputs = epmoe.rebalance_experts(weight, 12, 1, 1, 4)
    np.testing.assert_array_equal(outputs[2], [[4, 1, 1, 3, 3]])
    assert check_placement(weight, outputs, 12, 4)[0] == pytest.approx((250 + 4 / 3) / (1005 / 4))
    # The hottest gets more copies than any other (the search gave 4 4 3 1).
    _, _, logcnt = epmoe.rebalance_experts(np.array([[1000, 0, 0, 0]]), 12, 1, 1, 4)
    np.testing.assert_array_equal(logcnt, [[4, 3, 3, 2]])
