from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from core.settings import Settings, load_settings
from tests.infra import Endpoints, containers, docker_available, local_processes


@pytest.fixture(scope="session")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    """Kafka bootstrap address and Redis URL for the whole session."""
    if docker_available():
        with containers() as found:
            yield found
    else:
        with local_processes(tmp_path_factory.mktemp("services")) as found:
            yield found


@pytest.fixture
def settings(endpoints: Endpoints) -> Settings:
    """Settings pointing at the session's services, with topics and Redis keys unique to this test."""
    base = load_settings()
    suffix = uuid.uuid4().hex[:10]
    topics = base.kafka.topics.suffixed(suffix)
    return base.model_copy(update={
        "kafka": base.kafka.model_copy(update={"bootstrap_servers": endpoints.kafka_bootstrap, "topics": topics}),
        "redis": base.redis.model_copy(update={"url": endpoints.redis_url, "key_prefix": f"test-{suffix}"}),
    })
