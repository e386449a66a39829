"""Typed ``web.AppKey``s for the resources the composition root wires (``broker.app``)."""

from __future__ import annotations

from aiohttp import web

from broker.hub import Hub
from broker.metrics import Metrics
from broker.service import Broker
from broker.settings import BrokerSettings

SETTINGS = web.AppKey("settings", BrokerSettings)
BROKER = web.AppKey("broker", Broker)
METRICS = web.AppKey("metrics", Metrics)
HUB = web.AppKey("hub", Hub)
