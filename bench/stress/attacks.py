"""Attacks: named hostile inputs, each with the refusal it must meet.

Hook path tricks go to the real policy-hook; request tricks go to a real
broker-server over its socket (raw frames where an honest client would never
send them); the proxy attacks run in their own network namespace
(:mod:`attacks_ns`); another uid is played by ``nobody`` through setpriv.
Every row: expected refusal, observed result, and a finding when they differ.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from libbroker.wire import Channel, Request, encode_frame, encode_request
from stress import brokerwire, fuzz_targets
from stress.common import (
    HERE,
    Mode,
    Table,
    finding,
    script,
    start_broker,
    traceback_in,
    traceback_summary,
)

Rows = list[list[object]]


# --- the hook ----------------------------------------------------------------------------


def hook_cases(tmp: Path) -> Rows:
    policy = fuzz_targets.hook_world(tmp / "attack-hook")
    home = policy.home
    proj = f"{home}/proj"
    policy_file = tmp / "attack-policy.json"
    policy_file.write_text(policy.to_json())
    os.symlink(f"{home}/.ssh", f"{proj}/chain2") if not os.path.lexists(
        f"{proj}/chain2") else None
    os.symlink(f"{proj}/chain2", f"{proj}/chain1") if not os.path.lexists(
        f"{proj}/chain1") else None
    os.symlink("/proc/self/root" + f"{home}/.ssh", f"{proj}/via_root") if not os.path.lexists(
        f"{proj}/via_root") else None

    def call(tool: str, tool_input: dict[str, object], cwd: str = proj) -> dict[str, object]:
        return {"hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": tool_input,
                "cwd": cwd, "session_id": "stress"}

    cases: list[tuple[str, object]] = [
        ("Read the secret directly", call("Read", {"file_path": f"{home}/.ssh/id"})),
        ("Read through ..", call("Read", {"file_path": f"{proj}/../.ssh/id"})),
        ("Read through a symlink in the workdir", call("Read", {"file_path": f"{proj}/to_ssh/id"})),
        ("Read through a relative symlink", call("Read", {"file_path": f"{proj}/rel/id"})),
        ("Read through a symlink chain", call("Read", {"file_path": f"{proj}/chain1/id"})),
        ("Read through /proc/self/root", call("Read", {"file_path": f"{proj}/via_root/id"})),
        ("Read /proc/self/cwd/../.ssh/id", call("Read", {"file_path":
                                                        "/proc/self/cwd/../.ssh/id"})),
        ("Read with // and /./", call("Read", {"file_path": "/" + home + "//.ssh/./id"})),
        ("Read ~/.ssh/id (tilde)", call("Read", {"file_path": "~/.ssh/id"})),
        ("Read $HOME/.ssh/id", call("Read", {"file_path": "$HOME/.ssh/id"})),
        ("Read a relative path from cwd=home", call("Read", {"file_path": ".ssh/id"}, home)),
        ("Read a relative ../ path from the workdir", call("Read", {"file_path": "../.ssh/id"})),
        ("Read a path with a trailing slash", call("Read", {"file_path": f"{home}/.ssh/"})),
        ("Read with a NUL in the path", call("Read", {"file_path": f"{proj}/x\x00/../../.ssh"})),
        ("Read with file_path not a string", call("Read", {"file_path": [f"{home}/.ssh/id"]})),
        ("duplicate key: file_path twice, the secret last",
         f'{{"hook_event_name":"PreToolUse","tool_name":"Read","cwd":"{proj}",'
         f'"tool_input":{{"file_path":"{proj}/src/x","file_path":"{home}/.ssh/id"}}}}'),
        ("Grep rooted at / (an ancestor of home)", call("Grep", {"pattern": "KEY", "path": "/"})),
        ("Grep rooted at the home directory", call("Grep", {"pattern": "KEY", "path": home})),
        ("Grep with an absolute --glob into home", call("Grep", {"pattern": "KEY", "path": proj,
                                                                  "glob": f"{home}/.ssh/*"})),
        ("Glob **/id from home's parent", call("Glob", {"pattern": "**/id",
                                                        "path": os.path.dirname(home)})),
        ("Glob pattern climbing with .. after a wildcard", call("Glob", {"pattern": "*/../../*"})),
        ("Glob ~/.ssh/*", call("Glob", {"pattern": "~/.ssh/*"})),
        ("Write into the harness config", call("Write", {"file_path":
                                                         f"{home}/.claude/settings.json",
                                                         "content": "{}"})),
        ("Edit /etc/passwd", call("Edit", {"file_path": "/etc/passwd", "old_string": "a",
                                           "new_string": "b"})),
        ("Write into the deny path inside the workdir", call("Write", {
            "file_path": f"{proj}/secret/x", "content": "x"})),
        ("MultiEdit into home", call("MultiEdit", {"file_path": f"{home}/.bashrc", "edits": []})),
        ("NotebookEdit into home", call("NotebookEdit", {"notebook_path": f"{home}/n.ipynb",
                                                         "new_source": ""})),
        ("Write through a symlink out of the workdir", call("Write", {
            "file_path": f"{proj}/to_ssh/authorized_keys", "content": "ssh-ed25519 x"})),
        ("Write through a symlink loop", call("Write", {"file_path": f"{proj}/loop1/x",
                                                        "content": "x"})),
        ("cwd relative (not absolute)", call("Read", {"file_path": ".ssh/id"}, "home")),
        ("deeply nested tool_input", '{"hook_event_name":"PreToolUse","tool_name":"Read",'
                                     '"cwd":"/","tool_input":' + "[" * 100000 + "]" * 100000
                                     + "}"),
    ]
    rows: Rows = []
    for name, doc in cases:
        data = doc if isinstance(doc, str) else json.dumps(doc)
        # As in a session: the hook's HOME is the policy's home.
        proc = subprocess.run([script("policy-hook"), f"--policy={policy_file}"],
                              input=data.encode("utf-8", "surrogatepass"), capture_output=True,
                              timeout=30, check=False, env=dict(os.environ, HOME=home))
        out = proc.stdout.decode(errors="replace")
        err = proc.stderr.decode(errors="replace").strip()
        denied = '"permissionDecision":"deny"' in out.replace(" ", "")
        if denied:
            observed = "deny"
        elif proc.returncode == 2:
            observed = f"exit 2: {err[:100]}"
        else:
            observed = f"ALLOWED (exit {proc.returncode}, no output)"
        ok = ((denied and proc.returncode == 0) or proc.returncode == 2) and not traceback_in(err)
        rows.append(["hook path tricks", name, "deny (or exit 2 for unusable input)", observed,
                     ok])
    return rows


# --- the broker ------------------------------------------------------------------------------


def _frame_request(body: object) -> bytes:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    return encode_frame(Channel.REQUEST, payload)


async def broker_async(sock: str, workdir: str, server_pid: int) -> Rows:
    rows: Rows = []
    base = {"argv": ["true"], "cwd": workdir, "with_stdin": False}
    outside = Path(workdir).parent / (Path(workdir).name + "2")  # shares the workdir's prefix
    outside.mkdir(exist_ok=True)
    link = Path(workdir) / "to_etc"
    if not link.is_symlink():
        os.symlink("/etc", link)
    refused_cases: list[tuple[str, bytes]] = [
        ("request field env", _frame_request({**base, "env": {"LD_PRELOAD": "/tmp/x.so"}})),
        ("request field env spelled \\u0065nv", encode_frame(
            Channel.REQUEST, json.dumps(base).encode()[:-1] + b',"\\u0065nv":{"A":"1"}}')),
        ("request field Env (case)", _frame_request({**base, "Env": {"A": "1"}})),
        ("unknown request field", _frame_request({**base, "environment": {}})),
        ("env inside a duplicate key", encode_frame(
            Channel.REQUEST, json.dumps(base).encode()[:-1] + b',"env":{},"env":null}')),
        ("cwd /", _frame_request({**base, "cwd": "/"})),
        ("cwd workdir/..", _frame_request({**base, "cwd": workdir + "/.."})),
        ("cwd through a symlink to /etc", _frame_request({**base, "cwd": str(link)})),
        ("cwd sibling sharing the workdir's prefix", _frame_request({**base,
                                                                     "cwd": str(outside)})),
        ("cwd relative", _frame_request({**base, "cwd": "."})),
        ("cwd with NUL", _frame_request({**base, "cwd": workdir + "\x00/.."})),
        ("cwd /proc/self/cwd (the server's)", _frame_request({**base,
                                                              "cwd": "/proc/self/cwd"})),
        ("argv with NUL", _frame_request({**base, "argv": ["sh\x00", "-c", "id"]})),
        ("argv empty", _frame_request({**base, "argv": []})),
        ("op sign with a key not enabled", _frame_request({"op": "sign", "key": "ABCDEF",
                                                           "argv": [], "cwd": "/"})),
        ("op exec with a key", _frame_request({**base, "key": "ABCDEF"})),
        ("unknown op", _frame_request({**base, "op": "shell"})),
        ("request not JSON", encode_frame(Channel.REQUEST, b"\xff\xfe{")),
        ("request JSON nested 100,000 deep", encode_frame(
            Channel.REQUEST, b'{"argv":' + b"[" * 100000 + b"]" * 100000 + b"}")),
        ("frame length over 1 MiB", bytes([5]) + (2**32 - 1).to_bytes(4, "big") + b"{"),
        ("stdin frame before the request", encode_frame(Channel.STDIN, b"x")),
        ("unknown channel 7", bytes([7, 0, 0, 0, 0])),
        ("server channel (exit) from a client", encode_frame(Channel.EXIT, b"\0\0\0\0")),
        ("two request frames", _frame_request({**base, "argv": ["sleep", "2"]}) +
         _frame_request(base)),
        ("signal frame of 0", _frame_request({**base, "argv": ["sleep", "2"]}) +
         encode_frame(Channel.SIGNAL, b"\x00")),
    ]
    for name, data in refused_cases:
        out = await brokerwire.raw(sock, data, timeout=35)
        ok = (out.error is not None and not out.error.startswith(("timeout", "connection"))
              and out.seconds < 5)
        observed = (f"error frame: {out.error[:90]}" if out.error is not None else
                    f"exit {out.status}, no error frame")
        observed += f" (after {out.seconds:.1f} s)" if out.seconds >= 1 else ""
        rows.append(["broker requests", name, "error frame (refused)", observed, ok])

    # What runs in the sandbox sees only the allowed environment and the workdir.
    res = await brokerwire.run(sock, ["env"], workdir)
    env_text = res.stdout_head.decode(errors="replace")
    leaked = [line.split("=")[0] for line in env_text.splitlines()
              if line.startswith(("NONO_", "STRESS_SECRET"))]
    rows.append(["broker environment", "NONO_* and a secret variable in the server's "
                 "environment", "absent from the command's environment",
                 f"names seen: {leaked or 'none'} (exit {res.status})",
                 res.status == 0 and not leaked])
    secret = Path(os.environ.get("HOME", "/root")) / f".stress-secret-{os.getpid()}"
    secret.write_text("host secret\n")
    try:
        res = await brokerwire.run(sock, ["cat", str(secret)], workdir)
        rows.append(["broker confinement", "read a file in the host's home", "fails",
                     f"exit {res.status}, {res.stdout_len} bytes", res.status != 0 and
                     b"host secret" not in res.stdout_head])
    finally:
        secret.unlink()
    marker = f"/tmp/stress-escape-{random.randrange(10**9)}"
    res = await brokerwire.run(sock, ["sh", "-c", f"echo x > {marker}"], workdir)
    rows.append(["broker confinement", "write outside the workdir (host /tmp)",
                 "not visible on the host", f"exit {res.status}; on the host: "
                 f"{'PRESENT' if os.path.exists(marker) else 'absent'}",
                 not os.path.exists(marker)])
    # The server's own environment holds a marker variable the command must never see.
    res = await brokerwire.run(sock, ["sh", "-c", f"cat /proc/{server_pid}/environ; "
                                      f"cat /proc/{os.getpid()}/environ"], workdir)
    seen = b"do-not-pass-me" in res.stdout_head or b"STRESS_SECRET" in res.stdout_head
    rows.append(["broker confinement", "read the broker-server's (host) environ via /proc/PID",
                 "its variables not readable", f"exit {res.status}; server's secret variable "
                 f"{'READ' if seen else 'not seen'}", not seen])
    return rows


async def broker_slowloris(sock: str, seconds: float) -> list[object]:
    """A request frame dribbled one byte a second: cut off by the request timeout."""
    started = time.monotonic()
    reader, writer = await asyncio.open_unix_connection(sock)
    data = encode_request(Request(("true",), "/", False))
    closed = None
    for i in range(len(data)):
        if time.monotonic() - started > seconds:
            break
        try:
            writer.write(data[i:i + 1])
            await writer.drain()
            got = await asyncio.wait_for(reader.read(4096), 1.0)
            if got or got == b"":
                closed = time.monotonic() - started
                break
        except TimeoutError:
            continue
        except ConnectionError:
            closed = time.monotonic() - started
            break
    writer.close()
    observed = (f"cut off after {closed:.0f} s" if closed is not None else
                f"still open after {seconds:.0f} s")
    return ["slowloris", "broker request frame, one byte a second", "cut off by the 30 s "
            "request timeout", observed, closed is not None and closed <= 32]


def broker_cases(mode: Mode, tmp: Path) -> Rows:
    env = dict(os.environ, NONO_ALLOW_ALL="1", NONO_BLOCK_NET="0",
               STRESS_SECRET_TOKEN="do-not-pass-me")
    rows: Rows = []
    try:
        start_broker(tmp, "--env-allow=PATH,HOME,NONO_ALLOW_ALL", env=env)[0].stop()
        rows.append(["broker environment", "--env-allow naming NONO_ALLOW_ALL",
                     "refused at start", "the server started", False])
    except RuntimeError as exc:
        rows.append(["broker environment", "--env-allow naming NONO_ALLOW_ALL",
                     "refused at start", str(exc).split(": ", 1)[-1].strip()[:140],
                     "exited 1" in str(exc) and "NONO" in str(exc)])
    server, sock, workdir = start_broker(tmp, "--env-allow=PATH,HOME,LANG", env=env)

    async def go() -> Rows:
        slow = asyncio.create_task(broker_slowloris(sock, 40.0)) if not mode.quick else None
        rows = await broker_async(sock, workdir, server.pid)
        if slow is not None:
            rows.append(await slow)
        return rows

    try:
        rows += asyncio.run(go())
        rows += uid_cases(sock, workdir)
        alive = server.proc.poll() is None
    finally:
        status = server.stop()
    err = server.stderr_text()
    trace = traceback_in(err) or "Traceback" in err or "Fatal error" in err
    excerpt = traceback_summary(err) if trace else ""
    rows.append(["broker health", "after every attack: alive, no traceback on stderr, exit 0",
                 "alive, clean stderr, exit 0", f"alive={alive}; exit {status}; traceback on "
                 f"stderr: {'YES: ' + excerpt if trace else 'no'}",
                 alive and status == 0 and not trace])
    return rows


# --- another uid -------------------------------------------------------------------------------

_NOBODY_CLIENT = """
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect failed:", e.strerror); sys.exit(3)
body = json.dumps({"argv": ["id"], "cwd": sys.argv[2], "with_stdin": False}).encode()
s.sendall(struct.pack(">BI", 5, len(body)) + body)
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
print(repr(data[:200]))
"""


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           *argv], capture_output=True, text=True, timeout=30, check=False)


def uid_cases(sock: str, workdir: str) -> Rows:
    rows: Rows = []
    if os.geteuid() != 0:
        return [["another uid", "nobody connects to the broker", "refused",
                 "skipped: needs root for setpriv", None]]
    base = Path(sock).parent
    modes = [(p, p.stat().st_mode) for p in (base.parent, base)]
    try:
        for path, _ in modes:
            path.chmod(0o711)  # let nobody reach the socket's name; the socket stays 0600
        proc = _as_nobody("/usr/bin/python3", "-c", _NOBODY_CLIENT, sock, workdir)
        rows.append(["another uid", "nobody connects to the broker socket (0600)",
                     "connect refused (EACCES)", proc.stdout.strip()[:120] or proc.stderr[:120],
                     "connect failed" in proc.stdout])
        os.chmod(sock, 0o666)  # a misconfigured socket: the peer check must still refuse
        proc = _as_nobody("/usr/bin/python3", "-c", _NOBODY_CLIENT, sock, workdir)
        out = proc.stdout.strip()
        rows.append(["another uid", "nobody on a world-writable socket (SO_PEERCRED check)",
                     "error frame naming the uid, no command run", out[:140],
                     "is not the server's uid" in out and "uid=" not in out])
    finally:
        os.chmod(sock, 0o600)
        for path, mode in modes:
            path.chmod(mode & 0o7777)
    return rows


# --- the proxy, in its own network namespace ------------------------------------------


def proxy_cases(tmp: Path) -> Rows:
    if os.geteuid() != 0:
        return [["proxy attacks", "network namespace run (SSRF, exfiltration, smuggling, "
                 "slowloris)", "ran", "skipped: needs root for unshare -n -m", None]]
    out = tmp / "attacks-ns.json"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    proc = subprocess.run(["unshare", "-n", "-m", sys.executable, str(HERE / "attacks_ns.py"),
                           str(out), str(tmp)], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    if not out.exists():
        return [["proxy attacks", "network namespace run", "ran", f"exit {proc.returncode}: "
                 f"{proc.stderr.strip()[-400:]}", False]]
    rows: Rows = json.loads(out.read_text())
    if proc.returncode != 0:
        rows.append(["proxy attacks", "network namespace run", "exit 0",
                     f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}", False])
    return rows


def run(mode: Mode, tmp: Path) -> list[Table]:
    parts: dict[str, Callable[[], Rows]] = {
        "hook": lambda: hook_cases(tmp),
        "broker": lambda: broker_cases(mode, tmp),
        "proxy": lambda: proxy_cases(tmp),
    }
    rows: Rows = []
    for name, part in parts.items():
        print(f"   attacks: {name}", flush=True)
        try:
            rows += part()
        except Exception as exc:
            rows.append([name, "harness error", "-", f"{type(exc).__name__}: {exc}"[:300],
                         False])
    table = Table(f"Attacks refused ({len(rows)} named cases)",
                  ["#", "area", "case", "expected", "observed", "result"])
    for i, (area, case, expected, observed, ok) in enumerate(rows, 1):
        result = "ok" if ok else "skipped" if ok is None else finding(
            "attacks", f"{area}: {case}", f"python3 bench/stress.py --only attacks (case {i})",
            str(observed), str(expected))
        table.add(i, area, case, expected, observed, result)
    passed = sum(1 for r in rows if r[4])
    skipped = sum(1 for r in rows if r[4] is None)
    if skipped:
        table.notes.append(f"{skipped} rows skipped (not root).")
    table.notes.append(f"{passed} of {len(rows)} cases met their expected refusal. Rows of area "
                       "'control' check the instruments (a canary does count a connection that "
                       "reaches it).")
    return [table]
