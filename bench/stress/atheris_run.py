"""One timed, coverage-guided atheris run of one decoder (run as a subprocess).

    python3 atheris_run.py TARGET SECONDS WORKDIR

WORKDIR gets the corpus (seeded from :func:`fuzz_targets.seeds`) and any crash
artifact.  libFuzzer prints its own figures ("Done N runs in S second(s)") on
stderr; an exception outside the target's expected ones is a crash (atheris
prints it and exits non-zero), an input running past -timeout is a hang.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import atheris

with atheris.instrument_imports(include=["libbroker", "libegress", "libpolicy", "h11", "yaml",
                                         "stress"]):
    from stress import fuzz_targets


def main() -> None:
    name, seconds, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    target = fuzz_targets.TARGETS[name]
    expected = (*fuzz_targets.EXPECTED[name],)
    fuzz_targets.hook_world(workdir / "world")
    corpus = workdir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(fuzz_targets.seeds()[name]):
        (corpus / f"seed{i}").write_bytes(seed)

    def one(data: bytes) -> None:
        with contextlib.suppress(*expected):
            target(data)

    atheris.Setup([sys.argv[0], f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=2048",
                   f"-artifact_prefix={workdir}/", "-max_len=4096", "-print_final_stats=1",
                   str(corpus)], one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
