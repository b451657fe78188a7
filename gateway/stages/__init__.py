"""The request path's stages, in order: parse, policy, route, proxy; accounting runs at the edge."""
