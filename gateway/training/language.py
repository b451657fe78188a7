"""A cheap language guess for a prompt: script letters, then Latin-script function words."""

from __future__ import annotations


_SCRIPTS = (  # (language, code point ranges); the first script with the most letters wins
    ("ko", ((0xAC00, 0xD7AF), (0x1100, 0x11FF), (0x3130, 0x318F))),
    ("ja", ((0x3040, 0x30FF),)),
    ("zh", ((0x4E00, 0x9FFF), (0x3400, 0x4DBF))),
    ("ru", ((0x0400, 0x04FF),)),
    ("ar", ((0x0600, 0x06FF),)),
    ("th", ((0x0E00, 0x0E7F),)),
    ("hi", ((0x0900, 0x097F),)),
)
_STOPWORDS = {  # distinctive function words of Latin-script languages
    "en": {"the", "and", "is", "are", "you", "what", "how", "with", "this", "that", "of", "for", "write"},
    "es": {"el", "los", "las", "una", "por", "para", "con", "que", "es", "como", "del", "qué"},
    "fr": {"le", "les", "des", "une", "est", "et", "pour", "avec", "dans", "vous", "je", "sur"},
    "de": {"der", "die", "das", "und", "ist", "nicht", "mit", "ein", "eine", "ich", "sie", "für"},
    "pt": {"os", "uma", "não", "são", "com", "para", "como", "você", "em", "um", "que", "dos"},
    "it": {"il", "gli", "che", "di", "per", "una", "sono", "non", "della", "come", "questo", "con"},
}


def guess_language(text: str, sample_chars: int = 2000) -> str:
    """Cheap language guess: dominant non-Latin script, else Latin stopword vote ("en" on ties/none)."""
    head = text[:sample_chars]
    counts: dict[str, int] = {}
    latin = 0
    for ch in head:
        if not ch.isalpha():
            continue
        code = ord(ch)
        if code < 0x250:
            latin += 1
            continue
        for lang, ranges in _SCRIPTS:
            if any(lo <= code <= hi for lo, hi in ranges):
                counts[lang] = counts.get(lang, 0) + 1
                break
    if counts.get("ja", 0) and counts.get("ja", 0) * 5 >= counts.get("zh", 0):
        counts["ja"] += counts.pop("zh", 0)  # Japanese mixes kana with kanji
    if counts:
        lang, n = max(counts.items(), key=lambda kv: kv[1])
        if n >= latin:
            return lang
    if latin == 0:
        return "other"
    words = [w.strip(".,;:!?¿¡\"'()") for w in head.lower().split()]
    votes = {lang: sum(w in sw for w in words) for lang, sw in _STOPWORDS.items()}
    best = max(votes, key=lambda k: (votes[k], k == "en"))
    return best if votes[best] > votes["en"] else "en"
