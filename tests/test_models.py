"""Issue 22: any model, dataset and loss by spec (built-in, torchvision:NAME, MODULE:FUNCTION).

Pure parts (spec parsing, the registries, gpt and tokens) in-process; every bad-input line through
the launcher's real planning step (`launcher.main`, and one real subprocess run from the user's
folder), with a user package written to a temp folder outside the repo (tests/user_pkg.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.user_pkg import write_user_package
from workloads.launch import launcher
from workloads.spec import (
    BUILTIN_DATASETS,
    BUILTIN_LOSSES,
    BUILTIN_MODELS,
    SpecError,
    parse_kwargs,
    parse_spec,
    spec_slug,
)
from workloads.train.data import DATASETS, build_datasets
from workloads.train.gpt import gpt
from workloads.train.loop import main as train_main
from workloads.train.losses import LOSSES, cross_entropy, eval_entry, eval_sums, output_kind
from workloads.train.models import MODELS, build_model

FAST = "--max-steps 4 --batch-size 32 --epochs 1 --no-profile --device cpu".split()
USER = ["--model", "userpkg.nets:tiny_net", "--dataset", "userpkg.nets:blobs"]


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """The user's folder (outside the repo) as the cwd; userpkg forgotten afterwards."""
    folder = write_user_package(tmp_path / "project")
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield folder
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]


# --- specs and arguments (pure) ----------------------------------------------------------------


def test_spec_forms():
    assert parse_spec("--model", "gpt", BUILTIN_MODELS, torchvision=True).kind == "builtin"
    tv = parse_spec("--model", "torchvision:vit_b_16", BUILTIN_MODELS, torchvision=True)
    assert (tv.kind, tv.module, tv.name) == ("torchvision", "torchvision.models", "vit_b_16")
    imp = parse_spec("--model", "my.pkg.nets:build", BUILTIN_MODELS, torchvision=True)
    assert (imp.kind, imp.module, imp.name) == ("import", "my.pkg.nets", "build")
    # torchvision:NAME is a model form only: for --dataset it is a module called torchvision
    assert parse_spec("--dataset", "torchvision:x", BUILTIN_DATASETS).kind == "import"
    assert spec_slug("my.pkg.nets:build") == "my.pkg.nets-build"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("resnet7", "'resnet7' is not a built-in (resnet18, resnet50, smallcnn, mlp, gpt)"),
        ("mod:", "MODULE:FUNCTION needs a dotted module and a function name"),
        ("a-b:c", "MODULE:FUNCTION needs a dotted module"),
        ("torchvision:a.b", "give a torchvision.models builder"),
    ],
)
def test_bad_specs_name_the_forms(text, match):
    with pytest.raises(SpecError, match=re.escape(match)):
        parse_spec("--model", text, BUILTIN_MODELS, torchvision=True)


def test_kwargs_parse_to_python_values():
    got = parse_kwargs("--model-args", "n_layer=2, lr=1e-3,bias=False,act=gelu,neg=-1")
    assert got == {"n_layer": 2, "lr": 1e-3, "bias": False, "act": "gelu", "neg": -1}
    assert type(got["n_layer"]) is int and type(got["lr"]) is float
    assert parse_kwargs("--model-args", "") == {}
    for bad, match in (("n_layer", "is not k=v"), ("1x=2", "is not k=v"), ("a=1,a=2", "twice")):
        with pytest.raises(SpecError, match=match):
            parse_kwargs("--model-args", bad)


def test_registries_hold_the_builtin_names():
    assert tuple(MODELS) == BUILTIN_MODELS
    assert tuple(DATASETS) == BUILTIN_DATASETS
    assert tuple(LOSSES) == BUILTIN_LOSSES


def test_builtin_image_models_take_any_input_shape():
    x = torch.randn(2, 1, 12, 20)
    for name in ("mlp", "smallcnn"):
        model = build_model(name, num_classes=7, input_shape=(1, 12, 20)).eval()
        assert model(x).shape == (2, 7), name


# --- gpt and tokens ----------------------------------------------------------------------------


