"""Benchmark: the real agent CLIs on the host and in sessions, against the stand-in APIs.

In one run, interleaved, BENCH_N times each (median), in a realistic home
(bench/realistic_home.py: a year of transcripts, sessions, chats, Codex's
arg0 links, 1 GiB of caches):

0. the private config copy of that home per agent (agent_home.prepare, in
   process: its time, files and bytes, and its one line of what it left
   out; goal: <= 50 ms and <= 10 MiB), a first session's and the next one's
   (the copy kept by the last write-back, brought up to date), then ``--version`` per agent on the
   host, in a bwrap and in a Landlock session, and the session's delta
   (goal: +0.15 s);
1. one text turn (``claude -p``, ``codex exec``, ``gemini -p``) on the host,
   in a bwrap session and in a Landlock session, per installed agent, and the
   session's overhead per turn (the issue's goal: at most 0.1 s).  The host
   run reaches the APIs by their real names, as a session does (Claude Code
   makes several more requests to a first-party base URL than to a custom
   one): the stand-in listens on 127.0.0.1:443 and the host run sees an
   /etc/hosts naming the API hosts there (a bwrap mount namespace, ~5 ms).
   Where port 443 cannot be had, the host run uses base-URL variables
   (and says so);
2. the time the policy hook adds per file-tool call inside Claude Code:
   ``claude -p`` with BENCH_READS scripted Read calls, with the session's hook
   (``--settings``, the command a session renders) and without, on the host:
   (with - without) / reads;
3. where a session's start goes: one bwrap and one Landlock session of
   ``claude -p`` with AGENT_SANDBOX_TRACE=1 (the launcher's phases, in ms).

Needs the pinned CLIs in .agents (``just setup-dev``) and bwrap; an agent not
installed there is skipped (never one found elsewhere on PATH).
Run: ``python3 bench/agents.py`` (``BENCH_N=5 BENCH_READS=20`` by default;
``BENCH_ONLY=copies,starts`` runs those sections only).  ``AGENTS_BASELINE=TREE``
(a checkout with its own ``.venv``, e.g. an export of main) adds that tree's
launcher to the starts, cold under bwrap and Landlock, interleaved run by run
with this one's, and prints both rows' deltas and their difference per agent;
``BENCH_STARTS=cold`` leaves out the ``+serve`` and ``+warm`` columns,
``BENCH_AGENTS=codex`` the other agents.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "agents"))
sys.path.insert(0, str(HERE.parent))

from agents_world import AGENTS_BIN, Home, _logins, installed  # noqa: E402
from realistic_home import build, measure  # noqa: E402
from standin_apis import HOSTS, start  # noqa: E402

N = int(os.environ.get("BENCH_N", "5"))
READS = int(os.environ.get("BENCH_READS", "20"))
MODES = ("host", "bwrap", "nono")


HOSTS_FILE: Path | None = None  # /etc/hosts for host runs, when the stand-in has :443
AGENTS = ("claude", "codex", "gemini")


def copies(w: Home) -> None:
    """The private copy of the realistic home, per agent, in process (warm page cache):
    a first session's (made anew) and the next one's (the last one's copy, kept by its
    write-back, brought up to date: agent_reuse), and that write-back."""
    from libbroker.launcher import agent_home, agents

    print(f"0a. the private config copy of a realistic home, median of {N} "
          "(goal: <= 50 ms, <= 10 MiB): first session / next session (the last one's "
          "copy brought up to date); the write-back that keeps it")
    for name in AGENTS:
        took: dict[str, list[float]] = {"first": [], "next": [], "back": []}
        cpu: dict[str, list[float]] = {"first": [], "next": [], "back": []}
        lines: dict[str, str] = {}
        for i in range(N):
            state = {"XDG_STATE_HOME": str(w.root / f"st-{name}-{i}")}  # nothing kept yet
            for kind in ("first", "next"):
                rt = w.root / f"rt-{name}-{i}-{kind}"
                rt.mkdir()
                t0, c0 = time.perf_counter(), time.process_time()
                made = agent_home.prepare(
                    agents.PROFILES[name], home=str(w.home), workdir=str(w.workdir),
                    session=f"bench-{i}-{kind}", runtime=str(rt), env=state,
                    claude_session={} if name == "claude" else None)
                took[kind].append(time.perf_counter() - t0)
                cpu[kind].append(time.process_time() - c0)
                files, size = measure(Path(made.root))
                lines[kind] = made.report.line(name)
                t0, c0 = time.perf_counter(), time.process_time()
                agent_home.write_back(str(rt), keep=True)  # as the launcher's end does
                took["back"].append(time.perf_counter() - t0)
                cpu["back"].append(time.process_time() - c0)
            shutil.rmtree(state["XDG_STATE_HOME"])
        src = sum(measure(w.home / e.host[2:])[1] if (w.home / e.host[2:]).is_dir()
                  else (w.home / e.host[2:]).stat().st_size for e in agents.PROFILES[name].entries)
        med = {k: statistics.median(v) * 1000 for k, v in took.items()}
        cmed = {k: statistics.median(v) * 1000 for k, v in cpu.items()}
        print(f"   {name:<7}{med['first']:6.1f} / {med['next']:5.1f} ms (cpu {cmed['first']:.1f} / "
              f"{cmed['next']:.1f} ms), write-back {med['back']:.1f} ms (cpu {cmed['back']:.1f}); "
              f"{size / (1 << 20):.2f} MiB ({files} files) of {src / (1 << 30):.2f} GiB "
              "in the home")
        # The goal is every session's but an agent's first on the machine (or after a
        # janitor's end), whose copy makes every file anew: said beside it.
        met = med["next"] <= 50 and size <= 10 << 20
        first = "" if med["first"] <= 50 else f" (a first session's: {med['first']:.0f} ms)"
        print(f"          {'goal met' if met else 'OVER THE GOAL'}{first}: {lines['next']}")


def _serve(w: Home) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """A resident service (docs/serve.md) for the "+serve" columns: its process, socket, config.

    Its gateway trusts the stand-in's CA as any process does; the sessions'
    config has no ``upstream_ca`` (a session with one runs its own proxy).
    """
    sock = w.root / "serve.sock"
    proc = subprocess.Popen(["agent-sandbox", "serve", f"--socket={sock}"],
                            env=w.env(SSL_CERT_FILE=str(w.apis.ca_file)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("agent-sandbox serve did not start")
        time.sleep(0.05)
    config = w.root / "config-serve.toml"
    config.write_text("".join(line + "\n" for line in w.config().read_text().splitlines()
                              if not line.startswith("upstream_ca")))
    done = subprocess.run(["agent-sandbox", "run", f"--config={config}", "--", "true"],
                          env=w.env(AGENT_SANDBOX_SERVE=str(sock), AGENT_SANDBOX_TRACE="1"),
                          cwd=w.workdir, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0 or "tenant requested from the resident service" not in done.stderr:
        proc.terminate()
        raise SystemExit(f"a session did not become the service's tenant: {done.stderr[-1500:]}")
    return proc, sock, config


def _service_cpu(pid: int) -> float:
    """CPU seconds of the service and its children (gateway, zygotes), their reaped ones
    included: the brokers and the warm runs its zygotes forked."""
    total = 0.0
    pids = [pid]
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            pids += [int(p) for p in fh.read().split()]
    for one in pids:
        with open(f"/proc/{one}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def starts(w: Home) -> None:
    """``--version`` per agent: host, bwrap, Landlock (the session's start and end around it),
    both again as tenants of a resident service with a cold launcher (``+serve``:
    no egress-proxy start; ``AGENT_SANDBOX_WARM=off``), and forked warm by the
    service's launcher zygote (``+warm``: no launcher interpreter either)."""
    wanted = os.environ.get("BENCH_AGENTS", ",".join(AGENTS)).split(",")
    agents = [a for a in AGENTS if installed(a) and a in wanted]
    base = os.environ.get("AGENTS_BASELINE", "")
    modes: tuple[str, ...] = MODES
    if base:  # the baseline's launcher beside ours, run by run
        modes += ("bwrap@base", "nono@base")
    if os.environ.get("BENCH_STARTS") != "cold":
        modes += ("bwrap+serve", "nono+serve", "bwrap+warm", "nono+warm")
    times: dict[tuple[str, str], list[float]] = {(a, m): [] for a in agents for m in modes}
    # CPU (user + system) of the run and all it waited for: what the load does not move.
    cpus: dict[tuple[str, str], list[float]] = {(a, m): [] for a in agents for m in modes}
    # With a baseline, each cold session's trace: when the command went, and the launcher's
    # own CPU at its end (the trace's, to the 0.1 ms; os.times counts 10 ms ticks).
    traced: dict[tuple[str, str], list[tuple[float, float]]] = {k: [] for k in times}
    served_modes = "bwrap+serve" in modes
    service, sock, serve_config = _serve(w) if served_modes else (None, None, w.config())

    def run(agent: str, mode: str) -> float:
        argv = [agent, "--version"]
        env = w.env(AGENT_SANDBOX_SERVE="off")
        served = "+" in mode
        if mode != "host":
            backend = mode.split("+")[0].split("@")[0]
            config = serve_config if served else w.config()
            launcher = "agent-sandbox"
            if mode.endswith("@base"):  # its launcher, and the CLIs where its sessions see them
                launcher = f"{base}/.venv/bin/agent-sandbox"
                env["PATH"] = env["PATH"].replace(
                    str(AGENTS_BIN), f"{base}/{AGENTS_BIN.relative_to(HERE.parent)}")
            argv = [launcher, "run", f"--config={config}", f"--sandbox={backend}",
                    "--", *argv]
            if served:
                env["AGENT_SANDBOX_SERVE"] = str(sock)
            if mode.endswith("+serve"):
                env["AGENT_SANDBOX_WARM"] = "off"
            if base and not served:
                env["AGENT_SANDBOX_TRACE"] = "1"
        s0 = _service_cpu(service.pid) if service and served else 0.0
        c0 = os.times()
        t0 = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=w.workdir, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, check=False)
        took = time.perf_counter() - t0
        c1 = os.times()
        if done.returncode != 0:
            raise SystemExit(f"{argv} failed: {done.stderr[-1500:]}")
        if served:
            time.sleep(0.2)  # the zygotes reap their children (their CPU counts then)
        share = _service_cpu(service.pid) - s0 if service and served else 0.0
        cpus[agent, mode].append(c1.children_user + c1.children_system
                                 - c0.children_user - c0.children_system + share)
        marks = dict(_marks(done.stderr))
        if "go" in marks and "clean" in marks:
            traced[agent, mode].append((marks["go"][0], marks["clean"][1]))
        return took

    try:
        for agent in agents:
            for mode in modes:
                run(agent, mode)  # warm
        for i in range(N):
            # Every other round the baseline's launcher first: neither tree always follows
            # the other's end (its teardown, the agent copy it left to take).
            order = [m for m in modes if i % 2 and m.endswith("@base")] + [
                m for m in modes if not (i % 2 and m.endswith("@base"))]
            for agent in agents:
                for mode in order:
                    times[agent, mode].append(run(agent, mode))
    finally:
        if service is not None:
            service.terminate()
            service.wait()
    print(f"0b. --version, median of {N} (s): " + " / ".join(modes)
          + "; each session's delta to the host (goal: +0.15)")

    def rows(values: dict[tuple[str, str], list[float]]) -> None:
        for agent in agents:
            med = [statistics.median(values[agent, m]) for m in modes]
            # Deltas to the ms: a goal of +0.15 s is not judged on a rounded +0.15.
            print(f"   {agent:<7}" + " /".join(f"{v:6.2f}" for v in med) + "    "
                  + " ".join(f"{v - med[0]:+.3f}" for v in med[1:]))

    rows(times)
    print("   the same in CPU seconds (user + system of every process reaped; the load does not "
          "move it; under bwrap the command inside its PID namespace is not counted; +serve and "
          "+warm: the service's CPU during the run counted, a warm run's own included):")
    rows(cpus)
    for agent in agents if base else ():  # this tree against the baseline's, run by run
        for b in ("bwrap", "nono"):
            pairs = list(zip(times[agent, b], times[agent, f"{b}@base"], strict=True))
            cpairs = list(zip(cpus[agent, b], cpus[agent, f"{b}@base"], strict=True))
            diffs = sorted((a - b_) * 1000 for a, b_ in pairs)
            q1, mid, q3 = statistics.quantiles(diffs, n=4)
            print(f"   {agent:<7}{b}: this tree - baseline, median of the {len(pairs)} pairs: "
                  f"{mid:+.1f} ms wall (quartiles {q1:+.1f} / {q3:+.1f}), "
                  f"{statistics.median(a - b_ for a, b_ in cpairs) * 1000:+.1f} ms cpu")
            tpairs = list(zip(traced[agent, b], traced[agent, f"{b}@base"], strict=False))
            if len(tpairs) >= 2:
                go = statistics.quantiles([a[0] - b_[0] for a, b_ in tpairs], n=4)
                cpu = statistics.quantiles([a[1] - b_[1] for a, b_ in tpairs], n=4)
                print(f"   {'':<7}{b}: traced, go {go[1]:+.1f} ms (quartiles {go[0]:+.1f} / "
                      f"{go[2]:+.1f}), the launcher's cpu at its end {cpu[1]:+.1f} ms "
                      f"(quartiles {cpu[0]:+.1f} / {cpu[2]:+.1f})")
    for agent in agents if "bwrap+warm" in modes else ():  # warm against cold, both tenants
        for b in ("bwrap", "nono"):
            cold, warm = (statistics.median(times[agent, f"{b}+{k}"]) for k in ("serve", "warm"))
            ccold, cwarm = (statistics.median(cpus[agent, f"{b}+{k}"]) for k in ("serve", "warm"))
            print(f"   {agent:<7}{b}: warm / cold launcher {warm / cold:.2f}x wall, "
                  f"{cwarm / ccold:.2f}x cpu")
    for agent in agents:  # where a session's time goes, in one line (AGENT_SANDBOX_TRACE)
        argv = ["agent-sandbox", "run", f"--config={w.config()}", "--sandbox=nono", "--", agent,
                "--version"]
        done = subprocess.run(argv, env=w.env(AGENT_SANDBOX_TRACE="1"), cwd=w.workdir,
                              capture_output=True, text=True, timeout=60, check=False)
        line = [ln for ln in done.stderr.splitlines() if "where the time went" in ln]
        print(f"   {agent:<7}Landlock: {line[-1].split(') ', 1)[-1] if line else '?'}")


