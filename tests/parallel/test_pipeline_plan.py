"""Pure parts of the pipeline: rank layout, stage balance, bubble, the agreed loss scale,
and the submit-time rules of pipeline specs."""

from __future__ import annotations

import itertools

import pytest

from hpc_train.parallel.pipeline.balance import (balance_blocks, bubble_fraction, cut_problem,
                                                 stage_bounds)
from hpc_train.parallel.layout import LayoutError, Parallelism, ParallelLayout
from hpc_train.spec import spec_from_dict
from hpc_train.spec.pipeline_rules import gpt_blocks
from hpc_train.spec.problems import SpecInvalid


def test_layout_puts_a_pipeline_on_consecutive_ranks():
    layout = ParallelLayout(world_size=8, stages=4)
    assert layout.replicas == 2
    assert layout.all_pipelines() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.all_replica_sets() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for rank in range(8):   # rank = replica * K + stage
        assert rank == layout.replica_of(rank) * 4 + layout.stage_of(rank)
        assert rank in layout.pipeline_ranks(layout.replica_of(rank))
        assert rank in layout.replica_ranks(layout.stage_of(rank))
        # all stages of one pipeline read the same data part, one part per replica
        assert layout.data_part(rank) == (layout.replica_of(rank), 2)
        place = layout.of_rank(rank)
        assert (place.stage, place.replica, place.data_part) == \
            (layout.stage_of(rank), layout.replica_of(rank), layout.data_part(rank))


def test_layout_without_pipeline_makes_every_rank_a_replica():
    layout = ParallelLayout(world_size=4)
    assert layout.replicas == 4 and layout.parallelism is Parallelism.DATA_PARALLEL
    assert [layout.data_part(r) for r in range(4)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert [layout.stage_of(r) for r in range(4)] == [0, 0, 0, 0]


def test_layout_refuses_partial_pipelines():
    with pytest.raises(LayoutError, match="multiple of the stage count") as caught:
        ParallelLayout(world_size=6, stages=4)
    assert isinstance(caught.value, ValueError) and caught.value.fitting_world == 8
    assert "use 8 ranks" in str(caught.value)
    assert ParallelLayout.problem(6, 4).fitting_world == 8 and ParallelLayout.problem(8, 4) is None
    with pytest.raises(ValueError, match="outside a world"):
        ParallelLayout(world_size=8, stages=4).of_rank(8)


def brute_force_best(costs, stages):
    """The smallest possible largest-stage cost, over every contiguous cut."""
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(costs)), stages - 1):
        bounds = [0, *cuts, len(costs)]
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


@pytest.mark.parametrize("costs", [[1, 1, 1, 1], [5, 1, 1, 1, 1, 1, 1, 5], [1, 2, 3, 4, 5, 6, 7],
                                   [10, 1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 5], [3, 3, 3, 3, 3, 3],
                                   [0.5, 0.25, 0.125, 2.0, 0.125, 1.0]])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_balance_is_optimal_contiguous_and_non_empty(costs, stages):
    if stages > len(costs):
        pytest.skip("more stages than blocks")
    sizes = balance_blocks(costs, stages)
    assert len(sizes) == stages and all(s >= 1 for s in sizes) and sum(sizes) == len(costs)
    assert max(sum(costs[a:b]) for a, b in stage_bounds(sizes)) == pytest.approx(brute_force_best(costs, stages), rel=1e-5)


def test_balance_of_a_gpt_like_list_gives_the_big_ends_their_own_stages():
    # Embedding and head are large, the layers equal: the cut keeps the stages near-equal.
    costs = [8, 3, 3, 3, 3, 3, 3, 8]
    assert balance_blocks(costs, 2) == [4, 4]
    assert stage_bounds([4, 4]) == [(0, 4), (4, 8)]


def test_balance_refuses_impossible_cuts():
    with pytest.raises(ValueError, match="non-empty"):
        balance_blocks([1, 1], 3)


