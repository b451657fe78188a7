"""The hop to a replica, owned once (issue 38).

    attempt.py       `Attempt`: one try at one replica, the owner of its lease from pick to release (first byte,
                     answered, failed) and of the upstream response until a relay takes both; `failover` and the
                     retry budget (`may_try`) for every try after the first
    hop.py           `UpstreamHop`: chat, completions (and native Responses): the attempts, then the answer whole
                     or relayed
    settle.py        a whole answer written into the context (usage, finish reason, text, the output cap)
    sink.py          the client's sink: what a relayed stream said, into the context; the lease's end; the work of
                     an attempt the client left (`price_abandoned`)
    resume.py        a broken stream's continuation: a second attempt through the same code, on another replica
    continuation.py  the continuation protocol: the request that goes on with an answer, and the splice

The stages call in here (gateway.stages.proxy, gateway.stages.embed); backends/ below holds the HTTP client, the
replica pool and statistics, the relay and the probes, and knows nothing of the request's context.
"""
