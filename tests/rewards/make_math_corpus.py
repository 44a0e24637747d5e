#!/usr/bin/env python3
"""Writes tests/rewards/math_corpus.jsonl: (response, label, expected) pairs for the math reward.

`expected` is rlhf's intended score (rewards/math_verifier.h). Deterministic: a fixed seed and
fixed templates, so the file only changes when this script does. Keeps the "math_verify"
column of an existing corpus for ids it still has (math_verify_reference.py fills it in), and
sets each row's "disagreement_reason" from DISAGREEMENTS below.

    python3 tests/rewards/make_math_corpus.py
    $(scripts/python-env) tests/rewards/math_verify_reference.py
"""

import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "math_corpus.jsonl")

# Why rlhf's math_score and math-verify (0.9.0) differ on a row, by id. A row listed here that
# no longer differs, or a differing row missing here, fails MathVerifier.AgreesWithMathVerify.
_SET_OF_BOXES = ("math-verify reads several \\boxed{} in one response as the set of them; we take "
                 "the last box")
_UNICODE_MINUS = "math-verify finds no answer in plain text with a unicode minus (U+2212)"
_UNIT_LABEL = ("math-verify reads the label's unit words in math mode as symbols (a product); we "
               "drop words after a number")
DISAGREEMENTS = {
    **{f"boxed_last-{i:02d}": _SET_OF_BOXES for i in range(0, 16, 2)},
    **{f"negative-{i:02d}": _UNICODE_MINUS for i in range(1, 30, 3)},
    **{f"units-{i:02d}": _UNIT_LABEL for i in (11, 14, 20)},
    "boxed_nested-30": "math-verify keeps \\text{{12}} as a string; we unwrap \\text and braces",
    "fraction-15": ("math-verify reads the full stop after 5/11 as a decimal point (5/11.0), "
                    "and that float misses 5/11 in its comparison"),
    "decimal-25": "math-verify evaluates 0.1 + 0.2; we do no arithmetic on a non-number answer",
    "expression-16": "math-verify extracts nothing from \\text{Paris}; we compare text answers",
    "expression-18": "math-verify proves 1+x = x+1 symbolically; we compare expressions as text",
    "expression-19": "math-verify simplifies 2\\sqrt{2} = \\sqrt{8}; we compare them as text",
    "tolerance-02": ("math-verify rounds numbers to 6 decimals before comparing, so 1000000.5 "
                     "is not 1000000; our tolerance is relative (1e-6)"),
}


