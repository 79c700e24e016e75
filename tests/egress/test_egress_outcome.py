"""The one table from the proxy's own statuses to a verdict, and the two words of each mode."""

from __future__ import annotations

import pytest

from libegress.outcome import Mode, Outcome, Verdict, verdict_of


@pytest.mark.parametrize(("status", "verdict"), [
    (400, Verdict.REFUSED), (403, Verdict.REFUSED), (405, Verdict.REFUSED),
    (407, Verdict.REFUSED), (421, Verdict.REFUSED),
    (408, Verdict.LIMIT), (431, Verdict.LIMIT),
    (503, Verdict.LIMIT),  # too many connections (listener, gateway tenant): a bound, not a fault
    (502, Verdict.FAILED), (504, Verdict.FAILED), (500, Verdict.FAILED),
])  # fmt: skip
def test_a_status_the_proxy_answers_has_one_verdict(status: int, verdict: Verdict) -> None:
    assert verdict_of(status) is verdict
    assert Outcome.answered(status, "why", "h", 1).verdict is verdict


def test_a_refusal_says_its_status_first_an_allowed_request_does_not() -> None:
    assert Outcome.answered(403, "not on the allow list", "h", 443).text == \
        "403 not on the allow list"
    assert Outcome(Verdict.ALLOWED, "h", 443, mode=Mode.PLAIN, status=200).text == ""


def test_each_mode_keeps_its_log_and_record_words() -> None:
    assert [(m.log_word, m.record_word) for m in Mode] == [
        ("raw", "tunnel"), ("socks", "socks"), ("intercept", "injected"), ("http", "plain")]
