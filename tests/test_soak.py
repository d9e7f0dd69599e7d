"""bench.soak reads the cause of a failure from the run's own output (issue 22)."""

from __future__ import annotations

from bench.soak import devnet_causes, pytest_causes, pytest_seconds

PYTEST = """\
....F....
    def test_x():
>       assert 1 == 2
E       assert 1 == 2
=========================== short test summary info ============================
FAILED tests/test_a.py::test_x - assert 1 == 2
1 failed, 8 passed in 3.0s
"""


def test_pytest_failures_name_the_test_and_the_first_error_line() -> None:
    want = ["FAILED tests/test_a.py::test_x - assert 1 == 2", "E       assert 1 == 2"]
    assert pytest_causes(PYTEST) == want
    assert pytest_causes("make: *** [test] Killed\n") == ["no pytest summary: make: *** [test] Killed"]


def test_devnet_failures_name_the_fail_lines_and_the_node_errors() -> None:
    out = "run 1 summary\nFAIL host-1 was slashed 0.2 GNK (missing_reveal)\n"
    logs = {
        "host-1.log": '{"event": "fetched"}\n{"event": "reveal_refused", "error": "ErrLateReveal"}\n',
        "verifier-0.log": '{"event": "verdict"}\n',
    }
    causes = devnet_causes(out, logs)
    assert causes[0] == "FAIL host-1 was slashed 0.2 GNK (missing_reveal)"
    assert causes[1].startswith("host-1.log: ") and "ErrLateReveal" in causes[1]
    assert len(causes) == 2  # the healthy verifier's log says nothing
    assert devnet_causes("", {})[0].startswith("exit status non-zero")


def test_pytest_seconds_are_read_from_the_last_summary_line() -> None:
    assert pytest_seconds(PYTEST) == 3.0
    assert pytest_seconds("....\n1173 passed in 486.93s (0:08:06)\n") == 486.93
    assert pytest_seconds("=== 2 failed, 5 passed, 1 skipped in 12.50s ===\n") == 12.5
    assert pytest_seconds("make: *** [test] Killed\n") is None
