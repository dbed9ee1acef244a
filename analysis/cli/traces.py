"""`traces DIR` and `merge PART...`: the options of the trace analysis (where it runs, what it
writes) and the shard path. The tables are printed by main.print_traces."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from analysis.cli.table import say
from analysis.outputs import check_json_out
from analysis.trace.cache import cache_enabled
from analysis.trace.executors import EXECUTORS, Executor
from analysis.trace.folder import analyze_trace_dir, find_trace_files
from analysis.trace.shard import merge_parts, parse_shard, part_json, reduce_shard
from profiler.runfolder.errors import InputError

__all__ = ["add_parsers", "check_outputs", "run_merge", "run_shard", "run_traces", "write_parquet"]


def add_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    t = sub.add_parser("traces", help="analyse one folder of per-rank Kineto traces")
    t.add_argument("trace_dir", type=Path)
    t.add_argument("--workers", type=int, default=None, help="load processes (default: cores)")
    t.add_argument(
        "--shard",
        default=None,
        metavar="K/N",
        help="reduce only shard K of N (files by sorted path, i mod N) into a part for `merge`"
        " (a JSON part, or Parquet when --json ends in .parquet)",
    )
    t.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="process",
        help="where the per-rank reductions run: local processes (default) or a Dask cluster",
    )
    where = t.add_mutually_exclusive_group()
    where.add_argument(
        "--scheduler", default=None, metavar="ADDRESS", help="Dask scheduler (tcp://host:8786)"
    )
    where.add_argument(
        "--scheduler-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="Dask scheduler file (`dask scheduler --scheduler-file FILE`)",
    )
    t.add_argument(
        "--cache",
        action="store_true",
        help="keep each rank's summary in .dpscope-cache/ beside its trace (also"
        " DPSCOPE_TRACE_CACHE=1): a second analysis of unchanged traces skips decoding",
    )
    m = sub.add_parser("merge", help="merge the parts of `traces DIR --shard K/N` into one JSON")
    m.add_argument("parts", type=Path, nargs="+", metavar="PART")
    for s in (t, m):
        s.add_argument(
            "--parquet",
            type=Path,
            default=None,
            metavar="DIR",
            help="also write steps/collectives/ops/memory .parquet tables into DIR",
        )
    return [t, m]


def _executor(args: argparse.Namespace) -> Executor:
    if args.workers is not None and args.workers < 1:
        raise InputError("--workers", f"{args.workers} is not >= 1", "pass --workers 1 or more")
    return Executor(
        kind=args.executor,
        scheduler=args.scheduler,
        scheduler_file=args.scheduler_file,
        cache=cache_enabled(True if args.cache else None),
    )


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse a bad --json or --parquet before any work."""
    if args.command == "traces":
        _executor(args)  # a bad option combination is one line before any file is read
        if args.json is not None:
            files = find_trace_files(args.trace_dir)
            folders = [args.trace_dir] if args.trace_dir.is_dir() else []
            check_json_out(args.json, files, folders)
    elif args.json is not None:  # merge: never over one of the parts being merged
        check_json_out(args.json, args.parts)
    out = getattr(args, "parquet", None)
    if out is not None:
        if getattr(args, "shard", None) is not None:
            raise InputError(
                "--parquet", "is for whole results, not parts", "merge the parts, then --parquet"
            )
        blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None or str(out) in ("", "."):
            why = f"{blocker} is a file, not a folder" if blocker else "not a folder name"
            raise InputError(
                out, f"cannot write the Parquet tables ({why})", "pass a folder to --parquet"
            )


def write_parquet(result: dict, out: Path | None) -> None:
    """The four Parquet tables of a traces result into `out` (nothing when None)."""
    if out is None:
        return
    from analysis.parquet import trace_tables, write_tables

    paths = write_tables(trace_tables(result), out)
    say(f"wrote {', '.join(p.name for p in paths)} into {out}{os.sep}")


def run_traces(args: argparse.Namespace, progress: bool) -> dict:
    return analyze_trace_dir(
        args.trace_dir,
        workers=args.workers,
        progress=progress,
        executor=_executor(args),
        clock_align=args.clock_align,
    )


def run_merge(args: argparse.Namespace) -> dict:
    return merge_parts(args.parts, clock_align=args.clock_align)


def run_shard(args: argparse.Namespace, progress: bool, write_json) -> int:
    """`traces DIR --shard K/N --json PART`: write shard K's part (JSON, or Parquet by suffix);
    no tables (a part is half-done)."""
    parse_shard(args.shard)  # a bad K/N is one line before any file is read
    if args.json is None:
        raise InputError(
            "--shard", "needs --json PART to write the part to", "add --json part-K.json"
        )
    header, summaries = reduce_shard(
        args.trace_dir,
        args.shard,
        workers=args.workers,
        progress=progress,
        executor=_executor(args),
    )
    if args.json.suffix == ".parquet":
        from analysis.trace.shard import write_parquet_part

        try:
            write_parquet_part(header, summaries, args.json)
        except OSError as err:
            raise InputError(
                args.json, f"cannot write the part ({err.strerror})", "pass a writable path"
            ) from None
    else:
        write_json(part_json(header, summaries), args.json)
    say(
        f"shard {header['shard']}/{header['shards']}: {len(header['shard_files'])} of "
        f"{len(header['files'])} files, {len(summaries)} reduced, "
        f"{len(header['skipped'])} skipped; wrote {args.json}"
    )
    for s in header["skipped"]:
        say(f"  skipped {s['file']}: {s['reason']}")
    return 0
