"""`gateway whatif`: a routes or policy change priced and timed on recorded traffic before it ships (issue 40).

    logline     the numbers each request log line carries so that it can be replayed (no prompt text)
    records     a log line read back as a `Logged` request (streamed; old lines: price only)
    decide      re-decide one request under a config with the server's own routing and policy functions
    limits      the tenant's rate limits and daily budget on the log's clock (the limiter's own windows)
    replay      one pass over the logs: decisions and prices for each scenario, the latency window kept
    physics     each tier's serving physics fitted from the log's measurements (the emulator's model)
    fleet       the window's arrivals replayed against a simulated fleet of emulator engines
    summary     per scenario, tenant and tier: shares, costs, TTFT quantiles, refusals, burn-down
    report      the terminal table, the JSON object and the self-contained HTML report
    cli         `gateway whatif --log FILES --routes NEW --policies NEW [--baseline-*] [--calibrate]`
"""
