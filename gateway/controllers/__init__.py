"""HTTP controllers, grouped by domain; each is thin and delegates to ``gateway.pipeline``."""
