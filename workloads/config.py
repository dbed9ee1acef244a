"""The training configuration: one keyword-only dataclass and its CLI (its run.json record:
workloads.record; its layout: workloads.plan).

`TrainConfig` is the single source of truth for the flags of `python -m workloads.train`; the
launcher builds its parser from the same fields (`add_config_arguments`) and hands the validated
config to every rank with `to_argv`, so the two CLIs cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from profiler.runfolder.errors import OneLineParser  # re-exported: the launcher and train use it,
from profiler.runfolder.layout import validate_run_id
from profiler.runfolder.schema import MODES, PROCESS_GROUP_MODES
from profiler.session import ProfileConfig
from workloads.spec import (
    BUILTIN_DATASETS,
    BUILTIN_LOSSES,
    BUILTIN_MODELS,
    Spec,
    parse_kwargs,
    parse_spec,
    spec_slug,
)

__all__ = [
    "MODES",
    "OneLineParser",
    "PROCESS_GROUP_MODES",
    "TrainConfig",
    "add_config_arguments",
    "config_from_namespace",
    "default_run_id",
    "to_argv",
]

COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
EVAL_BATCH = 256
"""Samples per evaluation batch (each rank's shard of the test split is read in these)."""
# Finite ranges of the float options: (flag field, low, high, low inclusive); nan/inf never pass.
_FLOAT_RANGES = (
    ("lr", 0.0, 1e6, True),
    ("momentum", 0.0, 1e6, True),
    ("weight_decay", 0.0, 1e6, True),
    ("bucket_cap_mb", 0.0, 1 << 20, False),  # MiB: (0, 1 TiB]
    ("collective_timeout", 0.0, 7 * 24 * 3600.0, False),  # s: (0, one week]
)


def _opt(default: Any, help: str, choices: tuple | None = None) -> Any:  # noqa: A002
    """A dataclass field whose help text doubles as its one-line doc and its CLI help."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(kw_only=True)
class TrainConfig:
    """Everything one training run needs; validated once, identical on every rank."""

    mode: str = _opt(
        "single",
        "single | dp (nn.DataParallel) | ddp (one process per device) | fsdp (FSDP2 fully_shard, "
        "one process per device)",
        MODES,
    )
    backend: str = _opt(
        "auto", "process-group backend for ddp: auto | nccl | gloo", ("auto", "nccl", "gloo")
    )
    device: str = _opt("auto", "auto (CUDA when present) | cpu | cuda", ("auto", "cpu", "cuda"))
    dp_gpus: int = _opt(0, "GPUs nn.DataParallel spreads over (0 = all visible)")
    model: str = _opt(
        "resnet18",
        f"model: a built-in ({' | '.join(BUILTIN_MODELS)}), torchvision:NAME (a "
        "torchvision.models classification builder) or MODULE:FUNCTION (your factory)",
    )
    model_args: str = _opt(
        "", 'keyword arguments for the model factory, "k=v,..." (ints, floats, bools, strings)'
    )
    dataset: str = _opt(
        "synthetic",
        f"dataset: a built-in ({' | '.join(BUILTIN_DATASETS)}) or MODULE:FUNCTION returning "
        "(train, test) datasets of (input, target) pairs",
    )
    dataset_args: str = _opt("", 'keyword arguments for the dataset factory, "k=v,..."')
    loss: str = _opt(
        "cross_entropy",
        f"loss: {' | '.join(BUILTIN_LOSSES)} or MODULE:FUNCTION(output, target) -> scalar tensor",
    )
    data_dir: str = _opt("data", "folder holding cifar10/cifar100 (torchvision layout)")
    download: bool = _opt(
        False, "download cifar10/cifar100 into --data-dir if absent (needs internet)"
    )
    epochs: int = _opt(1, "training epochs (the run stops at --max-steps first if that is set)")
    max_steps: int = _opt(0, "maximum optimizer steps over the whole run (0 = no limit)")
    batch_size: int = _opt(64, "GLOBAL batch for --scaling strong; per-device batch for weak")
    scaling: str = _opt(
        "strong", "strong: fixed global batch | weak: fixed per-device batch", ("strong", "weak")
    )
    grad_accum_steps: int = _opt(
        1,
        "micro-batches per optimizer step (gradient accumulation; DDP all-reduces once per step, "
        "the others run under no_sync): global batch = per-device micro-batch x world x K, so "
        "--batch-size keeps its meaning and each device's share is split into K micro-batches",
    )
    lr: float = _opt(0.05, "SGD learning rate")
    momentum: float = _opt(0.9, "SGD momentum")
    weight_decay: float = _opt(5e-4, "SGD weight decay")
    amp: str = _opt(
        "none",
        "autocast dtype: none | bf16 | fp16 (GradScaler on CUDA fp16)",
        ("none", "bf16", "fp16"),
    )
    sync_bn: bool = _opt(False, "convert BatchNorm to SyncBatchNorm under ddp")
    num_workers: int = _opt(0, "DataLoader worker processes per rank")
    threads: int = _opt(
        0, "torch threads per rank (0 = CPU cores ÷ processes per node; GPU: torch's)"
    )
    pin_memory: bool = _opt(False, "DataLoader pin_memory (useful with CUDA)")
    seed: int = _opt(0, "seed of model init and of the global data order (one run per seed)")
    warmup_steps: int = _opt(2, "first steps kept out of throughput (marked warmup=1 in steps.csv)")
    bucket_cap_mb: float = _opt(25.0, "DDP gradient bucket size in MiB")
    gradient_as_bucket_view: bool = _opt(
        False, "DDP: gradients are views into the buckets (saves a copy)"
    )
    static_graph: bool = _opt(False, "DDP static_graph")
    find_unused_parameters: bool = _opt(False, "DDP find_unused_parameters")
    comm_hook: str = _opt("none", "DDP gradient communication hook", COMM_HOOKS)
    zero: int = _opt(
        0,
        "ZeRO stage of --mode ddp's optimizer: 0 = none, 1 = ZeroRedundancyOptimizer (each rank "
        "keeps the optimizer state of its share of the parameters)",
        (0, 1),
    )
    fsdp_wrap: str = _opt(
        "",
        "--mode fsdp: the classes fully_shard wraps, MODULE:CLASS[,...] (default: each element of "
        "the model's top-level ModuleList/Sequential containers, e.g. gpt's blocks)",
    )
    fsdp_reshard_after_forward: str = _opt(
        "true",
        "--mode fsdp: free each block's gathered parameters after its forward (true: ZeRO-3-like, "
        "all-gathered again in backward) or keep them until backward (false: ZeRO-2-like)",
        ("true", "false"),
    )
    profile: bool = _opt(True, "trace with torch.profiler (--no-profile for overhead comparisons)")
    profile_wait: int = _opt(1, "profiler schedule: steps skipped per cycle")
    profile_warmup: int = _opt(1, "profiler schedule: traced-but-discarded steps per cycle")
    profile_active: int = _opt(3, "profiler schedule: recorded steps per cycle")
    profile_repeat: int = _opt(1, "profiler schedule: cycles (0 = until the run ends)")
    profile_with_stack: bool = _opt(False, "record Python stacks in traces (much larger files)")
    checkpoint: bool = _opt(False, "save checkpoint.pt (rank 0, atomic) after every epoch")
    checkpoint_every: int = _opt(
        0,
        "also save checkpoint.pt every N optimizer steps (0 = off); a restarted job resumes there",
    )
    save_final: bool = _opt(False, "save final.pt (the model's state_dict) at the end of the run")
    eval_batches: int = _opt(
        50,
        f"evaluation covers at most this many batches of {EVAL_BATCH} test samples per epoch "
        "(the first ones of the test split, split over the ranks; 0 = the whole test split)",
    )
    stop_on_nonfinite: bool = _opt(
        True, "stop the run (error.kind diverged) when a step's loss is NaN or infinite"
    )
    collective_timeout: float = _opt(
        300.0,
        "seconds a collective (and the launcher's heartbeat watchdog) waits before the run is "
        "declared hung",
    )
    init_method: str = _opt(
        "", "process-group init_method, e.g. file:///path (default: torchrun env://)"
    )
    runs_dir: str = _opt("runs", "folder that receives one run folder per run")
    run_id: str = _opt(
        "", "run folder name (default: <mode>-<backend>-<model>-<dataset>-n<world>-s<seed>-<time>)"
    )
    sweep_id: str = _opt("", "the sweep this run belongs to (set by `make profile-sweep`)")
    repeat_id: str = _opt("", "the `--repeat` rounds this run belongs to (set by the launcher)")
    repeat_round: int = _opt(0, "this run's round of `--repeat`, from 0 (set by the launcher)")

    def __post_init__(self) -> None:
        for name in (
            "mode",
            "backend",
            "device",
            "scaling",
            "amp",
            "comm_hook",
            "zero",
            "fsdp_reshard_after_forward",
        ):
            choices = _FIELDS[name].metadata["choices"]
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"--{_flag(name)} must be one of {', '.join(map(str, choices))}; got "
                    f"{getattr(self, name)!r}"
                )
        # Spec syntax only (nothing imported): the launcher's check_workload calls the factories.
        self.model_spec(), self.dataset_spec(), self.loss_spec()
        self.model_kwargs(), self.dataset_kwargs()
        for name in ("epochs", "batch_size", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{_flag(name)} must be >= 1; got {getattr(self, name)}")
        for name in (
            "max_steps",
            "num_workers",
            "threads",
            "warmup_steps",
            "checkpoint_every",
            "repeat_round",
            "dp_gpus",
            "eval_batches",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"--{_flag(name)} must be >= 0; got {getattr(self, name)}")
        self._check_floats()
        if self.max_steps and self.warmup_steps >= self.max_steps:
            raise ValueError(
                f"--warmup-steps ({self.warmup_steps}) leaves no measured step of --max-steps "
                f"({self.max_steps}); raise --max-steps or lower --warmup-steps"
            )
        if self.init_method and not self.init_method.startswith(("file://", "tcp://", "env://")):
            raise ValueError(
                f"--init-method must start with file://, tcp:// or env://; got {self.init_method!r}"
            )
        self._check_family()
        ProfileConfig(**self.profile_kwargs())  # bad schedules fail here, before any folder exists
        if self.run_id:
            validate_run_id(self.run_id)  # the same rule for every writer (profiler.runfolder)

    def _check_floats(self) -> None:
        """Each float option finite and in its range (_FLOAT_RANGES), named by its flag."""
        for name, low, high, inclusive in _FLOAT_RANGES:
            value = getattr(self, name)
            above = value >= low if inclusive else value > low
            if not (math.isfinite(value) and above and value <= high):
                bracket = "[" if inclusive else "("
                raise ValueError(
                    f"--{_flag(name)} must be a finite number in {bracket}{low:g}, {high:g}]; "
                    f"got {value}"
                )

    def _check_family(self) -> None:
        """The data-parallel family's options belong to their modes (one line each)."""
        if self.zero and self.mode != "ddp":
            why = "FSDP already shards the optimizer state" if self.mode == "fsdp" else ""
            raise ValueError(
                f"--zero {self.zero} shards DDP's optimizer state, so it needs --mode ddp (got "
                f"--mode {self.mode}{'; ' + why if why else ''}); drop --zero or use --mode ddp"
            )
        if self.mode != "fsdp" and (self.fsdp_wrap or not self.reshard_after_forward):
            flag = "--fsdp-wrap" if self.fsdp_wrap else "--fsdp-reshard-after-forward false"
            raise ValueError(f"{flag} applies to --mode fsdp (got --mode {self.mode}); drop it")
        if self.mode == "fsdp" and self.sync_bn:
            raise ValueError("--sync-bn converts BatchNorm for DDP; drop it with --mode fsdp")
        self.fsdp_classes()

    @property
    def reshard_after_forward(self) -> bool:
        """--fsdp-reshard-after-forward as a bool."""
        return self.fsdp_reshard_after_forward == "true"

    def fsdp_classes(self) -> list[tuple[str, str]]:
        """--fsdp-wrap as (module, class) pairs (syntax only; workloads.train.sharding imports
        them)."""
        names = [w.strip() for w in self.fsdp_wrap.split(",") if w.strip()]
        bad = [n for n in names if not _CLASS_SPEC.fullmatch(n)]
        if bad or (self.fsdp_wrap and not names):
            raise ValueError(
                f"--fsdp-wrap {self.fsdp_wrap!r}: name classes as MODULE:CLASS[,...], e.g. "
                "mypkg.nets:Block,torch.nn:TransformerEncoderLayer"
            )
        return [tuple(n.split(":", 1)) for n in names]  # type: ignore[misc]

    def model_spec(self) -> Spec:
        return parse_spec("--model", self.model, BUILTIN_MODELS, torchvision=True)

    def dataset_spec(self) -> Spec:
        return parse_spec("--dataset", self.dataset, BUILTIN_DATASETS)

    def loss_spec(self) -> Spec:
        return parse_spec("--loss", self.loss, BUILTIN_LOSSES)

    def model_kwargs(self) -> dict:
        """--model-args as keyword arguments (workloads.spec.parse_kwargs)."""
        return parse_kwargs("--model-args", self.model_args)

    def dataset_kwargs(self) -> dict:
        """--dataset-args as keyword arguments."""
        return parse_kwargs("--dataset-args", self.dataset_args)

    @property
    def rendezvous(self) -> str:
        """run.json `config.rendezvous`: `file` for a file:// init_method, else `c10d` (TCP store)."""
        return "file" if self.init_method.startswith("file://") else "c10d"

    def profile_kwargs(self) -> dict:
        """Keyword arguments for profiler.session.ProfileConfig."""
        return {
            "enabled": self.profile,
            "wait": self.profile_wait,
            "warmup": self.profile_warmup,
            "active": self.profile_active,
            "repeat": self.profile_repeat,
            "with_stack": self.profile_with_stack,
        }


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_CLASS_SPEC = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*")


def _flag(name: str) -> str:
    return name.replace("_", "-")


def add_config_arguments(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = ()) -> None:
    """Add one `--flag` per TrainConfig field (booleans get `--x/--no-x`), defaults as in the class."""
    for f in dataclasses.fields(TrainConfig):
        if f.name in exclude:
            continue
        kwargs: dict[str, Any] = {"default": f.default, "help": f.metadata["help"], "dest": f.name}
        if isinstance(f.default, bool):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = type(f.default)
            if f.metadata["choices"]:
                kwargs["choices"] = f.metadata["choices"]
        parser.add_argument(f"--{_flag(f.name)}", **kwargs)


def config_from_namespace(ns: argparse.Namespace, **overrides: Any) -> TrainConfig:
    """Build (and so validate) a TrainConfig from parsed arguments plus explicit overrides."""
    values = {name: getattr(ns, name) for name in _FIELDS if hasattr(ns, name)}
    values.update(overrides)
    return TrainConfig(**values)


def to_argv(cfg: TrainConfig) -> list[str]:
    """The `workloads.train` command line that reproduces `cfg` exactly."""
    argv: list[str] = []
    for f in dataclasses.fields(TrainConfig):
        value = getattr(cfg, f.name)
        if isinstance(value, bool):
            argv.append(f"--{_flag(f.name)}" if value else f"--no-{_flag(f.name)}")
        else:
            argv += [f"--{_flag(f.name)}", str(value)]
    return argv


def default_run_id(cfg: TrainConfig, *, backend: str, world_size: int | None) -> str:
    """`<mode>-<backend>-<model>-<dataset>-n<world_size>-s<seed>-<YYYYmmddTHHMMSS>` (UTC); n0 for
    a skipped run whose device count is unknown (DP without GPUs). The mode is `ddp-zero1` for
    ZeRO-1 and `fsdp-keep` for FSDP without resharding after forward."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    n = world_size or 0
    model, dataset = spec_slug(cfg.model), spec_slug(cfg.dataset)  # `a.b:f` -> `a.b-f`
    mode = cfg.mode + (f"-zero{cfg.zero}" if cfg.zero else "")
    mode += "-keep" if cfg.mode == "fsdp" and not cfg.reshard_after_forward else ""
    return f"{mode}-{backend}-{model}-{dataset}-n{n}-s{cfg.seed}-{stamp}"