def rows():
    rng = random.Random(27)
    out = []

    def add(category, response, label, expected):
        index = sum(1 for row in out if row["category"] == category)
        out.append({"id": f"{category}-{index:02d}", "category": category, "response": response,
                    "label": label, "expected": expected})

    def wrong(n):
        return n + rng.choice([-3, -2, -1, 1, 2, 5, 10])

    # \boxed integers, right and wrong, with the reasoning's numbers before them.
    for _ in range(16):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        n = a * b
        add("boxed_int", f"We multiply {a} by {b}: {a} \\times {b} = {n}. So the answer is "
            f"$\\boxed{{{n}}}$.", str(n), 1)
        add("boxed_int", f"{a} \\cdot {b} gives \\boxed{{{wrong(n)}}}", str(n), 0)

    # Nested braces inside the box.
    for _ in range(10):
        p, q = rng.randint(1, 9), rng.randint(10, 19)
        add("boxed_nested", f"Simplifying, $\\boxed{{\\frac{{{p}}}{{{q}}}}}$.",
            f"\\frac{{{p}}}{{{q}}}", 1)
        add("boxed_nested", f"Therefore \\boxed{{\\dfrac{{{p}}}{{{q}}}}}", f"{p}/{q}", 1)
        add("boxed_nested", f"\\boxed{{\\frac{{{p}}}{{{q}}}}}", f"\\frac{{{p + 1}}}{{{q}}}", 0)
    add("boxed_nested", "\\boxed{\\text{{12}}}", "12", 1)
    add("boxed_nested", "\\boxed{{{7}}}", "7", 1)

    # Several boxes: the last one counts.
    for _ in range(8):
        first, last = rng.randint(1, 50), rng.randint(51, 99)
        add("boxed_last", f"At first I got \\boxed{{{first}}} but rechecking, \\boxed{{{last}}}.",
            str(last), 1)
        add("boxed_last", f"At first I got \\boxed{{{first}}} but rechecking, \\boxed{{{last}}}.",
            str(first), 0)

    # GSM8K: "#### N" in the response and in the label's answer field.
    for _ in range(14):
        a, b = rng.randint(10, 60), rng.randint(2, 9)
        n = a * b
        label = f"She buys {b} boxes of {a}: {b}*{a} = <<{b}*{a}={n}>>{n}.\n#### {n}"
        add("gsm8k", f"Each box has {a} and there are {b} boxes, so {a} * {b} = {n}.\n#### {n}",
            label, 1)
        add("gsm8k", f"{a} + {b} = {a + b}.\n#### {a + b}", label, 0)
    # The label's answer with thousands separators.
    add("gsm8k", "Total: 1200 + 34 = 1234\n#### 1234", "1,200 + 34 = 1,234\n#### 1,234", 1)

    # "The answer is ..." / "Answer: ...", any case, the last one.
    phrases = ["The answer is {x}.", "Therefore, the answer is ${x}$.", "Answer: {x}",
               "So the final answer is {x}.", "THE ANSWER IS {x}", "answer: {x} \n"]
    for phrase in phrases:
        for _ in range(3):
            n = rng.randint(-50, 500)
            add("answer_is", f"We add 3 and 4 to get 7, then {phrase.format(x=n)}", str(n), 1)
            add("answer_is", f"Adding 12 to it, {phrase.format(x=wrong(n))}", str(n), 0)
    add("answer_is", "The answer is 12. Wait, no: the answer is 14. Double-check with 3.", "14", 1)
    add("answer_is", "The answer is approximately 3.14, give or take 0.01.", "3.14", 1)
    add("answer_is", "The answer is clearly 9, since 3 squared is 9. Also 4.", "9", 1)

    # The last number of a chatty response.
    for _ in range(16):
        a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 9)
        n = (a + b) * c
        text = (f"Tom has {a} apples and Ann has {b}. Together that is {a + b}. Each apple costs "
                f"{c} dollars, so they pay {n} dollars in total.")
        add("last_number", text, str(n), 1)
        add("last_number", text, str(a + b), 0)

    # Fractions, written plainly and in LaTeX, with equivalent values.
    for _ in range(10):
        p, q = rng.randint(1, 7), rng.randint(8, 15)
        k = rng.randint(2, 4)
        add("fraction", f"The probability is {p}/{q}.", f"\\frac{{{p}}}{{{q}}}", 1)
        add("fraction", f"The probability is $\\frac{{{p * k}}}{{{q * k}}}$.", f"{p}/{q}", 1)
        add("fraction", f"The probability is {p}/{q}.", f"{p}/{q + 1}", 0)
    for p, q in [(1, 2), (1, 4), (3, 4), (1, 8), (5, 8), (2, 5)]:
        add("fraction", f"\\boxed{{\\tfrac{{{p}}}{{{q}}}}}", str(p / q), 1)
        add("fraction", f"It is {p / q}.", f"\\dfrac{{{p}}}{{{q}}}", 1)

    # Percentages: 50% compares as 50.
    for _ in range(10):
        n = rng.randint(5, 95)
        add("percent", f"The discount is {n}%.", str(n), 1)
        add("percent", f"So the increase is \\boxed{{{n}\\%}}", f"{n}\\%", 1)
        add("percent", f"The rate is {n}%.", str(n + 1), 0)

    # Money.
    for _ in range(10):
        dollars, cents = rng.randint(1, 5000), rng.choice([0, 25, 50, 99])
        value = dollars + cents / 100
        shown = f"{dollars:,}.{cents:02d}"
        add("money", f"She pays ${shown} in total.", f"{value:g}" if cents else str(dollars), 1)
        add("money", f"The total cost is \\boxed{{\\$ {dollars}}}.", str(dollars), 1)
        add("money", f"He earns ${dollars + 1} per week.", str(dollars), 0)

    # Units after the number.
    units = ["apples", "cm", "meters", "km/h", "dollars", "hours", "m^2", "kg", "students",
             "minutes"]
    for unit in units:
        n = rng.randint(2, 300)
        add("units", f"The answer is {n} {unit}.", str(n), 1)
        add("units", f"Hence \\boxed{{{n}\\text{{ {unit}}}}}", str(n), 1)
        add("units", f"It measures {n} {unit}", f"{n} {unit}", 1)
    add("units", "The angle is \\boxed{90^\\circ}.", "90", 1)
    add("units", "The angle is 45°.", "45", 1)

    # Negative numbers, with ASCII and unicode minus.
    for _ in range(10):
        n = -rng.randint(1, 99)
        add("negative", f"The temperature drops to \\boxed{{{n}}}.", str(n), 1)
        add("negative", f"x = \u2212{-n}", str(n), 1)
        add("negative", f"The result is {-n}.", str(n), 0)

    # Thousands separators.
    for _ in range(10):
        n = rng.randint(1000, 9999999)
        add("thousands", f"The population is {n:,}.", str(n), 1)
        add("thousands", f"\\boxed{{{n}}}", f"{n:,}", 1)
        add("thousands", f"The population is {n:,}.", f"{n + 1000:,}", 0)

    # Decimals and integers that are the same number.
    for _ in range(8):
        n = rng.randint(1, 200)
        add("decimal", f"\\boxed{{{n}.0}}", str(n), 1)
        add("decimal", f"The mean is {n}.50", f"{n}.5", 1)
        add("decimal", f"The mean is {n}.25", f"{n}.2", 0)
    add("decimal", "The answer is .5", "0.5", 1)
    add("decimal", "\\boxed{0.1 + 0.2}", "0.3", 0)

    # Responses with no answer.
    for text in ["I'm not sure how to solve this.", "Let me think about it step by step.",
                 "The problem has no solution.", "", "   \n  ", "\\boxed{}",
                 "The answer is .", "We cannot determine it."]:
        add("no_answer", text, "5", 0)

    # Variables, assignments and expressions (compared as text).
    for _ in range(6):
        n = rng.randint(1, 30)
        add("expression", f"Solving gives $x = {n}$.", str(n), 1)
        add("expression", f"The answer is $y={n}$.", f"y = {n}", 1)
    add("expression", "\\boxed{x+1}", "x + 1", 1)
    add("expression", "\\boxed{\\sqrt{2}}", "\\sqrt{2}", 1)
    add("expression", "\\boxed{\\pi}", "\\pi", 1)
    add("expression", "\\boxed{\\left(1, 2\\right)}", "(1,2)", 1)
    add("expression", "The answer is \\text{Paris}.", "Paris", 1)
    add("expression", "\\boxed{2x+1}", "x + 1", 0)
    add("expression", "\\boxed{1+x}", "x+1", 0)
    add("expression", "\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 0)
    add("expression", "\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1)

    # Mixed numbers.
    add("mixed", "\\boxed{1\\frac{1}{2}}", "1.5", 1)
    add("mixed", "\\boxed{2\\frac{3}{4}}", "11/4", 1)
    add("mixed", "She ran 3 1/2 miles.", "3.5", 0)  # the last number is 1/2

    # Tolerance: relative 1e-6.
    add("tolerance", "\\boxed{0.3333333}", "1/3", 1)
    add("tolerance", "\\boxed{0.333}", "1/3", 0)
    add("tolerance", "\\boxed{1000000.5}", "1000000", 1)
    add("tolerance", "\\boxed{3.14159}", "3.14", 0)

    return out


def main():
    verdicts = {}
    if os.path.exists(CORPUS):
        with open(CORPUS, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    if "math_verify" in row:
                        verdicts[row["id"], row["response"], row["label"]] = row["math_verify"]
    corpus = rows()
    with open(CORPUS, "w", encoding="utf-8") as f:
        for row in corpus:
            key = (row["id"], row["response"], row["label"])
            if key in verdicts:
                row["math_verify"] = verdicts[key]
            if row["id"] in DISAGREEMENTS:
                row["disagreement_reason"] = DISAGREEMENTS[row["id"]]
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(corpus)} rows to {CORPUS}")


if __name__ == "__main__":
    main()
