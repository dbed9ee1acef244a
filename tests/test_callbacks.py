"""The training loop's callback points (profiler.callbacks, docs/callbacks.md): a recording
callback attached to a real short single-device run on CPU sees every event in the documented
order, with the right steps, and the row it sees at `step_end` is the row steps.csv holds."""

from __future__ import annotations

import csv
from contextlib import contextmanager

import msgspec
import pytest
import torch

from profiler.callbacks import Callback, Callbacks, Event, StepState
from workloads.config import config_from_namespace
from workloads.train.context import init_context
from workloads.train.loop import build_parser, train

STEP = [
    "step_start",
    "[data]",
    "after_data",
    "[forward]",  # micro-batch 0 of 2
    "[backward]",
    "[forward]",  # micro-batch 1: after_forward, then the backward that would all-reduce
    "after_forward",
    "[backward]",
    "after_backward",
    "[optimizer]",
    "step_end",
]


class Recording(Callback):
    """Notes every event (and phase entered) with the step the state says, and the rows."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str | None]] = []
        self.rows: list[dict] = []

    def _note(self, event: str, state: StepState) -> None:
        self.seen.append((event, state.step, state.phase))

    @contextmanager
    def _phase(self, state: StepState, name: str):
        self.seen.append((f"[{name}]", state.step, state.phase))
        yield

    def phase(self, state, name):
        return self._phase(state, name)

    def step_end(self, state: StepState) -> None:
        self._note("step_end", state)
        self.rows.append(msgspec.structs.asdict(state.row))


for _event in Event:
    if _event is not Event.STEP_END:
        setattr(Recording, _event.value, lambda self, state, _e=_event.value: self._note(_e, state))


@pytest.fixture
def recorded_run(tmp_path):
    """3 optimizer steps of 2 micro-batches, a checkpoint every 2 steps and one at the epoch's
    end, the default profiler schedule."""
    argv = [
        *"--mode single --model mlp --dataset synthetic --device cpu --epochs 1".split(),
        *"--max-steps 3 --warmup-steps 1 --batch-size 32 --grad-accum-steps 2".split(),
        *"--checkpoint-every 2 --checkpoint --run-id cb".split(),
        *["--runs-dir", str(tmp_path)],
    ]
    cfg = config_from_namespace(build_parser().parse_args(argv))
    threads = torch.get_num_threads()
    rec = Recording()
    try:
        train(cfg, init_context(cfg), tmp_path / "cb", callbacks=[rec])
    finally:
        torch.set_num_threads(threads)  # train() sets the plan's threads in this process
    return rec, tmp_path / "cb"


@pytest.mark.integration
def test_a_real_run_fires_the_events_in_the_documented_order(recorded_run):
    rec, run_dir = recorded_run
    events = [e for e, _, _ in rec.seen]
    num_eval = events.count("eval_batch")
    assert num_eval >= 1  # the synthetic test split, in batches of 256
    expected = [
        "run_start",
        *STEP,  # step 0
        *STEP,  # step 1
        "checkpoint",  # --checkpoint-every 2
        *STEP,  # step 2; --max-steps 3 ends the epoch
        "epoch_end",
        *["eval_batch"] * num_eval,
        "checkpoint",  # --checkpoint
        "run_end",
    ]
    assert events == expected
    # The step the state names: the running step inside a step, the steps done after one.
    steps = [s for _, s, _ in rec.seen]
    per_step = len(STEP)
    assert steps[0] == 0
    assert steps[1 : 1 + per_step] == [0] * per_step
    assert steps[1 + per_step : 1 + 2 * per_step] == [1] * per_step
    assert steps[1 + 2 * per_step] == 2  # the checkpoint after two steps
    assert steps[2 + 2 * per_step : 2 + 3 * per_step] == [2] * per_step
    assert set(steps[2 + 3 * per_step :]) == {3}
    # A phase is named only while it runs; the callbacks' phase contexts see it set.
    for event, _, phase in rec.seen:
        if event.startswith("["):
            assert phase == event.strip("[]")
        else:
            assert phase is None, event
    assert (run_dir / "checkpoint.pt").is_file()


@pytest.mark.integration
def test_the_row_a_callback_sees_at_step_end_is_the_steps_csv_row(recorded_run):
    rec, run_dir = recorded_run
    with (run_dir / "steps.csv").open() as f:
        on_disk = list(csv.DictReader(f))
    assert [int(r["step"]) for r in on_disk] == [0, 1, 2]
    assert len(rec.rows) == 3
    for seen, row in zip(rec.rows, on_disk, strict=True):
        assert list(seen) == list(row)  # every steps.csv column, in order
        # Later callbacks in the list see the columns the earlier ones filled.
        assert isinstance(seen["rss_bytes"], int) and seen["rss_bytes"] > 0
        assert seen["samples"] == 32 and seen["warmup"] == int(seen["step"] < 1)
        for column in ("step", "warmup", "profiled", "samples"):
            assert str(seen[column]) == row[column]
        assert float(row["loss"]) == pytest.approx(seen["loss"], rel=1e-12)
        assert float(row["step_time_s"]) == pytest.approx(seen["step_time_s"], rel=1e-12)
    # The default schedule (wait 1, warmup 1, active 3): step 0 is not traced, 1 and 2 are.
    assert [r["profiled"] for r in rec.rows] == [0, 1, 1]


def test_callbacks_reject_an_unknown_event_and_nest_phase_contexts():
    entered: list[str] = []

    class Marks(Callback):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        @contextmanager
        def _ctx(self, name):
            entered.append(f"{self.tag}>{name}")
            yield
            entered.append(f"{self.tag}<{name}")

        def phase(self, state, name):
            return self._ctx(name)

    model = torch.nn.Linear(2, 2)
    state = StepState(rank=0, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    cbs = Callbacks([Marks("a"), Marks("b")])
    with pytest.raises(TypeError, match="callback event 'step_start' is not an Event"):
        cbs.fire("step_start", state)
    with cbs.phase(state, "forward"):
        assert state.phase == "forward"
    assert state.phase is None
    assert entered == ["a>forward", "b>forward", "b<forward", "a<forward"]
