"""LangChain's standard vector store suite (`langchain_tests`), unmodified, sync and async."""

from __future__ import annotations

from typing import AsyncIterator

import pytest
from langchain_core.vectorstores import VectorStore
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from langchain_quiver import QuiverVectorStore


class TestQuiverStandard(VectorStoreIntegrationTests):
    # has_sync, has_async and has_get_by_ids are left at their default, True:
    # every test of the suite runs.

    @pytest.fixture
    async def vectorstore(self, server, index_name) -> AsyncIterator[VectorStore]:  # type: ignore[override]
        store = QuiverVectorStore(self.get_embeddings(), index_name, url=server.url, api_key=server.key)
        try:
            yield store
        finally:
            await store.aclose()
