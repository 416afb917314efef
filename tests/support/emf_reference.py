"""Prints the EMF line AWS's own library (aws-embedded-metrics) writes for the
dimensions and metrics given as JSON on stdin:
{"namespace": "...", "dimensions": {"function": "..."}, "metrics": [[name, value, unit], ...]}"""

import asyncio
import json
import os
import sys

spec = json.load(sys.stdin)
os.environ["AWS_EMF_ENVIRONMENT"] = "Local"  # print to stdout
os.environ["AWS_EMF_NAMESPACE"] = spec["namespace"]

from aws_embedded_metrics.logger.metrics_logger_factory import create_metrics_logger  # noqa: E402


async def main():
    logger = create_metrics_logger()
    logger.reset_dimensions(False)  # no default dimensions (ServiceName, ...)
    logger.set_dimensions(spec["dimensions"])
    for name, value, unit in spec["metrics"]:
        logger.put_metric(name, value, unit)
    await logger.flush()


asyncio.run(main())
