"""Replay a MetaSchedule trace stored in the tuning database.

`mlcpipe tune --tuner metaschedule` (pipeline/tuning/metaschedule.py) keeps the best schedule
MetaSchedule found for a kernel as its trace: the schedule primitives and sampling decisions,
postprocessors included, serialised with TVM's JSON. Replaying it on the same kernel gives the
schedule back without searching again. The trace names blocks and loops as that kernel had
them, so replaying it on another function fails: that kernel then gets the rules' schedule.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir import Schedule, ScheduleError, Trace

RULE_NAME = "MetaSchedule"


def trace_to_json(trace: Trace) -> str:
    """A trace (postprocessors kept) as one JSON string for the tuning database."""
    return tvm.ir.save_json(trace.as_json(remove_postproc=False))


def replay(func: tirx.PrimFunc, trace_json: str) -> Schedule | None:
    """`func` scheduled by the stored trace, or None when the trace does not fit `func`. A stored
    value that is no trace at all raises (ValueError): the database is broken, not the kernel."""
    trace = tvm.ir.load_json(trace_json)
    sch = Schedule(func)
    try:
        Trace.apply_json_to_schedule(trace, sch)
    # recorded on another kernel: a block or loop it names is not there (ScheduleError), or an
    # instruction gets another number of loops / blocks back than it recorded (InternalError)
    except (ScheduleError, tvm.error.InternalError):
        return None
    return sch
