"""Fast checks of the stress harness's own pure parts (the suite itself is `just stress`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from stress import common, fuzz_targets


@pytest.fixture(autouse=True)
def _no_findings() -> None:
    common.FINDINGS.clear()


def test_table_markdown_escapes_pipes_and_newlines() -> None:
    table = common.Table("T", ["a", "b"])
    table.add("x|y", "line\nbreak")
    text = table.markdown()
    assert "| x\\|y | line break |" in text
    assert text.startswith("### T\n\n| a | b |\n|---|---|\n")


def test_findings_of_one_known_cause_share_a_number() -> None:
    first = common.finding("fuzz", "request: RecursionError", "cmd", "RecursionError: deep", "x")
    second = common.finding("attacks", "nested", "cmd", "RecursionError again", "x")
    other = common.finding("faults", "something else", "cmd", "observed", "x")
    assert first == second == "**FINDING 1**"
    assert other == "**FINDING 2**"
    assert len(common.FINDINGS) == 2
    assert common.FINDINGS[0].seen_also


def test_percentile_and_formatting() -> None:
    values = [float(v) for v in range(1, 101)]
    assert common.percentile(values, 50) in (50.0, 51.0)
    assert common.percentile(values, 99) == 99.0
    assert common.ms(float("nan")) == "-"
    assert common.ms(0.0015) == "1.5 ms"


def test_traceback_summary_names_the_exception() -> None:
    text = ("noise\nTraceback (most recent call last):\n  File \"a.py\", line 1, in f\n"
            "    f()\n  File \"b.py\", line 2, in g\n    g()\nValueError: boom\nmore\n")
    summary = common.traceback_summary(text)
    assert "b.py" in summary and summary.endswith("ValueError: boom")
    assert common.traceback_in(text)


@pytest.mark.parametrize("name", sorted(fuzz_targets.TARGETS))
def test_seeds_only_raise_what_the_target_expects(name: str, tmp_path: Path) -> None:
    fuzz_targets.hook_world(tmp_path / "world")
    for seed in fuzz_targets.seeds()[name]:
        try:
            fuzz_targets.TARGETS[name](seed)
        except fuzz_targets.EXPECTED[name]:
            pass
