"""GSM8K-style arithmetic word problems with known answers, for offline runs and tests.

Seeded: the same (seed, n) always gives the same problems, so generated evaluations are comparable across runs.
Each template computes its answer from the same numbers it writes, and the worked solution ends in '#### N'
exactly like GSM8K's answer column.

Two levels. 'mixed' (`generated:N`) is GSM8K-like: one- and two-step problems with numbers into the
thousands. 'easy' (`generated-easy:N`) is one step on small numbers: the level a 135M-parameter instruct model
(the embedded default) solves about a third of the time (22 of 64 held-out ones, greedy, 64 new tokens), so
GRPO has right and wrong answers to tell apart from its first step, and learning shows within minutes on a CPU.
A model that solves nothing, or everything, gives GRPO no signal.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from rlstack.payload.data.problems import Problem

NAMES = ["Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Isla", "Jack", "Lena", "Omar", "Rosa", "Sam"]
ITEMS = ["apples", "books", "marbles", "pencils", "stickers", "cookies", "cards", "shells"]

Template = Callable[[random.Random], tuple[str, str, int]]


def _add_sub(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(5, 60), r.randint(2, 40)
    c = r.randint(1, a + b)
    ans = a + b - c
    q = f"{name} has {a} {item}. {name} gets {b} more and then gives away {c}. How many {item} does {name} have now?"
    s = f"{name} has {a} + {b} = {a + b} {item}. After giving away {c}: {a + b} - {c} = {ans}.\n#### {ans}"
    return q, s, ans


def _multiply(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    boxes, per = r.randint(2, 12), r.randint(3, 25)
    ans = boxes * per
    q = f"{name} buys {boxes} boxes of {item}. Each box holds {per} {item}. How many {item} does {name} buy?"
    s = f"{boxes} boxes x {per} {item} = {ans} {item}.\n#### {ans}"
    return q, s, ans


def _money(r: random.Random) -> tuple[str, str, int]:
    name = r.choice(NAMES)
    price, qty, paid_extra = r.randint(3, 250), r.randint(2, 9), r.randint(0, 1)
    total = price * qty
    fee = r.randint(10, 90) if paid_extra else 0
    ans = total + fee
    fee_q = f" There is also a ${fee} delivery fee." if fee else ""
    q = f"{name} buys {qty} chairs at ${price:,} each.{fee_q} How many dollars does {name} pay in total?"
    s = f"{qty} x ${price:,} = ${total:,}." + (f" Adding the fee: ${total:,} + ${fee} = ${ans:,}." if fee else "")
    return q, s + f"\n#### {ans}", ans


def _divide(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    friends, each = r.randint(2, 9), r.randint(2, 20)
    total = friends * each
    q = f"{name} shares {total} {item} equally among {friends} friends. How many {item} does each friend get?"
    s = f"{total} / {friends} = {each}.\n#### {each}"
    return q, s, each


def _two_step(r: random.Random) -> tuple[str, str, int]:
    name = r.choice(NAMES)
    days, per_day, spent = r.randint(3, 14), r.randint(10, 300), r.randint(0, 500)
    earned = days * per_day
    ans = earned - spent
    q = (f"{name} earns ${per_day} a day for {days} days and then spends ${spent:,} on a bike. "
         f"How much money does {name} have left? (It may be negative if {name} owes money.)")
    s = f"{days} x {per_day} = {earned:,}. {earned:,} - {spent:,} = {ans:,}.\n#### {ans}"
    return q, s, ans


def _easy_add(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(2, 9), r.randint(2, 9)
    q = f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?"
    return q, f"{a} + {b} = {a + b}.\n#### {a + b}", a + b


def _easy_sub(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a = r.randint(6, 19)
    b = r.randint(2, a - 1)
    q = f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?"
    return q, f"{a} - {b} = {a - b}.\n#### {a - b}", a - b


def _easy_multiply(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    boxes, per = r.randint(2, 5), r.randint(2, 5)
    q = f"{name} buys {boxes} boxes of {item}. Each box holds {per} {item}. How many {item} does {name} buy?"
    return q, f"{boxes} x {per} = {boxes * per}.\n#### {boxes * per}", boxes * per


TEMPLATES: list[Template] = [_add_sub, _multiply, _money, _divide, _two_step]
LEVELS: dict[str, list[Template]] = {"mixed": TEMPLATES, "easy": [_easy_add, _easy_sub, _easy_multiply]}
# Problem ids carry the level, so results of two levels never pair up in `rlstack compare`.
ID_PREFIX = {"mixed": "gen", "easy": "easy"}


def generate(n: int, seed: int = 0, level: str = "mixed") -> list[Problem]:
    """n problems of a level; the i-th one depends only on (seed, i), so a larger n extends a smaller one."""
    templates = LEVELS[level]
    out = []
    for i in range(n):
        r = random.Random(f"{seed}:{i}")
        q, s, _ = r.choice(templates)(r)
        out.append(Problem(id=f"{ID_PREFIX[level]}-{seed}-{i}", question=q, answer=s, solution=s))
    return out
