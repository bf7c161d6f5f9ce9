"""``GET /v1/models`` and ``GET /v1/models/{id}``: only the models the caller may use, each by its
name and by every alias (a card of the same shape, ``metadata.alias_of`` naming the model)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get
from msgspec import UNSET

from backends.base import Tokenizing
from backends.openai_wire import ModelCard, ModelList
from gateway.controllers.auth import authenticate_request, principal_of
from gateway.controllers.docs import error_responses
from gateway.errors import ApiError
from gateway.pipeline import Pipeline
from gateway.routing.router import ModelGroup, is_wildcard


def _card(group: ModelGroup, name: str) -> ModelCard:
    """The group's card under ``name``: its own name, or an alias (one a wildcard matched included)."""
    metadata: dict[str, Any] = {"deployments": len(group.deployments)}
    if group.config.aliases:
        metadata["aliases"] = list(group.config.aliases)
    if name != group.name:
        metadata["alias_of"] = group.name
    # Engine-backed deployments say how they run the model (native / transformers / generate).
    impls = sorted({str(m["model_impl"]) for d in group.deployments
                    if isinstance(m := getattr(d.backend, "metadata", None), dict) and "model_impl" in m})
    if impls:
        metadata["model_impl"] = impls[0] if len(impls) == 1 else impls
    if any(isinstance(m := getattr(d.backend, "metadata", None), dict) and "pooling" in m for d in group.deployments):
        metadata["embeddings"] = True
    # The context a request can count on: the smallest of the deployments that know theirs.
    contexts = [d.backend.max_model_len for d in group.deployments if isinstance(d.backend, Tokenizing)]
    return ModelCard(id=name, owned_by=group.config.owned_by, metadata=metadata,
                     max_model_len=min(contexts) if contexts else UNSET)


def _listed(group: ModelGroup) -> list[ModelCard]:
    """A card for the group's name and one for each alias. A wildcard alias (``gpt-4o-*``) stands for
    names that cannot be enumerated, so it is not listed (a name it matches is still retrievable)."""
    return [_card(group, name) for name in group.names if not is_wildcard(name)]


class ModelsController(Controller):
    path = "/v1/models"
    tags = ["OpenAI"]
    before_request = authenticate_request  # type: ignore[assignment]  # a function attribute reads as a method

    @get("/", summary="List the models this key may use", responses=error_responses(401))
    async def list_models(self, request: Request[Any, Any, Any], pipeline: Pipeline) -> ModelList:
        """Each model by its name and by each of its aliases; wildcard aliases (``gpt-4o-*``) match
        names that cannot be enumerated and are not listed, but a name one matches that the key's
        allow-list holds is."""
        principal = principal_of(request)
        cards = [card for g in pipeline.visible_groups(principal) for card in _listed(g)]
        listed = {card.id for card in cards}
        for name in sorted(principal.allowed_models or ()):  # a name the key may use that a wildcard serves
            if name not in listed and not is_wildcard(name) and (group := pipeline.services.router.resolve(name)):
                cards.append(_card(group, name))
        return ModelList(data=cards)

    @get("/{model_id:path}", summary="Retrieve a model", responses=error_responses(401, 404))
    async def retrieve(self, request: Request[Any, Any, Any], model_id: str, pipeline: Pipeline) -> ModelCard:
        principal = principal_of(request)
        name = model_id.lstrip("/")
        group = pipeline.services.router.resolve(name)
        if group is None or not pipeline.may_serve(principal, name, group):
            raise ApiError(404, f"The model '{name}' does not exist.", param="model", code="model_not_found")
        return _card(group, name)
