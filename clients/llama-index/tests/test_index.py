"""End to end: LlamaIndex's VectorStoreIndex on the store, with offline embeddings, sync and async."""

from __future__ import annotations

import re
from typing import List

from conftest import MakeStore
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.embeddings import BaseEmbedding, MockEmbedding
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

VOCABULARY = ["apple", "banana", "cherry", "engine", "wheel", "road", "river", "boat"]


class KeywordEmbedding(BaseEmbedding):
    """Counts of a few words, plus a constant so no text embeds to zero: meaningful, offline, exact."""

    def _vector(self, text: str) -> List[float]:
        words = re.findall(r"[a-z]+", text.lower())
        return [float(words.count(w)) for w in VOCABULARY] + [0.1]

    def _get_text_embedding(self, text: str) -> List[float]:
        return self._vector(text)

    def _get_query_embedding(self, query: str) -> List[float]:
        return self._vector(query)

    async def _aget_query_embedding(self, query: str) -> List[float]:
        return self._vector(query)


DOCUMENTS = [
    Document(text="An apple and a banana. Apple pie.", id_="fruit", metadata={"topic": "food"}),
    Document(text="The engine turns the wheel on the road.", id_="car", metadata={"topic": "machines"}),
    Document(text="A boat on the river. The river is wide.", id_="water", metadata={"topic": "nature"}),
]

# A splitter that needs no downloaded tokenizer: the machine running the tests may be offline.
SPLITTER = SentenceSplitter(chunk_size=64, chunk_overlap=0, tokenizer=str.split)


def build(make_store: MakeStore, embed_model: BaseEmbedding) -> VectorStoreIndex:
    storage = StorageContext.from_defaults(vector_store=make_store())
    return VectorStoreIndex.from_documents(
        DOCUMENTS, storage_context=storage, embed_model=embed_model, transformations=[SPLITTER]
    )


def test_from_documents_and_a_retriever_find_the_right_document(make_store: MakeStore) -> None:
    index = build(make_store, KeywordEmbedding())
    retriever = index.as_retriever(similarity_top_k=1)
    for query, doc in [("apple", "fruit"), ("wheel road", "car"), ("a river boat", "water")]:
        (hit,) = retriever.retrieve(query)
        assert hit.node.ref_doc_id == doc
        assert hit.node.metadata["topic"] == DOCUMENTS[[d.id_ for d in DOCUMENTS].index(doc)].metadata["topic"]
    food = index.as_retriever(
        similarity_top_k=3, filters=MetadataFilters(filters=[MetadataFilter(key="topic", value="food")])
    ).retrieve("river")
    assert [h.node.ref_doc_id for h in food] == ["fruit"]

    index.delete_ref_doc("fruit")
    assert [h.node.ref_doc_id for h in index.as_retriever(similarity_top_k=1).retrieve("apple")] != ["fruit"]


async def test_async_retrieval_and_insert(make_store: MakeStore) -> None:
    index = build(make_store, KeywordEmbedding())
    (hit,) = await index.as_retriever(similarity_top_k=1).aretrieve("engine")
    assert hit.node.ref_doc_id == "car" and hit.score > 0.5
    await index.ainsert_nodes(SPLITTER([Document(text="cherry cherry", id_="cherries")]))
    (hit,) = await index.as_retriever(similarity_top_k=1).aretrieve("cherry")
    assert hit.node.get_content() == "cherry cherry"
    await index.adelete_ref_doc("cherries")
    (hit,) = await index.as_retriever(similarity_top_k=1).aretrieve("cherry")
    assert hit.node.ref_doc_id != "cherries"
    await index.vector_store.aclose()  # type: ignore[attr-defined]


def test_mock_embedding_builds_and_retrieves(make_store: MakeStore) -> None:
    # MockEmbedding gives every text the same vector: every node ties, and ties are ordered by row id.
    index = build(make_store, MockEmbedding(embed_dim=4))
    hits = index.as_retriever(similarity_top_k=5).retrieve("anything")
    assert sorted(h.node.ref_doc_id for h in hits) == ["car", "fruit", "water"]
    assert all(abs(h.score - 1.0) < 1e-6 for h in hits)
