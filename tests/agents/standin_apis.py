"""Stand-ins for the three agents' model APIs, on loopback, over TLS.

One threaded HTTPS server answers for every API host (a trustme CA signs one
certificate naming them all; tests reach it through egress-proxy's ``resolve``
pins and ``upstream_ca``, or directly through a base-URL variable):

- Anthropic Messages (``POST /v1/messages``, SSE or JSON);
- OpenAI Responses (``POST /v1/responses`` and ``/responses``, SSE);
- Gemini (``POST /v1beta/models/M:streamGenerateContent?alt=sse`` and
  ``:generateContent``).

The script is in the prompt, so every test says what it wants where it asks:
a user turn holding ``RUN<<cmd>>`` gets a shell tool call running ``cmd``;
once the tool's result comes back, the answer is ``RESULT<<...>>`` with that
output inside; any other prompt gets ``pong``.  For Claude Code a prompt may
hold several calls, ``RUN<<cmd>>`` and ``TOOL<<Name {json input}>>`` (Read,
Grep, Write, ...), made one per turn in order; the answer then holds every
result, joined by ``\n--\n``.  Every request is recorded
(path, headers of interest, a short body) for the tests to look at.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trustme

HOSTS = (
    "api.anthropic.com",
    "api.openai.com",
    "generativelanguage.googleapis.com",
)
_RUN = re.compile(r"RUN<<(.*?)>>", re.S)
_CALL = re.compile(r"RUN<<(.*?)>>|TOOL<<(\w+) (\{.*?\})>>", re.S)


@dataclass
class Seen:
    path: str
    host: str
    auth: str
    body: str


@dataclass
class Apis:
    port: int
    ca_file: Path
    seen: list[Seen] = field(default_factory=list)
    dump: list[bytes] | None = None  # whole request bodies, when debugging

    def paths(self) -> list[str]:
        return [s.path for s in self.seen]


def _texts(value: Any) -> list[str]:
    """Every string in a JSON value, depth first."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    return []


def _answer(prompt_texts: list[str], result: str | None) -> tuple[str, str | None]:
    """(text, command): what to say, or which command to call a tool with."""
    if result is not None:
        return f"RESULT<<{result[:2000]}>>", None
    for text in reversed(prompt_texts):
        m = _RUN.search(text)
        if m:
            return "", m.group(1)
    return "pong", None


# --- Anthropic -------------------------------------------------------------


Call = tuple[str, dict[str, Any]]  # a tool's name and input


def _anthropic(body: dict[str, Any]) -> tuple[str, Call | None]:
    """(text, call): the script's next tool call, or the answer once all were made."""
    if not body.get("tools"):
        return "pong", None  # a side request (a title, a summary): never a tool call
    messages = body.get("messages") or []
    users = [m for m in messages if m.get("role") == "user"]
    # The prompt: the first user turn's own words (the system prompt mentions many things).
    prompt = "\n".join(_texts(users[0].get("content"))) if users else ""
    calls: list[Call] = [
        ("Bash", {"command": m.group(1)}) if m.group(1) is not None
        else (m.group(2), json.loads(m.group(3)))
        for m in _CALL.finditer(prompt)
    ]
    results = [
        "\n".join(_texts(block.get("content")))
        for m in users
        if isinstance(m.get("content"), list)
        for block in m["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    if not calls:
        return "pong", None
    if len(results) < len(calls):
        name, tool_input = calls[len(results)]
        # Its id names how many results came before: Claude Code merges turns,
        # and a repeated id makes it loop.
        return "", (name, {**tool_input, "__id": f"toolu_standin{len(results)}"})
    return "RESULT<<" + "\n--\n".join(r[:2000] for r in results) + ">>", None


def _sse(event: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(data) + "\n\n").encode()


def _split(call: Call) -> tuple[str, str, dict[str, Any]]:
    """A call's name, id and input (the id rides in the input as ``__id``)."""
    tool_input = dict(call[1])
    return call[0], str(tool_input.pop("__id", "toolu_standin0")), tool_input


def anthropic_stream(body: dict[str, Any]) -> bytes:
    text, call = _anthropic(body)
    model = body.get("model", "claude")
    out = _sse(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_standin",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 1},
            },
        },
    )
    if call is None:
        block: dict[str, Any] = {"type": "text", "text": ""}
        delta: dict[str, Any] = {"type": "text_delta", "text": text}
        stop = "end_turn"
    else:
        name, tool_id, tool_input = _split(call)
        block = {"type": "tool_use", "id": tool_id, "name": name, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(tool_input)}
        stop = "tool_use"
    out += _sse(
        "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
    )
    out += _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    out += _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    out += _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
    )
    out += _sse("message_stop", {"type": "message_stop"})
    return out


