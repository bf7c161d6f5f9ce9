"""Real servers for tests and benchmarks: loopback HTTP, no mocks."""
