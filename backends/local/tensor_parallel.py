"""The local engine split over ``tensor_parallel_size`` ranks (``engine.tensor_parallel``):
rank 0 runs in this process behind the usual ``LocalEngineBackend``, the others in processes."""

from __future__ import annotations

from backends.config import DeploymentConfig
from backends.local.backend import LocalEngineBackend
from backends.local.options import engine_config, pooling_params
from engine import AsyncEngine
from engine.tensor_parallel import start_tensor_parallel


class TensorParallelBackend(LocalEngineBackend):
    def __init__(self, config: DeploymentConfig, world: int) -> None:
        self.group = start_tensor_parallel(engine_config(config), world)
        super().__init__(AsyncEngine(engine=self.group.engine), config.model, config.id, pooling=pooling_params(config))

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            self.group.shutdown()
