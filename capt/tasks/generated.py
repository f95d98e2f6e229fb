"""Small schema-valid data the project makes itself, for machines with neither the hub nor local files.

Rows are in the official release layout (the same as local jsonl files) plus one extra key,
``"generated": true``, and go through the same normalisation and validation; the normaliser gives every
flagged row a uid starting with ``gen:`` (`Example.is_generated`), also after `write_generated` wrote
them to disk and they were loaded back as local files. Generation is
deterministic in (task, split, size, seed). Labels are uniform over the classes and follow a simple rule read
off the text, so a model can learn them and a smoke run shows learning (`make demo`: MiniLM learns CB and RTE
well above the majority class):

- CB: the premise says "the N was A"; the hypothesis repeats it (entailment), negates it with "not"
  (contradiction), or speaks of another noun (neutral).
- RTE: the premise holds "The N is A."; the hypothesis is that sentence (entailment) or names another
  adjective (not_entailment).
- BoolQ: the passage holds "The N is A."; the question asks "is the N A" (true) or another adjective (false).
- COPA: the right choice speaks of the premise's noun, the wrong one of another noun.
- WiC: both sentences put the word in the same place (true) or in different places (false).
- CSQA: each noun has one fixed place among the choices.
- MultiRC: an answer is right when it is the adjective the text gives the asked noun.

This is NOT benchmark data: never report scores on it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from capt.tasks import registry
from capt.tasks.records import GENERATED_KEY

NOUNS = ("apple", "river", "teacher", "garden", "window", "doctor", "violin", "mountain", "kitten",
         "letter", "engine", "forest", "candle", "bridge", "pencil", "ocean", "farmer", "castle",
         "rabbit", "lantern")
ADJECTIVES = ("red", "quiet", "old", "bright", "heavy", "small", "warm", "tall", "green", "slow",
              "happy", "cold")
VERBS = ("opened", "painted", "moved", "cleaned", "found", "carried", "watched", "fixed")
NAMES = ("Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Hugo")
PLACES = ("kitchen", "library", "park", "school", "museum", "station", "garage", "beach", "hospital",
          "market")
LETTERS = ("A", "B", "C", "D", "E")

Row = dict[str, Any]


def _filler(rng: random.Random, count: int) -> str:
    return " ".join(f"{rng.choice(NAMES)} {rng.choice(VERBS)} the {rng.choice(NOUNS)}."
                    for _ in range(count))


def _other(rng: random.Random, options: tuple[str, ...], avoid: str) -> str:
    return rng.choice([o for o in options if o != avoid])


def _boolq(rng: random.Random, idx: int) -> Row:
    noun, adj = rng.choice(NOUNS), rng.choice(ADJECTIVES)
    label = rng.random() < 0.5
    asked = adj if label else _other(rng, ADJECTIVES, adj)
    passage = f"{noun.title()} -- {_filler(rng, 2)} The {noun} is {adj}. {_filler(rng, rng.randint(1, 3))}"
    return {"question": f"is the {noun} {asked}", "passage": passage, "idx": idx, "label": label}


def _cb(rng: random.Random, idx: int) -> Row:
    noun, adj = rng.choice(NOUNS), rng.choice(ADJECTIVES)
    label = rng.choice(("entailment", "contradiction", "neutral"))
    premise = f"{rng.choice(NAMES)} said that the {noun} was {adj}. {_filler(rng, rng.randint(0, 2))}"
    hypothesis = {"entailment": f"the {noun} was {adj}", "contradiction": f"the {noun} was not {adj}",
                  "neutral": f"the {_other(rng, NOUNS, noun)} was {rng.choice(ADJECTIVES)}"}[label]
    return {"premise": premise.strip(), "hypothesis": hypothesis, "label": label, "idx": idx}


def _rte(rng: random.Random, idx: int) -> Row:
    noun, adj = rng.choice(NOUNS), rng.choice(ADJECTIVES)
    label = rng.choice(("entailment", "not_entailment"))
    asked = adj if label == "entailment" else _other(rng, ADJECTIVES, adj)
    premise = f"{_filler(rng, rng.randint(0, 2))} The {noun} is {adj}. {_filler(rng, 1)}"
    return {"premise": premise.strip(), "hypothesis": f"The {noun} is {asked}.", "label": label, "idx": idx}


def _copa(rng: random.Random, idx: int) -> Row:
    noun = rng.choice(NOUNS)
    right = f"The {noun} was {rng.choice(ADJECTIVES)}."
    wrong = f"The {_other(rng, NOUNS, noun)} was {rng.choice(ADJECTIVES)}."
    label = rng.randint(0, 1)
    choices = (right, wrong) if label == 0 else (wrong, right)
    return {"premise": f"{rng.choice(NAMES)} {rng.choice(VERBS)} the {noun}.", "choice1": choices[0],
            "choice2": choices[1], "question": rng.choice(("cause", "effect")), "label": label, "idx": idx}


def _wic(rng: random.Random, idx: int) -> Row:
    word = rng.choice(NOUNS)
    place = rng.choice(PLACES)
    label = rng.random() < 0.5
    other = place if label else _other(rng, PLACES, place)
    s1 = f"{rng.choice(NAMES)} saw the {word} in the {place}."
    s2 = f"The {word} in the {other} was {rng.choice(ADJECTIVES)}."
    start1, start2 = s1.index(word), s2.index(word)
    return {"word": word, "sentence1": s1, "sentence2": s2, "idx": idx, "label": label,
            "start1": start1, "start2": start2, "end1": start1 + len(word), "end2": start2 + len(word),
            "version": 1.1}


def _csqa(rng: random.Random, idx: int) -> Row:
    noun = rng.choice(NOUNS)
    right = PLACES[NOUNS.index(noun) % len(PLACES)]
    options = [right, *rng.sample([p for p in PLACES if p != right], 4)]
    rng.shuffle(options)
    key = LETTERS[options.index(right)]
    return {"answerKey": key, "id": f"{rng.getrandbits(64):016x}{idx:016x}",
            "question": {"question_concept": noun,
                         "choices": [{"label": lab, "text": t} for lab, t in zip(LETTERS, options, strict=True)],
                         "stem": f"Where would you usually find a {noun}?"}}


def _multirc(rng: random.Random, idx: int, counters: dict[str, int]) -> Row:
    facts = [(noun, rng.choice(ADJECTIVES)) for noun in rng.sample(NOUNS, 3)]
    text = " ".join(f"The {noun} is {adj}. {_filler(rng, 1)}" for noun, adj in facts)
    questions = []
    for noun, adj in facts:
        candidates = [adj, *rng.sample([a for a in ADJECTIVES if a != adj], 2)]
        rng.shuffle(candidates)
        answers = []
        for cand in candidates:
            answers.append({"text": cand, "idx": counters["answer"], "label": int(cand == adj)})
            counters["answer"] += 1
        questions.append({"question": f"What is the {noun} like?", "answers": answers,
                          "idx": counters["question"]})
        counters["question"] += 1
    return {"idx": idx, "version": 1.1, "passage": {"text": text, "questions": questions}}


_SIMPLE: dict[str, Callable[[random.Random, int], Row]] = {
    "boolq": _boolq, "cb": _cb, "copa": _copa, "rte": _rte, "wic": _wic, "csqa": _csqa,
}


def generate_rows(task: str, split: str, size: int, seed: int = 0) -> list[Row]:
    """`size` rows of one official split (MultiRC: passages of 9 answer rows, about `size` rows).

    Deterministic in (task, split, size, seed); ``split`` is ``train`` or ``val``.
    """
    registry.get(task)  # an unknown task raises UnknownTaskError (a KeyError) naming the valid ones
    rng = random.Random(f"capt-generated:{task}:{split}:{seed}")
    if task == "multirc":
        counters = {"question": 0, "answer": 0}
        rows = [_multirc(rng, i, counters) for i in range(max(1, round(size / 9)))]
    else:
        rows = [_SIMPLE[task](rng, i) for i in range(size)]
    for row in rows:
        row[GENERATED_KEY] = True
    return rows


def example_rows(task: str, count: int = 2) -> list[dict[str, Any]]:
    """`count` unlabelled raw rows of `task` in the official layout (generated, schema-valid): an input example
    for a capsule's model card, its registry snippet and its tests."""
    unlabelled = (GENERATED_KEY, "idx", "id", "label", "answerKey")
    return [{k: v for k, v in row.items() if k not in unlabelled} for row in generate_rows(task, "val", count)]


def write_generated(directory: str | Path, tasks: Iterable[str] = registry.TASK_NAMES, train_size: int = 200,
                    val_size: int = 50, seed: int = 0) -> Path:
    """Write generated data in the official local layout ``<directory>/<task>/{train,val}.jsonl``."""
    root = Path(directory)
    for task in tasks:
        folder = root / task
        folder.mkdir(parents=True, exist_ok=True)
        for split, size in (("train", train_size), ("val", val_size)):
            lines = (json.dumps(row) + "\n" for row in generate_rows(task, split, size, seed))
            (folder / f"{split}.jsonl").write_text("".join(lines), encoding="utf-8")
    return root
