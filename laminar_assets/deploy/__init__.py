"""The local deployment: a long-lived Spark Connect server and `dagster dev`, started and stopped together."""

from .connect_server import ConnectServer, ConnectServerOptions, start_connect_server

__all__ = ["ConnectServer", "ConnectServerOptions", "start_connect_server"]
