"""The Prompted Critic baseline (M-GRPO style): the frozen base model, prompted as a judge,
scores each Searcher report's usefulness for its sub-task and the question in [0, 1].

The score is the judge's probability of "Yes" against "No" for the next token, one
forward pass per report: a coarse, biased scalar, as the paper says such judges are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agents.logprobs import pad_batch
from envs.chat import ChatFormat

JUDGE_SYSTEM = "You judge the reports of a search assistant. Reply with Yes or No."


class PromptedCritic:
    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 16):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.batch_size = batch_size
        self.yes, self.no = (self.chat.encode(word)[0] for word in ("Yes", "No"))

    def prompt(self, question: str, task: str, report: str) -> list[int]:
        user = (f"Question: {question}\nSub-task: {task}\nReport: {report or '(empty)'}\n"
                "Is this report correct and useful for the sub-task and the question?")
        return self.chat.prompt(JUDGE_SYSTEM, user)

    @torch.no_grad()
    def scores(self, items: Sequence[tuple[str, str, str]]) -> list[float]:
        """P(Yes) / (P(Yes) + P(No)) per (question, sub-task, report)."""
        device = next(self.model.parameters()).device
        out: list[float] = []
        for lo in range(0, len(items), self.batch_size):
            prompts = [self.prompt(*item) for item in items[lo: lo + self.batch_size]]
            ids, att, pos = pad_batch(prompts, 0, "left")  # the last position is the next token
            logits = self.model(input_ids=ids.to(device), attention_mask=att.to(device),
                                position_ids=pos.to(device)).logits[:, -1].float()
            pair = torch.stack([logits[:, self.yes], logits[:, self.no]], -1).softmax(-1)
            out.extend(pair[:, 0].tolist())
        return out

    def score_rows(self, rows: Sequence[Any]) -> list[float]:
        """A score in [0, 1] per learner row (``algos.batch.Row``), each row's report judged
        against its sub-task and question. Which rows are judged the role rules decide
        (``algos.roles``: the rows whose advantage is the critic's)."""
        return self.scores([(r.episode.question["question"], r.segment.task, r.segment.output) for r in rows])
