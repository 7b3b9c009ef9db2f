"""QA data: FlashRAG-layout loaders for the seven benchmarks and the synthetic world.

``load_qa(name, split, root)`` reads ``<root>/<name>/<split>.jsonl`` (or parquet), the
hub dataset when ``root`` is None, or the built-in synthetic world when ``root`` is
``"synthetic"``. ``build_world(seed)`` makes a synthetic encyclopedia and questions in
the styles of the seven benchmarks; ``write_flashrag`` writes it out as files.
"""

from envs.data.items import DATASETS, MULTI_HOP, SINGLE_HOP, QAItem, read_jsonl, write_jsonl
from envs.data.qa import load_qa
from envs.data.synthwiki import SynthWiki, build_world, default_world, write_flashrag

__all__ = ["DATASETS", "MULTI_HOP", "SINGLE_HOP", "QAItem", "SynthWiki", "build_world",
           "default_world", "load_qa", "read_jsonl", "write_flashrag", "write_jsonl"]
