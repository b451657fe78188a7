"""The route: which tier and which replica serve a request, as named steps of the request path.

    route (candidate tiers) -> session -> detour -> ... -> affinity -> rank

Each step is a stage of `gateway.pipeline.RequestPath`, in that order, over a pure decision function that
needs no live request (config, tenant, reading, scores, pool state): `gateway route explain` and
`POST /admin/explain` run the same functions dry (nothing recorded, no exploration spent).

    quality       quality_floor: the cheapest tier within the floor of the best predicted quality
    detour        'auto' on a tier with no healthy replica: the nearest healthy tier
    sessions      which tier a conversation holds (Redis, else in process)
    explain       the decision for one request, dry; explain_text renders it for people
    tools         the quality predictor outside the request path (`gateway route score`)
"""
