"""The Lambda context object, with the attributes the runtime provides."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field


@dataclass
class LambdaContext:
    function_name: str = "sluice-test-fn"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 512
    timeout_ms: int = 60_000
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_group_name: str = "/aws/lambda/sluice-test-fn"
    log_stream_name: str = "2026/11/29/[$LATEST]abc"
    started: float = field(default_factory=time.monotonic)

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:eu-north-1:123456789012:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self.timeout_ms - (time.monotonic() - self.started) * 1000))
