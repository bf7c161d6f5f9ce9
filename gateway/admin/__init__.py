"""Tenant administration: the service layer (shared by CLI and API), the admin REST API, bootstrap."""