def test_gpt_ties_embedding_and_head_and_is_causal():
    torch.manual_seed(0)
    model = gpt(num_classes=50, n_layer=2, n_embd=32, n_head=4, block_size=16).eval()
    assert model.head.weight is model.wte.weight
    # Registered first, so DDP (which buckets in reverse order) puts it in the last bucket.
    assert next(model.parameters()) is model.wte.weight
    # Counted once: wte + wpe + 2 blocks (12 C^2 + 13 C) + ln_f (2 C), C = 32
    c = 32
    assert (
        sum(p.numel() for p in model.parameters())
        == 50 * c + 16 * c + 2 * (12 * c * c + 13 * c) + 2 * c
    )
    idx = torch.randint(50, (3, 10))
    out = model(idx)
    assert out.shape == (3, 10, 50)
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 50  # later tokens must not change earlier logits
    torch.testing.assert_close(model(changed)[:, :6], out[:, :6])
    assert not torch.allclose(model(changed)[:, 6:], out[:, 6:])
    with pytest.raises(ValueError, match='raise it with --model-args "block_size=17"'):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_tokens_follow_a_fixed_bigram_teacher():
    a = build_datasets("tokens", dataset_args={"vocab_size": 64, "seq_len": 12, "num_train": 300})
    b = build_datasets("tokens", dataset_args={"vocab_size": 64, "seq_len": 12, "num_train": 300})
    assert a.num_classes == 64 and len(a.train) == 300 and len(a.test) == 256
    x, y = a.train.tensors
    assert x.shape == y.shape == (300, 12) and x.dtype == torch.long
    torch.testing.assert_close(x[:, 1:], y[:, :-1])  # the target is the input shifted by one
    torch.testing.assert_close(a.train.tensors[0], b.train.tensors[0])  # fixed: no seed, no file
    pairs = torch.stack([x.flatten(), y.flatten()], dim=1).unique(dim=0)
    assert torch.bincount(pairs[:, 0], minlength=64).max() <= 4  # at most 4 successors each


def test_sequence_cross_entropy_flattens_tokens_and_eval_reports_perplexity():
    out, y = torch.randn(4, 6, 10), torch.randint(10, (4, 6))
    flat = torch.nn.functional.cross_entropy(out.reshape(24, 10), y.reshape(24))
    torch.testing.assert_close(cross_entropy(out, y), flat)
    assert output_kind(out, y) == "sequence"
    assert output_kind(out[:, 0], y[:, 0]) == "class_scores"
    assert output_kind(out, out) == "other"
    halves = eval_sums(out[:2], y[:2], cross_entropy) + eval_sums(out[2:], y[2:], cross_entropy)
    rec = eval_entry("sequence", halves.tolist(), epoch=0)
    assert rec["test_loss"] == pytest.approx(float(flat), rel=1e-6)
    assert rec["perplexity"] == pytest.approx(float(flat.exp()), rel=1e-6)
    hits = (out.argmax(-1) == y).sum().item()
    assert rec["top1_pct"] == pytest.approx(100 * hits / 24)
    assert (rec["top5_pct"], rec["tokens"], rec["samples"]) == (None, 24, 4)


# --- bad input: one line naming the spec, exit code 2, nothing written --------------------------


def _one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            ["--model", "userpkg.broken:build"],
            "--model userpkg.broken:build: module userpkg.broken does not import "
            "(ModuleNotFoundError: No module named 'a_module_that_is_not_installed')",
        ),
        (["--model", "userpkg.nets:nothere"], "userpkg.nets has no function nothere (it has: "),
        (
            ["--model", "userpkg.nets:raises"],
            "--model userpkg.nets:raises raised RuntimeError: the factory failed on purpose",
        ),
        (["--model", "userpkg.nets:not_a_module"], "returned str, not a torch.nn.Module"),
        (["--dataset", "userpkg.nets:one_dataset"], "returned TensorDataset, not two datasets"),
        (
            ["--dataset", "userpkg.nets:not_pairs"],
            "train[0] is Tensor, not an (input, target) pair",
        ),
        ([*USER, "--model-args", "hidden"], "--model-args entry 'hidden' is not k=v"),
        ([*USER, "--model-args", "widht=3"], "--model-args widht: userpkg.nets:tiny_net takes no"),
        (
            [*USER, "--loss", "userpkg.nets:vector_loss"],
            "--loss userpkg.nets:vector_loss returned (2,), not a scalar tensor",
        ),
        (["--model", "resnet7"], "--model 'resnet7' is not a built-in"),
        (
            ["--model", "torchvision:resnet7"],
            "resnet7 is not a classification model of torchvision",
        ),
        (["--model", "gpt", "--dataset", "tokens", "--model-args", "vocab_size=10"], "below the"),
        (["--dataset", "tokens", "--dataset-args", "seq=3"], "--dataset-args seq: tokens takes no"),
    ],
)
def test_bad_workloads_fail_with_one_line_before_any_folder(user_dir, capsys, args, match):
    runs = user_dir / "runs"
    assert launcher.main([*FAST, *args, "--mode", "all", "--runs-dir", str(runs)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("python -m workloads.launch: error: ") and match in line
    assert not runs.exists()


def test_train_cli_refuses_a_bad_spec_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        train_main(["--model", "resnet7"])
    assert exit_.value.code == 2
    assert "--model 'resnet7' is not a built-in" in _one_line(capsys.readouterr().err)


@pytest.mark.integration
def test_a_real_launch_from_the_user_folder_refuses_in_one_line(tmp_path):
    """The launcher run where the user works, dpscope on PYTHONPATH: the user's module is found
    there (it imports, then fails on its own missing import) and the exit code is 2."""
    folder = write_user_package(tmp_path / "project")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "workloads.launch", "--model", "userpkg.broken:build", *FAST],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "No module named 'a_module_that_is_not_installed'" in _one_line(proc.stderr)
    assert not (folder / "runs").exists()
