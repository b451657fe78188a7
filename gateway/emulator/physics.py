"""Step-time formulas of the emulated engine (see `profiles.py` for the numbers).

A scheduler step prefills the newly admitted sequences and then runs one decode
iteration for every running sequence:

    step_s = prefill_s(new prompt tokens not in the prefix cache)
           + decode_s(running sequences, context tokens they hold)

Prefill is compute-bound (time linear in tokens). Decode is memory-bandwidth-bound:
the weights are streamed once per step whatever the batch (tpot_1), each extra
sequence adds a little compute (batch_slope), and each context token's KV is read
once per step (kv_read_s_per_token).
"""

from __future__ import annotations

import math

import numpy as np

from .profiles import Profile


def prefill_s(profile: Profile, tokens: int) -> float:
    """Seconds to prefill `tokens` prompt tokens."""
    return tokens / profile.prefill_tps if tokens > 0 else 0.0


def decode_s(profile: Profile, running: int, context_tokens: int) -> float:
    """Seconds of one decode iteration for `running` sequences holding `context_tokens`."""
    if running <= 0:
        return 0.0
    batch = profile.tpot_1_s * (1.0 + profile.batch_slope * (running - 1))
    return batch + profile.kv_read_s_per_token * context_tokens


def draw_output_len(
    profile: Profile, rng: np.random.Generator, max_tokens: int, ignore_eos: bool, min_tokens: int
) -> int:
    """Output length: max_tokens if ignore_eos, else a lognormal draw capped by max_tokens."""
    if ignore_eos:
        return max_tokens
    mu = math.log(max(profile.output_len_median, 1))
    drawn = int(round(float(rng.lognormal(mu, profile.output_len_sigma))))
    return max(1, min(max_tokens, max(drawn, min_tokens)))
