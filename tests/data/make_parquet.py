"""Writes the Parquet files tests/data/parquet_reader_test.cpp reads, with pyarrow (what
Hugging Face `datasets` and veRL's preprocessing use). Usage: make_parquet.py OUT_DIR

prompts.parquet    5 rows in 3 row groups (2 + 2 + 1): the column kinds prompt datasets have,
                   nulls at every level, veRL GSM8K's `prompt` messages and `reward_model`.
many.parquet       100000 rows (id = row index) in 4 row groups: more than one Arrow batch.
binary.parquet     an `image` binary column (unsupported: JSON has no bytes).
nested_date.parquet  a struct column holding a date32 field (unsupported, nested).
empty.parquet      the prompts schema with no rows.
"""
import pathlib
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def prompts_table():
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    reward_model = pa.struct([("ground_truth", pa.string()), ("style", pa.string())])
    columns = {
        "prompt": pa.array(["What is 6*7?", "Say hi", None, "日本語で \"quoted\"\n", ""]),
        "label": pa.array(["42", "hi", "x", None, ""]),
        "label_id": pa.array([1, -2, None, 2**40, 0], pa.int64()),
        "small": pa.array([-128, 127, 0, None, 5], pa.int8()),
        "big_unsigned": pa.array([2**64 - 1, 0, 1, 2, None], pa.uint64()),
        "score": pa.array([0.25, -1e300, None, 3.0, 0.0], pa.float64()),
        "weight": pa.array([0.1, 1.5, 2.0, None, -0.5], pa.float32()),
        "accepted": pa.array([True, False, None, True, False]),
        "messages": pa.array(
            [
                [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "6*7?"}],
                [{"role": "user", "content": "hi"}],
                None,
                [],
                [{"role": "assistant", "content": None}, None],
            ],
            pa.list_(message)),
        "reward_model": pa.array(
            [
                {"ground_truth": "42", "style": "rule"},
                {"ground_truth": "hi", "style": None},
                None,
                {"ground_truth": "", "style": "model"},
                {"ground_truth": "7", "style": "rule"},
            ],
            reward_model),
        "token_ids": pa.array([[1, 2, 3], [], None, [7, None], [2**31 - 1]], pa.list_(pa.int32())),
        "data_source": pa.array(["gsm8k", "gsm8k", "math", "gsm8k", None]).dictionary_encode(),
        "tags": pa.array(
            [[("a", 1), ("b", 2)], [], None, [("z", None)], [("k", -1)]],
            pa.map_(pa.string(), pa.int64())),
        "long_text": pa.array(["long", None, "x", "y", "z"], pa.large_string()),
        "nothing": pa.array([None] * 5, pa.null()),
    }
    return pa.table(columns)


def write(table, path, row_group_size, row_groups):
    pq.write_table(table, path, row_group_size=row_group_size)
    # The test relies on these files spanning row groups: check it here, where it is known.
    got = pq.ParquetFile(path).metadata.num_row_groups
    assert got == row_groups, f"{path}: {got} row groups, wanted {row_groups}"


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    prompts = prompts_table()
    write(prompts, out / "prompts.parquet", row_group_size=2, row_groups=3)
    write(prompts.slice(0, 0), out / "empty.parquet", row_group_size=2, row_groups=1)
    n = 100_000
    many = pa.table({"id": pa.array(range(n), pa.int64()),
                     "text": pa.array([f"row {i}" for i in range(n)])})
    write(many, out / "many.parquet", row_group_size=30_000, row_groups=4)
    binary = pa.table({"prompt": ["a"], "image": pa.array([b"\x89PNG"], pa.binary())})
    write(binary, out / "binary.parquet", row_group_size=10, row_groups=1)
    nested = pa.table({"prompt": ["a"],
                       "meta": pa.array([{"id": 1, "created": 19000}],
                                        pa.struct([("id", pa.int64()), ("created", pa.date32())]))})
    write(nested, out / "nested_date.parquet", row_group_size=10, row_groups=1)


if __name__ == "__main__":
    main()
