"""Hostile input v4 (issue 36), the user-code class: a user's module, factory, forward or dataset
that exits or fails costs one line naming it, exit code 2, before any run folder exists; never a
silent exit 0 with no run, never a traceback.

The user's code lives where users keep it: a module in their own folder (a tmp folder outside the
repo, the working directory of the command), named by --model / --dataset MODULE:FUNCTION."""

from __future__ import annotations

import sys
import textwrap
import uuid

import pytest

from workloads.launch import launcher

BASE = "--max-steps 4 --batch-size 32 --no-profile --device cpu".split()

MLP = """
import torch
from torch import nn


def net(num_classes=10, input_shape=(3, 32, 32)):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()), num_classes))
"""


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """The user's own folder (the command's working directory), with a unique module name per
    test so no module is reused from sys.modules."""
    monkeypatch.chdir(tmp_path)
    name = f"user_{uuid.uuid4().hex[:8]}"
    yield tmp_path, name
    for mod in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[mod]


def _launch(tmp_path, argv: list[str], capsys) -> str:
    runs = tmp_path / "runs"
    assert launcher.main([*BASE, *argv, "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert not runs.exists()
    return lines[0]


MODEL_CASES = {  # name -> (module source, --model FUNCTION, words of the one line)
    "exit-at-import": (
        "import sys\nsys.exit(0)\n" + MLP,
        "net",
        "your module {m} called sys.exit(0) while being imported",
    ),
    "factory-exits-3": (
        MLP + "\n\ndef bad(**kw):\n    raise SystemExit(3)\n",
        "bad",
        "your {m}:bad called sys.exit(3); a factory must return its result, not exit",
    ),
    "forward-exits": (
        MLP
        + textwrap.dedent(
            """
            class Quit(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.w = nn.Linear(1, 1)

                def forward(self, x):
                    import sys
                    sys.exit("bye")


            def quit(**kw):
                return Quit()
            """
        ),
        "quit",
        "your model's forward called sys.exit('bye') on a sample batch",
    ),
}


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_a_model_that_exits_is_one_line_naming_it(case, user_folder, capsys):
    tmp_path, name = user_folder
    source, fn, words = MODEL_CASES[case]
    (tmp_path / f"{name}.py").write_text(source)
    line = _launch(tmp_path, ["--model", f"{name}:{fn}", "--dataset", "synthetic"], capsys)
    assert words.format(m=name) in line, line


def test_builtins_exit_as_the_model_is_one_line(tmp_path, monkeypatch, capsys):
    """`--model builtins:exit` made `dpscope profile` exit 0 with no output and no run."""
    monkeypatch.chdir(tmp_path)
    line = _launch(tmp_path, ["--model", "builtins:exit", "--dataset", "synthetic"], capsys)
    assert "--model builtins:exit: your builtins:exit called sys.exit()" in line


DATASET_CASES = {  # name -> (the dataset class body, words of the one line)
    "getitem-raises": (
        "def __getitem__(self, i):\n        raise KeyError(f'no sample {i}')",
        "train[0] raised KeyError: 'no sample 0'; fix its __getitem__",
    ),
    "getitem-exits": (
        "def __getitem__(self, i):\n        raise SystemExit(4)",
        "train[0] called sys.exit(4); __getitem__ must return (input, target)",
    ),
    "shapes-differ": (
        "def __getitem__(self, i):\n"
        "        return torch.zeros(3, 32, 32 + i), torch.tensor(i % 10)",
        "train[0] and train[1] cannot be batched together",
    ),
}


@pytest.mark.parametrize("case", list(DATASET_CASES))
def test_a_dataset_whose_items_fail_is_one_line(case, user_folder, capsys):
    tmp_path, name = user_folder
    body, words = DATASET_CASES[case]
    source = textwrap.dedent(
        """
        import torch
        from torch.utils.data import Dataset


        class Items(Dataset):
            def __len__(self):
                return 64

            BODY


        def data():
            return Items(), None
        """
    ).replace("BODY", body)
    (tmp_path / f"{name}.py").write_text(source)
    line = _launch(tmp_path, ["--model", "mlp", "--dataset", f"{name}:data"], capsys)
    assert f"--dataset {name}:data: " in line and words in line, line
