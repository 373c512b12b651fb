"""serverless.yml binds each topic to its own consumer function, reporting item failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shared.queues.publish import TOPICS

ROOT = Path(__file__).resolve().parents[3]


class _Loader(yaml.SafeLoader):
    pass


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    value = loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None
    return {"!" + suffix: value}


_Loader.add_multi_constructor("!", _tag)


def test_every_topic_has_a_consumer_function_bound_to_its_queue() -> None:
    functions = yaml.load((ROOT / "serverless.yml").read_text(), Loader=_Loader)["functions"]
    source = (ROOT / "functions" / "consumers.py").read_text()
    for topic in TOPICS:
        word = topic.split(".")[-1]
        name = "rss" + word.capitalize()
        function = functions[name]
        assert function["handler"] == f"functions/consumers.{word}"
        assert f"\n{word} = CONSUMERS[{topic!r}].lambda_handler".replace("'", '"') in source
        [event] = function["events"]
        sqs = event["sqs"]
        assert sqs["functionResponseType"] == "ReportBatchItemFailures"
        assert sqs["arn"] == {"!GetAtt": f"Rss{word.capitalize()}Queue.Arn"}
        assert 1 <= sqs["batchSize"] <= 10
