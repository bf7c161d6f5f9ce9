"""``/v1/embeddings`` on the in-process engine: one pooling request per input, batched by the
engine's scheduler with everything else it runs (``engine.pooling``). Only a deployment configured
with ``options.pooling`` serves them; token counts are exact (the inputs' ids)."""

from __future__ import annotations

from backends.base import BadRequest, Completed
from backends.call import CallContext
from backends.embeddings_wire import Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage, encode_vector
from backends.local.run import EngineRun, LocalModel, collect
from backends.local.wire import NO_EFFECT_PARAMS
from backends.openai_wire import extra_params
from engine import SamplingParams


async def embed(backend: LocalModel, request: EmbeddingRequest, ctx: CallContext) -> Completed[EmbeddingList]:
    if backend.pooling is None:
        raise BadRequest(f"the model '{request.model}' does not serve embeddings (its deployment sets no "
                         "options.pooling)", param="model")
    for name in extra_params(request):  # what the engine cannot honour is named, never dropped
        if name not in NO_EFFECT_PARAMS:
            raise BadRequest(f"'{name}' is not supported by the local engine", param=name)
    try:
        inputs = request.inputs()
    except ValueError as exc:
        raise BadRequest(str(exc), param="input") from None
    width = backend.engine.hidden_size
    if isinstance(request.dimensions, int) and request.dimensions != width:
        raise BadRequest(f"this model's embeddings have {width} dimensions; it cannot give {request.dimensions}",
                         param="dimensions")
    prompts = [backend.tokenizer.encode(i) if isinstance(i, str) else list(i) for i in inputs]
    if not all(prompts):
        raise BadRequest("an input has no tokens", param="input")
    run = EngineRun(backend.engine, prompts, SamplingParams(max_tokens=None), "input", ctx, pooling=backend.pooling,
                   listed=request.listed)
    finals = await collect(run)
    vectors = [out.embedding or [] for out in finals]
    data = [Embedding(index=i, embedding=encode_vector(v, request.base64)) for i, v in enumerate(vectors)]
    usage = EmbeddingUsage(prompt_tokens=run.meter.prompt_tokens, total_tokens=run.meter.prompt_tokens)
    return Completed(EmbeddingList(data=data, model=request.model, usage=usage), run.meter)
