"""An ``api_base`` with user info or a query: every request to the upstream (a completion, a stream,
a readiness probe) carries them, against a real loopback server that records each request's head."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import msgspec
import pytest

from backends.config import DeploymentConfig
from backends.openai_http import OpenAIHTTPBackend
from backends.openai_wire import ChatCompletionRequest

ANSWER = json.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "up", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}).encode()
STREAM = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,'
          b'"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
MODELS = b'{"object":"list","data":[]}'


class Recorder:
    """Answers a chat completion (whole, or streamed when asked) and ``GET .../models``; keeps each head."""

    def __init__(self) -> None:
        self.heads: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                self.heads.append(head)
                length = next((int(line.split(":")[1]) for line in head.split("\r\n")
                               if line.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length)
                if head.startswith("GET"):
                    kind, answer = "application/json", MODELS
                elif b'"stream":true' in body:
                    kind, answer = "text/event-stream", STREAM
                else:
                    kind, answer = "application/json", ANSWER
                writer.write(f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {len(answer)}\r\n\r\n"
                             .encode() + answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Recorder, int]]:
    recorder = Recorder()
    server = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    yield recorder, server.sockets[0].getsockname()[1]
    server.close()


async def _exercise(api_base: str, api_key: str | None = None) -> None:
    """A whole answer, a stream and a readiness probe from a deployment on ``api_base``, each answered."""
    backend = OpenAIHTTPBackend(DeploymentConfig(provider="openai", model="up", api_base=api_base, api_key=api_key))
    request = msgspec.json.decode(b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
                                  type=ChatCompletionRequest)
    try:
        assert (await backend.chat(request)).response.choices[0].message.content == "hi"
        stream = await backend.chat_stream(msgspec.structs.replace(request, stream=True))
        assert [c.choices[0].delta.content async for c in stream.chunks] == ["hi"]
        assert await backend.ready()
    finally:
        await backend.aclose()


def _header(head: str, name: str) -> str | None:
    return next((line.split(":", 1)[1].strip() for line in head.split("\r\n")
                 if line.lower().startswith(name + ":")), None)


async def test_the_user_info_of_an_api_base_is_basic_auth_on_every_request(
        upstream: tuple[Recorder, int]) -> None:
    recorder, port = upstream
    await _exercise(f"http://probe%40x:s3cret-pass@127.0.0.1:{port}/v1")
    expected = "Basic " + base64.b64encode(b"probe@x:s3cret-pass").decode()
    assert [h.split(" ")[1] for h in recorder.heads] == ["/v1/chat/completions", "/v1/chat/completions",
                                                         "/v1/models"]
    assert [_header(h, "authorization") for h in recorder.heads] == [expected] * 3


async def test_a_deployment_key_is_sent_instead_of_the_api_bases_user_info(upstream: tuple[Recorder, int]) -> None:
    recorder, port = upstream
    await _exercise(f"http://user:pass-word@127.0.0.1:{port}/v1", api_key="sk-deployment")
    assert [_header(h, "authorization") for h in recorder.heads] == ["Bearer sk-deployment"] * 3


async def test_the_query_of_an_api_base_follows_every_requests_path(upstream: tuple[Recorder, int]) -> None:
    recorder, port = upstream
    await _exercise(f"http://127.0.0.1:{port}/openai/v1/?api-version=2024-10-21", api_key="k")
    assert [h.split(" ")[1] for h in recorder.heads] == ["/openai/v1/chat/completions?api-version=2024-10-21"] * 2 \
        + ["/openai/v1/models?api-version=2024-10-21"]


async def test_a_path_with_a_query_of_its_own_has_the_api_bases_after_it(upstream: tuple[Recorder, int]) -> None:
    recorder, port = upstream
    backend = OpenAIHTTPBackend(DeploymentConfig(provider="openai", model="up", api_key="k",
                                                 api_base=f"http://127.0.0.1:{port}/openai/v1/?api-version=2024-10-21"))
    try:  # a background response asked about with the client's query
        await backend.held_response("GET", "resp_1", query="include%5B%5D=x")
    finally:
        await backend.aclose()
    assert [h.split(" ")[1] for h in recorder.heads] == [
        "/openai/v1/responses/resp_1?include%5B%5D=x&api-version=2024-10-21"]
