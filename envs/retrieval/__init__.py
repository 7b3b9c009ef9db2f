"""Retrieval for the search team: passages, the ``Retriever`` protocol, a dense retriever
(sentence-transformers + faiss, cached on disk), and a Search-R1-compatible HTTP server and
client. ``python -m envs.retrieval serve --corpus FILE`` starts the server."""

from envs.retrieval.dense import DenseRetriever, default_encoder_path
from envs.retrieval.factory import make_retriever
from envs.retrieval.passage import MemoRetriever, Passage, Retriever, load_corpus
from envs.retrieval.remote import RemoteRetriever, RetrievalError
from envs.retrieval.server import RetrievalServer

__all__ = ["DenseRetriever", "MemoRetriever", "Passage", "RemoteRetriever", "RetrievalError",
           "RetrievalServer", "Retriever", "default_encoder_path", "load_corpus", "make_retriever"]
