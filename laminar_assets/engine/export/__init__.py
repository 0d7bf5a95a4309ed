"""Exports: delivering a flow's or stage's Delta table to where applications read it. `delivery.Exporter` runs
one delivery (change feed -> net changes per key -> the target, with the delivered version), `protocol` is the
one seam of targets (`Target`, `Changes`, `TARGETS`), `changes` reads the change feed, `records` keeps the lake's
record of each delivery, `connections` says how targets are reached. One module per target: `postgres`, `redis`."""

from .connections import ENV_OPTIONS, Connection, connections_of, env_name, from_environment, mask_url
from .delivery import DeliveryResult, Exporter
from .protocol import EXPORT_STEPS, TARGETS, Applied, Changes, Delivered, Mode, Reason, Target, TargetContext, register_target
from .records import ExportRecord, lag, record_uri
from .records import load as load_record

__all__ = [
    "ENV_OPTIONS", "EXPORT_STEPS", "TARGETS", "Applied", "Changes", "Connection", "Delivered", "DeliveryResult", "ExportRecord",
    "Exporter", "Mode", "Reason", "Target", "TargetContext", "connections_of", "env_name", "from_environment", "lag",
    "load_record", "mask_url", "record_uri", "register_target",
]
