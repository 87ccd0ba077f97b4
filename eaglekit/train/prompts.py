"""The project's own prompt sets: a held-out evaluation set (assets/prompts/heldout.jsonl, written by hand in
MT-bench's eight categories plus code completion and grade-school math) and a training set generated here from the
lists in prompt_lists: topics by domain crossed with task templates, sampled with a seeded RNG (the same n and seed
give the same file), deduplicated on normalized text, and with no 8-word n-gram shared with any held-out prompt
(such a candidate is rejected, so training never sees a held-out prompt's wording).

    python -m eaglekit.train.prompts --out eaglekit/assets/prompts/train.jsonl   # regenerate the committed file
    python -m eaglekit.train.prompts --out prompts.jsonl --chat     # the same prompts for `eaglekit regenerate`
"""

from __future__ import annotations

import argparse
import json
import random
import re
from importlib import resources

from . import prompt_lists as L

SETS = ("heldout", "train")
TRAIN_N, TRAIN_SEED = 2400, 0
REJECT_N = 8  # a training prompt sharing an n-gram this long with a held-out prompt is rejected
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """Lowercased words with punctuation stripped: the unit of the dedup key and of the n-gram checks."""
    return _WORD.findall(text.lower())


def normalize(text: str) -> str:
    return " ".join(words(text))


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def ngram_overlap(a: str, b: str, n: int) -> set[tuple[str, ...]]:
    """The word n-grams (lowercased, punctuation stripped) that texts a and b share."""
    return ngrams(a, n) & ngrams(b, n)


def check_disjoint(train: list[dict], heldout: list[dict], n: int) -> list[tuple[str, str]]:
    """(training id, held-out id) for every pair of prompts sharing a word n-gram; empty when disjoint."""
    index: dict[tuple[str, ...], list[str]] = {}
    for h in heldout:
        for g in ngrams(h["prompt"], n):
            index.setdefault(g, []).append(h["id"])
    hits: list[tuple[str, str]] = []
    for t in train:
        found = {hid for g in ngrams(t["prompt"], n) for hid in index.get(g, ())}
        hits.extend((t["id"], hid) for hid in sorted(found))
    return hits


