"""Development helpers that are not providers: the loopback echo server (``python -m backends.dev.echo_server``)."""
