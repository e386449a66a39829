"""The broker's HTTP face: REST routes, realtime endpoints (SSE, signaling relay), plan routes, OpenAPI."""
