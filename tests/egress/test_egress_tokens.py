"""The token command: bounded, renewed, kept through failures, never said."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libbroker.errors import TokenError, UsageError
from libegress.tokens import TokenKeeper, parse_token, read_token, token_argv

SECRET = "ghu_SECRETSECRET42"


def test_argv_is_split_without_a_shell() -> None:
    assert token_argv("devctl token --app 'my app'") == ["devctl", "token", "--app", "my app"]
    assert token_argv("echo $HOME; rm -rf /") == ["echo", "$HOME;", "rm", "-rf", "/"]
    with pytest.raises(UsageError):
        token_argv("")
    with pytest.raises(UsageError):
        token_argv("echo 'unbalanced")


@pytest.mark.parametrize("output", [b"", b"\n", b"two words\n", b"tok\x01en\n", b"\xff\xfe"])
def test_unusable_output_is_refused(output: bytes) -> None:
    with pytest.raises(TokenError) as exc:
        parse_token(output)
    assert str(exc.value) == "the token command printed no usable token"


def test_first_line_is_the_token() -> None:
    assert parse_token(b"  abc123  \nsecond line\n") == "abc123"


def test_read_token_runs_the_command() -> None:
    argv = [sys.executable, "-c", f"print('{SECRET}')"]
    assert asyncio.run(read_token(argv)) == SECRET


def test_failures_name_the_cause_not_the_output() -> None:
    fail = [sys.executable, "-c", f"import sys; print('{SECRET}'); sys.exit(3)"]
    with pytest.raises(TokenError) as exc:
        asyncio.run(read_token(fail))
    assert "status 3" in str(exc.value) and SECRET not in str(exc.value)
    with pytest.raises(TokenError) as missing:
        asyncio.run(read_token(["/nonexistent/token-cmd"]))
    assert "could not start" in str(missing.value)


def test_run_time_is_bounded_and_the_command_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    slow = [sys.executable, "-c",
            f"import os,time; open('{pidfile}','w').write(str(os.getpid())); time.sleep(30)"]
    with pytest.raises(TokenError) as exc:
        asyncio.run(read_token(slow, bound=0.5))
    assert "longer than" in str(exc.value)
    pid = int(pidfile.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_keeper_renews_and_keeps_the_old_token_on_failure(tmp_path: Path) -> None:
    source = tmp_path / "token"
    source.write_text("first\n")
    said: list[str] = []
    keeper = TokenKeeper(["cat", str(source)], every=0.2, say=said.append, backoff=(0.05,))

    async def scenario() -> list[str | None]:
        seen = []
        await keeper.refresh()
        seen.append(keeper.current())
        task = asyncio.create_task(keeper.keep())
        source.write_text("second\n")
        await asyncio.sleep(0.5)
        seen.append(keeper.current())
        source.unlink()  # renewals now fail
        await asyncio.sleep(0.5)
        seen.append(keeper.current())
        source.write_text("third\n")
        await asyncio.sleep(0.5)
        seen.append(keeper.current())
        task.cancel()
        return seen

    assert asyncio.run(scenario()) == ["first", "second", "second", "third"]
    assert any("previous token is kept" in s for s in said)
    assert not any(word in s for s in said for word in ("first", "second", "third"))


def test_no_command_no_token() -> None:
    keeper = TokenKeeper(None, every=1, say=lambda s: None)
    assert asyncio.run(keeper.refresh()) is False
    assert keeper.current() is None


def test_a_proxy_killed_mid_read_takes_the_command_with_it(tmp_path: Path) -> None:
    """SIGKILL of the reader (egress-proxy): nothing of ours runs, the kernel ends the command."""
    pidfile = tmp_path / "pid"
    command = ["sh", "-c", 'echo $$ > "$0"; exec sleep 300', str(pidfile)]
    reader = ("import asyncio, sys\n"
              "from libegress.tokens import read_token\n"
              f"asyncio.run(read_token({command!r}))\n")
    proxy = subprocess.Popen([sys.executable, "-c", reader])
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline and proxy.poll() is None
            time.sleep(0.02)
        pid = int(pidfile.read_text())
        assert "sleep" in Path(f"/proc/{pid}/cmdline").read_text()
    finally:
        proxy.send_signal(signal.SIGKILL)
        proxy.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # killed at once; init reaps it soon after
    stat = Path(f"/proc/{pid}/stat")
    alive = stat.exists() and ") Z" not in stat.read_text()
    if alive:  # not left behind by a failure
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the token command outlived the proxy"


def test_secrets_with_one_command_share_one_run(tmp_path: Path) -> None:
    """An agent's login keeper serves several hosts: one run per renewal, not one per host."""
    from libegress.secrets import Secret
    from libegress.tokens import distinct, secret_keepers, start_all

    runs = tmp_path / "runs"
    login = ("sh", "-c", f'echo run >> "{runs}"; echo {SECRET}')
    other = ("sh", "-c", f'echo run >> "{runs}"; echo other-token')
    secrets = [Secret(host, "Authorization", "Bearer {}", login, every=60, login="gemini")
               for host in ("a.example", "b.example", "c.example")]
    secrets.append(Secret("d.example", "X-Key", "{}", other, every=60))
    said: list[str] = []
    keepers = secret_keepers(secrets, said.append)
    runners = distinct([k.keeper for k in keepers.values()])
    assert len(runners) == 2
    asyncio.run(start_all(runners))
    assert runs.read_text().count("run") == 2
    assert {h: k.field() for h, k in keepers.items()} == {
        "a.example": (b"Authorization", f"Bearer {SECRET}".encode()),
        "b.example": (b"Authorization", f"Bearer {SECRET}".encode()),
        "c.example": (b"Authorization", f"Bearer {SECRET}".encode()),
        "d.example": (b"X-Key", b"other-token"),
    }


