"""QA data: FlashRAG-layout loaders for the seven benchmarks (``load_qa``) and the synthetic
world (``build_world``, written out as files by ``write_flashrag``)."""

from envs.data.items import DATASETS, MULTI_HOP, SINGLE_HOP, QAItem, read_jsonl, write_jsonl
from envs.data.qa import load_qa
from envs.data.synthwiki import SynthWiki, build_world, default_world, write_flashrag

__all__ = ["DATASETS", "MULTI_HOP", "SINGLE_HOP", "QAItem", "SynthWiki", "build_world",
           "default_world", "load_qa", "read_jsonl", "write_flashrag", "write_jsonl"]
