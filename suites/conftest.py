"""pytest wiring of the suites: options, the ``grace_record`` fixture, parametrisation and ordering.

Invariants:
- No torch import at import time (nor in hooks that every cell runs): Triton-only cells run
  suites/test_pi_stages.py through this file without torch. Only the parametrisation of tests that ask
  for ``workload_name`` imports the workload registry.
- Records leave a test only through ``grace_record`` as ``(USER_PROPERTY_KEY, record.to_property())``
  user properties, which pytest and pytest-xdist carry to the recording plugin.
- Tests are ordered workload by workload (correctness, then performance) so one process builds and
  compiles each workload once; performance tests share the xdist group ``gpu-performance`` so that with
  ``--dist loadgroup`` no two of them ever run at the same time (they would share the GPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from suites.options import SuiteOptions, add_options
from suites.records import USER_PROPERTY_KEY, Record
from suites.tp.options import add_tp_options


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)
    add_tp_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "xdist_group(name): run in one pytest-xdist worker (--dist loadgroup)")
    config.stash[_STARTED] = set()
    config.stash[_T0] = time.monotonic()
    try:
        overrides = dict(SuiteOptions.from_config(config).grace_options)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    if overrides:  # only then is grace (and torch) imported here
        from suites.modes import set_grace_overrides

        try:
            set_grace_overrides(overrides)
        except Exception as exc:
            raise pytest.UsageError(f"--grace-option: {exc}") from exc


_STARTED = pytest.StashKey[set[str]]()
_T0 = pytest.StashKey[float]()


@pytest.fixture
def grace_record(request: pytest.FixtureRequest) -> Callable[[Record], None]:
    """Call with a record from suites.records; the recorder stores it with this test's outcome."""

    def record(item: Record) -> None:
        request.node.user_properties.append((USER_PROPERTY_KEY, item.to_property()))

    return record


@pytest.fixture(scope="session")
def suite_options(pytestconfig: pytest.Config) -> SuiteOptions:
    return SuiteOptions.from_config(pytestconfig)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "workload_name" not in metafunc.fixturenames:
        return
    from suites.modes import SPECS, parse_modes
    from suites.workloads import select

    options = SuiteOptions.from_config(metafunc.config)
    names = [wl.name for wl in select(options.workloads)]
    if "mode" in metafunc.fixturenames:  # the correctness suite: every mode that runs a model
        params = [
            pytest.param(
                name, mode.value, id=f"{name}-{mode.value}", marks=pytest.mark.xdist_group(f"wl-{name}")
            )
            for name in names
            for mode in parse_modes(options.modes)
            if not SPECS[mode].timing_reference
        ]
        metafunc.parametrize(("workload_name", "mode"), params)
    else:
        metafunc.parametrize("workload_name", names)


def _workload_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("workload_name") if callspec is not None else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order: dict[str, int] = {}
    for item in items:
        name = _workload_of(item)
        if name is not None and name not in order:
            order[name] = len(order)
    items.sort(key=lambda item: -1 if _workload_of(item) is None else order[_workload_of(item) or ""])


def pytest_runtest_setup(item: pytest.Item) -> None:
    name = _workload_of(item)
    if name is None:
        return
    started = item.config.stash[_STARTED]
    budget = item.config.getoption("--time-budget-s")
    if name not in started and budget and time.monotonic() - item.config.stash[_T0] > budget:
        pytest.skip(f"time budget of {budget:g} s exhausted before workload {name} started")
    started.add(name)
