"""GSM8K-style arithmetic word problems with known answers, for offline runs and tests.

Seeded: the same (seed, n) always gives the same problems, so generated evaluations are comparable across runs.
Each template computes its answer from the same numbers it writes, and the worked solution ends in '#### N'
exactly like GSM8K's answer column.

Three levels, each with its own id prefix (results of two levels never pair up in `rlstack compare`):
- 'mixed' (`generated:N`) is GSM8K-like: one- and two-step problems with numbers into the thousands.
- 'easy' (`generated-easy:N`) is one step on small numbers: the level a 135M-parameter instruct model (the
  embedded default) solves about a third of the time, so GRPO has right and wrong answers to tell apart from its
  first step, and learning shows within minutes on a CPU. A model that solves nothing, or everything, gives GRPO
  no signal.
- 'two-step' (`generated-two-step:N`) chains two operations on the same small numbers (add then take away, boxes
  then a few more, share a total that first grows). Why: on the easy level most of a small model's gain can be
  the '#### N' line alone; here each step is within its reach but getting both right in a row is not, so it
  starts low, and a rise in accuracy has to come from the arithmetic, not from the format. The numbers stay small
  so that the gain is not capped by multi-digit arithmetic a 135M model cannot do at all.

Held out means held out: `side` splits the space of question texts in two by a hash of the text itself
(`held_out`), so a question on the test side can never be drawn for training, whatever the seeds and sizes. A
small level's space is small (the easy one has some tens of thousands of texts), so two seeded draws would share
questions by chance; the partition makes the split exact. The test side also skips texts it already gave:
greedy decoding answers a repeated question the same way, and a repeat would count one outcome twice in a paired
test.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Literal

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


def _two_add_sub(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(2, 9), r.randint(2, 9)
    c = r.randint(1, a + b - 1)
    ans = a + b - c
    q = f"{name} has {a} {item}. {name} gets {b} more and then gives away {c}. How many {item} does {name} have now?"
    return q, f"{a} + {b} = {a + b}. {a + b} - {c} = {ans}.\n#### {ans}", ans


def _two_boxes_add(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    extra, boxes, per = r.randint(1, 9), r.randint(2, 5), r.randint(2, 6)
    got = boxes * per
    ans = got + extra
    q = (f"{name} has {extra} {item} and buys {boxes} boxes of {item} with {per} {item} in each box. "
         f"How many {item} does {name} have now?")
    return q, f"{boxes} x {per} = {got}. {got} + {extra} = {ans}.\n#### {ans}", ans


def _two_boxes_sub(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    boxes, per = r.randint(2, 5), r.randint(2, 6)
    got = boxes * per
    c = r.randint(1, got - 1)
    ans = got - c
    q = (f"{name} buys {boxes} boxes of {item} with {per} {item} in each box and gives away {c}. "
         f"How many {item} does {name} have left?")
    return q, f"{boxes} x {per} = {got}. {got} - {c} = {ans}.\n#### {ans}", ans


def _two_more_than(r: random.Random) -> tuple[str, str, int]:
    name, other = r.sample(NAMES, 2)
    item = r.choice(ITEMS)
    a, b = r.randint(2, 9), r.randint(2, 9)
    theirs = a + b
    ans = a + theirs
    q = (f"{name} has {a} {item}. {other} has {b} more {item} than {name}. "
         f"How many {item} do {name} and {other} have together?")
    return q, f"{other}: {a} + {b} = {theirs}. Together: {a} + {theirs} = {ans}.\n#### {ans}", ans


def _two_share(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    friends, each = r.randint(2, 5), r.randint(2, 6)
    total = friends * each
    b = r.randint(1, min(9, total - 1))
    a = total - b
    q = (f"{name} has {a} {item} and gets {b} more, then shares them equally among {friends} friends. "
         f"How many {item} does each friend get?")
    return q, f"{a} + {b} = {total}. {total} / {friends} = {each}.\n#### {each}", each


TEMPLATES: list[Template] = [_add_sub, _multiply, _money, _divide, _two_step]
LEVELS: dict[str, list[Template]] = {
    "mixed": TEMPLATES,
    "easy": [_easy_add, _easy_sub, _easy_multiply],
    "two-step": [_two_add_sub, _two_boxes_add, _two_boxes_sub, _two_more_than, _two_share],
}
ID_PREFIX = {"mixed": "gen", "easy": "easy", "two-step": "two"}

Side = Literal["train", "test"]
HELD_OUT_SHARE = 4  # one question text in HELD_OUT_SHARE falls on the test side
# the test side's draws stop when this many in a row gave no new text: the level's test side is used up
EXHAUSTED_AFTER = 20_000


class LevelExhausted(ValueError):
    """More distinct held-out problems asked for than the level's test side holds."""


def held_out(question: str) -> bool:
    """Whether a question text is on the test side: by the sha256 of the text, so the split is a property of the
    text alone, the same in every process and on every machine (Python's own hash() is salted per process)."""
    return hashlib.sha256(question.encode()).digest()[0] % HELD_OUT_SHARE == 0


def generate(n: int, seed: int = 0, level: str = "mixed", side: Side | None = None) -> list[Problem]:
    """n problems of a level. Draw i depends only on (seed, i) and its id names it (`<prefix>-<seed>-<i>`), so
    a larger n extends a smaller one and an id means one question text whatever the side. `side` keeps only the
    draws on that side of `held_out` (None: every draw), the test side each text once."""
    templates = LEVELS[level]
    out: list[Problem] = []
    seen: set[str] = set()
    i = misses = 0
    while len(out) < n:
        r = random.Random(f"{seed}:{i}")
        q, s, _ = r.choice(templates)(r)
        keep = side is None or (held_out(q) == (side == "test") and not (side == "test" and q in seen))
        if keep:
            out.append(Problem(id=f"{ID_PREFIX[level]}-{seed}-{i}", question=q, answer=s, solution=s))
            seen.add(q)
            misses = 0
        else:
            misses += 1
            if misses >= EXHAUSTED_AFTER:
                raise LevelExhausted(f"the {level} level's {side} side holds about {len(out)} distinct problems; "
                                     f"{n} were asked for")
        i += 1
    return out
