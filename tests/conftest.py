from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from core.settings import Settings, load_settings
from tests.infra import Endpoints, containers, docker_available, local_processes


@pytest.fixture(scope="session")
def endpoints(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    """Kafka bootstrap address and Redis URL for the whole session: containers when a Docker engine
    answers and they start, else local processes (with one line saying why, when an engine answered)."""
    with contextlib.ExitStack() as stack:
        found = None
        if docker_available():
            try:
                found = stack.enter_context(containers())
            except Exception as exc:  # an image that cannot be pulled, a container that never got ready
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                capture = request.config.pluginmanager.get_plugin("capturemanager")
                with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                    print(f"\n[services] a Docker engine answers but the containers did not start ({reason}): "
                          "using local processes")
        if found is None:
            found = stack.enter_context(local_processes(tmp_path_factory.mktemp("services")))
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
