"""README.md's code runs as shown: the episode walk-through, and the user-written policy
through `python -m agents play` and `agents.collect`."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def _snippet():
    text = README.read_text()
    block = text.split("<!-- policy-snippet -->", 1)[1].split("<!-- /policy-snippet -->", 1)[0]
    return _python_blocks(block)[0]


def test_the_policy_snippet_is_short():
    assert len(_snippet().strip().splitlines()) < 20


def test_step_an_episode_prints_what_the_readme_shows(capsys):
    text = README.read_text()
    code = _python_blocks(text.split("## Step an episode", 1)[1])[0]
    exec(compile(code, "README:step", "exec"), {})
    expected = re.search(r"```\n(Debra.*?)\n```", text).group(1)
    assert capsys.readouterr().out.strip().splitlines()[-1] == expected


def test_user_policy_plugs_into_play_and_collect(tmp_path, monkeypatch):
    (tmp_path / "my_policy.py").write_text(_snippet())
    result = subprocess.run(
        [sys.executable, "-m", "agents", "play", "--policy", "python:my_policy:FirstHit",
         "--dataset", "hotpotqa", "--index", "3", "--save", str(tmp_path / "ep.jsonl")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Final answer:" in result.stdout and "<information>Doc 1(Title:" in result.stdout
    assert (tmp_path / "ep.jsonl").exists()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    collect_code = next(b for b in _python_blocks(README.read_text()) if "from agents import collect" in b)
    namespace = {}
    exec(compile(collect_code, "README:collect", "exec"), namespace)
    groups = namespace["groups"]
    assert len(groups) == 8 and all(len(g) == 4 for g in groups)
    assert all(ep.num_searches >= 1 for g in groups for ep in g)
