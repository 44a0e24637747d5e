#!/usr/bin/env python3
"""Scores tests/rewards/math_corpus.jsonl with Hugging Face's math-verify (the reference) and
writes its verdicts back as the "math_verify" column (1/0), so the C++ test needs no Python.

Run with the project's Python (math-verify is pinned in scripts/python-requirements.txt):

    $(scripts/python-env) tests/rewards/math_verify_reference.py

A bare label (no $, \\boxed or ####) is the answer itself, so it is parsed wrapped in $...$
(math-verify would otherwise read "x + 1" as its last number, 1), bare when that finds nothing;
other labels and every response are parsed as given. Prints the rows
where math-verify and the corpus's "expected" column differ without a stated
"disagreement_reason" (to be explained in make_math_corpus.py's DISAGREEMENTS), and the
stated reasons that no longer hold.
"""

import json
import os

from math_verify import parse, verify

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "math_corpus.jsonl")


def reference_score(response, label):
    marked = "$" in label or "\\boxed" in label or "####" in label
    gold = [] if marked else parse(f"${label}$")
    if not gold:
        gold = parse(label)
    answer = parse(response)
    return 1 if gold and answer and verify(gold, answer) else 0


def main():
    with open(CORPUS, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    unexplained, stale = [], []
    for row in rows:
        row["math_verify"] = reference_score(row["response"], row["label"])
        differs = row["math_verify"] != row["expected"]
        reason = row.get("disagreement_reason", "")
        if differs and not reason:
            unexplained.append(row)
        if reason and not differs:
            stale.append(row)
    with open(CORPUS, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    agree = sum(1 for row in rows if row["math_verify"] == row["expected"])
    print(f"math-verify agrees with expected on {agree}/{len(rows)} rows")
    for row in unexplained:
        print(f"unexplained: {row['id']}: expected {row['expected']}, math-verify "
              f"{row['math_verify']}: {row['response']!r} vs {row['label']!r}")
    for row in stale:
        print(f"stale reason: {row['id']}: {row['disagreement_reason']}")


if __name__ == "__main__":
    main()
