"""The runs JSON (`dpscope runs --json`, the report's summary.json; docs/reference/schemas.md) read
back typed: every run and group entry, family comparison, tune, comm run, projection and "what DDP adds" diff as a
Struct, so that whoever shows it reads attributes, never keys.

`read_runs_json` accepts what `compare_runs` returns, an older or hand-built runs JSON (a field
it lacks reads as empty, as `RunEntry`'s and `GroupEntry`'s defaults say) or a `RunsJson`
itself. Nested parts the report shows as they are (each run's traces JSON, memory entries and
breakdown) stay JSON objects on the entries; analysis.runs reads them into typed rows.
"""

from __future__ import annotations

from typing import Any

import msgspec

from analysis.project.view import CommEntry, ProjectionEntry, SkippedInput
from analysis.runs.entry import RunEntry, is_measured
from analysis.runs.familyview import FamilyEntry
from analysis.runs.groups import GroupEntry
from analysis.runs.opdiff import DdpAdds
from analysis.runs.tune import TuneEntry
from profiler.runfolder.errors import UserError

__all__ = ["InvalidEntry", "RunsJson", "RunsJsonError", "read_runs_json"]


class InvalidEntry(msgspec.Struct, kw_only=True):
    """A run folder that broke the run-folder contract (`invalid[]`): never analysed."""

    path: str = ""
    file: str | None = None
    field: str | None = None
    problem: str | None = None
    reason: str = ""


class RunsJson(msgspec.Struct, kw_only=True):
    """The runs JSON, typed, in its key order (docs/reference/schemas.md "runs JSON")."""

    schema_version: int | None = None
    runs: list[RunEntry] = []
    groups: list[GroupEntry] = []
    ddp_adds: list[DdpAdds] = []
    family: list[FamilyEntry] = []  # analysis.runs.family: ZeRO-1 and FSDP2 against DDP
    skipped: list[SkippedInput] = []
    tunes: list[TuneEntry] = []
    comm: list[CommEntry] = []
    projections: list[ProjectionEntry] = []
    projection_skipped: list[SkippedInput] = []
    invalid: list[InvalidEntry] = []
    warnings: list[str] = []

    def measured(self) -> list[RunEntry]:
        """The runs whose numbers count (ok or interrupted, analysis.runs.entry.is_measured)."""
        return [r for r in self.runs if is_measured(r)]

    def by_id(self, *, measured: bool = False) -> dict[str, RunEntry]:
        """run_id -> run entry, of every run or of the measured ones."""
        return {r.run_id: r for r in (self.measured() if measured else self.runs)}

    def members(self, group: GroupEntry, *, measured: bool = True) -> list[RunEntry]:
        """The run entries a group pools, in its order (measured ones by default)."""
        runs = self.by_id(measured=measured)
        return [runs[r] for r in group.run_ids if r in runs]


class RunsJsonError(UserError):
    """A runs JSON that does not decode as one (a field of the wrong type): one line."""


def read_runs_json(data: dict[str, Any] | RunsJson) -> RunsJson:
    """The runs JSON `data` as a RunsJson; raises RunsJsonError naming the bad field."""
    if isinstance(data, RunsJson):
        return data
    try:
        return msgspec.convert(data, RunsJson)
    except msgspec.ValidationError as err:
        raise RunsJsonError(
            f"runs JSON: {err} — pass the output of `dpscope runs --json` (compare_runs)"
        ) from None
