"""How much fits: ``kv`` is the KV-cache arithmetic the running engine uses (bytes per token, blocks
from a byte budget, whether the context fits); ``plan`` sizes a deployment from a model's config
alone, before loading anything (``switchyard engine capacity``)."""
