"""LangChain vector store on quiver, a vector database with exact k-nearest-neighbour search.

from langchain_quiver import QuiverVectorStore
store = QuiverVectorStore(embeddings, "docs", url="http://127.0.0.1:8080", api_key="...")
store.add_texts(["quiver is exact"], metadatas=[{"year": 2024}], ids=["a"])
store.similarity_search("exact search", k=1, filter={"year": {"$gte": 2020}})
"""

from quiver_vectors.string_ids import PROBES_MAX, NotStoredError, SlotHash, blake2b_slot
from .vectorstores import QuiverVectorStore, relevance

__all__ = ["NotStoredError", "PROBES_MAX", "QuiverVectorStore", "SlotHash", "blake2b_slot", "relevance"]
