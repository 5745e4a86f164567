"""The `math` style: step-by-step word problems from project-written families, numbers
drawn from a seeded generator (`math_problem(family, seed)` rebuilds a row); held out by a
hash of the normalised text."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from draftsmith.promptgen.docstrings import held_out, module_hash, normalised
from draftsmith.promptgen.styles.common import GENERATOR, Candidate

MATH_PER_FAMILY = 1000  # draws per family; repeats are dropped
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
