"""Provider adapters behind one Backend protocol (see backends.base)."""
