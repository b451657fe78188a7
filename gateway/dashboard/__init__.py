"""The live dashboard: GET /dashboard, its JSON, and the rolling windows behind it."""
