"""Datasets: the loader's errors and round trip, and the countdown, gsm8k and conciseness
generators."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.data import DatasetError, Example, load_dataset, write_dataset
from engine.data import conciseness as conciseness_data
from engine.data import countdown as countdown_data
from engine.data import gsm8k as gsm8k_data
from engine.rewards import conciseness, countdown, gsm8k

USER = [{"role": "user", "content": "Solve: 1 + 1 ="}]


def write_table(path: Path, columns: dict) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


# --- load_dataset errors -----------------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "nope.parquet"
    with pytest.raises(DatasetError, match=re.escape(f"{path}: file not found")):
        load_dataset(path)


def test_not_parquet(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_text('{"prompt": "hello"}\n')
    with pytest.raises(DatasetError, match=re.escape(f"{path}: not a readable parquet file")):
        load_dataset(path)


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(DatasetError, match="is a folder"):
        load_dataset(tmp_path)


def test_missing_column(tmp_path):
    path = write_table(tmp_path / "d.parquet", {"prompt": [USER]})
    with pytest.raises(DatasetError) as excinfo:
        load_dataset(path)
    message = str(excinfo.value)
    assert str(path) in message
    assert "missing column 'reward_func_args'" in message
    assert "found: prompt" in message


def test_empty_dataset(tmp_path):
    path = write_dataset([Example(USER, {"target": "2"})], tmp_path / "d.parquet")
    pq.write_table(pq.read_table(path).slice(0, 0), path)
    with pytest.raises(DatasetError, match=re.escape(f"{path}: the dataset is empty")):
        load_dataset(path)


@pytest.mark.parametrize(
    ("bad_prompt", "problem"),
    [
        ([], "must be a non-empty list of chat messages"),
        ([{"role": "robot", "content": "hi"}], "message 0 has role 'robot'"),
        ([{"role": "user"}], "message 0 content must be a string"),
        # Rows 0 and 1 then read back with name=None, which is accepted.
        ([{"role": "user", "content": "hi", "name": "bob"}], "message 0 has keys ['name']"),
        (
            [{"role": "system", "content": "s"}, {"role": "user", "content": None}],
            "message 1 content must be a string",
        ),
    ],
)
def test_wrong_prompt_names_file_row_and_column(tmp_path, bad_prompt, problem):
    # Rows 0 and 1 are fine; row 2 is not.
    table = pa.table({"prompt": [USER, USER, bad_prompt], "reward_func_args": ["{}"] * 3})
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    with pytest.raises(DatasetError) as excinfo:
        load_dataset(path)
    assert f"{path}: row 2, column 'prompt': " in str(excinfo.value)
    assert problem in str(excinfo.value)


@pytest.mark.parametrize(
    ("column", "problem"),
    [
        (pa.array([1, 2]), "must be a dict"),
        (pa.array([[1, 2], [3]]), "must be a dict"),
        (pa.array(['{"target": 2}', "not json"]), "row 1, column 'reward_func_args': a string"),
        (pa.array(['{"target": 2}', "[1, 2]"]), "row 1, column 'reward_func_args': must be a dict"),
        (pa.array(['{"target": 2}', None]), "row 1, column 'reward_func_args': must be a dict"),
    ],
)
def test_wrong_reward_func_args_names_file_row_and_column(tmp_path, column, problem):
    path = write_table(tmp_path / "d.parquet", {"prompt": [USER, USER], "reward_func_args": column})
    with pytest.raises(DatasetError) as excinfo:
        load_dataset(path)
    assert str(path) in str(excinfo.value)
    assert "column 'reward_func_args'" in str(excinfo.value)
    assert problem in str(excinfo.value)


# --- round trips and other writers' representations ---------------------------------------


def test_round_trip_keeps_heterogeneous_arguments_exactly(tmp_path):
    examples = [
        Example(
            prompt=[{"role": "system", "content": "Be brief."}, *USER],
            reward_func_args={"target": 5, "numbers": [1, 2, 2]},
            metadata={"solution": "1 + 2 + 2"},
        ),
        Example(prompt=USER, reward_func_args={"ground_truth": "7"}),
        Example(
            prompt=[*USER, {"role": "assistant", "content": "2"}, *USER],
            reward_func_args={"x": 1.5, "n": 2, "nested": {"a": [1, 2]}, "none": None, "é": "ü"},
        ),
    ]
    path = write_dataset(examples, tmp_path / "sub" / "d.parquet")
    assert path == tmp_path / "sub" / "d.parquet"
    loaded = load_dataset(path)
    assert loaded == examples
    # int stays int and float stays float, which a struct column would not guarantee.
    assert type(loaded[2].reward_func_args["n"]) is int
    assert type(loaded[2].reward_func_args["x"]) is float
    assert [p.name for p in path.parent.iterdir()] == ["d.parquet"]  # no partial file left


def test_loads_struct_columns_as_hugging_face_writes_them(tmp_path):
    # The reference's files: prompt list<struct>, reward_func_args struct.
    df = pd.DataFrame(
        {
            "prompt": [USER, USER],
            "reward_func_args": [
                {"target": 8, "numbers": [5, 3]},
                {"target": 2, "numbers": [1, 1]},
            ],
        }
    )
    path = tmp_path / "d.parquet"
    df.to_parquet(path)
    assert pa.types.is_struct(pq.read_schema(path).field("reward_func_args").type)
    assert load_dataset(path) == [
        Example(USER, {"target": 8, "numbers": [5, 3]}),
        Example(USER, {"target": 2, "numbers": [1, 1]}),
    ]


def test_struct_union_nulls_mean_absent_keys(tmp_path):
    path = write_table(
        tmp_path / "d.parquet",
        {"prompt": [USER, USER], "reward_func_args": [{"target": "2"}, {"ground_truth": "7"}]},
    )
    assert [e.reward_func_args for e in load_dataset(path)] == [
        {"target": "2"},
        {"ground_truth": "7"},
    ]


def test_loads_a_map_column(tmp_path):
    args = pa.array([[("target", "2")]], type=pa.map_(pa.string(), pa.string()))
    path = write_table(tmp_path / "d.parquet", {"prompt": [USER], "reward_func_args": args})
    assert load_dataset(path) == [Example(USER, {"target": "2"})]


def test_writes_records_from_pandas_with_numpy_inside(tmp_path):
    # pandas reads list columns back as NumPy arrays, also inside dicts.
    source = tmp_path / "source.parquet"
    pd.DataFrame(
        {"prompt": [USER], "reward_func_args": [{"target": 8, "numbers": [5, 3]}]}
    ).to_parquet(source)
    records = pd.read_parquet(source).to_dict("records")
    assert type(records[0]["reward_func_args"]["numbers"]).__module__ == "numpy"
    path = write_dataset(records, tmp_path / "d.parquet")
    assert load_dataset(path) == [Example(USER, {"target": 8, "numbers": [5, 3]})]


def test_write_errors_name_the_row_and_column(tmp_path):
    path = tmp_path / "d.parquet"
    good = Example(USER, {"target": "2"})
    with pytest.raises(DatasetError, match=r"row 1, column 'reward_func_args': cannot be stored"):
        write_dataset([good, Example(USER, {"target": {1, 2}})], path)
    with pytest.raises(DatasetError, match=r"row 1, column 'prompt': message 0 has role"):
        write_dataset([good, Example([{"role": "bot", "content": "x"}], {})], path)
    with pytest.raises(DatasetError, match=r"row 0 has no 'reward_func_args'"):
        write_dataset([{"prompt": USER}], path)
    with pytest.raises(DatasetError, match="no examples to write"):
        write_dataset([], path)
    assert not path.exists()


# --- countdown ---------------------------------------------------------------------------


def puzzle_key(example: Example) -> tuple:
    args = example.reward_func_args
    return tuple(sorted(args["numbers"])), args["target"]


def test_countdown_is_seeded():
    first = countdown_data.generate_splits(3, n_train=300, n_test=50, seed=7)
    again = countdown_data.generate_splits(3, n_train=300, n_test=50, seed=7)
    other = countdown_data.generate_splits(3, n_train=300, n_test=50, seed=8)
    assert first == again
    assert first != other


@pytest.mark.parametrize("n_given_numbers", [3, 4])
def test_countdown_defaults_write_solvable_disjoint_splits(tmp_path, n_given_numbers):
    result = countdown_data.generate_countdown(n_given_numbers, tmp_path)
    assert result.paths == [tmp_path / "train.parquet", tmp_path / "test.parquet"]
    assert result.summary == (
        f"countdown with {n_given_numbers} numbers (seed 42): 8192 train and 1024 test "
        f"puzzles in {tmp_path}"
    )
    train, test = (load_dataset(p) for p in result.paths)
    assert (len(train), len(test)) == (8192, 1024)

    keys = [puzzle_key(e) for e in train + test]
    assert len(set(keys)) == len(keys)  # unique within and across the splits

    for example in train + test:
        args = example.reward_func_args
        assert len(args["numbers"]) == n_given_numbers
        assert all(1 <= n <= 99 for n in args["numbers"])
        assert type(args["target"]) is int and 1 <= args["target"] <= 999
        completion = f"<think>x</think><answer>{example.metadata['solution']}</answer>"
        assert countdown.compute_score(completion, **args)["reward"] == pytest.approx(1.1)

    # A balanced operator pool: 8192 puzzles x (n - 1) operators, a quarter each. The
    # solutions hold only binary operators and positive literals, so characters count them.
    ops = Counter(c for e in train for c in e.metadata["solution"] if c in "+-*/")
    quarter = 8192 * (n_given_numbers - 1) // 4
    assert ops == {"+": quarter, "-": quarter, "*": quarter, "/": quarter}


def test_countdown_prompt():
    (puzzle,), _ = countdown_data.generate_splits(3, n_train=1, n_test=1, seed=42)
    example = countdown_data.to_example(puzzle)
    system, user = example.prompt
    assert system["role"] == "system"
    assert "<think></think>" in system["content"]
    assert "<answer></answer>" in system["content"]
    a, b, c = puzzle.numbers
    assert user == {
        "role": "user",
        "content": f"Given numbers: {a}, {b}, {c}\nTarget number: {puzzle.target}",
    }
    assert example.reward_func_args == {"target": puzzle.target, "numbers": [a, b, c]}


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        (
            {"n_given_numbers": 1, "n_train": 5, "n_test": 5},
            "n_given_numbers must be at least 2, got 1",
        ),
        ({"n_given_numbers": 3, "n_train": 0, "n_test": 5}, "n_train must be at least 1, got 0"),
        ({"n_given_numbers": 3, "n_train": 5, "n_test": 0}, "n_test must be at least 1, got 0"),
    ],
)
def test_countdown_refuses_bad_sizes(kwargs, problem):
    with pytest.raises(DatasetError, match=problem):
        countdown_data.generate_splits(**kwargs, seed=42)


# --- gsm8k -------------------------------------------------------------------------------

GSM8K_PROBLEMS = [
    {
        "question": "Mia has 3 boxes of 12 pencils and gives away 5 pencils. How many pencils "
        "does she have left?",
        "answer": "She has 3 * 12 = <<3*12=36>>36 pencils.\nShe keeps 36 - 5 = <<36-5=31>>31.\n"
        "#### 31",
    },
    {
        "question": "A school buys 1,250 notebooks at $2 each. How many dollars does it pay?",
        "answer": "It pays 1,250 * 2 = <<1250*2=2500>>2,500 dollars.\n#### 2,500",
    },
    {
        "question": "It was 4 degrees in the evening and the temperature fell by 9 degrees "
        "overnight. What was the temperature in the morning?",
        "answer": "4 - 9 = <<4-9=-5>>-5\n#### -5",
    },
]


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_gsm8k_conversion(tmp_path):
    source = write_jsonl(tmp_path / "gsm8k.jsonl", [json.dumps(p) for p in GSM8K_PROBLEMS])
    result = gsm8k_data.convert_gsm8k(source, tmp_path / "out" / "test.parquet")
    assert result.paths == [tmp_path / "out" / "test.parquet"]
    assert result.summary.startswith(f"gsm8k: 3 problems from {source}")
    examples = load_dataset(result.paths[0])
    assert [e.reward_func_args for e in examples] == [
        {"ground_truth": "31"},
        {"ground_truth": "2500"},
        {"ground_truth": "-5"},
    ]
    for example, problem in zip(examples, GSM8K_PROBLEMS, strict=True):
        assert example.prompt == [
            {"role": "system", "content": gsm8k_data.SYSTEM_PROMPT},
            {"role": "user", "content": problem["question"]},
        ]
        assert example.metadata == {"solution": problem["answer"]}
    completion = "<think>1250 * 2</think>\nIt pays <answer>2,500</answer> dollars."
    assert gsm8k.compute_score(completion, **examples[1].reward_func_args)["reward"] == 1.1


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"question": "q", "answer": "#### 3"', "not valid JSON"),
        ('["q", "#### 3"]', "expected a JSON object"),
        ('{"question": "q"}', "'answer' must be a non-empty string"),
        ('{"question": "", "answer": "#### 3"}', "'question' must be a non-empty string"),
        ('{"question": "q", "answer": "3"}', "no '####'"),
        ('{"question": "q", "answer": "#### 2.5"}', "final answer '2.5' is not an integer"),
        ('{"question": "q", "answer": "####"}', "final answer '' is not an integer"),
    ],
)
def test_gsm8k_malformed_lines_name_file_and_line(tmp_path, bad_line, problem):
    # Line 2 is blank (skipped), so the bad record is line 3.
    source = write_jsonl(tmp_path / "g.jsonl", [json.dumps(GSM8K_PROBLEMS[0]), "", bad_line])
    with pytest.raises(DatasetError) as excinfo:
        gsm8k_data.convert_gsm8k(source, tmp_path / "out.parquet")
    assert f"{source}: line 3: " in str(excinfo.value)
    assert problem in str(excinfo.value)
    assert not (tmp_path / "out.parquet").exists()


def test_gsm8k_missing_and_empty_inputs(tmp_path):
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(DatasetError, match=re.escape(f"{missing}: file not found")):
        gsm8k_data.convert_gsm8k(missing, tmp_path / "out.parquet")
    empty = write_jsonl(tmp_path / "empty.jsonl", [""])
    with pytest.raises(DatasetError, match="no problems"):
        gsm8k_data.convert_gsm8k(empty, tmp_path / "out.parquet")


# --- conciseness -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("split", "pairs"),
    [("train", conciseness_data.TRAIN_PAIRS), ("test", conciseness_data.TEST_PAIRS)],
)
def test_shipped_conciseness_files_match_the_module(split, pairs):
    examples = load_dataset(conciseness_data.SHIPPED_DIR / f"{split}.parquet")
    assert examples == conciseness_data.to_examples(pairs)
    assert len(examples) == 16
    for example in examples:
        target = example.reward_func_args["target"]
        assert conciseness.compute_score(target, target=target)["reward"] == 0.0


def test_conciseness_splits_are_disjoint():
    train = {q for q, _ in conciseness_data.TRAIN_PAIRS}
    test = {q for q, _ in conciseness_data.TEST_PAIRS}
    assert len(train) == len(conciseness_data.TRAIN_PAIRS)
    assert len(test) == len(conciseness_data.TEST_PAIRS)
    assert not train & test


def test_conciseness_generator(tmp_path):
    result = conciseness_data.write_conciseness(tmp_path)
    assert result.paths == [tmp_path / "train.parquet", tmp_path / "test.parquet"]
    assert result.summary == f"conciseness: 16 train and 16 test questions in {tmp_path}"
    assert load_dataset(result.paths[0])[0] == Example(
        [{"role": "user", "content": "Solve: 3 + 5 ="}], {"target": "8"}
    )
