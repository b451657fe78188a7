"""The HTTP edge's own parts: request ids, API keys read from headers, the one log line of every answer outside
the request path, and the server's handling of requests aiohttp's parser refuses."""
