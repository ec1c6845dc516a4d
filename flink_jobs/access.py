"""Before a job starts: does its Kafka user hold the ACLs the job needs? A refused sink write inside a
running job surfaces late and indirectly (on the mini-cluster it can take the task manager down, and
the job then waits for slots), so the brokers are asked first and the job is not started without them."""

from __future__ import annotations

from core.kafka import KafkaAuthorizationError, denied_topic_operations
from core.settings import KafkaSettings


def job_topic_needs(kafka: KafkaSettings, with_samples: bool = True) -> dict[str, list[str]]:
    """The operations the feature job performs on each topic.

    >>> sorted(job_topic_needs(KafkaSettings(), with_samples=False).items())
    [('rtrec.dead-letter', ['WRITE']), ('rtrec.features', ['WRITE']), ('rtrec.interactions', ['READ'])]
    """
    t = kafka.topics
    needs = {t.events: ["READ"], t.features: ["WRITE"], t.dead_letter: ["WRITE"]}
    if with_samples:
        needs[t.samples] = ["WRITE"]
    return needs


def check_job_acls(kafka: KafkaSettings, with_samples: bool = True) -> None:
    """Raises KafkaAuthorizationError naming every ACL the job's user lacks on the job's topics."""
    denied = denied_topic_operations(kafka.bootstrap_servers, job_topic_needs(kafka, with_samples),
                                     security=kafka.security.librdkafka())
    if not denied:
        return
    user = kafka.security.username or "ANONYMOUS"
    gaps = [f"Kafka user {user} lacks the {' and '.join(ops)} ACL{'s' if len(ops) > 1 else ''} on topic {topic} "
            f"(the job {'reads' if topic == kafka.topics.events else 'writes'} it)" for topic, ops in denied.items()]
    raise KafkaAuthorizationError("; ".join(gaps) + ". The job was not started; `rtrec services acls --dry-run` "
                                  "lists the ACLs the pipeline needs")
