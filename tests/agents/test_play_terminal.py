"""`python -m agents play --policy human` driven through a pseudo-terminal to the end."""

import os
import sys

import pexpect


def test_human_plays_a_cascade_episode_in_a_terminal(tmp_path):
    save = tmp_path / "ep.jsonl"
    child = pexpect.spawn(
        sys.executable,
        ["-m", "agents", "play", "--policy", "human", "--workflow", "cascade", "--dataset", "popqa",
         "--index", "1", "--split", "test", "--save", str(save)],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        encoding="utf-8", timeout=300, dimensions=(50, 200))
    try:
        child.expect("searcher_0> ")
        child.sendline(":ctx")  # the whole context, then the same prompt again
        child.expect("Task: Who was the director of A Voyage for Fluskan")
        child.expect("searcher_0> ")
        child.sendline("<search>A Voyage for Fluskan director</search>")
        child.expect(r"<information>Doc 1\(Title: ")
        child.expect("searcher_0> ")
        child.sendline("<summary>Directed by Debra Tilell.</summary>")
        for j in range(5):
            child.expect(f"answerer_{j}> ")
            child.sendline("<answer>Debra Tilell</answer>" if j != 4 else "<answer>never closed")
            if j == 4:  # an invalid turn gets a corrective observation and another go
                child.expect("Invalid turn: no <answer> tag")
                child.expect("answerer_4> ")
                child.sendline("Somebody Else")  # a bare answer is wrapped in <answer> tags
        child.expect("Final answer: 'Debra Tilell'")
        child.expect("EM 1")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert save.exists() and "Debra Tilell" in save.read_text()
    assert "Somebody Else" in save.read_text()  # the bare answer became a candidate
