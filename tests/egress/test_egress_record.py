"""--record: one JSON line per decision (never a secret); --learn: the allow list passes, marked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from egress_proxyproc import ProxyProc, start_proxy
from egress_world import TOKEN, World, proxy_args, require

from libegress.record import request_path
from libegress.route import EgressPolicy, Refused, Route, route

CLIENT_SECRET = "client-side-secret-record-0123456789"


def _curl(proxy: ProxyProc, *args: str) -> str:
    done = subprocess.run(
        [require("curl"), "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20",
         "-H", f"Authorization: Bearer {CLIENT_SECRET}", *args],
        capture_output=True, text=True, check=False, timeout=60,
    )
    return done.stdout


def _events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_decision_is_one_line_without_a_secret(world: World, tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    egress = tmp_path / "egress"
    p = start_proxy([*proxy_args(world, egress), f"--record={record}"], socks=True)
    try:
        plain = f"allowed.test:{world.plain.port}"
        _curl(p, "-x", p.http, "--cacert", str(world.ca_file), f"https://{plain}/raw")
        _curl(p, "--socks5-hostname", str(p.socks), "--cacert", str(world.ca_file),
              f"https://{plain}/socks")
        assert _curl(p, "-x", p.http, "--cacert", str(egress / "bundle.pem"),
                     "https://api.github.com/user?access_token=" + CLIENT_SECRET) == "200"
        _curl(p, "-x", p.http, f"http://{plain}/plain?q=1")
        assert _curl(p, "-x", p.http, "https://denied.test/") == "000"
    finally:
        assert p.stop() == 0
    events = _events(record)
    assert [(e["host"], e.get("kind"), e["verdict"]) for e in events] == [
        ("allowed.test", "tunnel", "allowed"),
        ("allowed.test", "socks", "allowed"),
        ("api.github.com", "injected", "allowed"),
        ("allowed.test", "plain", "allowed"),  # the stand-in speaks TLS: no answer,
        ("allowed.test", None, "failed"),  # and the connection fails
        ("denied.test", None, "refused"),
    ]
    tunnel, _, injected, plain_http, _, refused = events
    up, down = tunnel["up"], tunnel["down"]
    assert isinstance(up, int) and isinstance(down, int) and up > 0 and down > 0
    assert {"method": "GET", "path": "/user?...", "status": 200}.items() <= injected.items()
    assert {"method": "GET", "path": "/plain?..."}.items() <= plain_http.items()
    assert "not on the allow list" in str(refused["reason"])
    assert all(isinstance(e.get("dur", 0), float | int) for e in events)
    text = record.read_text()
    assert TOKEN not in text and CLIENT_SECRET not in text and "Bearer" not in text
    assert not any("learn" in e for e in events)


def test_learn_passes_unlisted_hosts_and_marks_them(world: World, tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    egress = tmp_path / "egress"
    args = list(proxy_args(world, egress))
    args[1] = "other.test:1"  # allowed.test is not on the list now
    p = start_proxy([*args, f"--record={record}", "--learn"])
    try:
        plain = f"allowed.test:{world.plain.port}"
        assert _curl(p, "-x", p.http, "--cacert", str(world.ca_file),
                     f"https://{plain}/raw") == "200"
        # The address rules still hold: a host that resolves to loopback is refused.
        _curl(p, "-x", p.http, "https://localhost:9/")
        # Seen even though it never resolves.
        _curl(p, "-x", p.http, "https://nowhere.invalid/")
        # The token still goes only to the inject host.
        assert _curl(p, "-x", p.http, "--cacert", str(egress / "bundle.pem"),
                     "https://api.github.com/user") == "200"
    finally:
        assert p.stop() == 0
    events = _events(record)
    marks = {(e["host"], e["verdict"], e.get("learn")) for e in events}
    assert ("allowed.test", "allowed", "not on the allow list") in marks
    assert ("localhost", "refused", "not on the allow list") in marks
    assert any("blocked-address" in str(e.get("reason")) or "refused" in str(e.get("reason"))
               for e in events if e["host"] == "localhost")
    assert ("nowhere.invalid", "failed", "not on the allow list") in marks
    assert ("api.github.com", "allowed", None) in marks
    assert world.plain.seen and all(not r.get("authorization") for r in world.plain.seen
                                    if r.get("path") == "/raw")


def test_learn_keeps_the_inject_rules() -> None:
    policy = EgressPolicy(learn=True)
    assert route(policy, "example.org", 8443, tls=True) is Route.LEARN
    assert route(policy, "github.com", 443, tls=True) is Route.INTERCEPT
    for host, port, tls in (("github.com", 80, False), ("api.github.com", 22, True)):
        try:
            route(policy, host, port, tls=tls)
        except Refused:
            continue
        raise AssertionError(f"{host}:{port} passed in learn mode")


def test_request_path_drops_the_query() -> None:
    assert request_path(b"/a/b?token=x#f") == "/a/b?..."
    assert request_path(b"/a\nb") == "/a\\x0ab"
