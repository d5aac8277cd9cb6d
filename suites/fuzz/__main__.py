"""``python -m suites.fuzz``: replay one fuzz case, or fuzz for a while, outside pytest.

    python -m suites.fuzz --seed 0 --case 17            # replay case 17 of base seed 0 (its profiles)
    python -m suites.fuzz --seed 0 --case 17 --profile warmup0   # under one of them
    python -m suites.fuzz --seed 0 --case 17 --show     # and print its model and schedule
    python -m suites.fuzz --seconds 60 [--seed 3]       # cases of a seed until the deadline

Exit status: 0 no case differs from eager, 1 a case does (or eager failed on a case: a generator bug),
2 a usage or settings error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

import torch

from suites.fuzz.execute import CaseResult, grace_compiler, inductor_compiler, make_cases, run_case
from suites.fuzz.recording import case_details
from suites.fuzz.session import fuzz, fuzz_environment, with_control
from suites.fuzz.settings import SettingsError, load_settings
from suites.modes import reset_compilers


def _device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def _print_result(result: CaseResult, device: str, show: bool) -> None:
    details = case_details(result, device)
    source = details.pop("source")
    if show:
        print(source)
    else:
        details.pop("schedule")
    print(json.dumps(details, indent=2, default=str))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="base seed (default: fuzz.toml's)")
    parser.add_argument("--case", type=int, default=None, help="replay this case of the seed alone")
    parser.add_argument("--profile", default=None, help="run the case under this one of its profiles")
    parser.add_argument("--seconds", type=float, default=None, help="fuzz until this deadline")
    parser.add_argument("--first-case", type=int, default=0, help="with --seconds: the first case")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--show", action="store_true", help="print the model's source and the schedule")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
        device = _device(args.device)
        seed = settings.base_seed if args.seed is None else args.seed
        if args.case is not None:
            failed = False
            for case in make_cases(settings, seed, args.case, device.type, args.profile):
                reset_compilers()
                with fuzz_environment(settings, device.type):
                    result = run_case(case, grace_compiler, device, settings)
                    if result.failed:
                        reset_compilers()
                        result = with_control(result, inductor_compiler, device, settings)
                _print_result(result, device.type, args.show)
                failed = failed or result.failed or result.eager_error is not None
            return 1 if failed else 0
        summary = fuzz(settings, device, deadline_s=args.seconds, base_seed=seed, first_case=args.first_case)
    except SettingsError as exc:
        print(f"suites.fuzz: {exc}", file=sys.stderr)
        return 2
    print(
        f"seed {summary.base_seed}: {summary.cases} cases, {summary.calls} calls compared, "
        f"{summary.mismatches} mismatches, {summary.failed_cases} failing cases, "
        f"{summary.invalid_cases} invalid, in {summary.seconds:.1f} s"
    )
    for result in summary.failures:
        _print_result(result, device.type, args.show)
    for result in summary.invalid:
        print(f"invalid case {result.case.index}: eager raised {result.eager_error}")
    return 1 if summary.failed_cases or summary.invalid_cases else 0


if __name__ == "__main__":
    sys.exit(main())
