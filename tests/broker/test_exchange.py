"""The broker conversation as a script: events in, the exact commands out, no sockets.

mitmproxy's Playbook style: each test plays a connection's events into a
fresh :class:`Exchange` and states every command it must answer with.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libbroker.broker.exchange import (
    AuditBroken,
    AuditLine,
    BadFrame,
    ChildExited,
    ClientGone,
    Close,
    CloseStdin,
    Command,
    DeliverSignal,
    Event,
    Exchange,
    HalfClose,
    InternalError,
    KillGroup,
    Opened,
    Refuse,
    RequestFrame,
    RequestTimeout,
    SendExit,
    Shutdown,
    SignalFrame,
    Spawn,
    Spawned,
    SpawnFailed,
    State,
    StdinData,
    StdinEof,
    from_wire,
)
from libbroker.wire import Channel, Data, Frame, Payload, Request

UID = 1000
REQ = Request(("make", "test"), "/w", with_stdin=True)
SIGN = Request((), "/", with_stdin=True, op="sign", key="ABCD")
PING = Request((), "/", with_stdin=False, op="ping")


def frame(request: Request) -> RequestFrame:
    return RequestFrame(request.to_json())


def audit(request: Request | None, **outcome: object) -> AuditLine:
    """The audit line of a connection from pid 7 (the test clock stands still: duration 0)."""
    fields: dict[str, object] = {
        "peer_pid": 7, "peer_uid": UID,
        "op": request.op if request else None,
        "argv": list(request.argv) if request else None,
        "cwd": request.cwd if request else None,
        "duration": 0.0,
    }  # fmt: skip
    if request is not None and request.key is not None:
        fields["key"] = request.key
    fields.update(outcome)
    return AuditLine(fields)


def play(*script: tuple[Event, list[Command]], state: State | None = None) -> Exchange:
    """Feed each event; each must produce exactly its commands."""
    exchange = Exchange(clock=lambda: 5.0)
    for step, (event, expected) in enumerate(script):
        assert exchange.handle(event) == expected, f"step {step}: {event}"
    if state is not None:
        assert exchange.state is state
    return exchange


OPENED = (Opened(7, UID, UID), [])
RUNNING = [OPENED, (frame(REQ), [Spawn(REQ)]), (Spawned(), [])]


def refused(request: Request | None, message: str, *, running: bool = False) -> list[Command]:
    stop: list[Command] = [CloseStdin(), KillGroup()] if running else []
    return [Refuse(message), *stop, audit(request, refused=message), HalfClose()]


def test_a_command_runs_streams_and_exits() -> None:
    play(
        *RUNNING,
        (StdinData(4096), []),
        (SignalFrame(b"\x02"), [DeliverSignal(2)]),
        (StdinEof(), [CloseStdin()]),
        (ChildExited(3), [KillGroup(), CloseStdin(), audit(REQ, exit=3), SendExit(3), HalfClose()]),
        state=State.DONE,
    )


def test_a_signal_death_is_128_plus_n_and_limit_hits_go_to_stderr() -> None:
    line = "broker: the command hit its task limit (64): 3 forks were refused\n"
    play(
        *RUNNING,
        (ChildExited(-9, ("task limit (64): 3 forks were refused",)),
         [KillGroup(), CloseStdin(), audit(REQ, exit=137), SendExit(137, (line,)), HalfClose()]),
    )  # fmt: skip


def test_ping_answers_even_with_the_audit_log_broken() -> None:
    answer = [SendExit(0), audit(PING, exit=0), HalfClose()]
    play(OPENED, (AuditBroken("disk full"), []), (frame(PING), answer), state=State.DONE)


def test_sign_spawns_like_exec_and_its_key_is_audited() -> None:
    play(OPENED, (frame(SIGN), [Spawn(SIGN)]), (Spawned(), []),
         (ChildExited(0), [KillGroup(), CloseStdin(), audit(SIGN, exit=0),
                           SendExit(0), HalfClose()]))  # fmt: skip


BEFORE_REQUEST = "protocol error: the first frame must be a request"


@pytest.mark.parametrize(
    ("script", "last", "asked", "message", "running"),
    [
        ([OPENED], StdinData(10), None, BEFORE_REQUEST, False),
        ([OPENED], StdinEof(), None, BEFORE_REQUEST, False),
        ([OPENED], SignalFrame(b"\x0f"), None, BEFORE_REQUEST, False),
        ([OPENED], BadFrame("unknown channel 9"), None, "protocol error: unknown channel 9",
         False),
        ([OPENED], RequestFrame(b'{"argv":["x"],"cwd":"/w","env":{}}'), None,
         "request field 'env' is refused: the environment is set by the broker's policy",
         False),
        ([OPENED, (AuditBroken("No space left on device"), [])], frame(REQ), REQ,
         "the audit log cannot be written (No space left on device): refusing to run "
         "unaudited", False),
        ([OPENED, (frame(REQ), [Spawn(REQ)])], SpawnFailed("cwd /x is outside the workdir /w"),
         REQ, "cwd /x is outside the workdir /w", False),
        ([OPENED], RequestTimeout(30.0), None, "no request within 30 s", False),
        ([OPENED], Shutdown(), None, "the broker is shutting down", False),
        ([OPENED], InternalError("KeyError"), None, "internal error: KeyError", False),
        (RUNNING, frame(REQ), REQ, "protocol error: only one request per connection", True),
        (RUNNING, SignalFrame(b"\x00"), REQ,
         "protocol error: signal frame payload must be one byte naming a signal", True),
        (RUNNING, BadFrame("frame length 9999999 exceeds the 1048576-byte limit"), REQ,
         "protocol error: frame length 9999999 exceeds the 1048576-byte limit", True),
        (RUNNING, InternalError("OSError"), REQ, "internal error: OSError", True),
    ],
)  # fmt: skip
def test_every_refusal(
    script: list[tuple[Event, list[Command]]],
    last: Event,
    asked: Request | None,
    message: str,
    running: bool,
) -> None:
    """One error frame, the command (if any) stopped, one audit line, the half-close."""
    exchange = play(*script, (last, refused(asked, message, running=running)))
    assert exchange.state is (State.ENDING if running else State.DONE)
    if running:  # the killed command is reaped later: only its group is killed again
        play_on(exchange, (ChildExited(-9), [KillGroup()]))
        assert exchange.state is State.DONE


def test_a_peer_of_another_uid_is_refused() -> None:
    message = f"peer uid 0 is not the server's uid {UID}"
    line = audit(None, refused=message)
    line.fields["peer_uid"] = 0
    play((Opened(7, 0, UID), [Refuse(message), line, HalfClose()]), state=State.DONE)


def play_on(exchange: Exchange, *script: tuple[Event, list[Command]]) -> None:
    for event, expected in script:
        assert exchange.handle(event) == expected, event


def test_nothing_the_client_sends_matters_once_all_is_said() -> None:
    exchange = play(OPENED, (frame(PING), [SendExit(0), audit(PING, exit=0), HalfClose()]))
    for event in (frame(REQ), StdinData(5), StdinEof(), SignalFrame(b""), BadFrame("x"),
                  RequestTimeout(30.0), ClientGone()):  # fmt: skip
        play_on(exchange, (event, []))
    play_on(exchange, (Shutdown(), [Close()]), (InternalError("E"), [Close()]))


def test_shutdown_kills_a_running_command_whose_exit_still_goes_out() -> None:
    play(*RUNNING, (Shutdown(), [KillGroup()]),
         (ChildExited(-15), [KillGroup(), CloseStdin(), audit(REQ, exit=143),
                             SendExit(143), HalfClose()]))  # fmt: skip


def test_the_client_going_before_its_request_leaves_an_audit_line() -> None:
    play(OPENED, (ClientGone(), [audit(None, exit=None, client_gone=True), HalfClose()]),
         state=State.DONE)  # fmt: skip


# --- every order of exit, stdin EOF and the client going away ---------------

EXITED = [KillGroup(), CloseStdin(), audit(REQ, exit=0), SendExit(0), HalfClose()]
GONE = [CloseStdin(), KillGroup(), audit(REQ, exit=None, client_gone=True), HalfClose()]


def expected_for(order: tuple[str, ...]) -> list[tuple[Event, list[Command]]]:
    """The oracle: whichever of exit and client-gone comes first ends the conversation."""
    events = {"exit": ChildExited(0), "eof": StdinEof(), "gone": ClientGone()}
    ended: str | None = None
    script: list[tuple[Event, list[Command]]] = []
    for name in order:
        if ended is None:
            commands = {"exit": EXITED, "eof": [CloseStdin()], "gone": GONE}[name]
            ended = None if name == "eof" else name
        elif name == "exit":  # the killed command is reaped
            commands = [KillGroup()]
        else:
            commands = []
        script.append((events[name], commands))
    return script


@pytest.mark.parametrize("order", list(itertools.permutations(["exit", "eof", "gone"])))
def test_every_order_of_exit_eof_and_client_gone(order: tuple[str, ...]) -> None:
    play(*RUNNING, *expected_for(order), state=State.DONE)


TAIL_EVENTS = st.sampled_from([
    StdinData(100), StdinEof(), SignalFrame(b"\x02"), SignalFrame(b""), RequestTimeout(30.0),
    Shutdown(), ClientGone(), frame(REQ), BadFrame("unknown channel 7"), InternalError("E"),
])  # fmt: skip


@given(st.lists(TAIL_EVENTS, max_size=8), st.integers(0, 8))
def test_any_order_says_one_final_thing_and_audits_once(tail: list[Event], exit_at: int) -> None:
    """Whatever comes, in whatever order, around the child's exit: at most one final
    frame, exactly one audit line and one half-close, nothing said after them, and
    the conversation DONE once the child is reaped."""
    exchange = play(*RUNNING)
    events = [*tail[:exit_at], ChildExited(0), *tail[exit_at:]]
    commands = [c for e in events for c in exchange.handle(e)]
    finals = [c for c in commands if isinstance(c, SendExit | Refuse)]
    assert len(finals) <= 1
    assert sum(isinstance(c, AuditLine) for c in commands) == 1
    assert sum(isinstance(c, HalfClose) for c in commands) == 1
    said = commands.index(HalfClose())
    assert all(isinstance(c, KillGroup | Close) for c in commands[said + 1 :])
    assert exchange.state is State.DONE


def test_events_out_of_the_pumps_order_are_bugs() -> None:
    with pytest.raises(RuntimeError, match="pump bug"):
        play(OPENED, (Spawned(), []))
    with pytest.raises(RuntimeError, match="pump bug"):
        play(OPENED, (ChildExited(0), []))


def test_from_wire() -> None:
    assert from_wire(Frame(Channel.REQUEST, b"{}")) == RequestFrame(b"{}")
    assert from_wire(Frame(Channel.SIGNAL, b"\x02")) == SignalFrame(b"\x02")
    assert from_wire(Frame(Channel.STDIN, b"")) == StdinEof()
    assert from_wire(Payload(Channel.STDIN, 9)) == StdinData(9)
    with pytest.raises(ValueError):
        from_wire(Data(Channel.STDIN, b"x"))
