"""The labeled set of issue 39's escalation benchmark (bench/escalation.py): short factual and arithmetic completions
with one checkable answer, for a base (not instruction-tuned) model: each item a few-shot prompt `Q: ...\\nA:` whose
answer is one line. Generated, not sampled from anywhere: arithmetic from a seeded generator, facts written here
(capitals, days, months, letters, plurals, number sequences). models/escalation-eval/README.md says how.

`correct(answer, item)`: exact match after `normalize` (first line, case, accents, surrounding spaces and a final
period), against the item's accepted answers (several only where a fact has several common spellings).
"""

from __future__ import annotations

import random
import string
import unicodedata
from typing import Any

SEED = 20261128

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "Japan": "Tokyo", "China": "Beijing|Peking", "Russia": "Moscow", "Egypt": "Cairo", "Greece": "Athens",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw",
    "Austria": "Vienna", "Hungary": "Budapest", "Ireland": "Dublin", "Belgium": "Brussels",
    "the Netherlands": "Amsterdam", "Canada": "Ottawa", "Australia": "Canberra", "Brazil": "Brasilia",
    "Argentina": "Buenos Aires", "Chile": "Santiago", "Peru": "Lima", "Colombia": "Bogota", "Venezuela": "Caracas",
    "Mexico": "Mexico City", "Cuba": "Havana", "India": "New Delhi", "Pakistan": "Islamabad", "Bangladesh": "Dhaka",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "Indonesia": "Jakarta", "the Philippines": "Manila",
    "South Korea": "Seoul", "North Korea": "Pyongyang", "Iran": "Tehran", "Iraq": "Baghdad", "Saudi Arabia": "Riyadh",
    "Turkey": "Ankara", "Syria": "Damascus", "Lebanon": "Beirut", "Jordan": "Amman", "Kenya": "Nairobi",
    "Ethiopia": "Addis Ababa", "Nigeria": "Abuja", "Ghana": "Accra", "Morocco": "Rabat", "Algeria": "Algiers",
    "Tunisia": "Tunis", "Libya": "Tripoli", "Sudan": "Khartoum", "Uganda": "Kampala", "Zimbabwe": "Harare",
    "Zambia": "Lusaka", "Angola": "Luanda", "Senegal": "Dakar", "Mali": "Bamako", "Ukraine": "Kyiv|Kiev",
    "Belarus": "Minsk", "Romania": "Bucharest", "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb",
    "the Czech Republic": "Prague", "Slovakia": "Bratislava", "Slovenia": "Ljubljana", "Switzerland": "Bern|Berne",
    "Iceland": "Reykjavik", "Estonia": "Tallinn", "Latvia": "Riga", "Lithuania": "Vilnius", "Afghanistan": "Kabul",
    "Nepal": "Kathmandu", "Mongolia": "Ulaanbaatar|Ulan Bator", "Uzbekistan": "Tashkent",
    "New Zealand": "Wellington", "Jamaica": "Kingston", "Ecuador": "Quito", "Uruguay": "Montevideo",
    "Paraguay": "Asuncion", "Qatar": "Doha", "Kuwait": "Kuwait City", "Oman": "Muscat",
    "the United Kingdom": "London", "the United States": "Washington|Washington, D.C.|Washington D.C.|Washington DC",
    "Malaysia": "Kuala Lumpur", "Cambodia": "Phnom Penh", "Laos": "Vientiane", "Armenia": "Yerevan",
    "Georgia (the country)": "Tbilisi", "Azerbaijan": "Baku", "Cyprus": "Nicosia", "Malta": "Valletta",
    "Albania": "Tirana", "Luxembourg": "Luxembourg|Luxembourg City", "Madagascar": "Antananarivo",
    "Somalia": "Mogadishu", "Rwanda": "Kigali", "Namibia": "Windhoek", "Botswana": "Gaborone",
}
CAPITAL_SHOTS = (("Italy", "Rome"), ("Kenya", "Nairobi"), ("Canada", "Ottawa"))

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
PLURALS = {
    "cat": "cats", "dog": "dogs", "house": "houses", "car": "cars", "book": "books", "tree": "trees",
    "box": "boxes", "bus": "buses", "church": "churches", "dish": "dishes", "glass": "glasses", "fox": "foxes",
    "baby": "babies", "city": "cities", "party": "parties", "story": "stories", "lady": "ladies", "day": "days",
    "boy": "boys", "key": "keys", "knife": "knives", "wife": "wives", "leaf": "leaves", "wolf": "wolves",
    "half": "halves", "child": "children", "man": "men", "woman": "women", "mouse": "mice", "goose": "geese",
    "tooth": "teeth", "foot": "feet", "person": "people", "ox": "oxen", "sheep": "sheep", "fish": "fish|fishes",
    "deer": "deer", "potato": "potatoes", "tomato": "tomatoes", "hero": "heroes", "cactus": "cacti|cactuses",
    "crisis": "crises", "analysis": "analyses", "phenomenon": "phenomena", "criterion": "criteria",
}
PLURAL_SHOTS = (("apple", "apples"), ("bench", "benches"), ("life", "lives"))


