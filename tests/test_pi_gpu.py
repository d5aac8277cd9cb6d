"""Parameter indirection on a GPU: the pointer table, and PI through the grace backend.

Each backend test compiles with ``scg=False`` so that the runner keeps the PI graph whenever it passed
its numeric check, then calls with inputs at new addresses (and new values) and compares with eager.
``grace.stats`` tells which variant ran and what PI recorded.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.gpu


def _compile(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    import torch

    from grace.backend import GraceBackend
    from grace.options import GraceOptions

    cache = tempfile.mkdtemp(prefix="grace-pi-test-")
    return torch.compile(fn, backend=GraceBackend(GraceOptions(scg=False, cache_dir=cache, **options)))


def _records() -> list[dict[str, Any]]:
    import grace

    return [r for r in grace.stats.snapshot() if r.get("graph_hash")]


def _run_moved(fn: Callable[..., Any], make_inputs: Callable[[int], tuple[Any, ...]], calls: int = 4) -> Any:
    """Compile ``fn``, call it on fresh inputs each time, compare every call with eager."""
    import torch

    import grace

    torch._dynamo.reset()
    grace.reset()
    compiled = _compile(fn)
    for seed in range(calls):
        inputs = make_inputs(seed)
        expected = fn(*inputs)
        got = compiled(*inputs)
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3, msg=f"call {seed}")
    return _records()


def _uses_pi(records: list[dict[str, Any]]) -> dict[str, Any]:
    chosen = [r for r in records if r["variant"] == "graph_pi"]
    assert chosen, (
        f"no graph used PI: {[(r['variant'], r.get('skip_reasons'), r.get('pi_stages')) for r in records]}"
    )
    return chosen[0]


def test_pointer_table_copies_only_changes() -> None:
    import torch

    from grace.pi.table import PointerTable

    table = PointerTable(3, torch.device("cuda"))
    assert table.write([16, 32, 48]) is True
    assert table.write([16, 32, 48]) is False
    assert table.write([16, 32, 64]) is True
    torch.cuda.synchronize()
    assert table.device_table.tolist() == [16, 32, 64]
    assert table.address(1) - table.address(0) == 8 and table.address(0) % 16 == 0
    assert (table.copies, table.skipped, table.bytes_per_copy) == (2, 1, 24)


def test_pointwise_inputs_move() -> None:
    import torch

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2 + y).sin()

    def inputs(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator(device="cuda").manual_seed(seed)
        return torch.randn(4096, device="cuda", generator=g), torch.randn(4096, device="cuda", generator=g)

    record = _uses_pi(_run_moved(fn, inputs))
    assert record["pi_bytes_per_replay"] <= 8 * 2  # two inputs, one slot each
    assert any(stage == "patch" and status == "pass" for stage, status, _ in record["pi_stages"])


def test_view_inputs_and_misaligned_views() -> None:
    import torch

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * 3 + 1

    def inputs(seed: int) -> tuple[torch.Tensor, ...]:
        base = torch.randn(
            4096 + 8, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)
        )
        offset = 4 if seed % 2 == 0 else 1  # 16-byte aligned views, then 4-byte aligned ones
        return (base[offset : offset + 4096],)

    _uses_pi(_run_moved(fn, inputs, calls=6))


def test_in_place_mutation_of_an_input() -> None:
    import torch

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(y)
        return x * 2

    import grace

    torch._dynamo.reset()
    grace.reset()
    compiled = _compile(fn)
    for seed in range(4):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x, y = torch.randn(1024, device="cuda", generator=g), torch.randn(1024, device="cuda", generator=g)
        x_eager = x.clone()
        expected = fn(x_eager, y)
        got = compiled(x, y)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(x, x_eager)


@pytest.mark.parametrize("vendor_update", ["host", "device"])
def test_bf16_matmul_uses_the_vendor_path(vendor_update: str) -> None:
    """cuBLAS reads both inputs inside its argument block: updated in the executable graph from the host
    (the default) or by the device prelude; every call at new addresses matches eager."""
    import torch

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    def inputs(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn(1024, 1024, device="cuda", generator=g).to(torch.bfloat16)
        b = torch.randn(1024, 1024, device="cuda", generator=g).to(torch.bfloat16)
        return a, b

    import grace

    torch._dynamo.reset()
    grace.reset()
    compiled = _compile(fn, pi_vendor_update=vendor_update)
    for seed in range(4):
        a, b = inputs(seed)
        torch.testing.assert_close(compiled(a, b), fn(a, b), rtol=2e-2, atol=2e-2)
    record = _uses_pi(_records())
    stages = {(s, st) for s, st, _ in record["pi_stages"]}
    assert ("vendor_match", "pass") in stages and ("vendor_update", "pass") in stages, record["pi_stages"]
    (message,) = [m for s, _, m in record["pi_stages"] if s == "vendor_update"]
    assert message.startswith("host updates" if vendor_update == "host" else "prelude applies"), message


def test_fill_node_serves_the_table_and_never_changes_a_queued_launch() -> None:
    """``pi_table_update="node"``: the table is written by the graph's fill node, whose parameters are
    updated on the executable graph per call. Calls on different input sets are queued behind a long
    kernel without synchronisation: each replay must read its own call's addresses, so an update made
    for call k+1 must not reach replay k, still waiting in the queue."""
    import torch

    import grace

    def fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return torch.relu(a * 2 + b) * c - d.sin()

    def inputs(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator(device="cuda").manual_seed(seed)
        return tuple(torch.randn(1 << 16, device="cuda", generator=g) for _ in range(4))

    torch._dynamo.reset()
    grace.reset()
    compiled = _compile(fn, pi_table_update="node")
    for seed in range(3):  # warm-up, the deciding call, one steady call; inputs move each time
        args = inputs(seed)
        torch.testing.assert_close(compiled(*args), fn(*args), msg=f"call {seed}")
    record = _uses_pi(_records())
    table = [(status, message) for stage, status, message in record["pi_stages"] if stage == "table"]
    assert table and table[-1][0] == "pass" and table[-1][1].startswith("node:"), record["pi_stages"]
    assert record["pi_bytes_per_replay"] <= 8 * 4

    sets = [inputs(100 + k) for k in range(8)]
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # keeps the stream busy while the calls below are queued
    outs = [compiled(*args).clone() for args in sets]  # outputs live in the graph's pool: copy each
    torch.cuda.synchronize()
    for k, (args, out) in enumerate(zip(sets, outs, strict=True)):
        torch.testing.assert_close(out, fn(*args), msg=f"queued call {k}")


def test_a_pi_graph_of_inputs_sharing_a_storage_keeps_no_placeholders() -> None:
    """Note: [A PI graph alone] and [Placeholders PI serves]: of two views of one storage the direct PI
    graph reads the first in place and the second from a placeholder of its own (PI tells uses apart
    by storage); bound, it lets that go (the memory held past the call is the graph's output alone),
    follows new storages through its table, and a misaligned view (a call PI cannot serve) gets new
    placeholders, right as eager."""
    import torch

    import grace

    n = 4 << 20  # 16 MiB per view

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 2 + b

    def inputs(seed: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator(device="cuda").manual_seed(seed)
        base = torch.randn(2 * n + 8, device="cuda", generator=g)
        return base[offset : offset + n], base[offset + n : offset + 2 * n]

    torch._dynamo.reset()
    grace.reset()
    compiled = _compile(fn)
    held_after: list[int] = []  # allocated past each call, beyond what was before and the inputs' storage
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    for seed, offset in ((0, 0), (0, 0), (0, 0), (1, 0), (2, 1), (3, 0), (4, 1)):
        a, b = inputs(seed, offset)
        expected = fn(a, b)
        got = compiled(a, b)
        torch.testing.assert_close(got, expected, msg=f"seed {seed}, offset {offset}")
        del got, expected
        torch.cuda.synchronize()
        held_after.append(torch.cuda.memory_allocated() - baseline - a.untyped_storage().nbytes())
        del a, b
    record = _uses_pi(_records())
    assert not any(r["code"] == "pi_direct_declined" for r in record["skip_reasons"]), record["skip_reasons"]
    view_bytes = 4 * n
    # the third call is the first steady one: only the graph's output (one view's size) stays
    assert held_after[2] <= view_bytes + (1 << 20), held_after
