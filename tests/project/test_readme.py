"""README.md is a short user guide whose code runs as shown: the episode walk-through, the
user-written policy through the README's own `play --save` and `replay` commands and through
`agents.collect` (printing what the README says it prints), and links that lead somewhere."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def _between(text, marker):
    """The README text between `<!-- marker -->` and `<!-- /marker -->`."""
    return text.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]


def _snippet():
    return _python_blocks(_between(README.read_text(), "policy-snippet"))[0]


def _section(text, title):
    """One `## title` section of the README, up to the next `## ` heading."""
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _links(text):
    """The relative targets of the markdown links and images in `text`, anchors cut off."""
    return [link for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
            if "://" not in link]


def test_the_readme_is_a_short_guide_that_links_its_notes():
    text = README.read_text()
    assert len(text) <= 12_000, f"README.md has {len(text)} characters; the guide keeps under 12,000"
    links = _links(text)
    assert "docs/micro.md" in links
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for link in _links(page.read_text()):
            target = page.parent / link
            assert target.is_file(), f"{page.relative_to(ROOT)} links to {link}, which does not exist"


def test_the_policy_snippet_is_short():
    assert len(_snippet().strip().splitlines()) < 20


def test_step_an_episode_prints_what_the_readme_shows(capsys):
    text = README.read_text()
    code = _python_blocks(text.split("## Step an episode", 1)[1])[0]
    exec(compile(code, "README:step", "exec"), {})
    expected = re.search(r"```\n(Debra.*?)\n```", text).group(1)
    assert capsys.readouterr().out.strip().splitlines()[-1] == expected


def _readme_command(text, start):
    """The README command (a line of a bash block in "Plug in a policy") that starts with `start`."""
    section = _section(text, "Plug in a policy")
    lines = [ln for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
             for ln in block.splitlines() if ln.startswith(start)]
    assert lines, f"README.md's 'Plug in a policy' shows no `{start} ...` command"
    return shlex.split(lines[0].split("  #", 1)[0])


def test_user_policy_plugs_into_play_replay_and_collect(tmp_path, monkeypatch, capsys):
    text = README.read_text()
    (tmp_path / "my_policy.py").write_text(_snippet())
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    play = _readme_command(text, "python -m agents play --policy python:my_policy:FirstHit")
    assert "--save" in play
    saved = tmp_path / play[play.index("--save") + 1]
    result = subprocess.run([sys.executable, *play[1:]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Final answer:" in result.stdout and "<information>Doc 1(Title:" in result.stdout
    assert saved.exists()
    # `replay` on what `play --save` wrote: the README's way to step through a saved episode.
    replay = _readme_command(text, "python -m agents replay")
    assert tmp_path / replay[-1] == saved
    result = subprocess.run([sys.executable, *replay[1:]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600, env=env, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "<subtask>" in result.stdout

    # The collect snippet runs beside my_policy.py and prints the output the README shows.
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    block = _between(text, "collect-snippet")
    collect_code = _python_blocks(block)[0]
    assert "from agents import collect" in collect_code
    expected = re.search(r"```\n(.*?)\n```", block.split("```python", 1)[1].split("```", 1)[1],
                         re.DOTALL).group(1)
    capsys.readouterr()
    namespace = {}
    exec(compile(collect_code, "README:collect", "exec"), namespace)
    assert capsys.readouterr().out.strip().splitlines()[-1] == expected == "0.0"
    groups = namespace["groups"]
    assert len(groups) == 8 and all(len(g) == 4 for g in groups)
    assert all(ep.num_searches >= 1 for g in groups for ep in g)


def test_the_readme_reports_the_scale_out_ratios_and_the_guarantees():
    """Issues 15 and 17: the two scale-out ratios that `perf --scaleout` measures, the cluster
    command, and what the reliability section guarantees."""
    text = README.read_text()
    for name in ("collect.ray_workers_speedup", "learner.ddp_step_ratio", "ray start --head", "ray_address=auto",
                 "docs/retrieval_server.md", "weights_only", "non-finite", "never raises on model output",
                 "docs/reliability.md"):
        assert name in text, name
