"""Random small models for the differential fuzzer, generated as Python source from a seed.

Problem: the fuzzer needs many different models that reach the edges grace must handle (in-place
mutation of inputs through several ops, views and slices at offsets, reductions, matmuls, buffers and
CPU tensor attributes, random ops, several outputs, outputs aliasing inputs), each tiny enough that a
case compiles and runs in seconds, and each replayable from its seed alone.

Design: ``generate_model(rng, max_ops)`` draws a ``ModelSpec``: the inputs (2-D tensors that share a
row count ``R`` which calls may change, and 0-d scalar inputs), the module's Linear layers, buffers and
CPU tensor attributes, and the body of ``forward`` as source lines. Values are tracked with their
shapes (rows ``R - k`` or 1, a fixed column count), so every generated line is valid for every ``R``
in ``ModelSpec.row_choices``. ``build_module`` turns a spec into an ``nn.Module`` whose ``forward`` is
the generated source (registered with ``linecache`` so tracebacks show it); weights come from the
spec's own seed, so two builds are equal and independent (eager and grace each get one).

Invariants: the generator consumes only ``rng``; a spec is plain data (``to_dict``) and its source is
the model; no line depends on data values (no ``.item()``, no data-dependent control flow), so Dynamo
traces each model as one graph.
"""

from __future__ import annotations

import linecache
import random
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

ROW_CHOICES = (4, 5, 6, 7)  # every generated line is valid for each of these row counts
MAX_ROW_OFFSET = 2  # slices on rows keep at least R - 2 rows
COLS = (3, 4, 5, 8)
LINEAR_OUT = (2, 3, 4, 6)


@dataclass(frozen=True)
class Value:
    """A tensor the forward has computed: its name and shape (rows None means 1, else R - rows)."""

    name: str
    rows: int | None
    cols: int | None  # None: a 0-d scalar
    base: str | None = None  # the input this value may view (an in-place op on it must not read it)


@dataclass(frozen=True)
class ModelSpec:
    """One generated model: everything ``build_module`` and the schedule generator need."""

    seed: int
    dtype: str
    inputs: tuple[tuple[str, int | None], ...]  # (name, cols); cols None: a 0-d scalar input
    linears: tuple[tuple[int, int], ...]  # (in, out) of self.lin<k>
    buffers: tuple[int, ...]  # cols of self.buf<k> (1-D, on the model's device)
    cpu_attributes: tuple[int | None, ...]  # cols of self.cpu<k> (a CPU tensor; None: 0-d)
    body: tuple[str, ...]
    outputs: tuple[str, ...]
    mutated_inputs: tuple[str, ...] = ()
    mutates_state: bool = False  # a buffer is updated in place
    random_ops: bool = False
    features: tuple[str, ...] = field(default_factory=tuple)  # what the model exercises (for the record)

    @property
    def source(self) -> str:
        params = ", ".join(["self", *(name for name, _ in self.inputs)])
        lines = [f"def forward({params}):", *(f"    {line}" for line in self.body)]
        lines.append(f"    return ({', '.join(self.outputs)},)")
        return "\n".join(lines) + "\n"

    @property
    def pure(self) -> bool:
        """Calls are independent of each other and of the global generator (safe from two threads)."""
        return not self.mutates_state and not self.random_ops

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["source"] = self.source
        return data


