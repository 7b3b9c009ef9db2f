"""The taskset: one verifiers task per QA item of one dataset split (mopd's ``load_qa``)."""

from __future__ import annotations

import verifiers.v1 as vf

from envs.data import QAItem, load_qa


class SearchTeamData(vf.TaskData):
    """One question. The gold answers ride on the episode's task record (the scorer's
    side); no agent's prompt ever carries them."""

    qa_id: str = ""
    dataset: str = ""
    golden_answers: list[str] = []


class SearchTeamTask(vf.Task[SearchTeamData]):
    """A question; SearchTeamEnv plays it and scores every segment (no per-trace rewards)."""

    @property
    def key(self) -> str:
        # the dataset's own id: the content hash would change with the auto-set idx
        return f"{self.data.dataset}/{self.data.qa_id}"

    def question(self) -> QAItem:
        """The QA item mopd's env takes (``options={"question": ...}``)."""
        return QAItem(id=self.data.qa_id, question=self.data.prompt_text,
                      golden_answers=tuple(self.data.golden_answers), dataset=self.data.dataset)


class SearchTeamTasksetConfig(vf.TasksetConfig):
    dataset: str = "hotpotqa"
    """One of mopd's seven datasets (``envs.data.DATASETS``) or a directory's dataset name."""
    split: str = "dev"
    root: str | None = "synthetic"
    """``synthetic`` (the built-in world, offline), a FlashRAG directory, or None for the hub."""
    limit: int | None = None
    """Keep the first rows (vf-eval's ``-n`` selects after loading, too)."""


class SearchTeamTaskset(vf.Taskset[SearchTeamTask, SearchTeamTasksetConfig]):
    def load(self) -> list[SearchTeamTask]:
        cfg = self.config
        items = load_qa(cfg.dataset, cfg.split, root=cfg.root, limit=cfg.limit)
        return [SearchTeamTask(SearchTeamData(prompt=q.question, qa_id=q.id, dataset=q.dataset or cfg.dataset,
                                              golden_answers=list(q.golden_answers)), cfg.task)
                for q in items]