def test_a_login_keeper_is_not_run_while_its_file_is_absent(tmp_path: Path) -> None:
    """No login file yet: no run at start nor at the renewals (each would only exit
    quietly); the first renewal after the login appears runs it and takes it."""
    from libegress.oauth_login import ABSENT_STATUS
    from libegress.tokens import login_file

    auth, runs = tmp_path / "auth.json", tmp_path / "runs"
    # A stand-in keeper with the real one's argv shape: counts its runs, prints the
    # file's token, or exits with the quiet status when there is no file.
    keeper_py = tmp_path / "libegress.login_keeper"
    keeper_py.write_text(
        "import os, sys\n"
        f"open({str(runs)!r}, 'a').write('run\\n')\n"
        f"if not os.path.exists(sys.argv[2]): sys.exit({ABSENT_STATUS})\n"
        "print(open(sys.argv[2]).read().strip())\n")
    argv = [sys.executable, "-m", "libegress.login_keeper", "codex", str(auth)]
    assert login_file(argv) == str(auth)
    assert login_file(["gh", "auth", "token"]) == ""
    run = [sys.executable, str(keeper_py), "codex", str(auth)]
    said: list[str] = []
    keeper = TokenKeeper(run, every=60, say=said.append, backoff=(0.01,),
                         quiet_status=ABSENT_STATUS, login_file=login_file(argv))

    async def scenario() -> tuple[bool, str | None]:
        await keeper.start()
        task = asyncio.create_task(keeper.keep())
        await asyncio.sleep(0.3)  # renewals every 10 ms meanwhile, none run
        ran = runs.exists()
        auth.write_text(SECRET + "\n")
        while keeper.current() is None:
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return ran, keeper.current()

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == (False, SECRET)
    assert said == [] and runs.read_text() == "run\n"
    present = TokenKeeper(run, every=60, say=said.append, quiet_status=ABSENT_STATUS,
                          login_file=str(auth))
    asyncio.run(present.start())  # the file exists: the first run is as before
    assert present.current() == SECRET and runs.read_text() == "run\nrun\n"
