"""Regenerate the golden PTX pairs of tests/test_pi_ptx.py with the installed Triton.

Run once per Triton release named in cases.toml (in an environment that has that release):

    python tests/resources/pi/make_goldens.py tests/resources/pi

Writes ``<case>.before.ptx`` (Triton's PTX for sm_90, with the source path in ``.file`` replaced by the
file's base name) and ``<case>.after.ptx`` (the rewrite of it). Review the diff of every ``after`` file
by hand before committing: these files are the specification the unit tests hold the rewrite to.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from grace.compat import triton as triton_compat
from grace.pi import ptx
from suites.pi_corpus import corpus


def sanitise(text: str) -> str:
    """Keep only the base name of source files in ``.file`` directives."""
    return re.sub(r'(\.file\s+\d+\s+")[^"]*/([^"/]+")', r"\1\2", text)


def main(out: Path) -> None:
    cases = tomllib.loads((out / "cases.toml").read_text())["case"]
    version = str(triton_compat.triton_version())
    kernels = {k.subject: k for k in corpus()}
    for case in cases:
        if not version.startswith(case["triton"]):
            continue
        k = kernels[case["subject"]]
        art = triton_compat.compile_for_target(
            k.fn,
            k.signature,
            k.constexprs,
            divisible_by_16=k.divisible_by_16,
            equal_to_1=k.equal_to_1,
            num_warps=k.num_warps,
            num_stages=k.num_stages,
        )
        before = sanitise(art.ptx)
        entry = ptx.parse_entry(before)
        pmap = ptx.derive_param_map(
            entry, k.signature, specialised=k.equal_to_1, scratch=tuple(case["scratch"])
        )
        indices = [pmap.index_of(a) for a in case["rewrite"]]
        after = ptx.rewrite_pointer_params(before, pmap, indices).ptx
        (out / f"{case['name']}.before.ptx").write_text(before)
        (out / f"{case['name']}.after.ptx").write_text(after)
        sys.stdout.write(f"wrote {case['name']}\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
