"""Cheap surface features of a prompt (numpy, microseconds): what the quality predictor reads beside the embedding.

Length (characters, words, lines), numbers and math, multiple-choice options, code, question words, script.
The encoder sees only the head and tail of a long prompt; these count the whole text (up to SCAN_CHARS for the
pattern counts), which is where a prompt's size and kind show. Every value is a log count or a share, so
no single prompt dominates a fitted weight.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

SCAN_CHARS: Final = 16_000  # pattern counts read at most this much of a prompt (its head)

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_OPTION = re.compile(r"(?:^|\n|\s)\(?([A-J])[).:]\s", re.MULTILINE)
_CODE = re.compile(r"```|\bdef |\breturn\b|\bimport |\bclass |\bfunction\b|;\s*\n|\{\s*\n|=>|==|\bprint\(")
_MATH = re.compile(r"[=+*/^<>%]|\\frac|\\sqrt|\\\(|\$|\bsqrt\b|\bmod\b")
_LATEX = re.compile(r"\\[a-zA-Z]+")
_QUESTION = re.compile(r"\b(?:what|which|who|whom|whose|when|where|why|how)\b", re.IGNORECASE)
_IMPERATIVE = re.compile(r"\b(?:write|explain|describe|create|implement|design|compare|prove|solve|calculate)\b",
                         re.IGNORECASE)

NAMES: Final = (
    "log_chars", "log_words", "log_lines", "log_numbers", "digit_share", "log_options", "has_options",
    "log_code", "log_math", "log_latex", "log_questions", "question_mark_share", "log_imperatives",
    "non_ascii_share", "upper_share", "mean_word_length",
)
COUNT: Final = len(NAMES)
Array = npt.NDArray[np.float32]


def prompt_features(text: str) -> list[float]:
    """The COUNT values of NAMES for one prompt."""
    head = text[:SCAN_CHARS]
    chars = max(len(head), 1)
    words = head.split()
    options = {m.group(1) for m in _OPTION.finditer(head)}
    letters = sum(c.isalpha() for c in head) or 1
    return [
        math.log1p(len(text)),
        math.log1p(len(words)),
        math.log1p(text.count("\n")),
        math.log1p(len(_NUMBER.findall(head))),
        sum(c.isdigit() for c in head) / chars,
        math.log1p(len(options)),
        1.0 if len(options) >= 3 else 0.0,
        math.log1p(len(_CODE.findall(head))),
        math.log1p(len(_MATH.findall(head))),
        math.log1p(len(_LATEX.findall(head))),
        math.log1p(len(_QUESTION.findall(head))),
        head.count("?") / max(len(words), 1),
        math.log1p(len(_IMPERATIVE.findall(head))),
        sum(not c.isascii() for c in head) / chars,
        sum(c.isupper() for c in head) / letters,
        min(sum(map(len, words)) / max(len(words), 1), 20.0) / 10.0,
    ]


def feature_matrix(texts: Sequence[str]) -> Array:
    """(len(texts), COUNT) float32."""
    return np.array([prompt_features(t) for t in texts], dtype=np.float32).reshape(len(texts), COUNT)