def _marks(stderr: str) -> list[tuple[str, tuple[float, float]]]:
    """AGENT_SANDBOX_TRACE's lines: (what, (ms since the launcher's start, its cpu ms))."""
    out = []
    for line in stderr.splitlines():
        head, sep, what = line.partition(" ms) ")
        if sep and head.startswith("agent-sandbox: trace"):
            ms, _, cpu = head.removeprefix("agent-sandbox: trace").partition(" ms (cpu")
            out.append((what.split(":")[0], (float(ms), float(cpu))))
    return out


def turn_argv(agent: str, w: Home, mode: str) -> tuple[list[str], dict[str, str]]:
    """One text turn of ``agent``: the host run reaches the stand-in by name where it can."""
    base = f"https://127.0.0.1:{w.apis.port}"
    by_url = mode == "host" and HOSTS_FILE is None
    env: dict[str, str] = {}
    if agent == "claude":
        argv = ["claude", "-p", "hello"]
        if by_url:
            env["ANTHROPIC_BASE_URL"] = base
    elif agent == "codex":
        argv = ["codex", "exec", "--skip-git-repo-check", "hello"]
        if by_url:
            argv[1:1] = ["-c", f'model_providers.standin.base_url="{base}/v1"']
    else:
        argv = ["gemini", "--skip-trust", "-p", "hello"]
        if by_url:
            env["GOOGLE_GEMINI_BASE_URL"] = base
    if mode == "host" and HOSTS_FILE is not None:
        argv = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(HOSTS_FILE), "/etc/hosts",
                "--", *argv]
    if mode != "host":
        argv = ["agent-sandbox", "run", f"--config={w.config()}", f"--sandbox={mode}", "--", *argv]
    return argv, env


