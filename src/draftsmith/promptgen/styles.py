"""Training and held-out prompt sets in four styles, every row with its provenance.

A draft trained on a mix of styles is measured per style, so each style gets its own
training and held-out files, built from text that ships with Python and its installed
packages or that this module writes itself:

- `code`: complete a function's body from its signature (rebuilt from the AST) and its
  docstring, for the public documented functions and methods of the standard library
  and named `--package`s. Held out by module, with `docstrings`' split (same hash,
  same share) and its first-seen rule for repeated docstrings, so a docstring training
  set built from the same sources never saw a held-out module either.
- `math`: step-by-step word problems from project-written families, numbers drawn from a
  seeded generator (`math_problem(family, seed)` rebuilds a row). Held out by a hash of
  the normalised text.
- `chat`: project-written requests, templates x everyday subjects x tone variants. Held
  out by subject, so a held-out subject never appears in training.
- `prose`: paragraphs of plain prose from installed distributions' descriptions (their
  METADATA), each with a task. Held out by distribution.

Within a style a normalised text (NFKC, casefold, whitespace) is kept once, the first
time it comes, so no held-out text is a training text, nor repeated in either split.
Rows: `id`, `prompt` and provenance (`source` "package": `package`, `version`, and for
code `module`, `name`; `source` "generator": `generator`, then `family`, `seed` or
`template`, `variant`, `subject`). At most `--train-count` training rows and exactly
`--heldout-count` held-out rows are taken round-robin over modules, families, subjects or
distributions, in a hash order seeded by `--seed` (which also seeds the math numbers);
too few held-out rows is an error. `--max-prompt-chars` leaves longer prompts out.

    draftsmith promptgen styles --out-dir data/styles --train-count 8000 \\
        --heldout-count 32 --package numpy

writes `data/styles/{style}-train.jsonl` and `{style}-heldout.jsonl` for each style.
`resources/eval/{chat,code,math}.jsonl` were built with it (their README gives the command).
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib.metadata
import platform
import random
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.fsutil import atomic
from draftsmith.promptgen.docstrings import (
    PromptSourceError,
    documented_nodes,
    held_out,
    module_files,
    module_hash,
    normalised,
    source_roots,
)

STYLES = ("code", "math", "chat", "prose")
# A larger share than the module split's: chat and prose have a few hundred split keys,
# and a held-out set should still span several subjects or distributions.
CHAT_HELDOUT_SHARE = 0.08
PROSE_HELDOUT_SHARE = 0.1
MATH_PER_FAMILY = 1000  # draws per family; repeats are dropped
# The generator's recorded name in math and chat rows (not __name__): the module's name
# before it moved to promptgen, kept so that files it wrote stay byte-identical.
GENERATOR = "draftsmith.style_prompts"


@dataclass(frozen=True)
class Candidate:
    held: bool
    row: dict


# --- code -------------------------------------------------------------------------------

CODE_TASKS = (
    "Complete the body of this Python {kind} from `{module}` so that it does what its "
    "docstring says. Keep the signature and the docstring as they are.",
    "Here are the signature and docstring of `{name}` from the module `{module}`. "
    "Write the rest of the {kind}.",
    "Implement the Python {kind} below. Its docstring describes the behaviour; reply with the whole {kind}.",
    "Fill in the missing body of `{name}` ({module}), following its docstring.",
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def code_candidates(packages: list[str], stdlib: bool = True) -> Iterator[Candidate]:
    """One code prompt per public documented function or method, walked in
    `docstrings`' order; a docstring seen before is skipped as it skips it."""
    seen: set[str] = set()
    for prefix, root in source_roots(packages, stdlib):
        package, version = package_version(prefix)
        for module, path in module_files(prefix, root):
            held = held_out(module)
            for node, name, doc in documented_nodes(path):
                key = normalised(doc)
                if key in seen:
                    continue
                seen.add(key)
                block = code_block(node, name, doc)
                if block is not None:
                    row = {"id": f"{module}.{name}", "prompt": _code_prompt(module, name, block)}
                    origin = {"package": package, "version": version, "module": module, "name": name}
                    yield Candidate(held, row | {"source": "package"} | origin)


def package_version(prefix: str) -> tuple[str, str]:
    """(package label, version) of a source root: `python-stdlib` for the standard library."""
    if not prefix:
        return "python-stdlib", platform.python_version()
    names = importlib.metadata.packages_distributions().get(prefix) or [prefix]
    try:
        return prefix, importlib.metadata.version(names[0])
    except importlib.metadata.PackageNotFoundError:
        return prefix, "unknown"


def code_block(node: ast.AST, name: str, doc: str) -> str | None:
    """Decorators, `def` line and docstring of a function (a method under its class line);
    None for a class or a docstring that cannot be written back as a literal."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not _lines_kept(node):
        return None
    owner = name.rpartition(".")[0]
    docstring = _docstring(doc, "        " if owner else "    ")
    if docstring is None:
        return None
    stub = copy.copy(node)  # shallow: the signature is shared, only the body is replaced
    stub.body = [ast.Pass()]
    signature = ast.unparse(stub).rsplit("\n", 1)[0]
    if owner:
        signature = f"class {owner}:\n" + textwrap.indent(signature, "    ")
    return f"{signature}\n{docstring}"


def _lines_kept(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the docstring's newlines are its source lines: a `\\n` escape (or a
    backslash continuation) would come out as a broken line in a garbled indentation."""
    literal = node.body[0].value  # a docstring: an expression of one str constant
    return literal.value.count("\n") == literal.end_lineno - literal.lineno