def _item(kind: str, question: str, answers: str, shots: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    prompt = "".join(f"Q: {q}\nA: {a}\n\n" for q, a in shots) + f"Q: {question}\nA:"
    return {"kind": kind, "question": question, "answers": answers.split("|"), "prompt": prompt,
            "shown": any(q == question for q, _ in shots)}


def items() -> list[dict[str, Any]]:
    """The whole set, in a fixed order, each with an id."""
    rng = random.Random(SEED)
    out: list[dict[str, Any]] = []
    add_shots = (("3 + 4", "7"), ("12 + 30", "42"), ("51 + 26", "77"))  # answers unlike each other
    for _ in range(40):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        out.append(_item("add_1digit", f"{a} + {b}", str(a + b), add_shots))
    for _ in range(80):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append(_item("add_2digit", f"{a} + {b}", str(a + b), add_shots))
    for _ in range(30):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        out.append(_item("add_3digit", f"{a} + {b}", str(a + b), add_shots))
    sub_shots = (("9 - 4", "5"), ("50 - 8", "42"), ("75 - 13", "62"))
    for _ in range(50):
        a = rng.randint(10, 99)
        b = rng.randint(1, a)
        out.append(_item("sub_2digit", f"{a} - {b}", str(a - b), sub_shots))
    mul_shots = (("2 x 3", "6"), ("7 x 8", "56"), ("4 x 9", "36"))
    for _ in range(50):
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        out.append(_item("mul_small", f"{a} x {b}", str(a * b), mul_shots))
    seq_shots = (("2, 4, 6, 8, ?", "10"), ("5, 10, 15, 20, ?", "25"), ("1, 4, 7, 10, ?", "13"))
    for _ in range(50):
        start, step = rng.randint(0, 30), rng.randint(1, 12)
        terms = [start + step * i for i in range(4)]
        out.append(_item("sequence", ", ".join(map(str, terms)) + ", ?", str(start + step * 4), seq_shots))
    shots = tuple((f"What is the capital of {c}?", a) for c, a in CAPITAL_SHOTS)
    for country, capital in CAPITALS.items():
        out.append(_item("capital", f"What is the capital of {country}?", capital, shots))
    day_shots = (("What day comes after Monday?", "Tuesday"), ("What month comes after March?", "April"),
                 ("What day comes after Saturday?", "Sunday"))
    for i, day in enumerate(DAYS):
        out.append(_item("next_day", f"What day comes after {day}?", DAYS[(i + 1) % 7], day_shots))
        out.append(_item("prev_day", f"What day comes before {day}?", DAYS[(i - 1) % 7], day_shots))
    for i, month in enumerate(MONTHS):
        out.append(_item("next_month", f"What month comes after {month}?", MONTHS[(i + 1) % 12], day_shots))
        out.append(_item("prev_month", f"What month comes before {month}?", MONTHS[(i - 1) % 12], day_shots))
    letter_shots = (("What letter comes after C?", "D"), ("What letter comes after M?", "N"),
                    ("What letter comes after T?", "U"))
    for i, letter in enumerate(string.ascii_uppercase[:-1]):
        out.append(_item("next_letter", f"What letter comes after {letter}?", string.ascii_uppercase[i + 1],
                         letter_shots))
    shots = tuple((f"What is the plural of {w}?", p) for w, p in PLURAL_SHOTS)
    for word, plural in PLURALS.items():
        out.append(_item("plural", f"What is the plural of {word}?", plural, shots))
    out = [item for item in out if not item.pop("shown")]  # a question its own prompt answers: left out
    for i, item in enumerate(out):
        item["id"] = f"e{i:04d}"
    return out


def normalize(text: str) -> str:
    """The first line, without accents, case, surrounding spaces and a final period."""
    line = text.strip().split("\n", 1)[0].strip()
    line = unicodedata.normalize("NFKD", line).encode("ascii", "ignore").decode()
    return line.lower().rstrip(".").strip()


def correct(answer: str, item: dict[str, Any]) -> bool:
    return normalize(answer) in {normalize(a) for a in item["answers"]}