def anthropic_json(body: dict[str, Any]) -> bytes:
    text, call = _anthropic(body)
    content: list[dict[str, Any]] = [{"type": "text", "text": text or "ok"}]
    if call is not None:
        name, tool_id, tool_input = _split(call)
        content = [{"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}]
    return json.dumps(
        {
            "id": "msg_standin",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude"),
            "content": content,
            "stop_reason": "tool_use" if call else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
    ).encode()


# --- OpenAI Responses ------------------------------------------------------


def _openai_tool(body: dict[str, Any]) -> tuple[str, str]:
    """The shell tool this Codex offers: its name and which argument form it takes."""
    names = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    for name in ("shell_command", "exec_command", "shell"):
        if name in names:
            return name, name
    return "shell", "shell"


def openai_stream(body: dict[str, Any]) -> bytes:
    items = body.get("input") or []
    result = None
    if items and isinstance(items[-1], dict) and items[-1].get("type") == "function_call_output":
        out = items[-1].get("output")
        result = out if isinstance(out, str) else json.dumps(out)
    users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
    text, cmd = _answer(_texts(users[-1].get("content")) if users else [], result)
    resp = {
        "id": "resp_standin",
        "object": "response",
        "status": "in_progress",
        "model": body.get("model", "gpt"),
        "output": [],
    }
    out = _sse("response.created", {"type": "response.created", "response": resp})
    if cmd is None:
        item: dict[str, Any] = {
            "type": "message",
            "id": "msg_standin",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    else:
        name, form = _openai_tool(body)
        args: dict[str, Any]
        if form == "shell":
            args = {"command": ["bash", "-c", cmd]}
        elif form == "exec_command":
            args = {"cmd": cmd}
        else:
            args = {"command": cmd}
        item = {
            "type": "function_call",
            "id": "fc_standin",
            "call_id": "call_standin",
            "name": name,
            "arguments": json.dumps(args),
            "status": "completed",
        }
    out += _sse(
        "response.output_item.done",
        {"type": "response.output_item.done", "output_index": 0, "item": item},
    )
    done = {
        **resp,
        "status": "completed",
        "output": [item],
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        },
    }
    out += _sse("response.completed", {"type": "response.completed", "response": done})
    return out


# --- Gemini ----------------------------------------------------------------


def _gemini(body: dict[str, Any]) -> tuple[str, str | None]:
    contents = body.get("contents") or []
    last = contents[-1] if contents else {}
    for part in last.get("parts") or []:
        if isinstance(part, dict) and "functionResponse" in part:
            return _answer([], "\n".join(_texts(part["functionResponse"].get("response"))))
    texts = [p["text"] for p in last.get("parts") or [] if isinstance(p, dict) and "text" in p]
    return _answer(texts, None)


def _fill(schema: dict[str, Any]) -> Any:
    """A value that fits a JSON schema (Gemini's side requests ask for JSON)."""
    if schema.get("enum"):
        choices = schema["enum"]
        return "user" if "user" in choices else choices[0]
    kind = str(schema.get("type", "string")).lower()
    if kind == "object":
        return {k: _fill(v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 10
    if kind == "boolean":
        return False
    return "standin"


def gemini_chunk(body: dict[str, Any]) -> dict[str, Any]:
    config = body.get("generationConfig") or {}
    text, cmd = _gemini(body)
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    if config.get("responseMimeType") == "application/json":
        text, cmd = json.dumps(_fill(schema or {})), None
    if cmd is None:
        part: dict[str, Any] = {"text": text}
    else:
        part = {"functionCall": {"name": "run_shell_command", "args": {"command": cmd}}}
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "gemini-standin",
    }


def _handler(apis: Apis) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, code: int, data: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            apis.seen.append(Seen(self.path, self.headers.get("Host", ""), "", ""))
            self._reply(404, b'{"error":{"message":"not here"}}')

        def do_HEAD(self) -> None:
            self._reply(200, b"")

        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(size) if size else b""
            auth = (
                self.headers.get("x-api-key")
                or self.headers.get("x-goog-api-key")
                or self.headers.get("Authorization")
                or ""
            )
            apis.seen.append(
                Seen(
                    self.path,
                    self.headers.get("Host", ""),
                    auth,
                    raw[:4000].decode("utf-8", "replace"),
                )
            )
            if apis.dump is not None:
                apis.dump.append(raw)
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {}
            path = self.path.split("?")[0]
            if path.endswith("/v1/messages"):
                if body.get("stream"):
                    self._reply(200, anthropic_stream(body), "text/event-stream")
                else:
                    self._reply(200, anthropic_json(body))
            elif path.endswith("/responses"):
                self._reply(200, openai_stream(body), "text/event-stream")
            elif ":streamGenerateContent" in path:
                data = b"data: " + json.dumps(gemini_chunk(body)).encode() + b"\r\n\r\n"
                self._reply(200, data, "text/event-stream")
            elif ":generateContent" in path:
                self._reply(200, json.dumps(gemini_chunk(body)).encode())
            elif ":countTokens" in path:
                self._reply(200, b'{"totalTokens": 10}')
            elif "count_tokens" in path:
                self._reply(200, b'{"input_tokens": 10}')
            else:
                self._reply(404, b'{"error":{"message":"not here"}}')

    return Handler


def start(tmp: Path, port: int = 0) -> tuple[Apis, ThreadingHTTPServer]:
    ca = trustme.CA()
    cert = ca.issue_cert(*HOSTS, "localhost", "127.0.0.1")
    ca_file = tmp / "standin-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(ctx)
    apis = Apis(port=0, ca_file=ca_file)
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(apis))
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    apis.port = server.server_address[1]
    # (shutdown() waits for the serving loop's next poll: 0.5 s by default)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return apis, server


if __name__ == "__main__":  # by hand: python3 tests/agents/standin_apis.py DIR
    import sys
    import time

    found, _ = start(Path(sys.argv[1]))
    found.dump = []
    print(found.port, found.ca_file, flush=True)
    while True:
        time.sleep(1)
        for s in found.seen:
            print(s.path, s.auth[:20], s.body[:300].replace("\n", " "), flush=True)
        found.seen.clear()
        for i, raw in enumerate(found.dump):
            Path(sys.argv[1], f"body-{time.time():.3f}-{i}.json").write_bytes(raw)
        found.dump.clear()
