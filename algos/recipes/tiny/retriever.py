"""The tiny recipe's retriever: :class:`envs.retrieval.lexical.WordOverlapRetriever` (it moved
to ``envs`` so that the ``retriever=words`` setting can name it); kept for old imports."""

from envs.retrieval.lexical import WordOverlapRetriever

__all__ = ["WordOverlapRetriever"]