def _docstring(doc: str, indent: str) -> str | None:
    if '"""' in doc or _CONTROL.search(doc):
        return None
    quote = 'r"""' if "\\" in doc else '"""'
    lines = doc.splitlines()
    if len(lines) == 1 and not doc.endswith(('"', "\\")):
        return f'{indent}{quote}{doc}"""'
    rest = [f"{indent}{line}" if line else "" for line in lines[1:]]
    return "\n".join([f"{indent}{quote}{lines[0]}", *rest, f'{indent}"""'])


def _code_prompt(module: str, name: str, block: str) -> str:
    kind = "method" if "." in name else "function"
    task = CODE_TASKS[module_hash(f"{module}.{name}") % len(CODE_TASKS)]
    return f"{task.format(kind=kind, name=name, module=module)}\n\n```python\n{block}\n```"


# --- math -------------------------------------------------------------------------------

NAMES = (
    "Amara", "Bruno", "Chen", "Dalia", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jia", "Kofi",
    "Lena", "Mateo", "Nadia", "Omar", "Paula", "Quinn", "Rosa", "Sami", "Tariq", "Uma", "Viktor",
    "Wen", "Yara", "Zeno",
)  # fmt: skip
STEP_ASKS = (
    "Reason step by step and give the final answer at the end.",
    "Show your working step by step.",
    "Explain each step of your reasoning before stating the answer.",
    "Work through it one step at a time, then state the answer clearly.",
)
Problem = Callable[[random.Random], str]
COEFFICIENTS = tuple(v for v in range(-9, 10) if abs(v) > 1)  # no 0x, 1x or -1x


def _money(value: float) -> str:
    return f"{value:,.2f}".removesuffix(".00")


def _signed(value: int) -> str:
    """The term after another: '+ 4', '- 4', or nothing for 0."""
    if not value:
        return ""
    return f" - {-value}" if value < 0 else f" + {value}"