def timed(w: Home, argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=w.env(**env), cwd=w.workdir, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    took = time.perf_counter() - t0
    if done.returncode != 0 or ("pong" not in done.stdout and "RESULT<<" not in done.stdout):
        raise SystemExit(f"{argv[:6]} failed: {done.stdout[-500:]} {done.stderr[-1500:]}")
    return took


def turns(w: Home) -> None:
    agents = [a for a in AGENTS if installed(a)]
    times: dict[tuple[str, str], list[float]] = {(a, m): [] for a in agents for m in MODES}
    for agent in agents:  # warm: page cache, bytecode, each CLI's first-run files
        for mode in MODES:
            timed(w, *turn_argv(agent, w, mode))
    for _ in range(N):
        for agent in agents:
            for mode in MODES:
                times[agent, mode].append(timed(w, *turn_argv(agent, w, mode)))
    print(f"1. one text turn, median of {N} (s): host / bwrap / Landlock; session overhead")
    for agent in agents:
        med = [statistics.median(times[agent, m]) for m in MODES]
        print(f"   {agent:<7}{med[0]:6.2f} /{med[1]:6.2f} /{med[2]:6.2f}"
              f"    +{med[1] - med[0]:.2f} bwrap, +{med[2] - med[0]:.2f} Landlock")


def hook(w: Home) -> None:
    """Claude Code with READS Reads of distinct files: no hook, ``true``, ours, ``sleep 0.1``.

    ``true`` is a hook's floor (Claude Code spawns a shell per call); ``sleep
    0.1`` calibrates: Claude Code does part of a call's own work while its
    hook runs, so a hook adds less than its own run time.
    """
    if not installed("claude"):
        return
    from libpolicy.model import Policy
    from libpolicy.render import session_settings

    policy = w.root / "policy.json"
    policy.write_text(Policy(str(w.home), write=[str(w.workdir)]).to_json())
    ours = session_settings(Policy.load(str(policy)), str(policy))["hooks"]
    calls = ""
    for i in range(READS):
        (w.workdir / f"f{i}.txt").write_text(str(i))
        calls += "TOOL<<Read " + json.dumps({"file_path": str(w.workdir / f"f{i}.txt")}) + ">>"
    env = {"ANTHROPIC_BASE_URL": f"https://127.0.0.1:{w.apis.port}"}
    argvs: dict[str, list[str]] = {}
    for name, command in (("none", ""), ("true", "true"), ("policy-hook", None),
                          ("sleep 0.1", "sleep 0.1")):
        hooks = json.loads(json.dumps(ours))
        if command is not None:
            hooks["PreToolUse"][0]["hooks"][0]["command"] = command
        settings = w.root / f"settings-{len(argvs)}.json"
        settings.write_text(json.dumps({"hooks": hooks} if command != "" else {}))
        argvs[name] = ["claude", "-p", f"--settings={settings}", "--allowedTools=Read", calls]
    runs: dict[str, list[float]] = {name: [] for name in argvs}
    for argv in argvs.values():
        timed(w, argv, env)
    for _ in range(N):
        for name, argv in argvs.items():
            runs[name].append(timed(w, argv, env))
    med = {name: statistics.median(v) for name, v in runs.items()}
    print(f"2. a hook's added time per file-tool call in Claude Code ({READS} Reads, "
          f"median of {N}; {med['none']:.2f} s without a hook):")
    for name in ("true", "policy-hook", "sleep 0.1"):
        print(f"   {name:<12}{(med[name] - med['none']) / READS * 1000:6.1f} ms")


def trace(w: Home) -> None:
    if not installed("claude"):
        return
    print("3. AGENT_SANDBOX_TRACE=1, claude -p (ms since the launcher's start)")
    for mode in ("bwrap", "nono"):
        argv, env = turn_argv("claude", w, mode)
        done = subprocess.run(argv, env=w.env(AGENT_SANDBOX_TRACE="1", **env), cwd=w.workdir,
                              capture_output=True, text=True, timeout=120, check=False)
        lines = [ln for ln in done.stderr.splitlines() if "trace" in ln or " ms" in ln]
        print(f"   {mode}:")
        for line in lines:
            print("     " + line)


def main() -> None:
    global HOSTS_FILE
    tmp = Path(tempfile.mkdtemp(prefix="as-bench-agents-"))
    try:
        apis, server = start(tmp, 443)
        HOSTS_FILE = tmp / "hosts"
        HOSTS_FILE.write_text(Path("/etc/hosts").read_text() + "".join(
            f"127.0.0.1 {h}\n" for h in HOSTS))
    except OSError:
        apis, server = start(tmp)
        print("port 443 taken: host runs use base-URL variables (fewer requests than a session)")
    home = tmp / "home"
    (home / ".ssh").mkdir(parents=True)
    _logins(home)
    workdir = Path(tempfile.mkdtemp(prefix="as-b-", dir="/tmp"))
    w = Home(tmp, home, workdir, apis, mark="bench")
    build(home, str(workdir), installed("codex"))
    try:
        print(f"load: {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
        only = os.environ.get("BENCH_ONLY", "")  # e.g. "copies,starts"
        for name, section in (("copies", copies), ("starts", starts), ("turns", turns),
                              ("hook", hook), ("trace", trace)):
            if not only or name in only.split(","):
                section(w)
    finally:
        server.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
