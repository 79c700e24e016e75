"""The session record of real sessions: exactly their events, in order, chained, out of reach.

One scripted session per backend fetches from the allowed stand-in (github.com,
an inject host), is refused on another host, runs two brokered commands (one
failing), signs a commit, and tries to read and write the sessions directory.
Then the record is read back, verified, cut and edited.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from launcher_world import TOKEN, World

from libbroker.launcher import record, report

pytestmark = pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("gpg") and shutil.which("git")),
    reason="curl, gpg and git are needed",
)

CANARY = "old-record-canary-4242"

SCRIPT = r"""
exec 2>&1
curl -sS --max-time 20 -o /dev/null -w 'fetch=%{http_code}\n' https://github.com/probe?x=1
curl -s --max-time 20 -o /dev/null -w 'denied=%{http_connect}\n' https://denied.invalid/
broker-client -- true; echo "broker_true=$?"
broker-client -- false; echo "broker_false=$?"
git -c user.name='Record Test' -c user.email=r@example.com commit -S --allow-empty -qm signed
echo "commit=$?"
cat "$SESSIONS/old.jsonl" >/dev/null 2>&1; echo "read_record=$?"
ls "$SESSIONS" >/dev/null 2>&1; echo "list_records=$?"
echo forged >> "$SESSIONS/old.jsonl" 2>/dev/null; echo "append_record=$?"
touch "$SESSIONS/planted.jsonl" 2>/dev/null; echo "plant_record=$?"
"""


def _gpg(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GNUPGHOME": str(home)}
    return subprocess.run(["gpg", "--batch", "--yes", "--pinentry-mode", "loopback", *args],
                          capture_output=True, env=env, check=False, timeout=60)


def _signing_world(world: World) -> tuple[str, dict[str, str]]:
    gnupg = world.home / ".gnupg"
    gnupg.mkdir(mode=0o700)
    made = _gpg(gnupg, "--passphrase", "", "--quick-gen-key", "Record Test <r@example.com>",
                "ed25519", "sign", "never")
    assert made.returncode == 0, made.stderr
    listing = _gpg(gnupg, "--with-colons", "--list-secret-keys").stdout.decode()
    fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    env = {**world.env(), "GNUPGHOME": str(gnupg)}
    subprocess.run(["git", "init", "-q", "-b", "main", str(world.workdir)], check=True, env=env)
    return fpr, env


def _sessions(world: World) -> Path:
    return world.home / ".local" / "state" / "agent-sandbox" / "sessions"


def _kv(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.parametrize("backend", ["bwrap", "nono"])
def test_the_record_holds_exactly_the_sessions_events(world: World, backend: str) -> None:
    fpr, env = _signing_world(world)
    sessions = _sessions(world)
    sessions.mkdir(parents=True, mode=0o700)
    (sessions / "old.jsonl").write_text(CANARY + "\n")
    config = world.config(sign_key=fpr)
    try:
        done = world.run("sh", "-c", f"SESSIONS={sessions}\n" + SCRIPT, config=config,
                         env=env, sandbox=backend)
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=env, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    seen = _kv(done.stdout)
    assert seen["fetch"] == "200" and seen["denied"] == "403", done.stdout
    assert (seen["broker_true"], seen["broker_false"], seen["commit"]) == ("0", "1", "0")
    # The sandbox can neither read nor write the records.
    for probe in ("read_record", "list_records", "append_record", "plant_record"):
        assert seen[probe] != "0", (probe, done.stdout)
    assert (sessions / "old.jsonl").read_text() == CANARY + "\n"
    mine = sorted(p for p in sessions.iterdir() if p.name != "old.jsonl")
    assert len(mine) == 1 and mine[0].name.endswith(".jsonl"), mine
    path = mine[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(sessions.stat().st_mode) == 0o700

    events = record.events(str(path))
    shape = [(e["ev"], e.get("host") or e.get("argv") or e.get("key"),
              e.get("verdict") or e.get("exit")) for e in events]
    assert shape == [
        ("start", None, None),
        ("egress", "github.com", "allowed"),
        ("egress", "denied.invalid", "refused"),
        ("broker", ["true"], 0),
        ("broker", ["false"], 1),
        ("sign", fpr, 0),
        ("end", None, 0),
    ], shape
    start, fetch, refused, _, _, _, end = events
    assert start["backend"] == backend and start["workdir"] == str(world.workdir)
    assert start["cmd"][:2] == ["sh", "-c"] and len(start["config"]) == 64
    assert start["id"] == path.name.removesuffix(".jsonl")
    assert {"kind": "injected", "method": "GET", "path": "/probe?...", "status": 200,
            "port": 443}.items() <= fetch.items()
    assert fetch["down"] > 0 and fetch["dur"] >= 0
    assert "not on the allow list" in refused["reason"]
    assert end["dur"] > 0
    text = path.read_text()
    assert TOKEN not in text and "x-access-token" not in text and "Authorization" not in text
    assert record.verify(str(path)) == []
    assert "session record" not in done.stderr

    summary = report.summarize(events, [])
    assert summary["commands"]["count"] == 2 and len(summary["commands"]["failures"]) == 1
    assert [s["ok"] for s in summary["signatures"]] == [True]

    # report --verify fails after one byte is changed, and after a line is removed.
    good = path.read_bytes()
    cli = ["agent-sandbox", "report", "--verify", path.name.removesuffix(".jsonl")]
    assert subprocess.run(cli, env=world.env(), capture_output=True, check=False).returncode == 0
    at = good.index(b'"argv":["false"]')
    path.write_bytes(good[:at + 9] + b"t" + good[at + 10:])  # "false" -> "talse"
    bad = subprocess.run(cli, env=world.env(), capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and "chain breaks" in bad.stdout, bad.stdout
    lines = good.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3] + lines[4:]))
    bad = subprocess.run(cli, env=world.env(), capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and "chain breaks" in bad.stdout, bad.stdout


def test_learn_mode_proposes_the_domains_line(world: World) -> None:
    port = world.standin.port
    pins = [f"{h}:127.0.0.1:{port}" for h in ("a.cdn.test", "b.cdn.test", "c.cdn.test",
                                              "solo.test")]
    config = world.config(resolve=[f"github.com:127.0.0.1:{port}",
                                   f"api.github.com:127.0.0.1:{port}", *pins],
                          domains=["solo.test"])
    script = "\n".join(
        f"curl -sk --max-time 20 -o /dev/null https://{h}/" for h in
        ("a.cdn.test", "b.cdn.test", "c.cdn.test", "solo.test", "nowhere.invalid",
         "github.com")
    )
    done = subprocess.run(
        ["agent-sandbox", "run", f"--config={config}", "--learn", "--sandbox=bwrap", "--",
         "sh", "-c", script],
        env=world.env(), cwd=str(world.workdir), capture_output=True, text=True, timeout=90,
        check=False)
    assert done.returncode == 0, done.stderr
    learn_lines = [line for line in done.stderr.splitlines() if "LEARN MODE" in line]
    assert len(learn_lines) == 1
    env = world.env()
    listed = subprocess.run(["agent-sandbox", "report", "--list", "--json"], env=env,
                            capture_output=True, text=True, check=True)
    learned = next(r["id"] for r in json.loads(listed.stdout))
    proposed = subprocess.run(["agent-sandbox", "report", "--propose", learned], env=env,
                              capture_output=True, text=True, check=True)
    # The whole line: the configured domain first, then what the allow list would refuse.
    assert proposed.stdout == 'domains = ["solo.test", "nowhere.invalid", "*.cdn.test"]\n'
    shown = subprocess.run(["agent-sandbox", "report", learned], env=env,
                           capture_output=True, text=True, check=True).stdout
    assert "LEARN MODE" in shown
    assert "would have refused a.cdn.test, b.cdn.test, c.cdn.test, nowhere.invalid" in shown


def test_a_config_that_exposes_the_records_is_refused(world: World) -> None:
    config = world.config(read=[str(world.home / ".local")])
    (world.home / ".local").mkdir()
    done = world.run("true", config=config)
    assert done.returncode == 1
    assert "session record's directory" in done.stderr and "record = false" in done.stderr
    done = world.run("true", config=world.config("off.toml", read=[str(world.home / ".local")],
                                                 record=False))
    assert done.returncode == 0, done.stderr
    assert not _sessions(world).exists()
