"""A small results store the report's and the paper comparison's tests fill by hand."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from matrix.store.db import open_store
from matrix.store.models import Cell, CorrectnessResult, PerformanceResult, Run, Workload

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)


class Store:
    def __init__(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path / 'store.sqlite'}"
        self.Session = open_store(self.url)
        self.workloads: dict[str, Workload] = {}

    def cell(self, session: Session, cell_id: str = "torch-2.11") -> Cell:
        cell = Cell(
            fingerprint=uuid.uuid4().hex, cell_id=cell_id, kind="current", torch_version="2.11.0",
            triton_version="3.6.0", cuda_runtime="13.0", gpu_name="NVIDIA H200", python_version="3.11",
            platform="linux-x86_64",
        )  # fmt: skip
        session.add(cell)
        session.flush()
        return cell

    def run(self, session: Session, cell: Cell, minutes: int) -> Run:
        run = Run(
            uid=str(uuid.uuid4()), cell=cell, started_at=T0 + dt.timedelta(minutes=minutes), status="complete"
        )
        session.add(run)
        session.flush()
        return run

    def workload(self, session: Session, name: str, tier: str = "standard") -> Workload:
        key = name if tier == "standard" else f"{name}@{tier}"
        if key not in self.workloads:
            wl = Workload(name=name, code_hash=f"abc-{tier}", tier=tier, tags=[])
            session.add(wl)
            session.flush()
            self.workloads[key] = wl
        return self.workloads[key]

    def results(
        self, session: Session, run: Run, name: str, medians: dict[str, float | None], **extra: Any
    ) -> None:
        wl = self.workload(session, name, extra.get("tier", "standard"))
        for mode, median in medians.items():
            key = f"{name}-{wl.tier}-{mode}"
            status = extra.get("correctness", {}).get(mode, "pass")
            reason = extra.get("reasons", {}).get(mode)
            session.add(CorrectnessResult(run=run, workload=wl, mode=mode, status=status, reason=reason,
                                          record_key=f"c-{key}"))  # fmt: skip
            session.add(
                PerformanceResult(
                    run=run, workload=wl, mode=mode, record_key=f"p-{key}",
                    status="ok" if median is not None else "skip", median_ms=median,
                    samples_ms=[median] * 30 if median is not None else [], floor_ms=0.5, compile_s=2.0,
                    kernels_in_graphs=7 if mode.startswith(("pt2cg", "grace")) else 0,
                    kernel_launches=1, graph_launches=1, copy_bytes_per_replay=4096,
                    details=extra.get("details", {}).get(mode, {}),
                )
            )  # fmt: skip
