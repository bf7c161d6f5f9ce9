"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shape, for models whose tokenizer the gateway
holds (the in-process engine: ``backends.base.Tokenizing``). They run no model, so they are not
metered, but count against requests/min (``Pipeline.admit_poll``: a valid request, after its checks);
the key must be allowed the model, as for a completion. Nothing of them goes upstream, so
a field they do not model, at any depth (``messages[0].foo``), is a 400 naming it, never dropped."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, post
from msgspec import UNSET, Meta, Struct, UnsetType

from backends.base import Tokenizing
from backends.estimate import bound_chat_prompt, bound_text
from backends.nested_fields import unknown_nested_field
from backends.openai_wire import ChatCompletionRequest, ChatMessage, extra_params, set_extra_params
from backends.tools_wire import Tool
from gateway.body import WireBody
from gateway.contracts import Principal
from gateway.controllers.auth import authenticate_request, principal_of
from gateway.controllers.docs import error_responses
from gateway.controllers.polled import headed
from gateway.errors import ApiError
from gateway.off_loop import sized
from gateway.pipeline import Pipeline


class TokenizeRequest(msgspec.Struct, kw_only=True, dict=True):  # dict: the fields sent, for refuse_unmodelled
    """Exactly one of ``prompt`` (text) or ``messages`` (rendered with the model's chat template)."""

    model: str
    prompt: str | UnsetType = UNSET
    messages: Annotated[list[ChatMessage], Meta(min_length=1)] | UnsetType = UNSET
    # unset: True for a prompt, False for messages (their chat template writes the special tokens)
    add_special_tokens: bool | UnsetType = UNSET
    add_generation_prompt: bool = True  # for messages, as are the three below (as chat completions take them)
    continue_final_message: bool = False
    tools: list[Tool] | None | UnsetType = UNSET
    chat_template_kwargs: dict[str, Any] | None | UnsetType = UNSET
    return_token_strs: bool | None = False  # null: not asked (vLLM's is optional)

    def chat_request(self) -> ChatCompletionRequest:
        """The conversation as a chat completion request, rendered as the engine renders a chat prompt."""
        chat = ChatCompletionRequest(model=self.model, messages=self.messages,  # type: ignore[arg-type]
                                     tools=self.tools, chat_template_kwargs=self.chat_template_kwargs)
        if self.continue_final_message:
            set_extra_params(chat, {"continue_final_message": msgspec.Raw(b"true")})
        return chat


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | UnsetType = UNSET


class DetokenizeRequest(msgspec.Struct, kw_only=True, dict=True):
    model: str
    tokens: list[int]


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


def refuse_unmodelled(body: Struct) -> None:
    """A 400 naming the first field of ``body`` that its type does not model: a top-level one, or
    one nested in a modelled field (``messages[0].foo``, ``tools[0].function.foo``)."""
    path = next(iter(extra_params(body)), None) or unknown_nested_field(body)
    if path is not None:
        raise ApiError(400, f"'{path}' is not supported by this endpoint", param=path, code="unsupported_parameter")


def tokenizer_for(pipeline: Pipeline, principal: Principal, model: str) -> Tokenizing:
    """The tokenizer of a deployment of ``model`` the key may use; 400 when none exposes one."""
    group = pipeline.group_for(principal, model)
    for deployment in group.deployments:
        if isinstance(deployment.backend, Tokenizing):
            return deployment.backend
    providers = sorted({d.config.provider for d in group.deployments})
    raise ApiError(400, f"The model '{model}' is served by {', '.join(providers)}, whose tokenizer the gateway does "
                   "not hold; tokenizing needs a model the built-in engine serves.", param="model")


def _tokenized(tokenizer: Tokenizing, data: TokenizeRequest) -> TokenizeResponse:
    if isinstance(data.prompt, str):
        ids = tokenizer.tokenize_text(data.prompt, data.add_special_tokens is not False)
    else:
        ids = tokenizer.tokenize_chat(data.chat_request(), data.add_generation_prompt, data.add_special_tokens is True)
    strings = tokenizer.token_strings(ids) if data.return_token_strs else UNSET
    return TokenizeResponse(count=len(ids), max_model_len=tokenizer.max_model_len, tokens=ids, token_strs=strings)


class TokenizeController(Controller):
    tags = ["Tokenizer"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method

    @post("/tokenize", status_code=200, dto=WireBody[TokenizeRequest], return_dto=None,
          summary="Tokenize a prompt or a conversation (vLLM's shape)", responses=error_responses())
    async def tokenize(self, request: Request[Any, Any, Any], data: TokenizeRequest,
                       pipeline: Pipeline) -> Response[TokenizeResponse]:
        if (data.prompt is UNSET) == (data.messages is UNSET):
            raise ApiError(400, "Give exactly one of 'prompt' or 'messages'.", param="prompt")
        principal = principal_of(request)
        tokenizer = tokenizer_for(pipeline, principal, data.model)
        refuse_unmodelled(data)
        if isinstance(data.prompt, str):
            bound = bound_text(data.prompt)
        else:
            bound = bound_chat_prompt(data.chat_request())
        headers = await pipeline.admit_poll(principal, "tokenize")
        with headed(headers):  # a huge input in a thread
            return Response(await sized(bound, lambda: _tokenized(tokenizer, data)), headers=headers)

    @post("/detokenize", status_code=200, dto=WireBody[DetokenizeRequest], return_dto=None,
          summary="Turn token ids back into text (vLLM's shape)", responses=error_responses())
    async def detokenize(self, request: Request[Any, Any, Any], data: DetokenizeRequest,
                         pipeline: Pipeline) -> Response[DetokenizeResponse]:
        principal = principal_of(request)
        tokenizer = tokenizer_for(pipeline, principal, data.model)
        refuse_unmodelled(data)
        headers = await pipeline.admit_poll(principal, "detokenize")
        with headed(headers):
            return Response(DetokenizeResponse(prompt=tokenizer.detokenize(data.tokens)), headers=headers)
