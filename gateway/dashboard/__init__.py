"""The per-tenant usage dashboards: sign-in, data API over the hourly rollups, the web page."""
