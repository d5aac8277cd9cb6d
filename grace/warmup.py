"""When a slot's warm-up ends and its deciding call (the captures) comes.

Problem: a slot runs ``warmup_calls`` calls without a graph before it decides. Counted in calls, a
graph that runs several times in one training step (one compiled layer serving every layer of a model)
decides inside the first step, while graphs that run once a step decide in the second, and the slots
of a step's backward later still. In a pool that a step's graphs share (option ``step_pool``, Note: [A
training step in one pool] in grace.poolgroups) that order is what goes wrong: a capture allocates the
blocks free at its moment, and a capture made one step after another member's finds that member's
lent outputs free (they died at the end of the earlier step), though in a steady step they are alive
when the later member replays. Its replay would overwrite them, so it is refused in every step and the
slot makes another output set, which lands on other such blocks. (The many sets DeBERTa's and
BlenderbotSmall's layer graphs kept had another cause, found after this change: Note: [What a replay
can overwrite] in grace.poolgroups.)

Note: [Captures of a step in one step] For training graphs in a step's pool, warm-up is counted in
steps (compiled-call generations, ``torch_compat.compiled_call_generation``: the user's
``cudagraph_mark_step_begin`` count, else Dynamo's count of top-level compiled calls), not in calls: a
call in the generation of the slot's last warm-up call is one more warm-up call. So every graph a step
runs is captured in one step, the first after its warm-up, in the order the step runs them, as
cudagraph trees record a whole path in one pass: a block a capture finds free then belongs to outputs
that are dead at that point of every later step that runs the same way. Calls made with the slot's
shapes but an input on another device (grace.runner, Note: [Warm-up per signature, not per
placement]) count as warm-up calls made before this step. A slot that keeps running in one generation
(no new top-level call, no step mark) decides after ``_MAX_CALLS_IN_ONE_STEP`` calls there.

Invariants: without ``by_step`` the count is the one of calls (``warmup_calls`` calls, then decide);
``left`` never goes below zero; ``finish`` makes the next call decide.
"""

from __future__ import annotations

from dataclasses import dataclass

from grace.compat import torch as torch_compat

_MAX_CALLS_IN_ONE_STEP = 256


@dataclass
class Warmup:
    """A slot's warm-up: ``left`` warm-up calls (or steps, ``by_step``) before the deciding call;
    ``generation`` and ``calls_in_step``: the generation of the last warm-up call and the calls made in
    it."""

    left: int
    by_step: bool = False
    generation: int | None = None
    calls_in_step: int = 0

    def decides_now(self) -> bool:
        """Whether this call is the deciding call; otherwise it is a warm-up call, counted here."""
        generation = torch_compat.compiled_call_generation() if self.by_step else None
        same_step = generation is not None and generation == self.generation
        if same_step and self.calls_in_step < _MAX_CALLS_IN_ONE_STEP:
            self.calls_in_step += 1
            return False
        if self.left <= 0:
            return True
        self.left -= 1
        self.generation, self.calls_in_step = generation, 1
        return False

    def skip(self, calls: int) -> None:
        """``calls`` made elsewhere count as warm-up calls of earlier steps."""
        self.left = max(0, self.left - calls)

    def finish(self) -> None:
        """The next call decides."""
        self.left, self.generation = 0, None