def _read(name: str) -> list[dict]:
    text = resources.files("eaglekit").joinpath("assets", "prompts", f"{name}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_prompt_set(name: str) -> list[dict]:
    """The shipped prompt set "heldout" or "train": a list of {"id", "category", "prompt", ...} dicts."""
    if name not in SETS:
        from ..errors import InputError

        raise InputError(f"unknown prompt set {name!r}", fix=f"use one of: {', '.join(SETS)}", code="E108")
    return _read(name)


# --- task templates: each takes the RNG and returns (domain, prompt[, extra fields]) ---


def _topic(rng):
    domain = rng.choice(list(L.TOPICS))
    return domain, rng.choice(L.TOPICS[domain])


def t_explain(rng):
    d, t = _topic(rng)
    form = rng.choice(
        [
            "Explain {t} to {a}.",
            "Can you explain {t} {l}?",
            "How would you describe {t} to {a}?",
            "I never understood {t}. Explain it {l}, please.",
        ]
    )
    return d, form.format(t=t, a=rng.choice(L.AUDIENCES), l=rng.choice(L.LENGTHS))


def t_list(rng):
    d, t = _topic(rng)
    k = rng.randint(3, 7)
    form = rng.choice(
        [
            "List {k} interesting facts about {t}.",
            "Give me {k} tips related to {t}.",
            "What are {k} common mistakes people make with {t}?",
            "Name {k} things everyone should know about {t}.",
            "Make a bullet list of {k} key ideas in {t}.",
        ]
    )
    return d, form.format(k=k, t=t)


def t_compare(rng):
    d = rng.choice(list(L.TOPICS))
    a, b = rng.sample(L.TOPICS[d], 2)
    form = rng.choice(
        [
            "What is the difference between {a} and {b}?",
            "Compare {a} and {b} in a few sentences.",
            "How are {a} and {b} similar, and how are they different?",
            "Which would you rather learn about, {a} or {b}? Explain why.",
        ]
    )
    return d, form.format(a=a, b=b)


def t_question(rng):
    d, t = _topic(rng)
    form = rng.choice(
        [
            "What is the history of {t}?",
            "Why do people find {t} interesting?",
            "What should a beginner know about {t}?",
            "What is one surprising thing about {t}?",
            "How has {t} changed over the last hundred years?",
            "Why does {t} matter in daily life?",
        ]
    )
    return d, form.format(t=t)


def t_story(rng):
    c, s = rng.choice(L.CHARACTERS), rng.choice(L.SITUATIONS)
    form = rng.choice(
        [
            "Write a short story about {c} who {s}.",
            "Tell me a {m} story about {c} who {s}.",
            "Write a story of about 150 words in which {c} {s}.",
            "Write the first paragraph of a {m} story: {c} {s}.",
        ]
    )
    return "creative writing", form.format(c=c, s=s, m=rng.choice(L.MOODS))


def t_poem(rng):
    d, t = _topic(rng)
    form = rng.choice(
        ["Write {f} about {t}.", "Write {f} with a {m} tone about {t}.", "Could you write {f} on the subject of {t}?"]
    )
    return d, form.format(f=rng.choice(L.POEM_FORMS), t=t, m=rng.choice(L.MOODS))


def t_email(rng):
    r, s = rng.choice(L.RECIPIENTS), rng.choice(L.EMAIL_SUBJECTS)
    form = rng.choice(
        [
            "Write a short email to {r} {s}.",
            "Draft a polite message to {r} {s}.",
            "Help me write an email to {r} {s}. Keep it brief and friendly.",
        ]
    )
    return "everyday life", form.format(r=r, s=s)


def t_steps(rng):
    h = rng.choice(L.HOW_TO)
    form = rng.choice(
        [
            "How do I {h}? Give step-by-step instructions.",
            "What are the steps to {h}?",
            "Explain how to {h} in {k} simple steps.",
            "I want to {h}. Where do I start?",
        ]
    )
    return "everyday life", form.format(h=h, k=rng.randint(3, 6))


def t_recipe(rng):
    dish = rng.choice(L.DISHES)
    form = rng.choice(
        [
            "Give me a simple recipe for {d}.",
            "What ingredients do I need for {d}?",
            "How can I make {d} for {p} people?",
            "What is a quick way to cook {d} on a weeknight?",
        ]
    )
    return "cooking", form.format(d=dish, p=rng.randint(2, 8))


def t_travel(rng):
    p = rng.choice(L.PLACES)
    form = rng.choice(
        [
            "What should I pack for a {k}-day trip to {p}?",
            "Plan a {k}-day visit to {p} for a first-time visitor.",
            "What are some things to do in {p} on a rainy day?",
            "What food should I try when I visit {p}?",
        ]
    )
    return "travel", form.format(p=p, k=rng.randint(2, 6))


def t_python(rng):
    task = rng.choice(L.PY_TASKS)
    form = rng.choice(
        [
            "Write a Python function that {t}.",
            "Show me Python code that {t}.",
            "Can you write a function in Python that {t}?",
        ]
    )
    return "programming", form.format(t=task) + rng.choice(L.PY_EXTRAS)


def t_summarize(rng):
    p = rng.choice(L.PARAGRAPHS)
    return "reading", f"{rng.choice(L.SUMMARY_ASKS)}\n\n{p}"


def t_paragraph_question(rng):
    p = rng.choice(L.PARAGRAPHS)
    q = rng.choice(
        [
            "What problem does this text describe, and how was it solved?",
            "Who or what is this text about?",
            "Write one question a teacher could ask about this text, and answer it.",
            "List the facts in this text as short bullet points.",
        ]
    )
    return "reading", f"{p}\n\n{q}"


def t_rewrite(rng):
    s = rng.choice(L.SENTENCES)
    form = rng.choice(
        [
            'Rewrite this sentence to be {st}: "{s}"',
            'Make this {st}: "{s}"',
            'How could I say this in a way that is {st}? "{s}"',
        ]
    )
    return "writing", form.format(st=rng.choice(L.REWRITE_STYLES), s=s)


def t_roleplay(rng):
    role, ask = rng.choice(L.ROLES)
    form = rng.choice(
        [
            "Pretend you are {r}. {q}",
            "You are {r}. {q}",
            "Act as {r}. {q}",
            "Imagine you are {r}. {q} Stay in character.",
        ]
    )
    return "roleplay", form.format(r=role, q=ask)


def t_advice(rng):
    s = rng.choice(L.ADVICE)
    form = rng.choice(
        ["{s}. What should I do?", "{s}. Can you give me some advice?", "{s}. Give me three practical suggestions."]
    )
    return "everyday life", form.format(s=s[0].upper() + s[1:])


def t_pros_cons(rng):
    d, t = _topic(rng)
    form = rng.choice(
        [
            "What are the pros and cons of {t}?",
            "Give two advantages and two disadvantages of {t}.",
            "Is {t} worth the effort for a beginner? Give reasons for and against.",
        ]
    )
    return d, form.format(t=t)


def t_quiz(rng):
    d, t = _topic(rng)
    k = rng.randint(2, 5)
    form = rng.choice(
        [
            "Write {k} quiz questions about {t}, with answers.",
            "Make a short true-or-false quiz with {k} statements about {t}.",
            "Ask me {k} questions to test what I know about {t}.",
        ]
    )
    return d, form.format(k=k, t=t)


def t_slogan(rng):
    b = rng.choice(L.BUSINESSES)
    form = rng.choice(
        [
            "Write a catchy slogan for {b}.",
            "Suggest {k} names for {b}.",
            "Write a short social media post announcing the opening of {b}.",
            "Write a two-sentence advertisement for {b}.",
        ]
    )
    return "business", form.format(b=b, k=rng.randint(3, 6))


def t_plan(rng):
    d, t = _topic(rng)
    form = rng.choice(
        [
            "Make a one-week plan to learn the basics of {t}.",
            "Create a simple study plan for {t} with {k} sessions.",
            "How could a class spend one hour learning about {t}?",
        ]
    )
    return d, form.format(t=t, k=rng.randint(3, 6))


def t_define(rng):
    d, t = _topic(rng)
    form = rng.choice(["Define {t} {l}.", 'What does the term "{t}" mean?', "Describe {t} for {a}."])
    return d, form.format(t=t, l=rng.choice(L.LENGTHS), a=rng.choice(L.AUDIENCES))


def t_arithmetic(rng):
    text, fn = rng.choice(L.STORY_PROBLEMS)
    a, b = rng.randint(3, 25), rng.randint(2, 12)
    c = rng.randint(1, max(1, min(a * b, a + b) - 1))  # keeps every answer positive
    prompt = text.format(name=rng.choice(L.NAMES), a=a, b=b, c=c)
    ask = rng.choice(["", " Show your work.", " Explain each step."])
    return "math", prompt + ask, {"answer": fn(a, b, c)}


def t_math_fact(rng):
    a, b = rng.randint(12, 99), rng.randint(2, 19)
    op, ans = rng.choice([("times", a * b), ("plus", a + b), ("minus", a - b)])
    form = rng.choice(
        [
            "What is {a} {op} {b}?",
            "Calculate {a} {op} {b} and explain how you did it.",
            "Quick question: {a} {op} {b} equals what?",
        ]
    )
    return "math", form.format(a=a, op=op, b=b), {"answer": ans}


TEMPLATES = {
    f.__name__[2:]: f
    for f in (
        t_explain,
        t_list,
        t_compare,
        t_question,
        t_story,
        t_poem,
        t_email,
        t_steps,
        t_recipe,
        t_travel,
        t_python,
        t_summarize,
        t_paragraph_question,
        t_rewrite,
        t_roleplay,
        t_advice,
        t_pros_cons,
        t_quiz,
        t_slogan,
        t_plan,
        t_define,
        t_arithmetic,
        t_math_fact,
    )
}


def build_training_prompts(n: int = TRAIN_N, seed: int = TRAIN_SEED, heldout: list[dict] | None = None) -> list[dict]:
    """n training prompts, templates taken round-robin (a template whose lists run dry drops out), deduplicated on
    normalized text, none sharing a REJECT_N-gram with a held-out prompt. Deterministic in (n, seed, lists)."""
    if n < 1:
        from ..errors import InputError

        raise InputError(f"n={n}: the number of training prompts must be at least 1", fix="pass n >= 1", code="E108")
    heldout = load_prompt_set("heldout") if heldout is None else heldout
    banned = set().union(*(ngrams(h["prompt"], REJECT_N) for h in heldout))
    rng = random.Random(seed)
    live = list(TEMPLATES)
    seen: set[str] = set()
    out: list[dict] = []
    i = 0
    while len(out) < n and live:
        name = live[i % len(live)]
        for _ in range(50):  # a fresh, allowed prompt from this template, or the template is dry
            domain, prompt, *extra = TEMPLATES[name](rng)
            key = normalize(prompt)
            if key not in seen and not (ngrams(prompt, REJECT_N) & banned):
                seen.add(key)
                out.append(
                    {
                        "id": f"train-{len(out):05d}",
                        "category": name,
                        "domain": domain,
                        "prompt": prompt,
                        **(extra[0] if extra else {}),
                    }
                )
                i += 1
                break
        else:
            live.remove(name)
    return out


def to_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def as_chat(rows: list[dict]) -> list[dict]:
    """Each prompt as a one-turn conversation ({"messages": [user]}, the other fields kept): the chat JSONL that
    `eaglekit regenerate --data` reads, where the target answers the user turn through its chat template."""
    return [
        {"messages": [{"role": "user", "content": r["prompt"]}], **{k: v for k, v in r.items() if k != "prompt"}}
        for r in rows
    ]


def main(argv=None) -> int:
    from ..io import atomic_write_bytes

    p = argparse.ArgumentParser(prog="python -m eaglekit.train.prompts", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where to write the training prompts (JSONL)")
    p.add_argument("--n", type=int, default=TRAIN_N, help=f"number of prompts (default {TRAIN_N})")
    p.add_argument("--seed", type=int, default=TRAIN_SEED, help=f"sampling seed (default {TRAIN_SEED})")
    p.add_argument(
        "--chat",
        action="store_true",
        help='write one-turn conversations ({"messages": [...]}) for `eaglekit regenerate --data`',
    )
    args = p.parse_args(argv)
    heldout = load_prompt_set("heldout")
    rows = build_training_prompts(args.n, args.seed, heldout)
    data = to_jsonl(as_chat(rows) if args.chat else rows).encode()
    atomic_write_bytes(args.out, data)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["category"]] = counts.get(r["category"], 0) + 1
    print(f"wrote {len(rows)} prompts ({len(data) / 1e3:.0f} kB) to {args.out}")
    print("per template: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for k in (REJECT_N, 5):
        hits = check_disjoint(rows, heldout, k)
        print(
            f"{k}-gram overlap with the held-out set: {len(hits)} pairs, {len({t for t, _ in hits})} training prompts"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
