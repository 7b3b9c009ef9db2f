"""The synthetic world's bytes never move: a refactor of ``envs.data.synthwiki`` that
changes one passage, question, answer or their order fails here.

The micro recipe's cached base model, the numbers in ``docs/`` and many tests were made
from these exact worlds. A deliberate change of the world has to update the literals below
(and say so in its commit: the cached bases and the documented numbers go stale with it).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from envs.data import DATASETS, build_world, default_world
from envs.data.synthwiki import SPLITS

# sha256 of ``world_bytes(seed)``, computed on commit d728d09, before synthwiki.py was
# split into a package.
EXPECTED = {
    0: "38c4f521b6f2331be71c98f54e514c391f670537bf254a370f1281b14559c9ee",
    1: "7e4897de373055aa74b9f860c293aec24b33355e867c27b3015e2299b522d398",
}


def world_bytes(seed: int) -> bytes:
    """The corpus rows in order, then every split's questions (``QAItem.to_dict``) per dataset."""
    world = default_world() if seed == 0 else build_world(seed)
    questions = {
        split: {d: [q.to_dict() for q in world.questions(d, split)] for d in DATASETS}
        for split in SPLITS
    }
    return json.dumps([world.corpus, questions]).encode()


@pytest.mark.parametrize("seed", sorted(EXPECTED))
def test_world_is_byte_identical_to_the_recorded_one(seed):
    assert hashlib.sha256(world_bytes(seed)).hexdigest() == EXPECTED[seed]
