"""Serving-physics profiles for the emulator: one frozen `Profile` per tier.

Cost model (see `physics.py`), all times in seconds:

    prefill_s(p)      = p / prefill_tps                    (compute-bound, linear in tokens)
    decode_s(n, ctx)  = tpot_1_s * (1 + batch_slope * (n - 1))   (weights streamed once per step)
                        + kv_read_s_per_token * ctx              (every running token's KV is read)

Reference deployment assumed for all tiers: NVIDIA A100-80GB SXM (2.0 TB/s HBM, 312 TFLOP/s
dense fp16, 624 TOP/s int8), vLLM with 16-token KV blocks, Llama-3-style GQA (8 KV heads,
head dim 128, fp16 KV). Derivations:

- Decode at batch 1 is memory-bound: tpot_1 ~ weight bytes / HBM bandwidth, plus ~30-50 %
  kernel/launch/all-reduce overhead seen in practice.
- Weight-only int4 (AWQ/GPTQ with the Marlin kernel) streams 4x fewer bytes: the Marlin README
  (IST-DASLab/marlin) reports "close to ideal (4x) speedups up to batchsizes of 16-32"; the
  FastChat AWQ table measures 2.1-2.6x end-to-end ms/token vs fp16 (RTX A6000); AutoAWQ claims
  2-3x. We assume ~2x end to end at batch 1, and a steeper batch slope because dequantization
  makes int4 compute-bound sooner (vLLM docs: AWQ "more suitable for ... small number of
  concurrent requests").
- int8 (W8A8, SmoothQuant-style) halves weight bytes: the SmoothQuant paper reports up to
  1.56x speedup; we assume ~1.8x decode, and int8 tensor cores (2x fp16 peak) for prefill.
- Prefill is compute-bound: ~2 * params FLOP per token at ~45 % MFU. Quantized weight-only
  kernels gain little here (assumed parity with fp16 for int4).
- kv_read_s_per_token = KV bytes per token / aggregate HBM bandwidth.
- kv_capacity_tokens = (0.9 * HBM - weight bytes) / KV bytes per token (vLLM
  gpu_memory_utilization=0.9).
- Output lengths: lognormal, median 180 tokens, sigma 0.9: an assumption approximating the
  long-tailed response lengths of ShareGPT V3 (mean ~ 250 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Profile:
    """Physics and limits of one emulated backend (one replica)."""

    name: str
    model_name: str  # served model id reported by /v1/models and metric labels
    prefill_tps: float  # prompt tokens per second of prefill compute
    tpot_1_s: float  # decode step time with one running sequence and empty context
    batch_slope: float  # relative step-time growth per extra running sequence
    kv_read_s_per_token: float  # extra step time per context token held by running sequences
    max_running: int  # vLLM max_num_seqs
    max_batched_tokens: int  # prefill tokens admitted per step (vLLM max_num_batched_tokens)
    kv_capacity_tokens: int  # KV cache size in tokens
    max_model_len: int  # prompt + max_tokens limit (400 beyond it)
    prefix_cache_tokens: int  # capacity of the prefix-cache LRU, in tokens
    block_size: int = 16  # tokens per KV / prefix-cache block (vLLM default)
    output_len_median: int = 180
    output_len_sigma: float = 0.9
    default_max_tokens: int = 256

    def __post_init__(self) -> None:
        if self.kv_capacity_tokens < self.max_model_len:
            raise ValueError(f"profile {self.name}: kv_capacity_tokens < max_model_len")
        if self.prefill_tps <= 0 or self.max_running < 1 or self.block_size < 1:
            raise ValueError(f"profile {self.name}: prefill_tps, max_running, block_size must be > 0")


PROFILES: dict[str, Profile] = {
    # Small tier: Llama-3.1-8B W4A16 (AWQ/GPTQ, Marlin) on 1x A100-80GB.
    # Weights ~5.7 GB -> 2.9 ms at 2 TB/s; fp16 8B measures ~11-12 ms/token, so ~6.5 ms at ~1.8x.
    # Prefill: 16 GFLOP/token at ~45 % of 312 TFLOP/s -> ~9,000 tok/s.
    # KV: 128 KiB/token -> 64 ns/token; (72 - 5.7) GB / 128 KiB -> ~500k tokens.
    "int4": Profile(
        name="int4", model_name="emulator-int4", prefill_tps=9000.0, tpot_1_s=0.0065,
        batch_slope=0.03, kv_read_s_per_token=64e-9, max_running=256, max_batched_tokens=8192,
        kv_capacity_tokens=500_000, max_model_len=32768, prefix_cache_tokens=200_000,
    ),
    # Medium tier: a 32B model (Qwen2.5-32B class, 64 layers) W8A8 int8 on 1x A100-80GB.
    # Weights ~33 GB -> 16.5 ms at 2 TB/s; with overhead ~21 ms (fp16 would be ~38 ms: ~1.8x).
    # Prefill: 64 GFLOP/token at ~45 % of 624 TOP/s int8 -> ~4,400 tok/s.
    # KV: 256 KiB/token -> 128 ns/token; (72 - 33) GB / 256 KiB -> ~150k tokens.
    "int8": Profile(
        name="int8", model_name="emulator-int8", prefill_tps=4400.0, tpot_1_s=0.021,
        batch_slope=0.02, kv_read_s_per_token=128e-9, max_running=128, max_batched_tokens=8192,
        kv_capacity_tokens=150_000, max_model_len=32768, prefix_cache_tokens=60_000,
    ),
    # Large tier: Llama-3-70B fp16 on 4x A100-80GB (tensor parallel 4).
    # Weights 141 GB / (4 x 2 TB/s) = 17.6 ms; with all-reduce + overhead ~32 ms (public vLLM
    # TP4 reports: 25-40 ms/token at batch 1). Prefill: 140 GFLOP/token at ~45 % of
    # 4 x 312 TFLOP/s -> ~4,000 tok/s. KV: 320 KiB/token over 8 TB/s -> 41 ns/token;
    # (288 - 141) GB / 320 KiB -> ~450k tokens.
    "fp16": Profile(
        name="fp16", model_name="emulator-fp16", prefill_tps=4000.0, tpot_1_s=0.032,
        batch_slope=0.012, kv_read_s_per_token=41e-9, max_running=256, max_batched_tokens=8192,
        kv_capacity_tokens=450_000, max_model_len=32768, prefix_cache_tokens=150_000,
    ),
    # Overload benchmarks on a 2-core machine: a small replica (max 8 running sequences) whose
    # capacity is a few requests per second, so that 3x its capacity still costs this machine's
    # CPU little. Decode 15 ms/token at batch 1, +6 % per extra sequence (25 ms at 8: under a 50 ms
    # TPOT SLO); prefill 6,000 tok/s; prefix cache of 16k tokens (a few dozen conversations).
    "overload": Profile(
        name="overload", model_name="emulator-overload", prefill_tps=6000.0, tpot_1_s=0.015,
        batch_slope=0.06, kv_read_s_per_token=0.0, max_running=8, max_batched_tokens=4096,
        kv_capacity_tokens=65_536, max_model_len=8192, prefix_cache_tokens=16_384,
    ),
    # Functional tests: no modelled latency at all (the scheduler still yields once per step).
    "instant": Profile(
        name="instant", model_name="emulator-instant", prefill_tps=1e12, tpot_1_s=0.0,
        batch_slope=0.0, kv_read_s_per_token=0.0, max_running=256, max_batched_tokens=1 << 20,
        kv_capacity_tokens=1 << 22, max_model_len=1 << 20, prefix_cache_tokens=1 << 20,
        output_len_median=24, output_len_sigma=0.5,
    ),
}


def get_profile(name: str) -> Profile:
    """The named profile, or a ValueError listing the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown emulator profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
