"""EigenDB's published Python client (eigen-client from PyPI, unmodified) against quiver."""

import pytest
from eigen_client.client import Client
from eigen_client.data_types import Embedding


def test_the_published_client_works_unmodified(server, capsys):
    client = Client(url=server.url, api_key=server.key)
    assert "Authentication successful: Authenticated." in capsys.readouterr().out

    index = client.create_index(index_name="docs", dimensions=3, metric="cosine")
    assert client.list_indexes() == ["docs"]
    stats = client.get_index_stats("docs")
    assert (stats["index_name"], stats["dimensions"], stats["metric"]) == ("docs", 3, "cosine")

    index.insert([
        Embedding(id=1, data=[1.0, 0.0, 0.0], metadata={"title": "first"}),
        Embedding(id=2, data=[0.0, 1.0, 0.0], metadata={"title": "second"}),
    ])
    index.upsert([
        Embedding(id=2, data=[0.6, 0.8, 0.0], metadata={"title": "second, moved"}),
        Embedding(id=3, data=[0.0, 0.0, 1.0]),
    ])

    hits = index.search(Embedding(id=-1, data=[1.0, 0.1, 0.0]), k=2)
    assert hits == {
        "1": {"metadata": {"title": "first"}, "rank": 0},
        "2": {"metadata": {"title": "second, moved"}, "rank": 1},
    }

    found = index.retrieve([2, 3])
    assert sorted(found) == ["2", "3"]
    assert found["2"].data == [0.6, 0.8, 0.0]
    assert found["2"].metadata == {"title": "second, moved"}
    assert found["3"].metadata == {}

    index.delete([3])
    with pytest.raises(Exception, match="EMBEDDINGS_SKIPPED"):
        index.retrieve([3])
    # Inserting an id that exists is reported, as the client expects errors.
    with pytest.raises(Exception, match="already exists"):
        index.insert([Embedding(id=1, data=[1.0, 1.0, 1.0])])
    assert client.get_index_stats("docs")["count"] == 2

    client.delete_index("docs")
    assert client.list_indexes() == []
    with pytest.raises(Exception, match="INDEX_NOT_FETCHED"):
        client.get_index_stats("docs")


def test_a_wrong_key_is_refused(server, capsys):
    client = Client(url=server.url, api_key="not-the-key")
    printed = capsys.readouterr().out
    # The client prints the server's envelope when its key check fails.
    assert "Authentication failed" in printed and "401" in printed and "INVALID_API_KEY" in printed
    with pytest.raises(Exception, match="INVALID_API_KEY"):
        client.list_indexes()


def test_an_existing_index_is_opened_as_the_readme_says(server, capsys):
    """The README: create_index raises when the index exists, and an Index
    made with model_provider="none" opens it."""
    from eigen_client.index import Index

    client = Client(url=server.url, api_key=server.key)
    first = client.create_index(index_name="kept", dimensions=2, metric="l2")
    first.insert([Embedding(id=7, data=[1.0, 2.0], metadata={"k": "v"})])
    with pytest.raises(Exception, match="already exists"):
        client.create_index(index_name="kept", dimensions=2, metric="l2")
    index = Index(url=server.url, api_key=client.api_key, index_name="kept", model_provider="none")
    assert index.search(Embedding(id=-1, data=[1.0, 2.0]), k=1) == {"7": {"metadata": {"k": "v"}, "rank": 0}}
