"""LlamaIndex vector store on quiver, a vector database with exact k-nearest-neighbour search.

from llama_index.vector_stores.quiver import QuiverVectorStore
store = QuiverVectorStore("docs", url="http://127.0.0.1:8080", api_key="...")
"""

from quiver_vectors.string_ids import PROBES_MAX, NotStoredError, SlotHash, blake2b_slot
from .base import QuiverVectorStore, similarity

__all__ = ["NotStoredError", "PROBES_MAX", "QuiverVectorStore", "SlotHash", "blake2b_slot", "similarity"]