@pytest.mark.parametrize("blocks, stages, balance, words", [
    (4, 2, "auto", None), (4, 4, "time", None), (4, 2, [1, 3], None), (2, 2, [1, 1], None),
    (3, 4, "auto", "parallel.pipeline.stages 4 with 3 blocks: every stage needs a block. Fix: "
                   "use at most 3 stages"),
    (4, 2, [2, 3], "parallel.pipeline.balance [2, 3] with 2 stages and 4 blocks: one block count "
                   ">= 1 per stage, summing to the blocks. Fix: set parallel.pipeline.balance: [2, 2]"),
    (4, 2, [4, 0], "Fix: set parallel.pipeline.balance: [2, 2]"),
    (5, 3, [5], "Fix: set parallel.pipeline.balance: [2, 2, 1]"),
    (2, 3, [1, 1, 0], "Fix: set parallel.pipeline.balance: auto"),
])
def test_a_cut_the_blocks_cannot_take_is_one_line_naming_the_key(blocks, stages, balance, words):
    """What the ranks check once a user's model is built and its blocks are counted."""
    problem = cut_problem(blocks, stages, balance)
    if words is None:
        assert problem is None
    else:
        assert words in problem and "\n" not in problem, problem


def test_bubble_formula():
    assert bubble_fraction(2, 1) == 0.5
    assert bubble_fraction(2, 4) == pytest.approx(1 / 5)
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(1, 8) == 0.0


def test_agreed_scaler_halves_on_overflow_and_grows_after_good_steps():
    torch = pytest.importorskip("torch")
    from hpc_train.parallel.pipeline.scaler import AgreedLossScaler

    scaler = AgreedLossScaler("fp16", "dynamic", init_scale=8.0, growth_interval=2)
    scaler.update(overflow=True)
    assert scaler.scale == 4.0
    scaler.update(False)
    scaler.update(False)
    assert scaler.scale == 8.0
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.tensor([8.0, float("inf")])
    squares, bad = scaler.unscale_and_measure([param]).tolist()
    assert bad == 1.0 and squares == 0.0
    param.grad = torch.tensor([8.0, 16.0])
    squares, bad = scaler.unscale_and_measure([param]).tolist()
    assert bad == 0.0 and squares == pytest.approx(1.0 + 4.0)      # unscaled by 8
    fixed = AgreedLossScaler("fp16", 128.0)
    fixed.update(overflow=True)
    assert fixed.scale == 128.0
    assert AgreedLossScaler("bf16").loss_scale is None


def test_rules_count_the_blocks_the_builder_makes():
    from hpc_train.models import build_model

    for options in ({}, {"layers": 2}):      # the catalog's default depth, and a given one
        spec = spec_from_dict({"run": {"name": "t"}, "data": {"kind": "text"},
                               "model": {"name": "gpt", "options": options}})
        assert gpt_blocks(spec) == len(build_model("gpt", 256, options, seq_len=8))


def pipeline_spec(**pipeline):
    return {"run": {"name": "t"}, "slurm": {"tasks_per_node": 4},
            "data": {"kind": "text", "vocab_size": 256, "batch_size": 16},
            "model": {"name": "gpt", "options": {"layers": 4}},
            "parallel": {"pipeline": pipeline}}


def test_a_valid_pipeline_spec_and_its_batch_arithmetic():
    spec = spec_from_dict(pipeline_spec(stages=2, microbatches=8, schedule="1f1b", balance=[3, 3]))
    assert spec.replicas == 2 and spec.uses_pipeline
    assert spec.layout == ParallelLayout(world_size=4, stages=2)
    assert spec.samples_per_step == 16 * 2      # per replica x replicas, not x ranks


@pytest.mark.parametrize("pipeline, key", [
    ({"stages": 3, "microbatches": 4}, "parallel.pipeline.stages"),
    ({"stages": 2, "microbatches": 3}, "parallel.pipeline.microbatches"),
    ({"stages": 4, "microbatches": 2, "schedule": "1f1b"}, "parallel.pipeline.microbatches"),
    ({"stages": 2, "microbatches": 4, "balance": [2, 2, 2]}, "parallel.pipeline.balance"),
    ({"stages": 2, "microbatches": 4, "balance": [6, 0]}, "parallel.pipeline.balance"),
    ({"stages": 4, "microbatches": 4, "balance": "auto", "remat": "yes please"},
     "parallel.pipeline.remat"),
])
def test_wrong_pipeline_combinations_name_their_key(pipeline, key):
    with pytest.raises(SpecInvalid) as caught:
        spec_from_dict(pipeline_spec(**pipeline))
    assert str(caught.value).startswith(key) or f"\n{key}" in str(caught.value), str(caught.value)


def test_more_stages_than_blocks_is_refused():
    data = pipeline_spec(stages=4, microbatches=4)
    data["model"]["options"] = {"layers": 1}          # 3 blocks
    with pytest.raises(SpecInvalid, match="every stage needs a block"):
        spec_from_dict(data)