def _arith_packs(r: random.Random) -> str:
    name, packs, each = r.choice(NAMES), r.randint(3, 12), r.randint(4, 24)
    item = r.choice(("stickers", "pencils", "marbles", "cards", "buttons", "seed packets"))
    given, lost = r.randint(1, packs * each // 2), r.randint(1, 9)
    return (
        f"{name} buys {packs} packs of {item} with {each} in each pack, gives {given} to a "
        f"friend and later loses {lost}. How many {item} does {name} have left?"
    )


def _arith_bakery(r: random.Random) -> str:
    trays, per = r.randint(4, 20), r.choice((6, 8, 10, 12, 16, 24))
    food = r.choice(("rolls", "muffins", "croissants", "bagels", "scones"))
    total = trays * per
    morning = r.randint(total // 5, total // 2)
    afternoon = r.randint(1, total - morning)
    return (
        f"A bakery bakes {trays} trays of {food} each morning, with {per} on every tray. It "
        f"sells {morning} before noon and {afternoon} in the afternoon. How many {food} are "
        "left at closing time, and what fraction of the day's batch was sold?"
    )


def _arith_envelopes(r: random.Random) -> str:
    name, envelopes, each = r.choice(NAMES), r.randint(2, 8), r.randint(5, 60)
    spent = r.randint(5, 80)
    earned = r.randint(10, min(120, envelopes * each + spent - 1))
    start = envelopes * each + spent - earned
    return (
        f"{name} has {start} euros, spends {spent} on a present and then earns {earned} "
        f"for helping a neighbour. {name} then shares the money equally among {envelopes} "
        "envelopes. How much goes into each envelope?"
    )


def _arith_change(r: random.Random) -> str:
    boxes, price, other, other_price = r.randint(2, 15), r.randint(3, 19), r.randint(2, 12), r.randint(2, 9)
    total = boxes * price + other * other_price
    paid = (total // 50 + 1) * 50
    return (
        f"A school orders {boxes} boxes of pencils at {price} dollars a box and {other} boxes "
        f"of erasers at {other_price} dollars a box. It pays with {paid} dollars. How much "
        "change does it get?"
    )


def _pct_discount(r: random.Random) -> str:
    price, first, second = r.randint(20, 400), r.choice((10, 15, 20, 25, 30, 40)), r.choice((5, 10, 15, 20))
    thing = r.choice(("jacket", "pair of boots", "lamp", "backpack", "bicycle helmet", "kettle"))
    return (
        f"A {thing} costs {price} dollars. It is reduced by {first}% in a sale, and another "
        f"{second}% is taken off the reduced price at the till. What is the final price, and "
        f"is that the same as a single {first + second}% discount?"
    )


def _pct_of_part(r: random.Random) -> str:
    people, part, sub = 100 * r.randint(20, 900), r.choice(range(10, 100, 10)), r.choice(range(10, 100, 10))
    return (
        f"In a town of {people:,} people, {part}% cycle to work, and {sub}% of those cycle "
        "more than 10 km each way. How many people cycle more than 10 km to work?"
    )


def _pct_increase(r: random.Random) -> str:
    old, pct = 20 * r.randint(1, 30), 5 * r.randint(1, 12)
    new = old + old * pct // 100
    thing = r.choice(("concert ticket", "monthly bus pass", "gym membership", "bag of coffee"))
    return f"The price of a {thing} went up from {old} to {new} dollars. By what percentage did it rise?"


def _pct_score(r: random.Random) -> str:
    name, total = r.choice(NAMES), r.choice((40, 50, 60, 80, 120, 150))
    score, goal = r.randint(total // 3, total - 5), r.choice((80, 85, 90, 95))
    return (
        f"{name} scored {score} out of {total} on a test. What percentage is that, and how "
        f"many more points would have been needed to reach {goal}%?"
    )


def _rate_journey(r: random.Random) -> str:
    speed, quarters = r.choice(range(40, 160, 5)), r.randint(3, 24)
    vehicle = r.choice(("train", "coach", "ferry", "car"))
    return (
        f"A {vehicle} covers {speed * quarters / 4:g} km at an average speed of {speed} km/h. "
        "How long does the journey take, in hours and minutes?"
    )


def _rate_round_trip(r: random.Random) -> str:
    name, there, back = r.choice(NAMES), r.choice((12, 15, 18, 20, 24)), r.choice((8, 10, 12, 16))
    distance = r.choice((6, 12, 24, 36, 48))
    return (
        f"{name} cycles to a lake {distance} km away at {there} km/h and rides back along the "
        f"same road at {back} km/h. How long does the round trip take, and what is the "
        "average speed for the whole trip?"
    )


def _rate_meeting(r: random.Random) -> str:
    first, second, hours = r.randint(40, 110), r.randint(40, 110), r.choice((0.5, 1, 1.5, 2, 2.5, 3))
    return (
        f"Two cars set off at the same time from towns {(first + second) * hours:g} km apart "
        f"and drive towards each other, one at {first} km/h and the other at {second} km/h. "
        "When do they meet, and how far has each car driven by then?"
    )


def _rate_printer(r: random.Random) -> str:
    rate, copies, pages = r.randint(8, 45), r.randint(5, 60), r.randint(4, 40)
    return (
        f"An office printer prints {rate} pages per minute. How long will it take to print "
        f"{copies} copies of a {pages}-page report, in minutes and seconds?"
    )


def _ratio_recipe(r: random.Random) -> str:
    serves, grams, wanted = r.choice((2, 4, 6, 8)), 25 * r.randint(4, 24), r.randint(3, 20)
    dish = r.choice(("pancakes", "a fruit crumble", "flatbreads", "a sponge cake", "dumplings"))
    return (
        f"A recipe for {dish} for {serves} people uses {grams} g of flour. How much flour is "
        f"needed for {wanted} people?"
    )


def _ratio_share(r: random.Random) -> str:
    first, second = r.sample(NAMES, 2)
    a, b = r.sample(range(1, 10), 2)
    total = (a + b) * r.randint(5, 200)
    return f"{first} and {second} share {total} dollars in the ratio {a}:{b}. How much does each of them get?"


def _ratio_map(r: random.Random) -> str:
    scale, cm = r.choice((10_000, 25_000, 50_000, 100_000, 250_000)), r.randint(2, 40) / 2
    return (
        f"A map has a scale of 1:{scale:,}. Two villages are {cm:g} cm apart on the map. How "
        "far apart are they in real life, in kilometres?"
    )


def _ratio_marbles(r: random.Random) -> str:
    a, b = r.sample(range(1, 8), 2)
    red = a * r.randint(2, 15)
    return (
        f"The ratio of red to blue marbles in a jar is {a}:{b}. There are {red} red marbles. "
        "How many blue marbles are there, and how many marbles altogether?"
    )


def _linear_simple(r: random.Random) -> str:
    a, x, b = r.randint(2, 12), r.randint(-20, 20), r.randint(-50, 50)
    return f"Solve for x: {a}x{_signed(b)} = {a * x + b}."


def _linear_both_sides(r: random.Random) -> str:
    a, c = r.sample(range(2, 13), 2)
    x, b = r.randint(-15, 15), r.randint(1, 20)
    return f"Find x if {a}(x - {b}) = {c}x{_signed(a * (x - b) - c * x)}."


def _linear_riddle(r: random.Random) -> str:
    name, a, b, x = r.choice(NAMES), r.randint(2, 9), r.randint(1, 40), r.randint(2, 60)
    return (
        f"{name} thinks of a number, multiplies it by {a}, subtracts {b} and gets {a * x - b}. "
        "What was the number?"
    )


def _system_pair(r: random.Random) -> str:
    while True:
        a, b, c, d = (r.choice(COEFFICIENTS) for _ in range(4))
        if a * d != b * c:
            break
    x, y = r.randint(-12, 12), r.randint(-12, 12)
    return (
        f"Solve the system of equations {a}x{_signed(b)}y = {a * x + b * y} and "
        f"{c}x{_signed(d)}y = {c * x + d * y}."
    )


def _system_cafe(r: random.Random) -> str:
    while True:
        p, q, s, t = (r.randint(1, 6) for _ in range(4))
        if p * t != q * s:
            break
    coffee, cake = r.randint(2, 6), r.randint(1, 5)
    return (
        f"At a café, {p} coffees and {q} muffins cost {p * coffee + q * cake} dollars, and "
        f"{s} coffees and {t} muffins cost {s * coffee + t * cake} dollars. What does one "
        "coffee cost, and one muffin?"
    )


def _system_sum_difference(r: random.Random) -> str:
    x, y = r.randint(10, 500), r.randint(1, 300)
    return f"Two numbers add up to {x + y} and differ by {abs(x - y)}. What are the two numbers?"


def _system_farm(r: random.Random) -> str:
    hens, goats = r.randint(3, 60), r.randint(2, 40)
    return (
        f"A farm keeps only hens and goats. Together they have {hens + goats} heads and "
        f"{2 * hens + 4 * goats} legs. How many hens and how many goats are there?"
    )


def _units_miles(r: random.Random) -> str:
    miles = r.randint(3, 500)
    return (
        f"A road sign says the city is {miles} miles away. How far is that in kilometres, "
        "taking 1 mile as 1.609 km?"
    )


def _units_cups(r: random.Random) -> str:
    cups = r.randint(2, 24) / 2
    return f"A recipe calls for {cups:g} cups of milk. If one cup is 240 ml, how many litres is that?"


def _units_time(r: random.Random) -> str:
    days, hours, minutes = r.randint(1, 9), r.randint(1, 23), r.randint(1, 59)
    return f"How many seconds are there in {days} days, {hours} hours and {minutes} minutes?"


def _units_floor(r: random.Random) -> str:
    width, length = r.randint(20, 90) / 10, r.randint(20, 120) / 10
    return (
        f"A room measures {width:g} m by {length:g} m. What is its floor area in square "
        "metres and in square feet, taking 1 m as 3.281 ft?"
    )


def _units_temperature(r: random.Random) -> str:
    fahrenheit = r.randint(-20, 110)
    return f"A weather report gives a temperature of {fahrenheit} °F. What is that in degrees Celsius?"


def _geometry_garden(r: random.Random) -> str:
    width, length, price = r.randint(3, 30), r.randint(4, 40), r.randint(4, 25)
    return (
        f"A rectangular garden is {width} m wide and {length} m long. What is its area, and "
        f"how much does a fence around it cost at {price} dollars per metre?"
    )


def _geometry_circle(r: random.Random) -> str:
    diameter = r.randint(40, 240)
    return (
        f"A round table has a diameter of {diameter} cm. What are its circumference and its "
        "area? Use 3.14 for pi."
    )


def _geometry_box(r: random.Random) -> str:
    length, width, height = r.randint(10, 80), r.randint(10, 60), r.randint(5, 50)
    return (
        f"A box is {length} cm long, {width} cm wide and {height} cm tall. What is its volume "
        "in litres, and how much cardboard is needed to make it, ignoring overlaps?"
    )


def _geometry_ladder(r: random.Random) -> str:
    a, b, c = r.choice(((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (6, 8, 10)))
    k = r.choice((0.5, 1, 1.5, 2))
    return (
        f"A ladder leans against a wall with its foot {a * k:g} m from the wall and its top "
        f"{b * k:g} m above the ground. How long is the ladder?"
    )


def _geometry_tank(r: random.Random) -> str:
    radius, height = r.randint(20, 150), r.randint(50, 300)
    return (
        f"A cylindrical rain-water tank has a radius of {radius} cm and a height of {height} cm. "
        "How many litres does it hold when full? Use 3.14 for pi."
    )


def _stats_temperatures(r: random.Random) -> str:
    values = ", ".join(str(r.randint(-5, 35)) for _ in range(7))
    return (
        f"The midday temperatures this week were {values} °C. What were the mean and the median temperature?"
    )


def _stats_next_score(r: random.Random) -> str:
    name, scores = r.choice(NAMES), [r.randint(55, 98) for _ in range(r.randint(3, 6))]
    # Averages the next score (0 to 100) can reach: never empty for these scores.
    target = r.choice([t for t in range(40, 100) if 0 <= t * (len(scores) + 1) - sum(scores) <= 100])
    listed = ", ".join(map(str, scores))
    return (
        f"{name}'s test scores so far are {listed}. What score on the next test would make "
        f"the average exactly {target}?"
    )


def _stats_ages(r: random.Random) -> str:
    ages = ", ".join(str(r.randint(6, 80)) for _ in range(r.randint(5, 9)))
    return f"The ages of the people in a hiking group are {ages}. Find the mean, the median and the range."


def _interest_simple(r: random.Random) -> str:
    principal, rate, years = 100 * r.randint(5, 200), r.choice((1.5, 2, 2.5, 3, 3.5, 4, 5)), r.randint(2, 15)
    return (
        f"You put {principal:,} dollars in an account paying {rate:g}% simple interest a year. "
        f"How much interest has it earned after {years} years, and what is the balance then?"
    )


def _interest_compound(r: random.Random) -> str:
    principal, rate, years = 500 * r.randint(1, 40), r.choice((2, 3, 4, 5, 6, 8)), r.randint(2, 10)
    often = r.choice(("once a year", "twice a year", "every quarter"))
    return (
        f"{principal:,} dollars are invested at {rate}% a year, with interest compounded "
        f"{often}. What is the balance after {years} years?"
    )


def _interest_compare(r: random.Random) -> str:
    principal, years = 1000 * r.randint(1, 20), r.randint(3, 20)
    simple, compound = r.choice((4, 5, 6, 7)), r.choice((3, 4, 5, 6))
    return (
        f"Which gives more after {years} years on {principal:,} dollars: {simple}% simple "
        f"interest a year, or {compound}% a year compounded annually? By how much?"
    )


def _sequence_arithmetic(r: random.Random) -> str:
    start, step, n = r.randint(-20, 50), r.choice([s for s in range(-9, 13) if s]), r.randint(8, 60)
    shown = ", ".join(str(start + i * step) for i in range(4))
    return (
        f"What is term number {n} of the sequence {shown}, ...? And what is the sum of its first {n} terms?"
    )


def _sequence_geometric(r: random.Random) -> str:
    start, ratio, n = r.randint(1, 9), r.choice((2, 3, -2, 5, 10)), r.randint(6, 12)
    shown = ", ".join(str(start * ratio**i) for i in range(4))
    return f"The sequence {shown}, ... goes on in the same way. What is term number {n}?"


def _sequence_savings(r: random.Random) -> str:
    name, first, more, weeks = r.choice(NAMES), r.randint(1, 20), r.randint(1, 10), r.randint(6, 52)
    return (
        f"{name} saves {first} dollars in the first week and each week after that {more} dollars "
        f"more than the week before. How much has {name} saved after {weeks} weeks?"
    )


def _sequence_next(r: random.Random) -> str:
    shift, start = r.randint(-5, 10), r.randint(1, 6)
    shown = ", ".join(str(i * i + shift) for i in range(start, start + 5))
    return f"Find the next two numbers in the sequence {shown}, ... and describe the rule."


def _prob_dice(r: random.Random) -> str:
    name, total = r.choice(NAMES), r.randint(2, 12)
    return f"{name} rolls two fair six-sided dice. What is the probability that the total is {total}?"


def _prob_coins(r: random.Random) -> str:
    name, tosses = r.choice(NAMES), r.randint(3, 12)
    heads = r.randint(0, tosses)
    return f"{name} tosses a fair coin {tosses} times. What is the probability of exactly {heads} heads?"


def _prob_marbles(r: random.Random) -> str:
    red, blue, green = r.randint(1, 12), r.randint(1, 12), r.randint(1, 12)
    colour = r.choice(("red", "blue", "green"))
    return (
        f"A bag holds {red} red, {blue} blue and {green} green marbles. Two are drawn without "
        f"putting the first back. What is the probability that both are {colour}?"
    )


def _prob_at_least_one(r: random.Random) -> str:
    name, rolls, face = r.choice(NAMES), r.randint(2, 10), r.randint(1, 6)
    return f"{name} rolls a fair die {rolls} times. What is the probability of rolling at least one {face}?"


MATH_FAMILIES: dict[str, tuple[Problem, ...]] = {
    "arithmetic": (_arith_packs, _arith_bakery, _arith_envelopes, _arith_change),
    "percentages": (_pct_discount, _pct_of_part, _pct_increase, _pct_score),
    "rates": (_rate_journey, _rate_round_trip, _rate_meeting, _rate_printer),
    "ratios": (_ratio_recipe, _ratio_share, _ratio_map, _ratio_marbles),
    "linear_equations": (_linear_simple, _linear_both_sides, _linear_riddle),
    "systems": (_system_pair, _system_cafe, _system_sum_difference, _system_farm),
    "units": (_units_miles, _units_cups, _units_time, _units_floor, _units_temperature),
    "geometry": (_geometry_garden, _geometry_circle, _geometry_box, _geometry_ladder, _geometry_tank),
    "statistics": (_stats_temperatures, _stats_next_score, _stats_ages),
    "interest": (_interest_simple, _interest_compound, _interest_compare),
    "sequences": (_sequence_arithmetic, _sequence_geometric, _sequence_savings, _sequence_next),
    "probability": (_prob_dice, _prob_coins, _prob_marbles, _prob_at_least_one),
}


def math_problem(family: str, seed: int) -> str:
    """The problem a row's provenance (family, seed) names."""
    rng = random.Random(seed)
    problem = rng.choice(MATH_FAMILIES[family])(rng)
    return f"{problem} {rng.choice(STEP_ASKS)}"


def math_candidates(seed: int) -> Iterator[Candidate]:
    """MATH_PER_FAMILY draws of every family, interleaved; held out by text hash."""
    for k in range(MATH_PER_FAMILY):
        for family in MATH_FAMILIES:
            row_seed = module_hash(f"{seed}/{family}/{k}") >> 32
            prompt = math_problem(family, row_seed)
            row = {"id": f"math-{family}-{k:04d}", "prompt": prompt, "source": "generator"}
            provenance = {"generator": f"{GENERATOR}.math", "family": family, "seed": row_seed}
            yield Candidate(held_out(normalised(prompt)), row | provenance)


# --- chat -------------------------------------------------------------------------------

# Activities are gerund phrases ("... tips for {s}"), topics noun phrases ("explain {s}").
ACTIVITY_TEMPLATES = (
    "What are five practical tips for {s}?",
    "I want to get started with {s}. What should I do in my first week?",
    "What mistakes do people often make when {s}, and how can I avoid them?",
    "Make a simple four-week plan to help me get better at {s}.",
    "A friend says {s} is a waste of time. Help me write a friendly reply explaining why I enjoy it.",
    "What do I really need to buy for {s}, and what can I skip?",
    "How can I fit {s} into a busy week with a full-time job?",
    "Give me a short checklist to go through before {s}.",
    "What are the pros and cons of {s}?",
    "Is {s} better done alone or with other people? Compare the two.",
    "How can I keep {s} cheap when money is tight?",
    "Write a short, encouraging message to a friend who is nervous about {s}.",
    "How can I tell whether I am making progress at {s}?",
    "What is a realistic goal for a beginner at {s} after three months?",
    "Explain to a ten-year-old why someone might enjoy {s}.",
    "What should someone starting in their sixties keep in mind about {s}?",
)
TOPIC_TEMPLATES = (
    "Explain {s} in simple terms.",
    "What are some common misconceptions about {s}?",
    "Give me three surprising facts about {s}.",
    "Write a short poem about {s}.",
    "How would you explain {s} to a curious eight-year-old?",
    "Write a one-paragraph piece about {s} for a school newsletter.",
    "What makes {s} worth knowing about in everyday life?",
    "Compare how people understood {s} a century ago with how it is understood today.",
    "Write three quiz questions about {s}, with their answers.",
    "What is still debated or not well understood about {s}?",
    "Suggest a short reading and viewing plan for someone who wants to learn about {s}.",
    "Describe {s} in exactly five sentences.",
    "Write the opening paragraph of a magazine article about {s}.",
    "What would be a good analogy for explaining {s}?",
    "List the key terms someone needs to understand {s}, with a one-line definition each.",
    "Turn {s} into an idea for a short children's story.",
)
GENERAL_TEMPLATES = (
    "Write a short, friendly email inviting a colleague to a lunchtime talk about {s}.",
    "Rewrite this message so it sounds polite and warm: 'I need your notes on {s} by "
    "tomorrow. Don't forget.'",
    "Rewrite this sentence in plain English: 'Engagement with {s} necessitates considerable "
    "preliminary deliberation on the part of the individual.'",
    "Suggest three catchy titles for a blog post about {s}.",
    "Write a haiku about {s}.",
    "Summarise in three bullet points what a beginner should know about {s}.",
    "Write a short dialogue between two friends talking about {s}.",
    "Plan a one-hour evening workshop for adults about {s}: give a timed agenda.",
    "What are good questions to ask an expert on {s}?",
    "Write a one-sentence tip about {s} that would fit on a postcard.",
)
ACTIVITIES = (
    # cooking
    "baking bread at home", "cooking meals for the week ahead", "making soup from leftovers",
    "cooking with spices", "grilling vegetables", "making fresh pasta", "fermenting vegetables",
    "brewing coffee at home", "packing healthy school lunches", "cooking for a big family gathering",
    # travel
    "travelling with only a carry-on bag", "planning a road trip", "travelling across Europe by train",
    "camping with young children", "visiting a big city on a small budget",
    "learning a few phrases before a trip abroad", "travelling alone for the first time",
    "hiking in the mountains", "travelling with a dog", "planning a weekend away",
    # health habits
    "walking every day", "stretching every morning", "drinking more water", "going to bed earlier",
    "cutting down on sugar", "starting to run", "swimming for fitness", "doing yoga at home",
    "taking breaks from screens", "cooking with less salt",
    # money
    "keeping a monthly budget", "saving for a holiday", "paying off a credit card",
    "shopping for groceries on a budget", "selling things you no longer need",
    "choosing a mobile phone plan", "saving for retirement", "splitting bills with flatmates",
    "tracking daily spending", "buying a used car",
    # work
    "preparing for a job interview", "running a short team meeting", "writing clear work emails",
    "asking for a pay rise", "working from home", "giving a presentation",
    "learning a new software tool", "mentoring a new colleague", "changing careers",
    "keeping a shared calendar in order",
    # hobbies
    "learning to play the guitar", "knitting a scarf", "starting a vegetable garden",
    "taking photos with a phone", "drawing with pencils", "learning chess", "building model trains",
    "birdwatching", "keeping a personal journal", "learning to juggle", "painting with watercolours",
    "doing jigsaw puzzles", "keeping houseplants alive", "learning a new language", "singing in a choir",
    # home
    "decluttering a small flat", "repainting a bedroom", "fixing a dripping tap",
    "composting kitchen scraps", "cleaning the kitchen quickly", "organising a garage",
    "reducing household energy use", "putting up shelves", "washing wool jumpers",
    "moving to a new house",
    # family and friends
    "hosting a dinner party", "planning a child's birthday party", "staying in touch with old friends",
    "teaching a child to ride a bike", "volunteering at a food bank", "meeting people in a new city",
    "writing thank-you notes", "caring for an elderly parent", "raising a puppy",
    "reading aloud to children",
    # outdoors
    "identifying trees on a walk", "stargazing without a telescope", "picking wild blackberries",
    "keeping bees", "feeding garden birds in winter", "cleaning up litter on a beach",
    # learning
    "studying for an exam", "reading more books", "learning to type faster",
    "memorising a poem", "taking notes in lectures", "learning basic first aid",
)  # fmt: skip
TOPICS = (
    # science
    "the water cycle", "photosynthesis", "how rainbows form", "the phases of the Moon",
    "static electricity", "the tides", "how vaccines work", "black holes", "the greenhouse effect",
    "plate tectonics", "how magnets work", "the human heart", "dreaming", "the immune system",
    "gravity", "the speed of light", "DNA", "volcanic eruptions", "earthquakes", "the seasons",
    "how aeroplanes stay in the air", "the periodic table", "gut bacteria", "how a fridge works",
    "the northern lights",
    # history
    "the printing press", "Roman roads", "the invention of the telephone", "the Silk Road",
    "the Great Fire of London", "the Egyptian pyramids", "the first Moon landing",
    "the history of chocolate", "the Industrial Revolution", "the Vikings", "the history of tea",
    "the invention of paper", "the building of the Panama Canal", "medieval castles",
    "the history of the bicycle", "the ancient Olympic Games", "the fall of the Berlin Wall",
    "the history of the calendar", "the Renaissance", "early photography",
    # nature
    "migrating birds", "coral reefs", "honeybees", "rainforests", "octopuses", "the life of a tree",
    "deserts at night", "wolves", "mushrooms in the forest", "whales", "rock pools", "earthworms",
    "sunflowers", "glaciers", "bats",
    # money and the economy
    "compound interest", "inflation", "how banks make money", "credit scores", "the stock market",
    "home insurance", "supply and demand", "income tax", "cryptocurrency", "the history of money",
    # health and the body
    "sleep cycles", "the benefits of walking", "vitamin D", "jet lag", "caffeine", "good posture",
    "hydration", "muscle soreness after exercise", "the common cold", "hearing and loud noise",
    # culture, arts and food
    "jazz", "haiku poetry", "the modern Olympic Games", "street food", "origami", "the orchestra",
    "board games", "opera", "sourdough starters", "spices from around the world", "cheese making",
    "bridge design", "comic books", "folk tales", "chess openings",
    # technology
    "the internet", "password safety", "satellite navigation", "solar panels", "electric cars",
    "3D printing", "plastic recycling", "wind turbines", "email spam", "smartphone batteries",
)  # fmt: skip
# Tone variants: each template and subject is asked in these few ways.
CHAT_VARIANTS = ("", " Please keep it short.", " Use plain, friendly language.")
# (template, whether it takes activities, whether it takes topics); indices are provenance.
CHAT_TEMPLATES = (
    tuple((t, True, False) for t in ACTIVITY_TEMPLATES)
    + tuple((t, False, True) for t in TOPIC_TEMPLATES)
    + tuple((t, True, True) for t in GENERAL_TEMPLATES)
)


def chat_candidates() -> Iterator[Candidate]:
    """Every fitting template x subject x variant; held out by subject."""
    subjects = [(s, True) for s in ACTIVITIES] + [(s, False) for s in TOPICS]
    for index, (template, activities, topics) in enumerate(CHAT_TEMPLATES):
        for subject, is_activity in subjects:
            if not (activities if is_activity else topics):
                continue
            held = held_out(subject, CHAT_HELDOUT_SHARE)
            for variant, tone in enumerate(CHAT_VARIANTS):
                row = {"id": f"chat-{index:02d}-{variant}-{_slug(subject)}", "source": "generator"}
                provenance = {"generator": f"{GENERATOR}.chat", "template": index, "variant": variant}
                prompt = template.format(s=subject) + tone
                yield Candidate(held, row | {"prompt": prompt} | provenance | {"subject": subject})


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.casefold()).strip("-")


# --- prose ------------------------------------------------------------------------------

PROSE_TASKS = (
    "Summarise this paragraph from the description of the Python package `{package}` in two sentences:",
    "Rewrite this paragraph from the `{package}` package's description so that a newcomer to "
    "programming can follow it:",
    "Give the three key points of this paragraph from the description of `{package}`:",
    "Suggest a short, descriptive title for this paragraph from the description of `{package}`:",
)
# The same tasks for a paragraph of the Python language reference (`pydoc_data.topics`).
REFERENCE_TASKS = (
    "Summarise this paragraph of the Python reference on `{topic}` in two sentences:",
    "Rewrite this paragraph of the Python reference on `{topic}` so that a newcomer to "
    "programming can follow it:",
    "Give the three key points of this paragraph of the Python reference on `{topic}`:",
    "Suggest a short, descriptive title for this paragraph of the Python reference on `{topic}`:",
)
MIN_PARAGRAPH, MAX_PARAGRAPH = 200, 1200
# Paragraph starts that are markup, not prose: headings, lists, tables, quotes, HTML,
# badges, reStructuredText directives and field lists.
MARKUP_STARTS = ("#", "|", "+-", "+=", ">", "<", "![", "[!", "..", "* ", "- ", "+ ", ":", "=", "{")
_LIST_ITEM = re.compile(r"\d+[.)]\s")
_UNDERLINE = re.compile(r"([=\-~^*#+`'\".:_])\1{2,}")
_INLINE = (
    (re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),  # Markdown link or image: its text
    (re.compile(r"`([^`<]*?)\s*<[^>]*>`__?"), r"\1"),  # reStructuredText link: its text
    (re.compile(r":[a-z:]+:`([^`]*)`"), r"\1"),  # reStructuredText role
    (re.compile(r"(\*\*|__|``|\*|`)(\S(?:.*?\S)?)\1"), r"\2"),  # emphasis and code spans
)


def prose_candidates() -> Iterator[Candidate]:
    """One prompt per prose paragraph of each installed distribution's description, then
    of each topic of the Python reference that the standard library ships for `help()`."""
    for name, version, text in distributions():
        held = held_out(_canonical(name), PROSE_HELDOUT_SHARE)
        for i, paragraph in enumerate(prose_paragraphs(text)):
            row_id = f"{_canonical(name)}#{i}"
            task = PROSE_TASKS[module_hash(row_id) % len(PROSE_TASKS)].format(package=name)
            row = {"id": row_id, "prompt": f"{task}\n\n{paragraph}", "source": "package"}
            yield Candidate(held, row | {"package": name, "version": version})
    yield from _reference_candidates()


def _reference_candidates() -> Iterator[Candidate]:
    """Held out by topic; rows name the package `python` and the topic."""
    from pydoc_data.topics import topics

    for topic in sorted(topics):
        held = held_out(f"pydoc_data.topics:{topic}", PROSE_HELDOUT_SHARE)
        for i, paragraph in enumerate(prose_paragraphs(topics[topic], markup=False)):
            row_id = f"python-reference:{topic}#{i}"
            task = REFERENCE_TASKS[module_hash(row_id) % len(REFERENCE_TASKS)].format(topic=topic)
            row = {"id": row_id, "prompt": f"{task}\n\n{paragraph}", "source": "package"}
            provenance = {"package": "python", "version": platform.python_version(), "topic": topic}
            yield Candidate(held, row | provenance)


def distributions() -> list[tuple[str, str, str]]:
    """(name, version, description) of each installed distribution, sorted by name; the
    first of several copies on the path is the one Python imports."""
    found: dict[str, tuple[str, str, str]] = {}
    for dist in importlib.metadata.distributions():
        meta = dist.metadata
        name = meta["Name"]
        if name and _canonical(name) not in found:
            # The body of newer metadata, or the older header (importlib dedents it).
            text = meta["Description"] or ""
            found[_canonical(name)] = (name, meta["Version"] or "unknown", text)
    return [found[key] for key in sorted(found)]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).casefold()


def prose_paragraphs(text: str, markup: bool = True) -> Iterator[str]:
    """Plain-prose paragraphs of a Markdown or reStructuredText description, unwrapped,
    inline markup reduced to its text (with `markup`; plain text keeps `__debug__` whole);
    code, tables, lists and headings are skipped."""
    for block in _blocks(text):
        paragraph = _as_prose(block, markup)
        if paragraph is not None:
            yield paragraph


def _blocks(text: str) -> Iterator[list[str]]:
    """Blank-line separated blocks outside fenced code."""
    block: list[str] = []
    fenced = False
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith(("```", "~~~")):
            fenced, block = not fenced, []
        elif not fenced and line.strip():
            block.append(line)
        elif block:
            yield block
            block = []


def _as_prose(block: list[str], markup: bool) -> str | None:
    if any(line[:1].isspace() or _UNDERLINE.fullmatch(line.strip()) for line in block):
        return None  # indented code or quotes, or a heading with its underline
    first = block[0].lstrip()
    if first.startswith(MARKUP_STARTS) or _LIST_ITEM.match(first):
        return None
    text = " ".join(line.strip() for line in block)
    for pattern, replacement in _INLINE if markup else ():
        text = pattern.sub(replacement, text)
    return text if _plain(text) else None


def _plain(text: str) -> bool:
    if not MIN_PARAGRAPH <= len(text) <= MAX_PARAGRAPH or not text.endswith((".", "!", "?", '."', ".)")):
        return False
    if "://" in text or "::" in text or any(mark in text for mark in "|<>{}[]`*\\"):
        return False  # leftover markup or links: not the plain prose this style is for
    letters = [c for c in text if c.isalpha()]
    if len(letters) < 0.75 * len(text.replace(" ", "")):
        return False
    return sum(c.isupper() for c in letters) < 0.3 * len(letters)  # licence shouting


# --- building ---------------------------------------------------------------------------


# The provenance field whose values a selection is spread over.
SPREAD_BY = {"code": "module", "math": "family", "chat": "subject", "prose": "package"}


def candidates(style: str, packages: list[str], seed: int) -> Iterator[Candidate]:
    if style == "code":
        return code_candidates(packages)
    if style == "math":
        return math_candidates(seed)
    if style == "chat":
        return chat_candidates()
    if style == "prose":
        return prose_candidates()
    raise PromptSourceError(f"unknown style {style!r}: one of {', '.join(STYLES)}")


def split(rows: Iterable[Candidate], max_chars: int | None = None) -> tuple[list[dict], list[dict]]:
    """Training and held-out rows; a repeated id or normalised text is dropped, so no
    text is in both. Prompts longer than `max_chars` are left out."""
    seen: set[str] = set()
    train: list[dict] = []
    heldout: list[dict] = []
    for candidate in rows:
        row = candidate.row
        if max_chars is not None and len(row["prompt"]) > max_chars:
            continue
        keys = (f"id:{row['id']}", normalised(row["prompt"]))
        if any(key in seen for key in keys):
            continue
        seen.update(keys)
        (heldout if candidate.held else train).append(row)
    return train, heldout


def spread(rows: list[dict], count: int, seed: int, group: str) -> list[dict]:
    """`count` rows taken round-robin over the values of field `group`, each group's rows
    and the groups in each round in a seeded hash order of the ids: a small set spans as
    many groups as it has rows."""
    ranked = sorted(rows, key=lambda row: module_hash(f"{seed}:{row['id']}"))
    before: Counter = Counter()  # rows of each group ahead in the hash order
    rounds = []
    for row in ranked:
        rounds.append(before[row[group]])
        before[row[group]] += 1
    order = sorted(range(len(ranked)), key=rounds.__getitem__)  # stable: hash order within a round
    return [ranked[i] for i in order[:count]]


@dataclass(frozen=True)
class StyleSet:
    style: str
    train: list[dict]
    heldout: list[dict]
    available: tuple[int, int]  # training and held-out rows before the counts were applied


def style_set(
    style: str,
    *,
    packages: list[str],
    train_count: int,
    heldout_count: int,
    seed: int = 0,
    max_prompt_chars: int | None = None,
) -> StyleSet:
    """One style's rows; refuses fewer held-out rows than `heldout_count`."""
    train, heldout = split(candidates(style, packages, seed), max_prompt_chars)
    if len(heldout) < heldout_count:
        cap = f" of at most {max_prompt_chars} characters" if max_prompt_chars is not None else ""
        raise PromptSourceError(
            f"style {style}: only {len(heldout)} held-out prompts{cap} (and {len(train)} training); "
            f"asked for {heldout_count}"
        )
    group = SPREAD_BY[style]
    chosen = (spread(train, train_count, seed, group), spread(heldout, heldout_count, seed, group))
    return StyleSet(style, *chosen, available=(len(train), len(heldout)))


def build(out_dir: Path, styles: Iterable[str], **options) -> list[StyleSet]:
    """Write `{style}-train.jsonl` and `{style}-heldout.jsonl` for each style; every
    style is built before any file is written, so a refusal writes nothing."""
    sets: list[StyleSet] = []
    refusals: list[str] = []
    for style in dict.fromkeys(styles):
        try:
            sets.append(style_set(style, **options))
        except PromptSourceError as exc:
            refusals.append(str(exc))  # go on: one run names every style short of rows
    if refusals:
        raise PromptSourceError("\n".join(refusals))
    for built in sets:
        atomic.write_jsonl(out_dir / f"{built.style}-train.jsonl", built.train)
        atomic.write_jsonl(out_dir / f"{built.style}-heldout.jsonl", built.heldout)
    return sets


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="draftsmith promptgen styles",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--style", action="append", choices=STYLES, help="default: every style")
    parser.add_argument("--package", action="append", default=[], help="an installed package for `code`")
    parser.add_argument("--train-count", type=_count, default=10_000, help="at most this many per style")
    parser.add_argument("--heldout-count", type=_count, default=32, help="exactly this many per style")
    parser.add_argument("--seed", type=int, default=0, help="math numbers and the order rows are taken in")
    parser.add_argument("--max-prompt-chars", type=_count, default=None, help="leave out longer prompts")
    args = parser.parse_args(argv)
    try:
        sets = build(
            args.out_dir,
            args.style or STYLES,
            packages=args.package,
            train_count=args.train_count,
            heldout_count=args.heldout_count,
            seed=args.seed,
            max_prompt_chars=args.max_prompt_chars,
        )
    except PromptSourceError as exc:
        print(f"draftsmith: {exc}", file=sys.stderr)
        return 1
    for built in sets:
        train, heldout = built.available
        print(
            f"{built.style}: {len(built.train)} training (of {train}) and {len(built.heldout)} "
            f"held-out (of {heldout}) prompts in {args.out_dir}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
