"""--log-allowed: one line per allowed connection (host, port, pid, mode), never a secret."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from egress_proxyproc import ProxyProc, start_proxy
from egress_world import TOKEN, World, proxy_args, require

CLIENT_SECRET = "client-side-secret-0123456789"
PID_SCAN_INTERVAL = 1.1  # libegress.peers.PidFinder's interval, and a margin



def _curl(proxy: ProxyProc, *args: str) -> int:
    """Run curl through ``proxy``; its pid (the proxy logs the peer's pid).

    The proxy scans /proc for an unknown peer at most once a second (a flood
    of connections must not cost a scan each), so each client comes after
    the last scan's second is over: every line then names its pid.
    """
    curl = require("curl")
    time.sleep(PID_SCAN_INTERVAL)
    proc = subprocess.Popen(
        [curl, "-sS", "-o", "/dev/null", "--max-time", "20", "-H",
         f"Authorization: Bearer {CLIENT_SECRET}", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    proc.wait(60)
    return proc.pid


def _allowed_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if " egress-proxy allowed " in line]


def test_each_allowed_connection_is_logged_with_its_mode(world: World, tmp_path: Path) -> None:
    log = tmp_path / "proxy.log"
    egress = tmp_path / "egress"
    p = start_proxy([*proxy_args(world, egress), "--log-allowed"], log=log, socks=True)
    try:
        plain = f"allowed.test:{world.plain.port}"
        raw_pid = _curl(p, "-x", p.http, "--cacert", str(world.ca_file), f"https://{plain}/raw")
        socks_pid = _curl(p, "--socks5-hostname", str(p.socks), "--cacert", str(world.ca_file),
                          f"https://{plain}/socks")
        inject_pid = _curl(p, "-x", p.http, "--cacert", str(egress / "bundle.pem"),
                           "https://api.github.com/user")
        http_pid = _curl(p, "-x", p.http, f"http://{plain}/plain")
        denied_pid = _curl(p, "-x", p.http, "https://denied.test/")
    finally:
        assert p.stop() == 0
    lines = _allowed_lines(log)
    for host, port, pid, mode in (
        ("allowed.test", world.plain.port, raw_pid, "raw"),
        ("allowed.test", world.plain.port, socks_pid, "socks"),
        ("api.github.com", 443, inject_pid, "intercept"),
        ("allowed.test", world.plain.port, http_pid, "http"),
    ):
        want = f"egress-proxy allowed host={host} port={port} pid={pid} mode={mode}"
        assert sum(want in line for line in lines) == 1, (want, lines)
    assert len(lines) == 4
    text = log.read_text()
    assert f"pid={denied_pid}" in text and "denied.test" in text  # refused: logged as before
    assert not any("denied.test" in line for line in lines)
    assert TOKEN not in text and CLIENT_SECRET not in text
    assert "Authorization" not in text and "Bearer" not in text


def test_without_the_flag_allowed_connections_are_not_logged(world: World,
                                                             tmp_path: Path) -> None:
    log = tmp_path / "proxy.log"
    p = start_proxy(proxy_args(world, tmp_path / "egress"), log=log, socks=True)
    try:
        for args in (("--cacert", str(world.ca_file), f"https://allowed.test:{world.plain.port}/"),
                     ("https://denied.test/",)):
            subprocess.run([require("curl"), "-sS", "-o", "/dev/null", "--max-time", "20",
                            "-x", p.http, *args], capture_output=True, check=False, timeout=60)
    finally:
        assert p.stop() == 0
    assert _allowed_lines(log) == []
    assert "denied.test" in log.read_text()


def test_the_peer_pid_is_looked_up_for_an_allowed_line_only() -> None:
    """The pid's lookup scans /proc (~4 ms of CPU with 100 processes, more on a
    busy machine): an allowed connection without --log-allowed, a session's,
    must not pay it for a line nobody writes."""
    import io

    from libegress.eventlog import EventLog
    from libegress.outcome import Mode

    asked: list[int] = []

    def find_pid() -> int:
        asked.append(1)
        return 4242

    quiet = io.StringIO()
    EventLog(quiet).allowed("allowed.test", 443, Mode.TUNNEL, find_pid)
    assert asked == [] and quiet.getvalue() == ""
    told = io.StringIO()
    EventLog(told, log_allowed=True).allowed("allowed.test", 443, Mode.TUNNEL, find_pid)
    assert asked == [1] and " pid=4242 mode=raw" in told.getvalue()
