"""bench/gpu/host_stacks.py: a sampler's collapsed stacks summed by function, only those
inside the step's window."""

import re

from bench.gpu import host_stacks

RAW = """\
<module> (profile_step.py:5);main (profile_step.py:9);start (engine.py:3) 50
<module> (profile_step.py:5);one_step (profile_step.py:12);schedule (sched.py:40) 30
<module> (profile_step.py:5);one_step (profile_step.py:12);schedule (sched.py:41);alloc (kv.py:7) 10
<module> (profile_step.py:5);one_step (profile_step.py:13);f (r.py:1);f (r.py:2) 20
not a stack line
"""


def test_only_the_stacks_inside_the_window_count_and_lines_merge_into_functions():
    stacks = host_stacks.read_stacks(RAW)
    assert len(stacks) == 4
    total, inclusive, own = host_stacks.shares(stacks, re.compile(r"^one_step \("))
    assert total == 60  # start-up's 50 samples are outside
    assert inclusive["schedule (sched.py)"] == 40  # two lines of one function
    assert own["schedule (sched.py)"] == 30 and own["alloc (kv.py)"] == 10
    assert inclusive["f (r.py)"] == 20  # recursion counts a sample once
    assert inclusive["one_step (profile_step.py)"] == 60


def test_an_empty_window_says_so():
    stacks = host_stacks.read_stacks(RAW)
    assert host_stacks.report(*host_stacks.shares(stacks, re.compile("nothing")), 5) == [
        "no sample inside the window"
    ]


def test_with_the_calls_counted_shares_are_also_seconds_a_call():
    stacks = host_stacks.read_stacks(RAW)
    lines = host_stacks.report(*host_stacks.shares(stacks, re.compile("^one_step")), 3, 1 / 250 / 2)
    assert lines[0] == "60 samples inside the window, 0.120 s a call"
    assert "   0.080 s  schedule (sched.py)" in "\n".join(lines)  # 40 samples at 250 Hz, 2 calls
