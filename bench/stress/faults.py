"""Faults: things going wrong around the servers while they run.

Each fault is injected for real (kill -9 of a client, an upstream resetting
mid-body, a token command failing or hanging, the socket file deleted or
taken, the audit log's disk full, SIGTERM under load) and judged by what is
left afterwards: processes, fds, sockets, exit statuses, audit lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from stress import brokerwire, world
from stress.common import (
    HERE,
    Mode,
    Server,
    Table,
    commands_with_arg,
    descendants,
    finding,
    open_fds,
    process_age,
    processes_with_arg,
    script,
    start_broker,
    start_server,
    traceback_in,
    traceback_summary,
    wait_until,
)

COLUMNS = ["fault", "tries", "survived", "observed", "result"]


def _client_env(sock: str) -> dict[str, str]:
    return dict(os.environ, AGENT_SANDBOX_BROKER_SOCKET=sock)


# --- clients killed mid-stream ---------------------------------------------------------


def _kill_client(sock: str, workdir: str, variant: int, marker: str) -> str:
    """Start one client in ``variant`` and kill it mid-stream; '' or what went wrong."""
    env = _client_env(sock)
    if variant == 0:  # streaming stdout
        proc = subprocess.Popen([script("broker-client"), "-n", "-C", workdir, "--", "sh", "-c",
                                 f"yes {marker}"], stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None
        got = proc.stdout.read(1 << 20)
        if len(got) < 1 << 20:
            return f"read only {len(got)} bytes before the kill"
        proc.kill()
        proc.wait()
        proc.stdout.close()
    elif variant == 1:  # streaming stdin
        proc = subprocess.Popen([script("broker-client"), "-C", workdir, "--", "sh", "-c",
                                 f"cat >/dev/null; sleep 300.{marker}"],
                                stdin=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        for _ in range(8):
            proc.stdin.write(os.urandom(1 << 18))
        proc.stdin.flush()
        proc.kill()
        proc.wait()
        with contextlib.suppress(OSError):
            proc.stdin.close()
    else:  # a wire client: request sent, then the connection dropped without a word
        async def drop() -> None:
            from libbroker.wire import Request, encode_request
            _, writer = await asyncio.open_unix_connection(sock)
            writer.write(encode_request(Request(("sleep", f"300.{marker}"), workdir, False)))
            await writer.drain()
            await asyncio.sleep(0.5)
            writer.transport.abort()
        asyncio.run(drop())
    return ""


def clients_killed(mode: Mode, tmp: Path) -> list[list[str]]:
    server, sock, workdir = start_broker(tmp, f"--audit={tmp / 'kill-audit.jsonl'}")
    rows = []
    try:
        asyncio.run(brokerwire.run(sock, ["true"], workdir))
        fds_before = open_fds(server.pid)
        lingering = 0
        problems = []
        waits = []
        names = ["stdout streaming (yes), client kill -9", "stdin streaming, client kill -9",
                 "wire client drops the connection mid-command"]
        per_variant = {n: 0 for n in names}
        for i in range(mode.kill_rounds):
            variant = i % 3
            marker = str(random.randrange(10**6, 10**7))
            why = _kill_client(sock, workdir, variant, marker)
            per_variant[names[variant]] += 1
            started = time.monotonic()
            gone = wait_until(lambda: not descendants(server.pid) and
                              not processes_with_arg(marker), 10.0)
            waits.append(time.monotonic() - started)
            if why:
                problems.append(why)
            if not gone:
                lingering += 1
                problems.append(f"{names[variant]}: command still running 10 s after the kill")
        fds_after = open_fds(server.pid)
        alive = server.proc.poll() is None
        check = asyncio.run(brokerwire.run(sock, ["echo", "after"], workdir))
    finally:
        status = server.stop()
    audit = [json.loads(line) for line in (tmp / "kill-audit.jsonl").read_text().splitlines()]
    gone_lines = sum(1 for a in audit if a.get("client_gone"))
    observed = (f"command gone within {max(waits):.2f} s at worst (median "
                f"{sorted(waits)[len(waits) // 2]:.2f} s); processes lingering: {lingering}; "
                f"server fds {fds_before} before, {fds_after} after; audit lines marking the "
                f"client gone: {gone_lines}; a later command: exit {check.status}; server exit "
                f"{status} after SIGTERM")
    bad = problems or fds_after > fds_before or not alive or check.status != 0
    result = "ok"
    if bad or traceback_in(server.stderr_text()):
        result = finding("faults", "client killed mid-stream", "python3 bench/stress.py --only "
                         "faults", "; ".join(problems[:3]) or observed,
                         "the command ends, nothing lingers, the server serves on")
    rows.append(["clients killed mid-stream (" + ", ".join(f"{k}: {v}" for k, v in
                                                       per_variant.items()) + ")",
                 str(mode.kill_rounds), str(mode.kill_rounds - lingering), observed, result])
    return rows


# --- upstream reset mid-body ------------------------------------------------------------


async def _reset_one(proxy: world.Proxy, path_kind: str) -> str:
    """'' when the client saw an error for a body cut short, else what it saw."""
    ctx = proxy.client_context()
    if path_kind == "injected (TLS terminated)":
        reader, writer, head = await world.connect(proxy.port, "github.com:443")
        await world.start_tls(reader, writer, ctx, "github.com")
        raw = world.get("github.com", "/reset")
    elif path_kind == "raw tunnel":
        reader, writer, head = await world.connect(proxy.port, "other.stress.test:443")
        up = ssl.create_default_context(cafile=str(proxy.egress.parent / "up-ca.pem"))
        await world.start_tls(reader, writer, up, "other.stress.test")
        raw = world.get("other.stress.test", "/reset")
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        raw = b"GET http://plain.stress.test/reset HTTP/1.1\r\nHost: plain.stress.test\r\n\r\n"
    try:
        writer.write(raw)
        await writer.drain()
        head = await world.read_head(reader)
        length = int(world.header(head, "content-length") or 0)
        body = await asyncio.wait_for(reader.readexactly(length), 15)
        return f"got a whole {len(body)}-byte body"
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        return ""
    except TimeoutError:
        return "the client hung (no error within 15 s)"
    finally:
        world.close(writer)


async def _steady(proxy: world.Proxy, token: str, stop: asyncio.Event, out: list[int]) -> None:
    """Injected requests to api.github.com all the while: [done, failed]."""
    ctx = proxy.client_context()
    want = world.expected_tag("api.github.com", token)
    while not stop.is_set():
        try:
            reader, writer, _ = await world.connect(proxy.port, "api.github.com:443")
            await world.start_tls(reader, writer, ctx, "api.github.com")
            while not stop.is_set():
                _, body = await world.request(reader, writer, world.get("api.github.com"))
                if f"auth={want}".encode() in body:
                    out[0] += 1
                else:
                    out[1] += 1
            world.close(writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ssl.SSLError):
            out[1] += 1


def upstream_reset(mode: Mode, tmp: Path) -> list[list[str]]:
    up = world.start_upstreams(tmp)
    token = "stress-reset-" + os.urandom(6).hex()
    state = world.token_file(tmp, token)
    proxy = world.start_world_proxy(
        tmp, up, f"--resolve=plain.stress.test:127.0.0.1:{up.ports['plain']}",
        allow="other.stress.test,plain.stress.test",
        token_command=f"python3 {HERE / 'token_cmd.py'} {state}", socks=False)
    kinds = ["injected (TLS terminated)", "raw tunnel", "plain HTTP (absolute-form)"]
    outcomes: dict[str, list[str]] = {k: [] for k in kinds}

    async def go() -> list[int]:
        stop = asyncio.Event()
        steady = [0, 0]
        task = asyncio.create_task(_steady(proxy, token, stop, steady))
        for i in range(mode.reset_rounds):
            kind = kinds[i % 3]
            try:
                outcomes[kind].append(await _reset_one(proxy, kind))
            except (OSError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
                outcomes[kind].append(f"setup failed: {type(exc).__name__}: {exc}")
        await asyncio.sleep(0.5)
        stop.set()
        await task
        return steady

    try:
        fds_before = open_fds(proxy.pid)
        steady = asyncio.run(go())
        time.sleep(1.0)
        fds_after = open_fds(proxy.pid)
        alive = proxy.server.proc.poll() is None
    finally:
        status = proxy.server.stop()
        up.stop()
    rows = []
    for kind in kinds:
        bad = [o for o in outcomes[kind] if o]
        result = "ok"
        if bad:
            result = finding("faults", f"upstream reset mid-body ({kind})",
                             "python3 bench/stress.py --only faults",
                             f"{len(bad)} of {len(outcomes[kind])}: {bad[0]}",
                             "the client gets an error, never a whole body")
        rows.append([f"upstream resets mid-body: {kind}", str(len(outcomes[kind])),
                     str(len(outcomes[kind]) - len(bad)),
                     "client saw the body cut short (error) every time" if not bad else bad[0],
                     result])
    text = proxy.log_text() + proxy.server.stderr_text()
    observed = (f"{steady[0]} injected requests served meanwhile, {steady[1]} failed; proxy "
                f"fds {fds_before} before, {fds_after} after; exit {status} after SIGTERM")
    result = "ok"
    if steady[1] or not alive or fds_after > fds_before or traceback_in(text):
        result = finding("faults", "the proxy did not keep serving others through resets",
                         "python3 bench/stress.py --only faults", observed,
                         "every other request served, fds back to the baseline")
    rows.append(["... while others are served (injected GETs on another connection)",
                 str(steady[0] + steady[1]), str(steady[0]), observed, result])
    return rows


# --- the token command failing or hanging ---------------------------------------------


async def _tags(proxy: world.Proxy, count: int) -> tuple[list[str], float]:
    """``count`` injected requests: the auth tags seen, and the slowest one."""
    ctx = proxy.client_context()
    reader, writer, _ = await world.connect(proxy.port, "api.github.com:443")
    await world.start_tls(reader, writer, ctx, "api.github.com")
    tags, slowest = [], 0.0
    try:
        for _ in range(count):
            started = time.monotonic()
            _, body = await world.request(reader, writer, world.get("api.github.com"))
            slowest = max(slowest, time.monotonic() - started)
            text = body.decode()
            tags.append(text.split("auth=", 1)[1].split()[0] if "auth=" in text else "?")
    finally:
        world.close(writer)
    return tags, slowest


def token_startup_child(tmp: Path) -> list[list[str]]:
    """A first token read whose command leaves a child holding its stdout (full mode)."""
    marker = str(random.randrange(10**6, 10**7))
    command = f"sh -c 'sleep 600.{marker}; echo tok'"
    log = tmp / "token-start.log"
    argv = [script("egress-proxy"), "--listen=127.0.0.1:0", f"--token-command={command}",
            f"--log={log}"]
    err = tmp / "token-start.err"
    with open(err, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=fh)
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    started = time.monotonic()
    listening = wait_until(lambda: bool(proc.stdout and proc.stdout.read()), 45, 0.5)
    waited = time.monotonic() - started
    proc.send_signal(signal.SIGTERM)
    try:
        status: int | None = proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        status = proc.wait()
    time.sleep(0.5)
    left = processes_with_arg(f"600.{marker}")
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    logged = log.read_text(errors="replace").strip() if log.exists() else ""
    observed = (f"{'listening' if listening else 'no listening line'} after {waited:.0f} s "
                f"(the run bound is 30 s); log: {logged[-120:] or 'nothing'}; exit {status} "
                f"after SIGTERM; the command's child left running: {len(left)}")
    ok = listening and not left
    return [[f"token command ({command}) at start-up: its child keeps stdout open", "1",
             "1" if ok else "0", observed,
             "ok" if ok else finding(
                 "faults", "egress-proxy: a token command whose child keeps its stdout open "
                 "wedges the token read (start-up never completes; renewal stops) and the child "
                 "outlives the proxy",
                 f"egress-proxy --listen=127.0.0.1:0 --token-command=\"{command}\"",
                 observed + ". Likely cause: libegress/tokens.py read_token kills only the "
                 "direct child at the bound, then awaits proc.wait(), which asyncio completes "
                 "only once every pipe is closed - the orphaned grandchild holds stdout",
                 "after 30 s: the whole command (its process group) killed, a log line, the "
                 "proxy serving (without a token) and renewal retried")]]


def token_faults(mode: Mode, tmp: Path) -> list[list[str]]:
    up = world.start_upstreams(tmp)
    tokens = {f"T{i}": f"stress-tok{i}-" + os.urandom(6).hex() for i in range(1, 5)}
    state = world.token_file(tmp, tokens["T1"])
    runs = Path(str(state) + ".runs")
    proxy = world.start_world_proxy(
        tmp, up, "--token-every=1", token_command=f"python3 {HERE / 'token_cmd.py'} {state}",
        socks=False)
    rows: list[list[str]] = []

    def tag(name: str) -> str:
        return world.expected_tag("api.github.com", tokens[name])

    def phase(word: str, seconds: float) -> tuple[list[str], float, int]:
        before = len(runs.read_text().splitlines()) if runs.exists() else 0
        state.write_text(word + "\n")
        time.sleep(seconds)
        tags, slowest = asyncio.run(_tags(proxy, 20))
        after = len(runs.read_text().splitlines()) if runs.exists() else 0
        return tags, slowest, after - before

    def row(name: str, ok: bool, observed: str, expected: str) -> None:
        result = "ok" if ok else finding("faults", f"token command: {name}",
                                         "python3 bench/stress.py --only faults "
                                         "(egress-proxy --token-every=1)", observed, expected)
        rows.append([f"token command {name}", "1", "1" if ok else "0", observed, result])

    try:
        tags, _, _ = phase(f"ok:{tokens['T1']}", 0.2)
        row("works (baseline)", set(tags) == {tag("T1")}, f"20 requests carry T1: "
            f"{tags.count(tag('T1'))}", "T1 on every request")
        tags, slowest, tries = phase("fail", 4.0)
        row("fails (exit 1)", set(tags) == {tag("T1")} and tries >= 2,
            f"{tries} renewals tried in 4 s; 20 requests carry the old T1: "
            f"{tags.count(tag('T1'))}", "old token kept, renewal retried, requests flow")
        started = time.monotonic()
        state.write_text(f"ok:{tokens['T2']}\n")
        recovered = wait_until(lambda: asyncio.run(_tags(proxy, 1))[0] == [tag("T2")], 30, 0.5)
        row("recovers after failing", recovered,
            f"T2 in use {time.monotonic() - started:.1f} s after the command works again",
            "new token picked up within the back-off")
        tags, slowest, tries = phase("hang", 3.0)
        row("hangs", set(tags) == {tag("T2")} and slowest < 2.0,
            f"20 requests during the hang carry T2: {tags.count(tag('T2'))}, slowest "
            f"{slowest * 1000:.0f} ms", "requests keep flowing with the old token")
        if not mode.quick:
            started = time.monotonic()
            state.write_text(f"ok:{tokens['T3']}\n")
            recovered = wait_until(lambda: asyncio.run(_tags(proxy, 1))[0] == [tag("T3")],
                                   45, 1.0)
            # With --token-every=1 a fresh run may be in flight at any moment: a hung
            # one is a run older than a few seconds (the hang began >= 30 s ago).
            def hung_runs() -> list[int]:
                return [p for p in processes_with_arg(str(state))
                        if p != proxy.pid and process_age(p) > 5.0]

            wait_until(lambda: not hung_runs(), 5.0)  # a run killed just now is being reaped
            hung = hung_runs()
            row("recovers after hanging (30 s run bound)", recovered and not hung,
                f"T3 in use {time.monotonic() - started:.1f} s later; hung token commands "
                f"left: {len(hung)}", "hung run killed at the bound, renewal retried")
        if mode.quick:
            # The hung run above holds the keeper for its 30 s bound: the child case
            # needs the full mode.
            status = proxy.server.stop()
            rows.append(["token command hangs in a child process (full mode only)", "0", "-",
                         f"skipped in --quick; proxy exit {status} after SIGTERM during a hang",
                         "ok" if status == 0 else "exit status"])
        else:
            marker = str(random.randrange(10**6, 10**7))
            state.write_text(f"hang-child {marker}\n")
            started_child = wait_until(lambda: bool(processes_with_arg(f"3600.{marker}")), 5)
            time.sleep(1.0)
            state.write_text(f"ok:{tokens['T4']}\n")
            began = time.monotonic()
            recovered = wait_until(lambda: asyncio.run(_tags(proxy, 1))[0] == [tag("T4")],
                                   50, 1.0)
            waited = time.monotonic() - began
            outcome = (f"in use {waited:.0f} s later" if recovered else
                       f"never in use within {waited:.0f} s: renewal is wedged")
            row("hangs in a child process that keeps its stdout open", recovered,
                f"child started: {started_child}; the command was fixed, then T4 {outcome}"
                f"; renewal lines in the log: {proxy.log_text().count('token renewal failed')}",
                "the run bound (30 s) ends the whole command, renewal goes on")
            started = time.monotonic()
            status = proxy.server.stop()
            took = time.monotonic() - started
            time.sleep(0.5)
            left = processes_with_arg(f"3600.{marker}")
            cmd_left = processes_with_arg(str(state))
            row("... then the proxy gets SIGTERM", not left and not cmd_left and status == 0,
                f"proxy exit {status}"
                f"{' (did not exit within 15 s of SIGTERM: killed)' if status == -9 else ''} "
                f"after {took:.1f} s; token command processes left: {len(cmd_left)}; its "
                f"child (sleep) left: {len(left)}",
                "SIGTERM ends the proxy (exit 0) and everything its token command started")
            for pid in left + cmd_left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        text = proxy.log_text() + proxy.server.stderr_text()
        leaked = [name for name, value in tokens.items() if value in text]
        row("never logged", not leaked,
            f"tokens found in the log or stderr: {leaked or 'none'}; renewal failures logged: "
            f"{text.count('token renewal failed')}", "no token in any log line")
        trace = traceback_summary(proxy.server.stderr_text())
        row("run leaves the proxy's stderr clean", not trace,
            f"traceback on stderr: {trace}" if trace else "no traceback",
            "no traceback reaching the user")
    finally:
        proxy.server.stop()
        up.stop()
    return rows


# --- the broker socket deleted or replaced ----------------------------------------------


def _client(sock: str, workdir: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([script("broker-client"), "-n", f"--socket={sock}", "-C", workdir,
                           "--", *argv], capture_output=True, text=True, timeout=30,
                          check=False)


def socket_faults(tmp: Path) -> list[list[str]]:
    rows: list[list[str]] = []
    # Deleted while a command runs.
    server, sock, workdir = start_broker(tmp)
    try:
        long = subprocess.Popen([script("broker-client"), "-n", f"--socket={sock}", "-C",
                                 workdir, "--", "sh", "-c", "sleep 1; echo finished"],
                                stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        os.unlink(sock)
        late = _client(sock, workdir, "true")
        out, _ = long.communicate(timeout=30)
        status = server.stop()
    finally:
        server.stop()
    ok = late.returncode == 125 and out == "finished\n" and status == 0
    observed = (f"running command finished ({out.strip()!r}, exit {long.returncode}); new "
                f"client: exit {late.returncode}, {late.stderr.strip()!r}; server exit {status}")
    rows.append(["socket deleted under a running server", "1", "1" if ok else "0", observed,
                 "ok" if ok else finding("faults", "socket deleted", "rm SOCKET under "
                                         "broker-server", observed, "exit 125 + message")])

    # Replaced by a second server: the first one's shutdown must not remove the newcomer's.
    first, sock, workdir = start_broker(tmp)
    second: Server | None = None
    try:
        os.unlink(sock)
        second = start_server([script("broker-server"), f"--socket={sock}",
                               f"--workdir={workdir}"], 1, tmp)
        via_new = _client(sock, workdir, "echo", "new")
        first_status = first.stop()
        exists = os.path.exists(sock)
        after = _client(sock, workdir, "echo", "still")
    finally:
        first.stop()
        if second is not None:
            second_status = second.stop()
    ok = exists and after.returncode == 0
    observed = (f"client reached the new server: exit {via_new.returncode}; old server exit "
                f"{first_status} after SIGTERM; the new server's socket "
                f"{'still exists' if exists else 'was REMOVED by the old server'}; a client "
                f"after that: exit {after.returncode} {after.stderr.strip()[:120]!r}; new "
                f"server exit {second_status}")
    rows.append(["socket replaced by another server, then the old one stops", "1",
                 "1" if ok else "0", observed,
                 "ok" if ok else finding(
                     "faults", "an old broker-server removes the socket of the server that "
                     "replaced it",
                     "broker-server --socket=S & rm S; broker-server --socket=S & "
                     "kill -TERM <first>",
                     observed, "the old server removes the socket only if it is still its own "
                     "(same inode); the new server stays reachable")])

    # Replaced by a plain file.
    server, sock, workdir = start_broker(tmp)
    try:
        os.unlink(sock)
        Path(sock).write_text("not a socket\n")
        late = _client(sock, workdir, "true")
        status = server.stop()
        survived = os.path.exists(sock)
    finally:
        server.stop()
    ok = late.returncode == 125
    observed = (f"client: exit {late.returncode}, {late.stderr.strip()!r}; server exit {status}"
                f"; the file {'kept' if survived else 'was removed by the server on exit'}")
    note = "ok" if ok else finding("faults", "socket replaced by a file", "idem", observed,
                                   "exit 125")
    if ok and not survived:
        note = finding("faults", "broker-server removes a non-socket file at its socket path "
                       "on exit", "broker-server --socket=S & rm S; echo x > S; "
                       "kill -TERM <server>", observed,
                       "only its own socket is removed (bind_socket itself refuses to replace "
                       "a non-socket)")
    rows.append(["socket replaced by a regular file", "1", "1" if ok else "0", observed, note])
    return rows


# --- disk full on the audit log ----------------------------------------------------------


def audit_full(tmp: Path) -> list[list[str]]:
    rows: list[list[str]] = []
    server, sock, workdir = start_broker(tmp, "--audit=/dev/full")
    try:
        results = [_client(sock, workdir, "echo", f"n{i}") for i in range(5)]
        status = server.stop()
    finally:
        server.stop()
    err = server.stderr_text()
    ran = sum(1 for r in results if r.returncode == 0)
    notices = err.count("cannot write the audit log")
    internal = [line for line in err.splitlines() if "internal error" in line]
    observed = (f"{ran} of 5 commands ran; stderr notices 'cannot write the audit log': "
                f"{notices}; server exit {status} after SIGTERM"
                + (f" with {internal[0]!r}" if internal else ""))
    help_text = subprocess.run([script("broker-server"), "--help"], capture_output=True,
                               text=True, check=False).stdout.lower()
    documented = any(w in help_text for w in ("cannot be written", "fail closed", "disk full"))
    observed += f"; --help states a rule: {'yes' if documented else 'no'}"
    if documented:
        observed += (" (fail closed: the request whose line fails has already run; later ones "
                     "are refused until a line can be written)")
    ok = (ran == 0 or notices >= ran) and not traceback_in(err) and status == 0
    note = "ok"
    if status != 0 or traceback_in(err):
        note = finding("faults", "broker-server exits 70 ('internal error: OSError') on "
                       "SIGTERM when the audit log's disk is full",
                       "broker-server --audit=/dev/full ...; broker-client -- echo n; "
                       "kill -TERM <server>", observed,
                       "exit 0 after SIGTERM (DESIGN 2.3), the close of the audit file "
                       "handled like its writes")
    if ran and not documented:
        note = finding(
            "faults", "commands run unaudited when the audit log cannot be "
                       "written; the rule is not documented",
            "broker-server --audit=/dev/full; broker-client -- echo n",
            observed,
            "a documented rule (fail closed: refuse with an error frame, or run "
            "and log on stderr), stated in --help")
    rows.append(["audit log on /dev/full (ENOSPC on every write)", "5", str(ran), observed,
                 note])

    # A real small filesystem: fill it, run, free it, run again; no torn line.
    mnt = tmp / "auditfs"
    mnt.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True,
        text=True, check=False).returncode == 0
    if not mounted:
        rows.append(["audit log on a full 64 KiB tmpfs", "0", "-",
                     "skipped: mounting a tmpfs needs root", "skipped"])
        return rows
    try:
        log = mnt / "audit.jsonl"
        server, sock, workdir = start_broker(tmp, f"--audit={log}")
        try:
            filler = mnt / "filler"
            with contextlib.suppress(OSError), open(filler, "wb") as fh:
                while True:
                    fh.write(b"f" * 512)
                    fh.flush()
            full = [_client(sock, workdir, "echo", f"full{i}") for i in range(5)]
            filler.unlink()
            freed = [_client(sock, workdir, "echo", f"freed{i}") for i in range(5)]
            status = server.stop()
        finally:
            server.stop()
        lines = log.read_text(errors="replace").splitlines()
        torn = 0
        for line in lines:
            try:
                json.loads(line)
            except ValueError:
                torn += 1
        logged_full = sum(1 for line in lines if '"full' in line)
        logged_freed = sum(1 for line in lines if '"freed' in line)
        ran_full = sum(1 for r in full if r.returncode == 0)
        notices = server.stderr_text().count("cannot write the audit log")
        observed = (f"disk full: {ran_full} of 5 ran, stderr notices {notices}; lines for "
                    f"them in the file at the end (held back, written once space came back): "
                    f"{logged_full}; ")
        observed += (f"after freeing: "
                    f"{sum(r.returncode == 0 for r in freed)} ran, {logged_freed} audited; "
                    f"torn lines: {torn}; server exit {status}")
        ok = torn == 0 and logged_freed == 5
        note = "ok (see the /dev/full row for the rule)"
        if not ok:
            note = finding("faults", "audit log after the disk was full",
                           "broker-server --audit=<file on a full tmpfs>; free space; run",
                           observed, "every later request audited, no torn or mixed line")
        rows.append(["audit log on a full 64 KiB tmpfs, then space freed", "10",
                     str(ran_full + sum(r.returncode == 0 for r in freed)), observed, note])
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    return rows


# --- SIGTERM during live connections ------------------------------------------------------


def sigterm_broker(mode: Mode, tmp: Path) -> list[list[str]]:
    server, sock, workdir = start_broker(tmp)
    marker = str(random.randrange(10**6, 10**7))
    n = mode.sigterm_conns
    real = max(2, n // 10)
    procs = [subprocess.Popen([script("broker-client"), "-n", f"--socket={sock}", "-C", workdir,
                               "--", "sleep", f"300.{marker}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(real)]

    async def go() -> tuple[list[brokerwire.Outcome | BaseException], float, int]:
        tasks = []
        await asyncio.sleep(0)
        for i in range(n - real):
            argv = (["sleep", f"300.{marker}"] if i % 3 else ["sh", "-c", f"yes {marker}"])
            tasks.append(asyncio.create_task(brokerwire.run(sock, argv, workdir, timeout=60)))
        running = 0
        limit = time.monotonic() + 60
        while time.monotonic() < limit:
            running = len(commands_with_arg(marker, ("sleep", "yes")))
            if running >= n:
                break
            await asyncio.sleep(0.2)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return results, started, running

    try:
        results, started, _ = asyncio.run(go())
    except BaseException:
        server.proc.kill()
        for p in procs:
            p.kill()
        raise
    try:
        status = server.proc.wait(30)
    except subprocess.TimeoutExpired:
        status = None
    took = time.monotonic() - started
    client_status: list[int | None] = []
    client_err = []
    for p in procs:
        try:
            _, cerr = p.communicate(timeout=15)
            client_status.append(p.returncode)
            if p.returncode != 137 and cerr.strip():
                client_err.append(cerr.strip()[:160])
        except subprocess.TimeoutExpired:
            p.kill()
            client_status.append(None)
    ended = sum(1 for r in results if isinstance(r, brokerwire.Outcome)
                and (r.status is not None or r.error is not None))
    time.sleep(0.5)
    left = processes_with_arg(marker)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    removed = not os.path.exists(sock)
    statuses = sorted({str(r.status) for r in results if isinstance(r, brokerwire.Outcome)})
    observed = (f"{n} commands running; after SIGTERM: server exit {status} in "
                f"{took:.1f} s, socket {'removed' if removed else 'LEFT'}, {ended} of "
                f"{n - real} wire clients got a final frame (statuses {', '.join(statuses)}), "
                f"broker-client exits {sorted(set(map(str, client_status)))}"
                f"{' ' + repr(client_err[:1]) if client_err else ''}, commands left: "
                f"{len(left)}")
    ok = (status == 0 and removed and ended == n - real and not left
          and all(s is not None for s in client_status))
    return [[f"SIGTERM to broker-server during {n} live connections", "1", "1" if ok else "0",
             observed, "ok" if ok else finding("faults", "SIGTERM during live connections",
                                               "kill -TERM broker-server with N commands",
                                               observed, "all ended, socket removed, exit 0")]]


def sigterm_proxy(mode: Mode, tmp: Path) -> list[list[str]]:
    up = world.start_upstreams(tmp)
    proxy = world.start_world_proxy(
        tmp, up, f"--resolve=echo.stress.test:127.0.0.1:{up.ports['echo']}",
        allow="echo.stress.test:443", socks=False)
    n = mode.sigterm_conns

    async def go() -> tuple[int, int, float]:
        conns = []
        for _ in range(n):
            reader, writer, head = await world.connect(proxy.port, "echo.stress.test:443")
            if world.status_of(head) == 200:
                conns.append((reader, writer))
        started = time.monotonic()
        proxy.server.proc.send_signal(signal.SIGTERM)
        ended = 0
        for reader, _ in conns:
            with contextlib.suppress(OSError, TimeoutError):
                if await asyncio.wait_for(reader.read(), 15) == b"":
                    ended += 1
        for _, writer in conns:
            world.close(writer)
        return len(conns), ended, started

    try:
        opened, ended, started = asyncio.run(go())
        try:
            status = proxy.server.proc.wait(30)
        except subprocess.TimeoutExpired:
            status = None
        took = time.monotonic() - started
    finally:
        proxy.server.stop()
        up.stop()
    observed = (f"{opened} tunnels open; after SIGTERM: exit {status} in {took:.1f} s, "
                f"{ended} tunnels closed by the proxy")
    ok = status == 0 and ended == opened == n
    return [[f"SIGTERM to egress-proxy during {n} live tunnels", "1", "1" if ok else "0",
             observed, "ok" if ok else finding("faults", "proxy SIGTERM with live tunnels",
                                               "kill -TERM egress-proxy", observed,
                                               "exit 0, every tunnel closed")]]


def run(mode: Mode, tmp: Path) -> list[Table]:
    table = Table("Faults survived", COLUMNS)
    parts: dict[str, Callable[[], list[list[str]]]] = {
        "clients killed": lambda: clients_killed(mode, tmp),
        "upstream reset": lambda: upstream_reset(mode, tmp),
        "token command": lambda: token_faults(mode, tmp),
        "token command at start-up": lambda: [] if mode.quick else token_startup_child(tmp),
        "socket": lambda: socket_faults(tmp),
        "audit disk full": lambda: audit_full(tmp),
        "SIGTERM broker": lambda: sigterm_broker(mode, tmp),
        "SIGTERM proxy": lambda: sigterm_proxy(mode, tmp),
    }
    for name, part in parts.items():
        print(f"   faults: {name}", flush=True)
        try:
            table.rows += part()
        except Exception as exc:
            table.add(f"harness error in {name}", "-", "-",
                      f"{type(exc).__name__}: {exc}"[:300], "harness")
    return [table]

