"""The job's task (train/task.py): the loss of a micro-batch and the sums evaluation adds, for
classification, causal_lm (our gpt and a Hugging Face-style output) and the user's own step."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from hpc_train.spec import load_spec
from hpc_train.spec.schema import TaskKind
from hpc_train.train.task import METRIC_SLOTS, CausalLm, OwnStep, task_for
from hpc_train.usercode import UserCodeError
from tests.conftest import REPO

EXAMPLE = REPO / "examples/user_cnn"


@pytest.fixture
def lab_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    for name in [m for m in sys.modules if m.startswith(("lab_cnn", "usteps"))]:
        del sys.modules[name]


def no_autocast():
    return torch.autocast("cpu", enabled=False)


def test_auto_is_causal_lm_for_the_gpt_spec_and_classification_for_images():
    assert load_spec(REPO / "jobs/smoke.yaml").task_kind is TaskKind.CLASSIFICATION
    assert load_spec(REPO / "jobs/transformer_pipeline_cpu.yaml").task_kind is TaskKind.CAUSAL_LM
    spec = load_spec(REPO / "jobs/user_cnn.yaml", ["task.name=lab_cnn.steps:train_step"])
    assert spec.task_kind is TaskKind.OWN


def test_the_users_step_gives_the_loss_and_its_metrics_are_summed_until_taken(lab_on_path):
    from lab_cnn.model import SmallCNN

    spec = load_spec(REPO / "jobs/user_cnn.yaml", ["task.name=lab_cnn.steps:train_step",
                                                   "task.eval=lab_cnn.steps:eval_step"])
    task = task_for(spec, torch.device("cpu"))
    torch.manual_seed(0)
    model, images, labels = SmallCNN(10, 8), torch.randn(6, 3, 16, 16), torch.randint(10, (6,))
    loss = task.loss(model, images, labels)
    assert loss.requires_grad and loss.item() == pytest.approx(F.cross_entropy(model(images), labels).item())
    task.loss(model, images, labels)
    taken = task.take_metrics()
    assert taken.shape == (1 + METRIC_SLOTS,) and taken[0] == 2           # two passes
    top1 = (model(images).argmax(1) == labels).float().mean().item()
    assert task.metric_record(taken) == {"top1": pytest.approx(top1)}
    assert task.take_metrics()[0] == 0                                     # taken: starts again
    # Evaluation weighs each batch by its samples, with task.eval's own figures.
    batches = [(images, labels), (images[:2], labels[:2])]
    totals = task.evaluate(model, batches, no_autocast, lambda: None)
    assert totals[2] == 8 and not model.training
    record = task.val_record(totals)
    assert set(record) == {"loss", "top1", "confidence"}
    with torch.no_grad():
        expected = (F.cross_entropy(model(images), labels) * 6
                    + F.cross_entropy(model(images[:2]), labels[:2]) * 2) / 8
    assert record["loss"] == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("returned, words", [
    ("None", "returned None: a step returns the loss"),
    ("(loss, {}, 1)", "returned a tuple of 3"),
    ("model(x).sum(1)", "returned a tensor of shape (4,)"),
    ("(loss, {'lr': 1.0})", "a metric named 'lr'"),
])
def test_a_step_that_returns_no_loss_is_one_line_naming_it(tmp_path, monkeypatch, returned, words):
    (tmp_path / "usteps.py").write_text(
        "import torch.nn.functional as F\n"
        "def step(model, batch):\n"
        "    x, y = batch\n"
        "    loss = F.cross_entropy(model(x), y)\n"
        f"    return {returned}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("usteps", None)
    task = OwnStep("usteps:step")
    with pytest.raises(UserCodeError, match="task.name usteps:step") as raised:
        task.loss(torch.nn.Linear(3, 5), torch.randn(4, 3), torch.randint(5, (4,)))
    assert words in str(raised.value)


def test_causal_lm_reads_logits_of_an_output_object_and_skips_ignored_targets():
    torch.manual_seed(0)
    embed = torch.nn.Embedding(11, 11)

    class HfStyle(torch.nn.Module):                 # returns an object with .logits
        def __init__(self):
            super().__init__()
            self.embed = embed

        def forward(self, ids):
            return SimpleNamespace(logits=self.embed(ids))

    ids, targets = torch.randint(11, (3, 5)), torch.randint(11, (3, 5))
    targets[0, :2] = -100                           # padding: no loss, not counted
    task = CausalLm()
    loss = task.loss(HfStyle(), ids, targets)
    kept = targets.flatten() != -100
    logits = embed(ids).flatten(0, 1)
    assert loss.item() == pytest.approx(F.cross_entropy(logits[kept], targets.flatten()[kept]).item())
    totals = task.evaluate(HfStyle(), [(ids, targets)], no_autocast, lambda: None)
    assert totals[2] == kept.sum() and task.val_record(totals)["loss"] == pytest.approx(loss.item())
    assert totals[1] == ((logits.argmax(1) == targets.flatten()) & kept).sum()


def test_a_step_of_the_wrong_signature_is_refused_before_any_step(tmp_path, monkeypatch):
    (tmp_path / "usteps.py").write_text("def step(batch):\n    return batch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("usteps", None)
    with pytest.raises(UserCodeError, match=r"task.name usteps:step takes \(batch\): it is called "
                                            r"as step\(model, batch\)"):
        OwnStep("usteps:step")