class _Builder:
    """The generator's state while it draws one model (values in scope, module members)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.values: list[Value] = []
        self.body: list[str] = []
        self.linears: list[tuple[int, int]] = []
        self.buffers: list[int] = []
        self.cpu_attributes: list[int | None] = []
        self.mutated: list[str] = []
        self.features: set[str] = set()
        self.mutates_state = False
        self.random_ops = False
        self.counter = 0

    def new(
        self, expr: str, rows: int | None, cols: int | None, feature: str, base: str | None = None
    ) -> Value:
        value = Value(f"v{self.counter}", rows, cols, base)
        self.counter += 1
        self.body.append(f"{value.name} = {expr}")
        self.values.append(value)
        self.features.add(feature)
        return value

    def tensor(self) -> Value:
        """A recent 2-D value (later values are likelier, so chains grow deep)."""
        candidates = [v for v in self.values if v.cols is not None]
        weights = [i + 1 for i in range(len(candidates))]
        return self.rng.choices(candidates, weights)[0]

    def partner(self, a: Value) -> str:
        """An operand that broadcasts with ``a``: a value of its shape, a row or column of it, or a
        constant."""
        fits = [
            v
            for v in self.values
            if v is not a
            and v.cols is not None
            and (v.base is None or v.base != a.name)
            and v.name != a.base
            and (
                (v.rows, v.cols) == (a.rows, a.cols)
                or (v.rows is None and v.cols == a.cols)
                or (v.cols == 1 and v.rows == a.rows)
            )
        ]
        scalars = [v.name for v in self.values if v.cols is None]
        if fits and self.rng.random() < 0.75:
            return self.rng.choice(fits).name
        if scalars and self.rng.random() < 0.5:
            return self.rng.choice(scalars)
        return repr(round(self.rng.uniform(-1.5, 1.5), 3))


_UNARY = (
    "torch.sin({a})",
    "torch.tanh({a})",
    "torch.relu({a})",
    "torch.sigmoid({a})",
    "{a}.neg()",
    "{a}.abs()",
    "({a} * 0.5 + 0.25)",
    "torch.exp(torch.tanh({a}))",
)
_BINARY = (
    "{a} + {b}",
    "{a} * {b}",
    "{a} - {b}",
    "torch.where({a} > {b}, {a}, {b})",
    "{a} / ({b} * {b} + 1.0)",
)


def _unary(b: _Builder) -> None:
    a = b.tensor()
    b.new(b.rng.choice(_UNARY).format(a=a.name), a.rows, a.cols, "elementwise")


def _binary(b: _Builder) -> None:
    a = b.tensor()
    partner = b.partner(a)
    expr = b.rng.choice(_BINARY)
    if "where" in expr and partner.startswith("s"):  # a CPU scalar tensor input: keep to arithmetic
        expr = _BINARY[0]
    b.new(expr.format(a=a.name, b=partner), a.rows, a.cols, "elementwise")


def _linear(b: _Builder) -> None:
    a = b.tensor()
    assert a.cols is not None
    out = b.rng.choice(LINEAR_OUT)
    index = len(b.linears)
    b.linears.append((a.cols, out))
    b.new(f"self.lin{index}({a.name})", a.rows, out, "matmul")


def _reduce(b: _Builder) -> None:
    a = b.tensor()
    choices: list[tuple[str, int | None, int | None]] = [
        ("{a}.amax(1, keepdim=True)", a.rows, 1),
        ("{a}.mean(1, keepdim=True)", a.rows, 1),
    ]
    if a.rows is not None:
        choices += [("{a}.sum(0, keepdim=True)", None, a.cols), ("torch.cumsum({a}, 0)", a.rows, a.cols)]
    expr, rows, cols = b.rng.choice(choices)
    b.new(expr.format(a=a.name), rows, cols, "reduction")


def _slice(b: _Builder) -> None:
    a = b.tensor()
    assert a.cols is not None
    options: list[tuple[str, int | None, int]] = []
    if a.rows is not None and a.rows < MAX_ROW_OFFSET:
        options += [(f"{a.name}[1:]", a.rows + 1, a.cols), (f"{a.name}[:-1]", a.rows + 1, a.cols)]
    if a.cols >= 2:
        start = b.rng.randrange(0, a.cols - 1)
        stop = b.rng.randrange(start + 1, a.cols + 1)
        options.append((f"{a.name}[:, {start}:{stop}]", a.rows, stop - start))
        options.append((f"{a.name}.narrow(1, {start}, {stop - start})", a.rows, stop - start))
    options += [
        (f"{a.name}.transpose(0, 1).contiguous().transpose(0, 1)", a.rows, a.cols),
        (f"{a.name}.unsqueeze(0).expand(2, -1, -1).sum(0)", a.rows, a.cols),
        (f"{a.name}.reshape({a.name}.shape[0], -1)", a.rows, a.cols),
    ]
    expr, rows, cols = b.rng.choice(options)
    base = a.base or (a.name if a.name.startswith("x") else None)
    b.new(expr, rows, cols, "view", base=base)


def _buffer(b: _Builder) -> None:
    a = b.tensor()
    assert a.cols is not None
    index = len(b.buffers)
    b.buffers.append(a.cols)
    if b.rng.random() < 0.4:
        reduced = f"{a.name}.detach().mean(0)" if a.rows is not None else f"{a.name}.detach()[0]"
        b.body.append(f"self.buf{index}.mul_(0.5).add_({reduced}, alpha=0.5)")
        b.mutates_state = True
        b.features.add("buffer_update")
    b.new(f"{a.name} * self.buf{index}", a.rows, a.cols, "buffer")


def _cpu_attribute(b: _Builder) -> None:
    a = b.tensor()
    index = len(b.cpu_attributes)
    if b.rng.random() < 0.5:
        b.cpu_attributes.append(None)
        b.new(f"{a.name} * self.cpu{index}", a.rows, a.cols, "cpu_attribute")
    else:
        b.cpu_attributes.append(a.cols)
        b.new(f"{a.name} + self.cpu{index}.to({a.name}.device)", a.rows, a.cols, "cpu_attribute")


def _random(b: _Builder) -> None:
    a = b.tensor()
    expr = b.rng.choice(
        (
            "{a} * torch.rand_like({a})",
            "{a} * (torch.rand_like({a}) > 0.5)",  # a dropout mask (F.dropout's CUDA kernel draws otherwise)
            "{a} + torch.randn_like({a})",
        )
    )
    b.random_ops = True
    b.new(expr.format(a=a.name), a.rows, a.cols, "random")


def _mutate_input(b: _Builder, inputs: list[Value]) -> None:
    tensors = [v for v in inputs if v.cols is not None]
    x = b.rng.choice(tensors)
    kind = b.rng.choice(("add_", "mul_", "foreach", "copy_slice"))
    if kind == "add_":
        b.body.append(f"{x.name}.add_({b.partner(x)})")
    elif kind == "mul_":
        b.body.append(f"{x.name}.mul_({round(b.rng.uniform(0.5, 1.5), 3)})")
    elif kind == "foreach":
        group = [x, *[v for v in tensors if v is not x][:1]]
        names = ", ".join(v.name for v in group)
        if b.rng.random() < 0.5:
            b.body.append(f"torch._foreach_add_([{names}], {round(b.rng.uniform(-1, 1), 3)})")
        else:
            others = ", ".join(f"torch.tanh({v.name})" for v in group)
            b.body.append(f"torch._foreach_add_([{names}], [{others}])")
        b.mutated.extend(v.name for v in group[1:])
    else:
        b.body.append(f"{x.name}[1:3].copy_({x.name}[1:3] * 0.5 + 1.0)")
    b.mutated.append(x.name)
    b.features.add(f"inplace_{kind}")


_OPS = (
    (_unary, 3),
    (_binary, 3),
    (_linear, 2),
    (_reduce, 2),
    (_slice, 2),
    (_buffer, 1),
    (_cpu_attribute, 1),
    (_random, 0.5),
)


def generate_model(
    rng: random.Random, max_ops: int, dtypes: tuple[str, ...] = ("float32", "float64")
) -> ModelSpec:
    """Draw one model from ``rng`` (module docstring)."""
    b = _Builder(rng)
    inputs = [Value(f"x{i}", 0, rng.choice(COLS)) for i in range(rng.randint(1, 3))]
    if rng.random() < 0.3:
        inputs.append(Value("s0", None, None))
    b.values.extend(inputs)
    mutate_at = rng.randrange(0, max_ops + 1) if rng.random() < 0.6 else None
    functions, weights = zip(*_OPS, strict=True)
    for step in range(rng.randint(3, max_ops)):
        if step == mutate_at:
            _mutate_input(b, inputs)
        rng.choices(functions, weights)[0](b)
    computed = [v for v in b.values if v not in inputs]
    outputs = [computed[-1].name]
    outputs += [v.name for v in rng.sample(computed[:-1], min(len(computed) - 1, rng.randint(0, 2)))]
    tensor_inputs = [v for v in inputs if v.cols is not None]
    if rng.random() < 0.3:
        x = rng.choice(tensor_inputs)
        outputs.append(rng.choice((x.name, f"{x.name}[1:]", f"{x.name}[:, :1]")))
        b.features.add("output_aliases_input")
    if len(outputs) > 1:
        b.features.add("multiple_outputs")
    return ModelSpec(
        seed=rng.randrange(2**31),
        dtype=rng.choice(dtypes),
        inputs=tuple((v.name, v.cols) for v in inputs),
        linears=tuple(b.linears),
        buffers=tuple(b.buffers),
        cpu_attributes=tuple(b.cpu_attributes),
        body=tuple(b.body),
        outputs=tuple(outputs),
        mutated_inputs=tuple(dict.fromkeys(b.mutated)),
        mutates_state=b.mutates_state,
        random_ops=b.random_ops,
        features=tuple(sorted(b.features)),
    )


def _forward(spec: ModelSpec) -> Any:
    filename = f"<fuzz model {spec.seed}>"
    source = spec.source
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["forward"]


def build_module(spec: ModelSpec, device: torch.device) -> torch.nn.Module:
    """A fresh module for ``spec`` on ``device``; equal weights, buffers and attributes on every build."""
    dtype = getattr(torch, spec.dtype)
    generator = torch.Generator().manual_seed(spec.seed)
    module_type = type(f"FuzzModel{spec.seed}", (torch.nn.Module,), {"forward": _forward(spec)})
    module = module_type()
    for i, (n_in, n_out) in enumerate(spec.linears):
        linear = torch.nn.Linear(n_in, n_out, dtype=dtype)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(n_out, n_in, generator=generator, dtype=dtype) / n_in**0.5)
            linear.bias.copy_(torch.randn(n_out, generator=generator, dtype=dtype) * 0.1)
        module.add_module(f"lin{i}", linear.to(device))
    for i, cols in enumerate(spec.buffers):
        module.register_buffer(
            f"buf{i}", (torch.rand(cols, generator=generator, dtype=dtype) + 0.5).to(device)
        )
    for i, size in enumerate(spec.cpu_attributes):
        shape = () if size is None else (size,)
        setattr(
            module, f"cpu{i}", torch.rand(shape, generator=generator, dtype=dtype) + 0.5
        )  # stays on the CPU
    return module
