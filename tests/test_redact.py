"""Machine paths are replaced by placeholders in stored text, and nothing else changes."""

from __future__ import annotations

from matrix.redact import REPO_ROOT, default_roots, redact, redact_value

ROOTS = (
    ("/srv/env/lib/python3.12/site-packages", "<site-packages>"),
    ("/srv/env", "<env>"),
    ("/home/u", "~"),
)


def test_longest_root_wins_and_text_is_kept() -> None:
    text = 'File "/srv/env/lib/python3.12/site-packages/torch/x.py", line 3; python at /srv/env/bin/python'
    assert redact(text, ROOTS) == 'File "<site-packages>/torch/x.py", line 3; python at <env>/bin/python'


def test_only_whole_prefixes_are_replaced() -> None:
    assert redact("/srv/environment/a and /home/user", ROOTS) == "/srv/environment/a and /home/user"
    assert redact("see /home/u", ROOTS) == "see ~"


def test_values_inside_details_are_redacted() -> None:
    value = {"trace": ["/home/u/a.py:1", 3], "n": 1.5}
    assert redact_value(value, ROOTS) == {"trace": ["~/a.py:1", 3], "n": 1.5}


def test_the_checkout_is_a_root_of_this_process() -> None:
    assert (str(REPO_ROOT), "<repo>") in default_roots()
    assert redact(f"{REPO_ROOT}/suites/workloads/speech.py:92") == "<repo>/suites/workloads/speech.py:92"
    assert redact(None) is None and redact("") == ""


def test_the_recorded_command_names_no_machine_path() -> None:
    from matrix.recorder import recorded_command

    out = f"{REPO_ROOT}/.cache/out/run1/junit.xml"
    command = recorded_command(["pytest", "--junitxml", out, "--grace-matrix-db", "sqlite:////x/s.sqlite"])
    assert command == "pytest --junitxml <repo>/.cache/out/run1/junit.xml --grace-matrix-db '<store>'"
